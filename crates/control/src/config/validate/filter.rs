//! Validation of `[[filter]]` tables (issue 18): a tenant's eBPF program, read from its object
//! file, loaded and verified here as the data path would, so that `protego check` and a start
//! refuse a program the gateway would not run, naming the instruction and why.

use super::Validator;
use crate::config::raw::RawFilter;
use crate::error::ConfigError;
use datapath::{FilterConfig, FilterDirection};
use ids::TenantId;
use std::sync::Arc;
use toml::Spanned;

/// The largest object file accepted (the distributed form stores and ships it whole).
pub const MAX_OBJECT_BYTES: u64 = 1 << 20;

/// The most filters a tenant may run in one direction.
pub const MAX_PER_DIRECTION: usize = 16;

/// The largest `weight`.
pub const MAX_WEIGHT: i64 = 1000;

/// A validated filter with the line it was defined on (for duplicate messages).
pub(super) struct CheckedFilter {
    pub(super) config: FilterConfig,
    pub(super) line: usize,
}

impl Validator<'_, '_> {
    /// Validates one `[[filter]]` against the tenants and the filters before it.
    pub(super) fn filter(
        &self,
        f: &Spanned<RawFilter>,
        tenants: &[(TenantId, usize)],
        done: &[CheckedFilter],
    ) -> Result<CheckedFilter, Box<ConfigError>> {
        let line = self.line(&f.span());
        let f = f.get_ref();
        let s = "[[filter]]";
        let tenant = self.tenant_ref(&f.tenant, tenants, s)?;
        let direction = FilterDirection::parse(f.direction.get_ref()).ok_or_else(|| {
            self.err(
                f.direction.span(),
                s,
                "direction",
                format!(
                    "unknown direction {:?}: expected \"to_cloud\" or \"from_cloud\"",
                    f.direction.get_ref()
                ),
            )
        })?;
        let section = f
            .section
            .as_ref()
            .map_or_else(|| "xdp".to_owned(), |s| s.get_ref().clone());
        let weight = match &f.weight {
            None => 0,
            Some(w) if (0..=MAX_WEIGHT).contains(w.get_ref()) => *w.get_ref() as u32,
            Some(w) => {
                return Err(self.err(
                    w.span(),
                    s,
                    "weight",
                    format!("must be between 0 and {MAX_WEIGHT} (lower runs first)"),
                ))
            }
        };
        let object_name = f.object.get_ref().clone();
        let path = self.relative_path(&object_name);
        let object_err = |message: String| self.err(f.object.span(), s, "object", message);
        let size = std::fs::metadata(&path)
            .map_err(|e| object_err(format!("cannot read {}: {e}", path.display())))?
            .len();
        if size > MAX_OBJECT_BYTES {
            return Err(object_err(format!(
                "{} has {size} bytes; an object may have at most {MAX_OBJECT_BYTES}",
                path.display()
            )));
        }
        let bytes = std::fs::read(&path)
            .map_err(|e| object_err(format!("cannot read {}: {e}", path.display())))?;
        if let Err(e) = filter::Object::load(&bytes, &section) {
            let message = format!("{object_name}: {e}");
            return Err(match (&e, &f.section) {
                (
                    filter::LoadError::BadSectionName { .. }
                    | filter::LoadError::NoProgram { .. }
                    | filter::LoadError::Ambiguous { .. }
                    | filter::LoadError::NotXdp { .. },
                    Some(sec),
                ) => self.err(sec.span(), s, "section", message),
                _ => object_err(message),
            });
        }
        let object: Arc<[u8]> = bytes.into();
        if let Some(other) = done.iter().find(|o| {
            o.config.tenant == tenant
                && o.config.direction == direction
                && o.config.section == section
                && o.config.object == object
        }) {
            return Err(object_err(format!(
                "tenant {tenant:?} already runs {section} of this object {direction} (line {})",
                other.line
            )));
        }
        let same = done
            .iter()
            .filter(|o| o.config.tenant == tenant && o.config.direction == direction)
            .count();
        if same >= MAX_PER_DIRECTION {
            return Err(object_err(format!(
                "tenant {tenant:?} has {MAX_PER_DIRECTION} filters {direction} already, the most \
                 one direction may run"
            )));
        }
        let config = FilterConfig {
            tenant,
            direction,
            object_name,
            object,
            section,
            weight,
        };
        // A filter's place is its file's name, not its path (`ctl filter load` of a new
        // version replaces the program of that name): two files of one name would be one place.
        if let Some(other) = done.iter().find(|o| o.config.same_place(&config)) {
            return Err(object_err(format!(
                "tenant {:?} already runs {} of a file named {} {} (line {}); two filters of one \
                 tenant, direction and section need objects of different file names",
                config.tenant,
                config.section,
                config.file_name(),
                config.direction,
                other.line
            )));
        }
        Ok(CheckedFilter { config, line })
    }
}
