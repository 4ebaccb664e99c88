//! [`Store`] over etcd: commits as one guarded transaction each, reads in pages.

use super::*;

impl Store for EtcdStore {
    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        if changes.is_empty() {
            return Ok(());
        }
        // etcd refuses a transaction that writes a key twice; the last change of each key has
        // the effect of all of them. Each write: the key and its new value (None: delete).
        let mut last: BTreeMap<u64, Option<&Snapshot>> = BTreeMap::new();
        let mut config: Option<Option<&Snapshot>> = None;
        let mut filters: Option<Option<&Snapshot>> = None;
        for change in changes {
            match change {
                Change::PutIkeSa { spi, snapshot } => {
                    last.insert(*spi, Some(snapshot));
                }
                Change::DeleteIkeSa { spi } => {
                    last.insert(*spi, None);
                }
                Change::PutConfig { record } => config = Some(Some(record)),
                Change::DeleteConfig => config = Some(None),
                Change::PutFilters { record } => filters = Some(Some(record)),
                Change::DeleteFilters => filters = Some(None),
            }
        }
        let writes: Vec<(String, Option<&Snapshot>)> = last
            .iter()
            .map(|(&spi, value)| (self.keys.ike_sa(spi), *value))
            .chain(config.map(|value| (self.keys.config.clone(), value)))
            .chain(filters.map(|value| (self.keys.filters.clone(), value)))
            .collect();
        let ops: Vec<TxnOp> = writes
            .iter()
            .map(|(key, value)| match value {
                Some(value) => TxnOp::put(key.clone(), value.to_vec(), None),
                None => TxnOp::delete(key.clone(), None),
            })
            .collect();
        let count = ops.len();
        let bytes: usize = writes.iter().filter_map(|(_, v)| v.map(|v| v.len())).sum();
        let keys: Vec<&str> = writes.iter().map(|(key, _)| key.as_str()).collect();
        // The commit, a re-read of the guarded keys, the commit again, and, if a guard still
        // fails, the read that says why share the timeout.
        let deadline = std::time::Instant::now() + self.timeout;
        let mut reread = false;
        loop {
            let txn = self.txn(&keys, ops.clone());
            let response = self
                .call_until(deadline, |mut client| {
                    let txn = txn.clone();
                    async move { client.txn(txn).await }
                })
                .map_err(|detail| self.write_error(limit_hint(detail, count, bytes)))?;
            if response.succeeded() {
                let revision = response.header().map_or(0, |h| h.revision());
                let mut known = self.revisions();
                for (key, value) in &writes {
                    known.insert(key.clone(), if value.is_some() { revision } else { 0 });
                }
                return Ok(());
            }
            // A key changed since this store last saw it: an earlier commit of ours whose
            // answer was lost was applied after all (or this store never read the key). Learn
            // the keys' revisions and commit once more: these changes are the newest.
            if reread || !self.learn_revisions(&keys, deadline)? {
                break;
            }
            reread = true;
        }
        // A guard failed, so nothing was written: say why.
        if let Some(fence) = &self.fence {
            let key = fence.key.clone();
            let leader = self.call_until(deadline, |mut client| {
                let key = key.clone();
                async move { client.get(key, None).await }
            });
            let still = leader
                .as_ref()
                .ok()
                .and_then(|r| r.kvs().first())
                .is_some_and(|kv| {
                    kv.create_revision() == fence.term.revision()
                        && kv.value_str().ok() == Some(fence.name.as_str())
                });
            if !still {
                return Err(self.write_error(format!(
                    "nothing written: this node ({}) is no longer the leader of term {}",
                    fence.name, fence.term
                )));
            }
        }
        let found = self.read_schema(&self.budget(deadline)).map_err(|detail| {
            self.write_error(format!(
                "nothing written: the schema key {} is no longer {SCHEMA_VERSION}, and reading it \
                 failed: {detail}",
                self.keys.schema
            ))
        })?;
        Err(match schema_version(found.as_deref()) {
            Err(Mismatch::Newer(found)) => self.schema_error(found),
            Ok(()) => self.write_error(format!(
                "nothing written: the keys changed again while committing (is another program \
                 writing under {}?)",
                self.keys.all
            )),
            Err(Mismatch::Missing) => self.write_error(format!(
                "nothing written: the schema key {} is gone (was the prefix deleted?)",
                self.keys.schema
            )),
            Err(Mismatch::Invalid(value)) => self.write_error(format!(
                "nothing written: the schema key {} holds {value:?}",
                self.keys.schema
            )),
        })
    }

    fn ike_sas(&self) -> Result<Vec<(u64, Snapshot)>, StoreError> {
        let mut out: Vec<(u64, Snapshot)> = Vec::new();
        let mut start = self.keys.ike_sas.clone().into_bytes();
        // The revision of the first page, which the others read too.
        let mut revision = 0;
        loop {
            let mut options = GetOptions::new()
                .with_range(self.keys.ike_sas_end.clone())
                .with_limit(PAGE);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let mut page = self
                .call(|client| {
                    let (key, options) = (start.clone(), options.clone());
                    async move {
                        client
                            .kv_client()
                            .max_decoding_message_size(MAX_RESPONSE_BYTES)
                            .get(key, Some(options))
                            .await
                    }
                })
                .map_err(|detail| self.read_error(detail))?;
            if revision == 0 {
                revision = page.header().map_or(0, |h| h.revision());
                if revision <= 0 {
                    return Err(self.read_error("etcd's answer has no revision".into()));
                }
            }
            let more = page.more();
            let entries: Vec<(Vec<u8>, Snapshot)> = {
                let mut known = self.revisions();
                page.take_kvs()
                    .into_iter()
                    .map(|kv| {
                        let revision = kv.mod_revision();
                        let (key, value) = kv.into_key_value();
                        known.insert(String::from_utf8_lossy(&key).into_owned(), revision);
                        (key, Zeroizing::new(value))
                    })
                    .collect()
            };
            let Some((last_key, _)) = entries.last() else {
                break;
            };
            // The next page starts right after this one's last key.
            start.clone_from(last_key);
            start.push(0);
            for (key, snapshot) in entries {
                out.push((self.spi_of(&key)?, snapshot));
            }
            if !more {
                break;
            }
        }
        // etcd returns keys in ascending order, and fixed-width hex sorts as the SPIs do; this
        // only guards the contract (and costs one pass over a sorted list).
        out.sort_by_key(|(spi, _)| *spi);
        Ok(out)
    }

    fn applied_config(&self) -> Result<Option<Snapshot>, StoreError> {
        self.read_one(&self.keys.config)
    }

    fn filters(&self) -> Result<Option<Snapshot>, StoreError> {
        self.read_one(&self.keys.filters)
    }

    fn read_ike_sa(&self, spi: u64) -> Result<Option<Snapshot>, StoreError> {
        let key = self.keys.ike_sa(spi);
        let response = self
            .call(|mut client| {
                let key = key.clone();
                async move { client.get(key, None).await }
            })
            .map_err(|detail| self.read_error(detail))?;
        let kv = response.kvs().first();
        self.revisions()
            .insert(key, kv.map_or(0, etcd_client::KeyValue::mod_revision));
        Ok(kv.map(|kv| Zeroizing::new(kv.value().to_vec())))
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}
