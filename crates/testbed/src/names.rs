//! Per-run unique names for namespaces, interfaces and temporary directories.
//!
//! Every name starts with a 9-character run tag: `pt`, the owning process id in
//! base 36 (5 digits) and a per-process counter in base 36 (2 digits), e.g.
//! `pt02n9c07`. Network namespaces are `<tag>-<role>` (`pt02n9c07-gw`), interfaces
//! `<tag><suffix>` with a suffix of at most 6 characters, so that they fit the
//! kernel's `IFNAMSIZ` (15 characters plus the terminating NUL). The sweeper
//! ([`crate::sweep()`]) reads the pid back out of the tag to find leftovers of
//! processes that died without cleaning up.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{Error, Result};

/// Prefix of every name the test bed creates.
pub const PREFIX: &str = "pt";
/// Length of a run tag (`pt` + 5 pid digits + 2 counter digits).
pub const TAG_LEN: usize = 9;
/// Longest interface name the kernel accepts (`IFNAMSIZ - 1`).
pub const IFNAME_MAX: usize = 15;
/// Longest interface suffix after the run tag.
pub const IFSUFFIX_MAX: usize = IFNAME_MAX - TAG_LEN;
/// Longest role part of a namespace name.
pub const ROLE_MAX: usize = 40;

const PID_DIGITS: usize = 5;
const CTR_DIGITS: usize = 2;
const CTR_MODULUS: u32 = 36 * 36;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Identity of one test-bed instance: owning pid plus a per-process counter.
///
/// Two test beds in the same process (parallel test threads) get different
/// counters; test beds in different processes differ by pid. The counter wraps
/// after 1296 instances, which only collides if that many are alive at once.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct RunId {
    pid: u32,
    counter: u32,
}

impl RunId {
    /// Allocates the next run id of this process.
    pub fn next() -> RunId {
        let counter = COUNTER.fetch_add(1, Ordering::Relaxed) % CTR_MODULUS;
        RunId {
            pid: std::process::id(),
            counter,
        }
    }

    /// The owning process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The 9-character tag every name of this run starts with.
    pub fn tag(&self) -> String {
        let mut s = String::with_capacity(TAG_LEN);
        s.push_str(PREFIX);
        push_base36(&mut s, self.pid, PID_DIGITS);
        push_base36(&mut s, self.counter, CTR_DIGITS);
        s
    }

    /// Name of a network namespace of this run playing `role` (`[a-z0-9-]`, at
    /// most [`ROLE_MAX`] characters).
    pub fn netns_name(&self, role: &str) -> Result<String> {
        let name = format!("{}-{role}", self.tag());
        if role.is_empty() || role.len() > ROLE_MAX {
            return Err(Error::InvalidName {
                name,
                reason: "namespace role must be 1..=40 characters",
            });
        }
        if !role
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(Error::InvalidName {
                name,
                reason: "namespace role may only contain a-z, 0-9 and '-'",
            });
        }
        Ok(name)
    }

    /// Name of an interface of this run: the tag plus `suffix` (`[a-z0-9]`, at
    /// most [`IFSUFFIX_MAX`] characters), at most 15 characters in total.
    pub fn ifname(&self, suffix: &str) -> Result<String> {
        let name = format!("{}{suffix}", self.tag());
        if suffix.is_empty() || suffix.len() > IFSUFFIX_MAX {
            return Err(Error::InvalidName {
                name,
                reason: "interface suffix must be 1..=6 characters (IFNAMSIZ)",
            });
        }
        if !suffix
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(Error::InvalidName {
                name,
                reason: "interface suffix may only contain a-z and 0-9",
            });
        }
        Ok(name)
    }

    /// Interface name `<tag><kind><n in base 36>` (e.g. `pt02n9c07v1a`); fails
    /// when `n` needs more than 5 base-36 digits.
    pub fn ifname_numbered(&self, kind: char, n: u32) -> Result<String> {
        let mut digits = String::new();
        let mut width = 1;
        while width < IFSUFFIX_MAX - 1 && u64::from(n) >= 36u64.pow(width as u32) {
            width += 1;
        }
        push_base36(&mut digits, n, width);
        if u64::from(n) >= 36u64.pow(width as u32) {
            return Err(Error::InvalidName {
                name: format!("{}{kind}{n}", self.tag()),
                reason: "interface counter exhausted",
            });
        }
        self.ifname(&format!("{kind}{digits}"))
    }

    /// Reads the run id back from any name this module produced (namespace,
    /// interface or temp-dir name). Returns `None` for foreign names.
    pub fn parse(name: &str) -> Option<RunId> {
        let tag = name.get(..TAG_LEN)?;
        let digits = tag.strip_prefix(PREFIX)?;
        if !digits
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return None;
        }
        let pid = u32::from_str_radix(&digits[..PID_DIGITS], 36).ok()?;
        let counter = u32::from_str_radix(&digits[PID_DIGITS..], 36).ok()?;
        // Only names this module can produce: a bare tag, `<tag>-<role>` or an
        // interface `<tag><suffix>` that fits IFNAMSIZ.
        let rest = &name[TAG_LEN..];
        let ok = rest.is_empty()
            || rest.starts_with('-')
            || (name.len() <= IFNAME_MAX
                && rest
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        if !ok || pid == 0 {
            return None;
        }
        Some(RunId { pid, counter })
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.tag())
    }
}

