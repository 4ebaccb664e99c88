//! Timers of an IKE SA as a small array indexed by an enum (the quinn-proto `timer.rs`
//! pattern), plus the two timers each CHILD_SA carries.

use std::time::Instant;

/// An IKE SA timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Retransmit the outstanding request, or give up (RFC 7296 §2.1).
    Retransmit = 0,
    /// Check liveness (RFC 7296 §2.4) when nothing was received for `dpd_delay`.
    Dpd = 1,
    /// Rekey the IKE SA (RFC 7296 §2.18).
    IkeRekey = 2,
    /// Send a NAT keepalive (RFC 3948 §4).
    NatKeepalive = 3,
    /// Drop a half-open SA that never completed IKE_AUTH.
    HalfOpenExpiry = 4,
    /// Destroy a rekeyed or redundant IKE SA whose DELETE never came.
    DeleteTimeout = 5,
    /// Retry an exchange that was refused with TEMPORARY_FAILURE (RFC 7296 §2.25).
    TaskRetry = 6,
    /// Hard lifetime (swanctl `over_time` after the rekey time): an IKE SA that could not be
    /// rekeyed by then is deleted.
    IkeExpire = 7,
}

impl Timer {
    /// Every timer, for iteration.
    pub(crate) const ALL: [Timer; 8] = [
        Timer::Retransmit,
        Timer::Dpd,
        Timer::IkeRekey,
        Timer::NatKeepalive,
        Timer::HalfOpenExpiry,
        Timer::DeleteTimeout,
        Timer::TaskRetry,
        Timer::IkeExpire,
    ];
}

/// Deadlines of the IKE SA timers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TimerTable {
    data: [Option<Instant>; Timer::ALL.len()],
}

impl TimerTable {
    /// Arms `timer` for `at`.
    pub(crate) fn set(&mut self, timer: Timer, at: Instant) {
        self.data[timer as usize] = Some(at);
    }
    /// Disarms `timer`.
    pub(crate) fn stop(&mut self, timer: Timer) {
        self.data[timer as usize] = None;
    }
    /// The deadline of `timer`.
    pub(crate) fn get(&self, timer: Timer) -> Option<Instant> {
        self.data[timer as usize]
    }
    /// True (and disarms it) if `timer` is due at `now`.
    pub(crate) fn take_expired(&mut self, timer: Timer, now: Instant) -> bool {
        if self.data[timer as usize].is_some_and(|t| t <= now) {
            self.data[timer as usize] = None;
            true
        } else {
            false
        }
    }
    /// The earliest deadline.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.data.iter().flatten().min().copied()
    }
}

/// A CHILD_SA timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildTimer {
    /// Start rekeying (soft lifetime).
    Rekey = 0,
    /// Delete (hard lifetime).
    Expire = 1,
}

/// Deadlines of a CHILD_SA's timers.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ChildTimers {
    data: [Option<Instant>; 2],
}

impl ChildTimers {
    /// Arms `timer` for `at`.
    pub(crate) fn set(&mut self, timer: ChildTimer, at: Instant) {
        self.data[timer as usize] = Some(at);
    }
    /// Disarms `timer`.
    pub(crate) fn stop(&mut self, timer: ChildTimer) {
        self.data[timer as usize] = None;
    }
    /// The deadline of `timer`.
    pub(crate) fn get(&self, timer: ChildTimer) -> Option<Instant> {
        self.data[timer as usize]
    }
    /// True (and disarms it) if `timer` is due at `now`.
    pub(crate) fn take_expired(&mut self, timer: ChildTimer, now: Instant) -> bool {
        if self.data[timer as usize].is_some_and(|t| t <= now) {
            self.data[timer as usize] = None;
            true
        } else {
            false
        }
    }
    /// The earliest deadline.
    pub(crate) fn next_timeout(&self) -> Option<Instant> {
        self.data.iter().flatten().min().copied()
    }
}
