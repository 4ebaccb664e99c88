//! Tenant filters and CPU fairness in the distributed form (issue 18): the objects a data
//! node stages by digest, the filter set naming them, the fairness mode and weights, a map
//! operation and its answer, and what a data node reports of its filters and tenants.
//!
//! A filter set travels as one [`pb::FilterObject`] per distinct object (at most
//! [`MAX_FILTER_OBJECT`] bytes each, so no message grows with the number of tenants) and one
//! [`pb::Filters`] naming them by SHA-256 ([`filters_to_pb`], [`filters_from_pb`]).

use super::*;
use datapath::{
    CpuFairness, CpuFairnessConfig, FilterConfig, FilterCounters, FilterDirection, FilterMapAnswer,
    FilterMapOp, FilterMapReport, FilterProgramReport, TenantStats,
};
use std::collections::HashMap;
use std::sync::Arc;

/// The largest filter object a node takes (the configuration's limit).
pub const MAX_FILTER_OBJECT: usize = 1 << 20;

/// An object's SHA-256: how a filter set names it.
pub type ObjectDigest = [u8; 32];

/// A set's distinct objects, each with its digest, in the order the set first names them.
pub type FilterObjects = Vec<(ObjectDigest, Arc<[u8]>)>;

/// SHA-256 of `object` (aws-lc-rs, the workspace's cryptographic provider).
pub fn object_digest(object: &[u8]) -> ObjectDigest {
    let d = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, object);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// The staging directive of one object.
pub fn filter_object_to_pb(object: &[u8]) -> pb::FilterObject {
    pb::FilterObject {
        sha256: object_digest(object).to_vec(),
        object: object.to_vec(),
    }
}

/// Checks a staged object: at most [`MAX_FILTER_OBJECT`] bytes, and `sha256` is its digest.
/// Returns the digest and the bytes.
pub fn filter_object_from_pb(o: pb::FilterObject) -> Result<(ObjectDigest, Arc<[u8]>)> {
    if o.object.len() > MAX_FILTER_OBJECT {
        return err(
            "object",
            format!(
                "{} bytes; an object may have at most {MAX_FILTER_OBJECT}",
                o.object.len()
            ),
        );
    }
    let digest = object_digest(&o.object);
    if o.sha256 != digest {
        return err("sha256", "not the SHA-256 of the object");
    }
    Ok((digest, o.object.into()))
}

/// A filter set as the protocol writes it, and its distinct objects (each once, in the order
/// the set first names them) to stage before it.
pub fn filters_to_pb(filters: &[FilterConfig]) -> (FilterObjects, pb::Filters) {
    let mut objects: FilterObjects = Vec::new();
    let mut known: HashMap<*const u8, ObjectDigest> = HashMap::new();
    let filters = filters
        .iter()
        .map(|f| {
            // Filters of one object share its bytes: hash them once.
            let digest = *known
                .entry(f.object.as_ptr())
                .or_insert_with(|| object_digest(&f.object));
            if !objects.iter().any(|(d, _)| *d == digest) {
                objects.push((digest, Arc::clone(&f.object)));
            }
            pb::Filter {
                tenant: f.tenant.as_str().to_owned(),
                direction: f.direction.as_str().to_owned(),
                section: f.section.clone(),
                weight: f.weight,
                object_name: f.object_name.clone(),
                object_sha256: digest.to_vec(),
            }
        })
        .collect();
    (objects, pb::Filters { filters })
}

