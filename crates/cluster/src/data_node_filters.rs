//! A data node's tenant filters and CPU fairness (issue 18, distributed form): the objects
//! control stages by digest, the filter set that names them, the fairness mode and weights,
//! map operations on this node's own copy of the maps, and what the node reports of them.
//!
//! Objects are kept by SHA-256 from their `stage_filter_object` until a `set_filters` leaves
//! them out (those of the running set stay): control sends each object once per session and
//! a set change sends only the objects the node does not hold yet.

use super::DataApplier;
use crate::link::Answer;
use dataplane::DataPath;
use rpc::convert::ObjectDigest;
use rpc::pb;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tracing::info;

/// The most object bytes a data node holds staged and running (a set of every tenant's
/// filters at the largest objects is far smaller in practice; a bound keeps a confused
/// control node from filling the node's memory).
pub(super) const MAX_STAGED_BYTES: usize = 256 << 20;

/// The objects a data node holds, by digest, and the set it runs.
#[derive(Default)]
pub(super) struct FilterObjects(Mutex<Held>);

/// What [`FilterObjects`] guards.
#[derive(Default)]
pub(super) struct Held {
    /// The staged and running objects, by SHA-256.
    objects: HashMap<ObjectDigest, Arc<[u8]>>,
    /// The set the data plane runs, as control sent it (a new control node sends the same
    /// set again: it is not verified again).
    running: pb::Filters,
}

impl FilterObjects {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // Single inserts and replacements: a panicking holder leaves them consistent.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl DataApplier {
    /// `stage_filter_object`: keeps the object for the next `set_filters`.
    pub(super) fn stage_filter_object(&self, o: pb::FilterObject) -> Result<(), String> {
        let (digest, bytes) = rpc::convert::filter_object_from_pb(o)
            .map_err(|e| e.context("stage_filter_object").to_string())?;
        let objects = &mut self.filter_objects.lock().objects;
        if objects.contains_key(&digest) {
            return Ok(());
        }
        let held: usize = objects.values().map(|o| o.len()).sum();
        if held + bytes.len() > MAX_STAGED_BYTES {
            return Err(format!(
                "stage_filter_object: this node holds {held} bytes of filter objects; \
                 {} more would pass the limit of {MAX_STAGED_BYTES}",
                bytes.len()
            ));
        }
        objects.insert(digest, bytes);
        Ok(())
    }

    /// `set_filters`: the whole set, each program loaded and verified by the data plane
    /// (nothing changes on an error); then only the objects the set names are kept.
    pub(super) fn set_filters(&self, set: &pb::Filters) -> Result<(), String> {
        let mut held = self.filter_objects.lock();
        let filters = rpc::convert::filters_from_pb(set, |d| held.objects.get(d).cloned())
            .map_err(|e| e.context("set_filters").to_string())?;
        let unchanged = held.running == *set;
        if !unchanged {
            self.dp.set_filters(&filters).map_err(|e| e.to_string())?;
            held.running = set.clone();
        }
        let named: Vec<ObjectDigest> = set
            .filters
            .iter()
            .filter_map(|f| f.object_sha256.as_slice().try_into().ok())
            .collect();
        held.objects.retain(|d, _| named.contains(d));
        info!(
            filters = filters.len(),
            objects = held.objects.len(),
            unchanged,
            "tenant filters applied"
        );
        Ok(())
    }

    /// `set_cpu_fairness`: the mode and the tenants' weights.
    pub(super) fn set_cpu_fairness(&self, f: &pb::CpuFairness) -> Result<(), String> {
        let fairness = rpc::convert::cpu_fairness_from_pb(f)
            .map_err(|e| e.context("set_cpu_fairness").to_string())?;
        self.dp
            .set_cpu_fairness(&fairness)
            .map_err(|e| e.to_string())?;
        info!(
            mode = fairness.mode.as_str(),
            tenants = fairness.weights.len(),
            "CPU fairness applied"
        );
        Ok(())
    }

    /// `filter_map`: reads or changes this node's copy of a map; answered with the map and a
    /// dump's entries.
    pub(super) fn filter_map(&self, r: pb::FilterMapRequest) -> Result<Answer, String> {
        let (tenant, map, op) = rpc::convert::filter_map_request_from_pb(r)
            .map_err(|e| e.context("filter_map").to_string())?;
        let answer = self
            .dp
            .filter_map(&tenant, &map, op)
            .map_err(|e| e.to_string())?;
        Ok(Answer::FilterMap(Box::new(
            rpc::convert::filter_map_answer_to_pb(&answer),
        )))
    }

