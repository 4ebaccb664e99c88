//! Loader for the published test vectors under `crates/crypto/testdata/` (test builds only).
//!
//! File format: `[name]` opens a vector, `field = hex-or-word` lines fill it, `#` lines are
//! comments (each vector names its source in one). `testdata/check.py` recomputes every
//! expected value with Python's hmac module and pyca/cryptography.

/// One named vector: its fields in file order.
pub(crate) struct Vector {
    pub(crate) name: &'static str,
    fields: Vec<(&'static str, &'static str)>,
}

impl Vector {
    /// A field's raw text.
    pub(crate) fn get(&self, field: &str) -> Option<&'static str> {
        self.fields
            .iter()
            .find(|(k, _)| *k == field)
            .map(|(_, v)| *v)
    }

    /// A field's raw text; panics naming the vector if it is missing.
    pub(crate) fn text(&self, field: &str) -> &'static str {
        self.get(field)
            .unwrap_or_else(|| panic!("vector {} has no field {field}", self.name))
    }

    /// A hex field decoded.
    pub(crate) fn hex(&self, field: &str) -> Vec<u8> {
        hex::decode(self.text(field))
            .unwrap_or_else(|e| panic!("vector {} field {field}: {e}", self.name))
    }
}

/// Parses a testdata file.
pub(crate) fn parse(text: &'static str) -> Vec<Vector> {
    let mut out: Vec<Vector> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            out.push(Vector {
                name,
                fields: Vec::new(),
            });
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .expect("testdata line is `field = value`");
        out.last_mut()
            .expect("testdata field before the first [name]")
            .fields
            .push((k.trim(), v.trim()));
    }
    assert!(!out.is_empty(), "testdata file holds no vectors");
    out
}

/// An [`Rng`](crate::Rng) that replays fixed bytes (a vector's private value), then panics.
pub(crate) struct ReplayRng {
    bytes: Vec<u8>,
    pos: usize,
}

impl ReplayRng {
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        Self { bytes, pos: 0 }
    }

    /// True once every byte was consumed.
    pub(crate) fn exhausted(&self) -> bool {
        self.pos == self.bytes.len()
    }
}

impl crate::Rng for ReplayRng {
    fn fill(&mut self, dest: &mut [u8]) {
        let end = self.pos + dest.len();
        assert!(end <= self.bytes.len(), "ReplayRng ran out of bytes");
        dest.copy_from_slice(&self.bytes[self.pos..end]);
        self.pos = end;
    }
}
