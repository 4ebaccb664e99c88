//! The shell's side of customer attachments (issue 16, distributed form): the configured
//! attachments handed to the core with their VNets' VNIs, and the operator's moves of one.

use super::{AttachmentMeta, Cluster, ClusterError};
use rpc::pb;
use std::collections::BTreeMap;
use std::time::Instant;

/// The attachments as the core takes them: each with its VNet's VNI in `config`.
pub(super) fn attachment_metas(
    attachments: &[(datapath::AttachmentConfig, String)],
    config: &pb::DataConfig,
) -> Vec<AttachmentMeta> {
    attachments
        .iter()
        .map(|(a, steer)| AttachmentMeta {
            config: a.clone(),
            steer: steer.clone(),
            vni: config
                .vnets
                .iter()
                .find(|v| v.tenant == a.tenant.as_str() && v.name == a.vnet)
                .map(|v| v.vni),
        })
        .collect()
}

impl Cluster {
    /// Replaces the customer attachments on steer nodes' ports (`steers`: each one's steer
    /// node by attachment name; an attachment without one is left out): every live data node
    /// gets them, the steer nodes their steering.
    pub fn set_attachments(
        &self,
        attachments: &[datapath::AttachmentConfig],
        steers: &BTreeMap<String, String>,
    ) {
        let list: Vec<(datapath::AttachmentConfig, String)> = attachments
            .iter()
            .filter_map(|a| Some((a.clone(), steers.get(&a.name)?.clone())))
            .collect();
        let metas = attachment_metas(&list, &self.data_config());
        *self.attachments.lock().unwrap_or_else(|e| e.into_inner()) = list;
        let mut sh = self.state();
        sh.core.handle_attachments(metas, Instant::now());
        let q = self.carry(&mut sh, None);
        drop(sh);
        self.finish(q);
    }

    /// True if an attachment is called `name` (`protego ctl migrate` moves it rather than a
    /// tunnel).
    pub fn is_attachment(&self, name: &str) -> bool {
        self.state().core.attachment_by_name(name).is_some()
    }

    /// The attachments data node `name` serves.
    pub fn attachments_served_by(&self, name: &str) -> Vec<String> {
        let sh = self.state();
        let Some(id) = sh.core.known_id(name) else {
            return Vec::new();
        };
        sh.core
            .attachments()
            .values()
            .filter(|a| a.node == Some(id))
            .map(|a| a.meta.config.name.clone())
            .collect()
    }

    /// Moves attachment `name` to data node `to` (`protego ctl migrate`): the steer nodes
    /// steer its CE's frames and its routes' VXLAN to `to`, and have all answered when this
    /// returns (a steer node that did not gets its whole tables again; until then it sends
    /// to the old node, which still serves the attachment: nothing is lost either way).
    /// Returns the node's id.
    pub fn migrate_attachment(&self, name: &str, to: &str) -> Result<u32, ClusterError> {
        let mut sh = self.state();
        // Whether `to` confirmed holding the attachments.
        Self::poll_acks(&mut sh);
        let (_, node) = sh.core.handle_migrate_attachment(name, to)?;
        let q = self.carry(&mut sh, None);
        drop(sh);
        if !self.finish(q) {
            return Err(ClusterError::NoControl);
        }
        Ok(node)
    }
}
