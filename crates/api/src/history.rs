//! The tunnels' traffic over the last hour, for the console's charts
//! (`GET /api/v1/tunnels/{name}/traffic`): every [`INTERVAL`] the listener's thread reads the
//! tunnels' traffic counters and keeps, per tunnel, the rate in and out since the last
//! sample. A sample is 16 bytes and an hour holds [`SAMPLES`] of them: about 3 KB per tunnel,
//! 30 MB at 10 000 tunnels.

use crate::Api;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Time between samples.
pub(crate) const INTERVAL: Duration = Duration::from_secs(20);
/// Samples kept per tunnel: one hour.
const SAMPLES: usize = 180;

/// One interval's rates.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Sample {
    /// The end of the interval, Unix seconds.
    pub(crate) t: u64,
    /// Inner bits per second decrypted (from the peer).
    pub(crate) in_bps: f32,
    /// Inner bits per second encrypted (to the peer).
    pub(crate) out_bps: f32,
}

#[derive(Debug, Default)]
struct Tunnel {
    /// The byte counters at the last sample (in, out) and when.
    last: Option<(u64, u64, u64)>,
    samples: VecDeque<Sample>,
}

/// Every tunnel's samples, by name.
#[derive(Debug, Default)]
pub(crate) struct History {
    tunnels: Mutex<HashMap<String, Tunnel>>,
}

impl History {
    /// Records the counters of each tunnel at `now` (Unix seconds); forgets tunnels that are
    /// no longer configured. A counter that went down (the tunnel was set up again) starts a
    /// new series.
    pub(crate) fn record<'a>(&self, now: u64, tunnels: impl Iterator<Item = (&'a str, u64, u64)>) {
        let mut all = self.tunnels.lock().unwrap_or_else(PoisonError::into_inner);
        let mut seen = std::collections::HashSet::new();
        for (name, bytes_in, bytes_out) in tunnels {
            seen.insert(name);
            let t = all.entry(name.to_owned()).or_default();
            if let Some((t0, in0, out0)) = t.last {
                if now > t0 && bytes_in >= in0 && bytes_out >= out0 {
                    let secs = (now - t0) as f32;
                    if t.samples.len() == SAMPLES {
                        t.samples.pop_front();
                    }
                    t.samples.push_back(Sample {
                        t: now,
                        in_bps: (bytes_in - in0) as f32 * 8.0 / secs,
                        out_bps: (bytes_out - out0) as f32 * 8.0 / secs,
                    });
                } else if bytes_in < in0 || bytes_out < out0 {
                    t.samples.clear();
                }
            }
            t.last = Some((now, bytes_in, bytes_out));
        }
        all.retain(|name, _| seen.contains(name.as_str()));
    }

    /// A tunnel's samples, oldest first.
    pub(crate) fn samples(&self, tunnel: &str) -> Vec<Sample> {
        let all = self.tunnels.lock().unwrap_or_else(PoisonError::into_inner);
        all.get(tunnel)
            .map(|t| t.samples.iter().copied().collect())
            .unwrap_or_default()
    }
}

/// Unix seconds now.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Samples every [`INTERVAL`] until `stopped`.
pub(crate) async fn sample(api: Arc<Api>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            _ = tick.tick() => {}
        }
        let api = Arc::clone(&api);
        let done = tokio::task::spawn_blocking(move || {
            // The data path's counters only, not a whole status report.
            if let Ok(tunnels) = api.backend.tunnel_traffic() {
                api.history.record(
                    unix_now(),
                    (tunnels.iter()).map(|(name, _, t)| (name.as_str(), t.bytes_in, t.bytes_out)),
                );
            }
        })
        .await;
        if let Err(e) = done {
            tracing::warn!(error = %e, "traffic sample failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::History;

    #[test]
    fn rates_are_per_interval_and_a_reset_counter_starts_over() {
        let h = History::default();
        h.record(100, [("a", 0, 0), ("b", 5, 5)].into_iter());
        h.record(120, [("a", 2_500, 5_000), ("b", 5, 5)].into_iter());
        let a = h.samples("a");
        assert_eq!(a.len(), 1);
        assert_eq!((a[0].t, a[0].in_bps, a[0].out_bps), (120, 1000.0, 2000.0));
        // "a" set up again: its counters restart.
        h.record(140, [("a", 10, 10), ("b", 5, 5)].into_iter());
        assert!(h.samples("a").is_empty());
        h.record(160, [("a", 20, 10)].into_iter());
        assert_eq!(h.samples("a")[0].in_bps, 4.0);
        // "b" is no longer configured.
        assert!(h.samples("b").is_empty());
        for i in 0..400 {
            h.record(200 + i * 20, [("a", 20 + i, 10)].into_iter());
        }
        assert_eq!(h.samples("a").len(), super::SAMPLES, "one hour kept");
    }
}