impl fmt::Debug for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "RunId({} pid={} n={})",
            self.tag(),
            self.pid,
            self.counter
        )
    }
}

fn push_base36(out: &mut String, mut value: u32, digits: usize) {
    const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut buf = vec![b'0'; digits];
    for slot in buf.iter_mut().rev() {
        *slot = ALPHABET[(value % 36) as usize];
        value /= 36;
    }
    out.extend(buf.iter().map(|&b| b as char));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_fit_ifnamsiz() {
        let id = RunId {
            pid: 4_194_304,
            counter: 1295,
        };
        assert_eq!(id.tag().len(), TAG_LEN);
        let ifname = id.ifname("abcdef").expect("6-char suffix fits");
        assert_eq!(ifname.len(), IFNAME_MAX);
        assert_eq!(RunId::parse(&ifname), Some(id));
        let ns = id.netns_name("gw-1").expect("valid role");
        assert_eq!(RunId::parse(&ns), Some(id));
        assert_eq!(RunId::parse(&id.tag()), Some(id));
    }

    #[test]
    fn numbered_interfaces() {
        let id = RunId { pid: 1, counter: 0 };
        assert_eq!(id.ifname_numbered('v', 0).expect("fits"), "pt0000100v0");
        assert_eq!(id.ifname_numbered('v', 36).expect("fits"), "pt0000100v10");
        assert_eq!(
            id.ifname_numbered('v', 36u32.pow(5) - 1)
                .expect("fits")
                .len(),
            IFNAME_MAX
        );
        assert!(id.ifname_numbered('v', 36u32.pow(5)).is_err());
    }

    #[test]
    fn rejects_bad_names() {
        let id = RunId::next();
        assert!(id.ifname("abcdefg").is_err());
        assert!(id.ifname("A").is_err());
        assert!(id.ifname("").is_err());
        assert!(id.netns_name("Gw").is_err());
        assert!(id.netns_name("").is_err());
    }

    #[test]
    fn foreign_names_are_not_ours() {
        for name in [
            "eth0",
            "ptp0",
            "pt",
            "ptABCDEFG",
            "pt0000000",
            "pt00001zzlongername",
            "pt0000a01_x",
        ] {
            assert_eq!(RunId::parse(name), None, "{name}");
        }
    }

    #[test]
    fn counters_differ_within_a_process() {
        let a = RunId::next();
        let b = RunId::next();
        assert_ne!(a.tag(), b.tag());
        assert_eq!(a.pid(), std::process::id());
    }
}