    /// The report's filter counters, maps and tenants' CPU.
    pub(super) fn filter_report(&self, stats: &dataplane::DataplaneStats, report: &mut pb::Report) {
        let filters = self.dp.filter_report(None);
        report.filters = filters
            .programs
            .iter()
            .map(rpc::convert::filter_usage_to_pb)
            .collect();
        report.filter_maps = filters
            .maps
            .iter()
            .map(rpc::convert::filter_map_info_to_pb)
            .collect();
        report.tenants = stats
            .tenants
            .iter()
            .map(rpc::convert::tenant_cpu_to_pb)
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::applier;
    use super::*;
    use std::path::Path;

    /// `crates/filter/tests/filters/drop.c`, compiled; `None`: no clang-14 (not strict).
    fn drop_object() -> Option<Vec<u8>> {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../filter/tests/filters/drop.c");
        let out =
            std::env::temp_dir().join(format!("protego-cluster-drop-{}.o", std::process::id()));
        testreq::bpf::compile(&source, &out, true)
    }

    fn set(digest: &ObjectDigest, tenant: &str) -> pb::Filters {
        pb::Filters {
            filters: vec![pb::Filter {
                tenant: tenant.into(),
                direction: "to_cloud".into(),
                section: "xdp".into(),
                weight: 0,
                object_name: "drop.o".into(),
                object_sha256: digest.to_vec(),
            }],
        }
    }

    /// A staged object runs once a set names it, its maps answer per node, and an object no
    /// set names is dropped; a set naming an object never staged changes nothing.
    #[test]
    fn staged_objects_run_when_a_set_names_them() {
        let Some(object) = drop_object() else {
            return;
        };
        let a = applier();
        let digest = rpc::convert::object_digest(&object);
        let e = a
            .set_filters(&set(&digest, "acme"))
            .expect_err("not staged");
        assert!(e.starts_with("set_filters.filters[0].object_sha256"), "{e}");
        let mut bad = rpc::convert::filter_object_to_pb(&object);
        bad.sha256[0] ^= 1;
        let e = a.stage_filter_object(bad).expect_err("digest");
        assert!(e.starts_with("stage_filter_object.sha256"), "{e}");
        a.stage_filter_object(rpc::convert::filter_object_to_pb(&object))
            .expect("staged");
        a.stage_filter_object(rpc::convert::filter_object_to_pb(b"unused"))
            .expect("staged");
        a.set_filters(&set(&digest, "acme")).expect("runs");
        assert_eq!(a.dp.filter_report(None).programs.len(), 1);
        assert_eq!(
            a.filter_objects.lock().objects.len(),
            1,
            "the unused object is dropped"
        );
        let answer = a
            .filter_map(pb::FilterMapRequest {
                tenant: "acme".into(),
                map: "blocked".into(),
                op: "update".into(),
                key: 0u32.to_le_bytes().to_vec(),
                value: [10, 0, 0, 9].to_vec(),
                flags: 0,
            })
            .expect("updated");
        assert!(
            matches!(answer, Answer::FilterMap(m) if m.map.as_ref().is_some_and(|m| m.name == "blocked"))
        );
        let mut report = pb::Report::default();
        a.filter_report(&a.dp.stats(), &mut report);
        assert_eq!(report.filters.len(), 1);
        assert_eq!(report.filter_maps.len(), 2);
        // An empty set stops them.
        a.set_filters(&pb::Filters::default()).expect("none");
        assert!(a.dp.filter_report(None).programs.is_empty());
        assert!(a.filter_objects.lock().objects.is_empty());
    }

    #[test]
    fn fairness_and_map_requests_are_checked() {
        let a = applier();
        let e = a
            .set_cpu_fairness(&pb::CpuFairness {
                mode: "most".into(),
                weights: Vec::new(),
            })
            .expect_err("mode");
        assert!(e.starts_with("set_cpu_fairness.mode"), "{e}");
        a.set_cpu_fairness(&pb::CpuFairness {
            mode: "off".into(),
            weights: Vec::new(),
        })
        .expect("off");
        let e = a
            .filter_map(pb::FilterMapRequest {
                tenant: "acme".into(),
                map: "blocked".into(),
                op: "dump".into(),
                ..pb::FilterMapRequest::default()
            })
            .expect_err("no filters");
        assert!(e.contains("blocked"), "{e}");
    }
}
