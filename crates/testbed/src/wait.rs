//! Bounded polling: wait until a condition holds or a time limit passes, and
//! report the last observed state on timeout. There are no unbounded waits in
//! the test bed.

use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Default pause between two polls.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The outcome of one poll.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe<T> {
    /// The condition holds; stop waiting with this value.
    Ready(T),
    /// Not yet; the string describes the current state for the timeout message.
    NotYet(String),
}

/// Polls `probe` every [`POLL_INTERVAL`] until it is [`Probe::Ready`], returns an
/// error, or `timeout` passes ([`Error::WaitTimeout`] naming `what` and the last
/// state). The probe runs at least once.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Probe<T>>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe()? {
            Probe::Ready(v) => return Ok(v),
            Probe::NotYet(state) => state,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::WaitTimeout {
                what: what.to_owned(),
                timeout,
                last,
            });
        }
        thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_when_ready() {
        let mut n = 0;
        let v = wait_for("n to reach 3", Duration::from_secs(5), || {
            n += 1;
            Ok(if n >= 3 {
                Probe::Ready(n)
            } else {
                Probe::NotYet(format!("n={n}"))
            })
        })
        .expect("reaches 3");
        assert_eq!(v, 3);
    }

    #[test]
    fn times_out_with_last_state() {
        let err = wait_for::<()>("never", Duration::from_millis(120), || {
            Ok(Probe::NotYet("still no".to_owned()))
        })
        .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("never") && msg.contains("still no"), "{msg}");
    }
}
