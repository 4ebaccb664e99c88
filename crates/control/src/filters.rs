//! The tenants' filters at run time (issue 18 §1): `protego ctl filter load` and `unload`
//! change the running set, and the store keeps it.
//!
//! A node starts with its configuration file's `[[filter]]` tables. Once a filter was loaded or
//! unloaded with `protego ctl filter`, the store holds the whole set ([`FilterRecord`]: every
//! filter's tenant, direction, section, weight, object name and the object's bytes, each
//! object once), sealed like the other records, and at start ([`effective`]) the stored set
//! wins over the file's (a warning says when they differ; `--discard-applied` drops it with
//! the applied configuration). A change ([`change`]) is checked whole as the configuration's
//! `[[filter]]` tables are (the tenant exists, the object is at most
//! [`MAX_OBJECT_BYTES`](crate::config::MAX_OBJECT_BYTES), the program loads and verifies, at most
//! [`MAX_PER_DIRECTION`](crate::config::MAX_PER_DIRECTION) per tenant and direction), then
//! the data path takes the new set (it verifies every program again and changes nothing on an
//! error), then the store keeps it; should the store refuse, the data path gets the old set
//! back.
//!
//! A filter's place is (tenant, direction, object file name, section): loading a program into a
//! place that holds one (a new version of the same file) replaces it (atomically: batches in flight finish with the old program, the next runs
//! the new one; maps whose declaration did not change keep their contents).
//!
//! Map contents are not stored, but the tenants' *settings* are: each `filter map update` is
//! kept in the record ([`FilterMapSetting`], one per map and key, the latest value; a `delete`
//! of the key forgets it) and written again into the map wherever it starts afresh: by a
//! restarted gateway after its filters, and in the distributed form by every data node that
//! registers. What the programs write themselves (connection tables, counters) starts as the
//! object declares it, as the kernel's maps do after a reboot. A new set whose map of that
//! name is declared differently, or not at all, forgets the map's settings
//! ([`keep_settings`]), as the data path does its contents.

use crate::config::Config;
use crate::config::{MAX_OBJECT_BYTES, MAX_PER_DIRECTION, MAX_WEIGHT};
use crate::error::Error;
use crate::store::{Change, Store};
use base64ct::{Base64, Encoding};
use datapath::{FilterConfig, FilterDirection, FilterMapOp, FilterMapSetting};
use ids::TenantId;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use zeroize::Zeroizing;

/// Version of the record's encoding (2: with the map settings; 1, without, is read too).
const VERSION: u32 = 2;

/// The filter set as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterRecord {
    /// 1 for the first change, then one more for each.
    pub generation: u64,
    /// Every filter, in the order the data path is given them.
    pub filters: Vec<FilterConfig>,
    /// Whether the set was changed with `protego ctl filter load|unload`, so that it runs
    /// instead of the file's `[[filter]]` tables; false while the record holds only map
    /// settings made on the file's filters (the file's tables keep running then, as edited).
    pub set_stored: bool,
    /// The tenants' map settings, in the order they were first made.
    pub settings: Vec<FilterMapSetting>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    version: u32,
    generation: u64,
    /// Each distinct object once, in Base64.
    objects: Vec<String>,
    filters: Vec<WireFilter>,
    /// Absent in version 1, whose records were all stored sets.
    #[serde(default = "stored_set_by_default")]
    set_stored: bool,
    #[serde(default)]
    settings: Vec<WireSetting>,
}