/// Checks a filter set; `object` finds a staged object by digest (`None`: not staged).
pub fn filters_from_pb(
    set: &pb::Filters,
    object: impl Fn(&ObjectDigest) -> Option<Arc<[u8]>>,
) -> Result<Vec<FilterConfig>> {
    each("filters", &set.filters, |f| {
        let digest: ObjectDigest = f
            .object_sha256
            .as_slice()
            .try_into()
            .or_else(|_| err("object_sha256", "not a SHA-256 (32 bytes)"))?;
        let bytes = object(&digest).ok_or_else(|| {
            ConvertError::new(
                "object_sha256",
                format!("no object {} was staged", hex_of(&digest[..8])),
            )
        })?;
        Ok(FilterConfig {
            tenant: tenant_from_pb("tenant", &f.tenant)?,
            direction: direction_from_pb("direction", &f.direction)?,
            object_name: name_from_pb("object_name", &f.object_name)?,
            object: bytes,
            section: name_from_pb("section", &f.section)?,
            weight: f.weight,
        })
    })
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn direction_from_pb(field: &str, text: &str) -> Result<FilterDirection> {
    FilterDirection::parse(text).ok_or_else(|| {
        ConvertError::new(
            field,
            format!("{text:?} is not \"to_cloud\" or \"from_cloud\""),
        )
    })
}

/// The fairness mode and weights as the protocol writes them.
pub fn cpu_fairness_to_pb(f: &CpuFairnessConfig) -> pb::CpuFairness {
    pb::CpuFairness {
        mode: f.mode.as_str().to_owned(),
        weights: f
            .weights
            .iter()
            .map(|(t, w)| pb::TenantWeight {
                tenant: t.as_str().to_owned(),
                weight: u32::from(*w),
            })
            .collect(),
    }
}

/// Checks the fairness mode and weights (each 1..=65535).
pub fn cpu_fairness_from_pb(f: &pb::CpuFairness) -> Result<CpuFairnessConfig> {
    let mode = [CpuFairness::Off, CpuFairness::Account, CpuFairness::Enforce]
        .into_iter()
        .find(|m| m.as_str() == f.mode)
        .ok_or_else(|| {
            ConvertError::new(
                "mode",
                format!("{:?} is not \"off\", \"account\" or \"enforce\"", f.mode),
            )
        })?;
    let weights = each("weights", &f.weights, |w| {
        let weight = u16::try_from(w.weight)
            .ok()
            .filter(|w| *w >= 1)
            .ok_or_else(|| {
                ConvertError::new("weight", format!("{} is not in 1..=65535", w.weight))
            })?;
        Ok((tenant_from_pb("tenant", &w.tenant)?, weight))
    })?;
    Ok(CpuFairnessConfig { mode, weights })
}

/// A map operation on `tenant`'s map `map` as the protocol writes it.
pub fn filter_map_request_to_pb(
    tenant: &TenantId,
    map: &str,
    op: &FilterMapOp,
) -> pb::FilterMapRequest {
    let (name, key, value, flags) = match op {
        FilterMapOp::Dump => ("dump", Vec::new(), Vec::new(), 0),
        FilterMapOp::Update { key, value, flags } => ("update", key.clone(), value.clone(), *flags),
        FilterMapOp::Delete { key } => ("delete", key.clone(), Vec::new(), 0),
    };
    pb::FilterMapRequest {
        tenant: tenant.as_str().to_owned(),
        map: map.to_owned(),
        op: name.to_owned(),
        key,
        value,
        flags,
    }
}

/// Checks a map operation: the tenant, the map's name, and the operation (the map itself
/// checks the key's and value's sizes and the flags).
pub fn filter_map_request_from_pb(
    r: pb::FilterMapRequest,
) -> Result<(TenantId, String, FilterMapOp)> {
    let tenant = tenant_from_pb("tenant", &r.tenant)?;
    let map = name_from_pb("map", &r.map)?;
    let op = match r.op.as_str() {
        "dump" => FilterMapOp::Dump,
        "update" => FilterMapOp::Update {
            key: r.key,
            value: r.value,
            flags: r.flags,
        },
        "delete" => FilterMapOp::Delete { key: r.key },
        other => {
            return err(
                "op",
                format!("{other:?} is not \"dump\", \"update\" or \"delete\""),
            )
        }
    };
    Ok((tenant, map, op))
}

/// A map's description as the protocol writes it.
pub fn filter_map_info_to_pb(m: &FilterMapReport) -> pb::FilterMapInfo {
    pb::FilterMapInfo {
        tenant: m.tenant.as_str().to_owned(),
        name: m.name.clone(),
        object_name: m.object_name.clone(),
        kind: m.kind.clone(),
        key_size: m.key_size,
        value_size: m.value_size,
        max_entries: m.max_entries,
        entries: m.entries as u64,
        copies: u32::try_from(m.copies).unwrap_or(u32::MAX),
    }
}

/// Checks a map's description.
pub fn filter_map_info_from_pb(m: &pb::FilterMapInfo) -> Result<FilterMapReport> {
    Ok(FilterMapReport {
        tenant: tenant_from_pb("tenant", &m.tenant)?,
        name: name_from_pb("name", &m.name)?,
        object_name: m.object_name.clone(),
        kind: name_from_pb("kind", &m.kind)?,
        key_size: m.key_size,
        value_size: m.value_size,
        max_entries: m.max_entries,
        entries: usize::try_from(m.entries).unwrap_or(usize::MAX),
        copies: m.copies as usize,
    })
}

/// A map operation's answer as the protocol writes it.
pub fn filter_map_answer_to_pb(a: &FilterMapAnswer) -> pb::FilterMapResult {
    pb::FilterMapResult {
        map: Some(filter_map_info_to_pb(&a.map)),
        entries: a
            .entries
            .iter()
            .map(|(key, value)| pb::FilterMapEntry {
                key: key.clone(),
                value: value.clone(),
            })
            .collect(),
    }
}

/// Checks a map operation's answer (its entries are this one node's).
pub fn filter_map_answer_from_pb(a: pb::FilterMapResult) -> Result<FilterMapAnswer> {
    let map = a
        .map
        .as_ref()
        .ok_or_else(|| ConvertError::new("map", "missing"))
        .and_then(|m| filter_map_info_from_pb(m).map_err(|e| e.context("map")))?;
    Ok(FilterMapAnswer {
        map,
        entries: a.entries.into_iter().map(|e| (e.key, e.value)).collect(),
        nodes: Vec::new(),
    })
}

/// One running filter's counters as a data node reports them.
pub fn filter_usage_to_pb(p: &FilterProgramReport) -> pb::FilterUsage {
    let c = &p.counters;
    pb::FilterUsage {
        tenant: p.tenant.as_str().to_owned(),
        direction: p.direction.as_str().to_owned(),
        section: p.section.clone(),
        object_name: p.object_name.clone(),
        weight: p.weight,
        instructions: u32::try_from(p.instructions).unwrap_or(u32::MAX),
        passed: c.passed,
        dropped: c.dropped,
        tx: c.tx,
        aborted: c.aborted,
        insn_limit: c.insn_limit,
        metered_insns: c.metered_insns,
        cpu_ns: c.cpu_ns,
    }
}

/// Checks a reported filter's counters.
pub fn filter_usage_from_pb(u: &pb::FilterUsage) -> Result<FilterProgramReport> {
    Ok(FilterProgramReport {
        tenant: tenant_from_pb("tenant", &u.tenant)?,
        direction: direction_from_pb("direction", &u.direction)?,
        section: name_from_pb("section", &u.section)?,
        object_name: u.object_name.clone(),
        weight: u.weight,
        instructions: u.instructions as usize,
        counters: FilterCounters {
            passed: u.passed,
            dropped: u.dropped,
            tx: u.tx,
            aborted: u.aborted,
            insn_limit: u.insn_limit,
            metered_insns: u.metered_insns,
            cpu_ns: u.cpu_ns,
        },
    })
}

/// A tenant's CPU charge as a data node reports it.
pub fn tenant_cpu_to_pb(t: &TenantStats) -> pb::TenantCpu {
    pb::TenantCpu {
        tenant: t.tenant.as_str().to_owned(),
        cpu_weight: u32::from(t.cpu_weight),
        cpu_ns: t.cpu_ns,
        packets: t.packets,
        fair_drops: t.fair_drops,
        tokens_ns: t.tokens_ns,
        recent_cpu_ns: t.recent_cpu_ns,
    }
}

/// Checks a reported CPU charge.
pub fn tenant_cpu_from_pb(t: &pb::TenantCpu) -> Result<TenantStats> {
    Ok(TenantStats {
        tenant: tenant_from_pb("tenant", &t.tenant)?,
        cpu_weight: u16::try_from(t.cpu_weight).or_else(|_| {
            err(
                "cpu_weight",
                format!("{} is not in 1..=65535", t.cpu_weight),
            )
        })?,
        cpu_ns: t.cpu_ns,
        packets: t.packets,
        fair_drops: t.fair_drops,
        tokens_ns: t.tokens_ns,
        recent_cpu_ns: t.recent_cpu_ns,
    })
}

#[cfg(test)]
#[path = "filters_tests.rs"]
mod tests;