fn stored_set_by_default() -> bool {
    true
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireSetting {
    tenant: String,
    map: String,
    /// Hex.
    key: String,
    /// Hex.
    value: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireFilter {
    tenant: String,
    direction: String,
    section: String,
    weight: u32,
    object_name: String,
    /// Index into `objects`.
    object: usize,
}

impl FilterRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Zeroizing<Vec<u8>> {
        let mut objects: Vec<&Arc<[u8]>> = Vec::new();
        let filters = self
            .filters
            .iter()
            .map(|f| {
                let object = match objects.iter().position(|o| **o == f.object) {
                    Some(i) => i,
                    None => {
                        objects.push(&f.object);
                        objects.len() - 1
                    }
                };
                WireFilter {
                    tenant: f.tenant.as_str().to_owned(),
                    direction: f.direction.to_string(),
                    section: f.section.clone(),
                    weight: f.weight,
                    object_name: f.object_name.clone(),
                    object,
                }
            })
            .collect();
        let wire = Wire {
            version: VERSION,
            generation: self.generation,
            objects: objects.iter().map(|o| Base64::encode_string(o)).collect(),
            filters,
            set_stored: self.set_stored,
            settings: self
                .settings
                .iter()
                .map(|s| WireSetting {
                    tenant: s.tenant.as_str().to_owned(),
                    map: s.map.clone(),
                    key: hex::encode(&s.key),
                    value: hex::encode(&s.value),
                })
                .collect(),
        };
        // Serializing plain strings and numbers into a Vec cannot fail.
        Zeroizing::new(serde_json::to_vec(&wire).unwrap_or_default())
    }

    /// Reads a record written by [`FilterRecord::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let wire: Wire =
            serde_json::from_slice(bytes).map_err(|e| format!("unreadable record: {e}"))?;
        if !(1..=VERSION).contains(&wire.version) {
            return Err(format!(
                "record version {} (this Protego reads version {VERSION})",
                wire.version
            ));
        }
        let objects = wire
            .objects
            .iter()
            .enumerate()
            .map(|(i, text)| {
                Base64::decode_vec(text)
                    .map(Arc::<[u8]>::from)
                    .map_err(|_| format!("object {i} is not Base64"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let filters = wire
            .filters
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                let bad = |what: String| format!("filter {i}: {what}");
                Ok(FilterConfig {
                    tenant: TenantId::new(&f.tenant).map_err(|e| bad(e.to_string()))?,
                    direction: FilterDirection::parse(&f.direction)
                        .ok_or_else(|| bad(format!("unknown direction {:?}", f.direction)))?,
                    object: objects
                        .get(f.object)
                        .cloned()
                        .ok_or_else(|| bad(format!("no object {}", f.object)))?,
                    object_name: f.object_name,
                    section: f.section,
                    weight: f.weight,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let settings = wire
            .settings
            .into_iter()
            .enumerate()
            .map(|(i, s)| {
                let bad = |what: String| format!("setting {i}: {what}");
                Ok(FilterMapSetting {
                    tenant: TenantId::new(&s.tenant).map_err(|e| bad(e.to_string()))?,
                    map: s.map,
                    key: hex::decode(&s.key).map_err(|e| bad(format!("key: {e}")))?,
                    value: hex::decode(&s.value).map_err(|e| bad(format!("value: {e}")))?,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            generation: wire.generation,
            filters,
            set_stored: wire.set_stored,
            settings,
        })
    }
}

/// The declaration of `tenant`'s map `map` (`NAME`, or `OBJECT:NAME` with the object's name
/// as loaded) in `filters`, if exactly one of the tenant's objects declares it (as the data
/// path resolves the name).
fn declaration(filters: &[FilterConfig], tenant: &TenantId, map: &str) -> Option<filter::MapSpec> {
    let (object, name) = match map.rsplit_once(':') {
        Some((o, m)) => (Some(o), m),
        None => (None, map),
    };
    let mut found: Vec<(&Arc<[u8]>, filter::MapSpec)> = Vec::new();
    for f in filters.iter().filter(|f| f.tenant == *tenant) {
        if object.is_some_and(|o| o != f.object_name) {
            continue;
        }
        let Ok(program) = filter::Object::load(&f.object, &f.section) else {
            continue;
        };
        for spec in program.maps().iter().filter(|m| m.name == name) {
            // The programs of one object share its maps.
            if !found
                .iter()
                .any(|(o, m)| **o == f.object && m.name == spec.name)
            {
                found.push((&f.object, spec.clone()));
            }
        }
    }
    match <[_; 1]>::try_from(found) {
        Ok([(_, spec)]) => Some(spec),
        Err(_) => None,
    }
}

/// `settings` after `op` on `tenant`'s map `map` was carried out on the running `filters`:
/// an update keeps the key's new value (replacing an older one of the same key; the oldest
/// setting of the map goes once it holds as many as the map has entries), a delete forgets
/// the key; a dump changes nothing. None when nothing changed (a delete of a key no setting
/// wrote: the programs' own entries are not settings).
pub fn record_setting(
    settings: &[FilterMapSetting],
    filters: &[FilterConfig],
    tenant: &TenantId,
    map: &str,
    op: &FilterMapOp,
) -> Option<Vec<FilterMapSetting>> {
    let same =
        |s: &FilterMapSetting, key: &[u8]| s.tenant == *tenant && s.map == map && s.key == key;
    match op {
        FilterMapOp::Dump => None,
        FilterMapOp::Delete { key } => {
            let kept: Vec<FilterMapSetting> =
                settings.iter().filter(|s| !same(s, key)).cloned().collect();
            (kept.len() != settings.len()).then_some(kept)
        }
        FilterMapOp::Update { key, value, .. } => {
            if settings.iter().any(|s| same(s, key) && s.value == *value) {
                return None;
            }
            let mut next: Vec<FilterMapSetting> =
                settings.iter().filter(|s| !same(s, key)).cloned().collect();
            next.push(FilterMapSetting {
                tenant: tenant.clone(),
                map: map.to_owned(),
                key: key.clone(),
                value: value.clone(),
            });
            let room =
                declaration(filters, tenant, map).map_or(usize::MAX, |d| d.max_entries as usize);
            let of_map = |s: &FilterMapSetting| s.tenant == *tenant && s.map == map;
            let mut over = next
                .iter()
                .filter(|s| of_map(s))
                .count()
                .saturating_sub(room);
            next.retain(|s| {
                if over > 0 && of_map(s) {
                    over -= 1;
                    return false;
                }
                true
            });
            Some(next)
        }
    }
}

/// The settings that stay when the running set goes from `old` to `new`: those of maps
/// declared alike in both (the data path keeps such a map's contents across the change);
/// a map declared differently, or no more, loses its settings with its contents.
pub fn keep_settings(
    settings: &[FilterMapSetting],
    old: &[FilterConfig],
    new: &[FilterConfig],
) -> Vec<FilterMapSetting> {
    let mut verdicts: Vec<(&TenantId, &str, bool)> = Vec::new();
    settings
        .iter()
        .filter(|s| {
            if let Some((_, _, keep)) = verdicts
                .iter()
                .find(|(t, m, _)| **t == s.tenant && *m == s.map)
            {
                return *keep;
            }
            let before = declaration(old, &s.tenant, &s.map);
            let keep = before.is_some() && before == declaration(new, &s.tenant, &s.map);
            verdicts.push((&s.tenant, &s.map, keep));
            keep
        })
        .cloned()
        .collect()
}

/// A change of the running filter set (`protego ctl filter load|unload`), as the control
/// socket receives it: fields are checked by [`change`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterChange {
    /// Runs `section` of `object` on `tenant`'s traffic in `direction`, in place of the program
    /// in that place if there is one.
    Load {
        /// The tenant.
        tenant: String,
        /// `to_cloud` or `from_cloud`.
        direction: String,
        /// The object file's name (for status and errors).
        object_name: String,
        /// The object's bytes.
        object: Vec<u8>,
        /// The program's section (`xdp` when absent).
        section: Option<String>,
        /// Its order among the tenant's filters of that direction (lower first); when absent,
        /// the weight of the program it replaces, else 0.
        weight: Option<u32>,
    },
    /// Stops the tenant's filters in `direction` (both when absent) of `section` (every
    /// section when absent).
    Unload {
        /// The tenant.
        tenant: String,
        /// `to_cloud`, `from_cloud`, or both.
        direction: Option<String>,
        /// The section, or every one.
        section: Option<String>,
    },
}

/// A filter set after a change, and what changed.
#[derive(Debug, Clone)]
pub struct Changed {
    /// The whole new set.
    pub filters: Vec<FilterConfig>,
    /// The filter loaded (its place), if the change was a load.
    pub loaded: Option<FilterConfig>,
    /// Whether the load took the place of a program (`Load`), or the filters removed
    /// (`Unload`).
    pub replaced: Vec<FilterConfig>,
}

/// The set `current` becomes with `change`, checked as the configuration's `[[filter]]`
/// tables are against `tenants` (the running ones); an error says what is wrong and nothing
/// changes.
pub fn change(
    current: &[FilterConfig],
    tenants: &[TenantId],
    change: FilterChange,
) -> Result<Changed, String> {
    let tenant_of = |name: &str| {
        let tenant = TenantId::new(name).map_err(|e| format!("tenant: {e}"))?;
        if tenants.contains(&tenant) {
            Ok(tenant)
        } else {
            Err(format!("tenant {name:?} is not configured on this node"))
        }
    };
    let direction_of = |text: &str| {
        FilterDirection::parse(text).ok_or_else(|| {
            format!("unknown direction {text:?}: expected \"to_cloud\" or \"from_cloud\"")
        })
    };
    match change {
        FilterChange::Load {
            tenant,
            direction,
            object_name,
            object,
            section,
            weight,
        } => {
            let tenant = tenant_of(&tenant)?;
            let direction = direction_of(&direction)?;
            let section = section.unwrap_or_else(|| "xdp".to_owned());
            if weight.is_some_and(|w| i64::from(w) > MAX_WEIGHT) {
                return Err(format!(
                    "weight must be between 0 and {MAX_WEIGHT} (lower runs first)"
                ));
            }
            if object.len() as u64 > MAX_OBJECT_BYTES {
                return Err(format!(
                    "{object_name} has {} bytes; an object may have at most {MAX_OBJECT_BYTES}",
                    object.len()
                ));
            }
            filter::Object::load(&object, &section).map_err(|e| format!("{object_name}: {e}"))?;
            let mut loaded = FilterConfig {
                tenant: tenant.clone(),
                direction,
                object_name,
                object: object.into(),
                weight: weight.unwrap_or(0),
                section,
            };
            let place = |f: &FilterConfig| loaded.same_place(f);
            let replaced: Vec<FilterConfig> =
                current.iter().filter(|f| place(f)).cloned().collect();
            let others = current
                .iter()
                .filter(|f| f.tenant == tenant && f.direction == direction && !place(f))
                .count();
            if others >= MAX_PER_DIRECTION {
                return Err(format!(
                    "tenant {:?} has {MAX_PER_DIRECTION} filters {direction} already, the most \
                     one direction may run",
                    tenant.as_str()
                ));
            }
            if weight.is_none() {
                if let Some(old) = replaced.first() {
                    loaded.weight = old.weight;
                }
            }
            let place = |f: &FilterConfig| loaded.same_place(f);
            // In the place of the program it replaces, else after the others.
            let mut filters = Vec::with_capacity(current.len() + 1);
            let mut put = false;
            for f in current {
                if place(f) {
                    if !put {
                        filters.push(loaded.clone());
                        put = true;
                    }
                } else {
                    filters.push(f.clone());
                }
            }
            if !put {
                filters.push(loaded.clone());
            }
            Ok(Changed {
                filters,
                loaded: Some(loaded),
                replaced,
            })
        }
        FilterChange::Unload {
            tenant,
            direction,
            section,
        } => {
            let tenant = TenantId::new(&tenant).map_err(|e| format!("tenant: {e}"))?;
            let direction = direction.as_deref().map(direction_of).transpose()?;
            let gone = |f: &FilterConfig| {
                f.tenant == tenant
                    && direction.is_none_or(|d| d == f.direction)
                    && section.as_ref().is_none_or(|s| *s == f.section)
            };
            let replaced: Vec<FilterConfig> = current.iter().filter(|f| gone(f)).cloned().collect();
            if replaced.is_empty() {
                let mut what = format!("tenant {:?} runs no filter", tenant.as_str());
                if let Some(d) = direction {
                    what.push_str(&format!(" {d}"));
                }
                if let Some(s) = &section {
                    what.push_str(&format!(" in section {s}"));
                }
                return Err(what);
            }
            Ok(Changed {
                filters: current.iter().filter(|f| !gone(f)).cloned().collect(),
                loaded: None,
                replaced,
            })
        }
    }
}

/// The filters a starting node runs: `config`'s `[[filter]]` tables, or, once a set was
/// changed with `protego ctl filter`, the stored set (a warning says when it differs from the
/// file's), put in `config`; returned: the stored map settings to write into the maps once
/// the filters run. A stored filter whose tenant `config` no longer has fails the start with
/// an error that says so. With `discard` the stored set is deleted first
/// (`--discard-applied`).
pub fn effective(
    config: &mut Config,
    store: &mut dyn Store,
    discard: bool,
) -> Result<Vec<FilterMapSetting>, Error> {
    if discard {
        store.commit(&[Change::DeleteFilters])?;
        return Ok(Vec::new());
    }
    let Some(bytes) = store.filters()? else {
        return Ok(Vec::new());
    };
    let stored_error = |detail: String| Error::Filters {
        store: store.describe(),
        detail,
    };
    let record = FilterRecord::decode(&bytes).map_err(stored_error)?;
    if !record.set_stored {
        // Only map settings, made on the file's filters: those run, as the file has them now
        // (a setting whose map is gone or changed is skipped when it is written).
        if !record.settings.is_empty() {
            tracing::info!(
                settings = record.settings.len(),
                "the tenants' map settings are written again into the file's filters' maps"
            );
        }
        return Ok(record.settings);
    }
    if let Some(f) = record
        .filters
        .iter()
        .find(|f| !config.tenants.contains(&f.tenant))
    {
        return Err(stored_error(format!(
            "tenant {:?} runs {} of {} ({}) and is not configured (configure the tenant again, \
             or start once with --discard-applied to run the file's filters)",
            f.tenant.as_str(),
            f.section,
            f.object_name,
            f.direction
        )));
    }
    if record.filters == config.filters {
        tracing::info!(
            generation = record.generation,
            filters = record.filters.len(),
            "running the stored filters (the same as the file's [[filter]] tables)"
        );
    } else {
        tracing::warn!(generation = record.generation, filters = record.filters.len(),
            config = %config.path.display(),
            "running the filters loaded with `protego ctl filter`, not the file's [[filter]] tables \
             (start with --discard-applied to run the file's)");
    }
    config.filters = record.filters;
    if !record.settings.is_empty() {
        tracing::info!(
            settings = record.settings.len(),
            "the tenants' map settings are written again into their filters' maps"
        );
    }
    Ok(record.settings)
}

/// Writes `settings` into the maps of the filters `datapath` runs (an embedded gateway's
/// start, after its filters): each as an update of its key. One that fails (a map whose
/// per-CPU value no longer fits this node's workers) is logged and skipped. Returns how many
/// were written.
pub fn write_settings(datapath: &dyn datapath::DataPath, settings: &[FilterMapSetting]) -> usize {
    let mut written = 0;
    for s in settings {
        let op = FilterMapOp::Update {
            key: s.key.clone(),
            value: s.value.clone(),
            flags: 0,
        };
        match datapath.filter_map(&s.tenant, &s.map, op) {
            Ok(_) => written += 1,
            Err(e) => {
                tracing::warn!(tenant = %s.tenant, map = %s.map, error = %e, "a stored map setting could not be written again");
            }
        }
    }
    written
}

#[cfg(test)]
mod tests;
