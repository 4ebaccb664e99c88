//! Snapshots of an IKE SA for a standby control node: a small versioned binary format holding
//! SPIs, addresses, keys, message IDs, the cached response, CHILD_SAs with their keys and
//! selectors, queued work, and timers as durations relative to the snapshot instant.
//!
//! Layout (all integers big-endian): magic `PIKE`, version (1 byte), then the fields in the
//! order of [`encode`]. Variable-length fields are prefixed with a u32 length. Only established
//! (or rekeyed / deleting) SAs are snapshotted; an outstanding request is kept as its bytes and
//! retransmitted after a restore, but its exchange state (ephemeral keys) is not.

use crate::{
    event::{DeleteReason, IkeSpis},
    keys::{ChildKeyMat, IkeKeys},
    proposal::{EspAlgs, IkeAlgs},
    sa::{Active, ChildSa, ChildState, IkeSa, Nat, Pending, SaState, Task},
    timer::{ChildTimer, ChildTimers, Timer, TimerTable},
    Error, Identity, TrafficSelector, TunnelId,
};
use crypto::transform::{EncrId, IntegId, KeId, PrfId};
use crypto::{DhGroup, Encr, Integ, Prf};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};
use wire::ike::{ExchangeType, Reader};
use wire::{EspSpi, IkeSpi};
use zeroize::Zeroizing;

const MAGIC: &[u8; 4] = b"PIKE";
/// How far a restored SA's IV counter jumps ahead of the stored one. Every state is stored
/// before the message that depends on it leaves, so the stored counter is never behind what
/// was sent; but whoever can write the store could put back an older copy of a record, and
/// with AES-GCM a counter that goes back repeats a nonce under the same key (RFC 5282 §3:
/// the IV must not repeat for a key). The gap keeps the IVs fresh unless 2^32 messages were
/// protected since that older copy; the 64-bit counter allows 2^32 restores.
pub(crate) const RESTORE_IV_GAP: u64 = 1 << 32;
/// 2: the IKE SA's hard lifetime timer (`over_time`) joined the timers. 3: each CHILD_SA ends
/// with whether it is a per-resource one (RFC 9611). Version 2 is still read (a control node
/// restoring what an older one stored, its CHILD_SAs then plain ones).
const VERSION: u8 = 3;
/// The oldest version [`decode`] reads.
const OLDEST_VERSION: u8 = 2;

struct W(Zeroizing<Vec<u8>>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(b);
    }
    fn bool(&mut self, b: bool) {
        self.u8(u8::from(b));
    }
    fn addr(&mut self, a: SocketAddr) {
        self.ip(a.ip());
        self.u16(a.port());
    }
    fn ip(&mut self, a: IpAddr) {
        match a {
            IpAddr::V4(a) => {
                self.u8(4);
                self.0.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                self.u8(6);
                self.0.extend_from_slice(&a.octets());
            }
        }
    }
    /// Milliseconds between two instants (saturating), for "ago" and "remaining" fields.
    fn dur(&mut self, d: Duration) {
        self.u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    }
    fn opt_remaining(&mut self, t: Option<Instant>, now: Instant) {
        match t {
            Some(t) => {
                self.u8(1);
                self.dur(t.saturating_duration_since(now));
            }
            None => self.u8(0),
        }
    }
    fn ts(&mut self, v: &[TrafficSelector]) {
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        for t in v {
            self.u8(t.ip_proto);
            self.u16(t.start_port);
            self.u16(t.end_port);
            self.ip(t.start);
            self.ip(t.end);
        }
    }
    fn pending(&mut self, p: &Pending) {
        match p {
            Pending::RekeyChild(s) => {
                self.u8(0);
                self.u32(s.0);
            }
            Pending::CreateChild => self.u8(1),
            Pending::RekeyIke => self.u8(2),
            Pending::DeleteChildren(spis, r) => {
                self.u8(3);
                self.u32(u32::try_from(spis.len()).unwrap_or(u32::MAX));
                for s in spis {
                    self.u32(s.0);
                }
                self.u8(reason_code(*r));
            }
            Pending::DeleteIke(r) => {
                self.u8(4);
                self.u8(reason_code(*r));
            }
            Pending::Dpd => self.u8(5),
            Pending::AddChild => self.u8(6),
        }
    }
}

fn reason_code(r: DeleteReason) -> u8 {
    match r {
        DeleteReason::PeerRequest => 0,
        DeleteReason::LocalRequest => 1,
        DeleteReason::Rekeyed => 2,
        DeleteReason::DpdTimeout => 3,
        DeleteReason::RetransmitLimit => 4,
        DeleteReason::Expired => 5,
        DeleteReason::AuthFailed => 6,
        DeleteReason::NegotiationFailed => 7,
    }
}

fn reason_from(c: u8) -> Result<DeleteReason, Error> {
    Ok(match c {
        0 => DeleteReason::PeerRequest,
        1 => DeleteReason::LocalRequest,
        2 => DeleteReason::Rekeyed,
        3 => DeleteReason::DpdTimeout,
        4 => DeleteReason::RetransmitLimit,
        5 => DeleteReason::Expired,
        6 => DeleteReason::AuthFailed,
        7 => DeleteReason::NegotiationFailed,
        _ => return Err(Error::Snapshot("unknown delete reason")),
    })
}

fn identity(w: &mut W, id: &Identity) {
    let (t, d) = id.to_wire();
    w.u8(t.0);
    w.bytes(&d);
}

/// Serialises an SA; `None` for SAs still connecting.
pub(crate) fn encode(sa: &IkeSa, now: Instant) -> Option<Vec<u8>> {
    let keys = sa.keys.as_ref()?;
    if matches!(sa.state, SaState::Connecting | SaState::Dead) {
        return None;
    }
    let mut w = W(Zeroizing::new(Vec::with_capacity(1024)));
    w.0.extend_from_slice(MAGIC);
    w.u8(VERSION);
    w.u64(sa.spi.0);
    w.u64(sa.spis.initiator.0);
    w.u64(sa.spis.responder.0);
    w.bool(sa.initiator);
    w.u32(sa.tunnel.map_or(u32::MAX, |t| t.0));
    w.bool(sa.tunnel.is_some());
    w.addr(sa.local);
    w.addr(sa.remote);
    w.u8(match sa.state {
        SaState::Established => 0,
        SaState::Rekeyed => 1,
        _ => 2,
    });
    w.bool(sa.nat.local);
    w.bool(sa.nat.remote);
    w.u32(sa.next_request_id);
    w.u32(sa.next_peer_id);
    match &sa.last_response {
        Some((id, b)) => {
            w.u8(1);
            w.u32(*id);
            w.bytes(b);
        }
        None => w.u8(0),
    }
    match &sa.active {
        Some(a) => {
            w.u8(1);
            w.u32(a.id);
            w.u8(a.exchange.0);
            w.u32(a.retransmits);
            w.bytes(&a.bytes);
            // Exchanges without secret state are kept; the others continue as orphans.
            match &a.task {
                Task::Dpd => w.u8(1),
                Task::DeleteIke(r) => {
                    w.u8(2);
                    w.u8(reason_code(*r));
                }
                Task::DeleteChildren(spis, r) => {
                    w.u8(3);
                    w.pending(&Pending::DeleteChildren(spis.clone(), *r));
                }
                _ => w.u8(0),
            }
        }
        None => w.u8(0),
    }
    w.u64(sa.iv_counter);
    w.dur(now.saturating_duration_since(sa.established.unwrap_or(now)));
    w.dur(now.saturating_duration_since(sa.last_received));
    w.dur(now.saturating_duration_since(sa.last_sent));
    match &sa.peer_id {
        Some(id) => {
            w.u8(1);
            identity(&mut w, id);
        }
        None => w.u8(0),
    }
    let a = keys.algs;
    let (eid, ebits) = a.encr.id();
    w.u16(eid.0);
    w.u16(ebits.unwrap_or(0));
    w.u16(a.integ.map_or(0, |i| i.id().0));
    w.u16(a.prf.id().0);
    w.u16(a.dh.id().0);
    w.bytes(keys.keymat());
    w.bytes(&sa.ni);
    w.bytes(&sa.nr);
    for t in Timer::ALL {
        w.opt_remaining(sa.timers.get(t), now);
    }
    w.u32(u32::try_from(sa.queue.len()).unwrap_or(0));
    for p in &sa.queue {
        w.pending(p);
    }
    w.u32(u32::try_from(sa.deferred.len()).unwrap_or(0));
    for (t, p) in &sa.deferred {
        w.dur(t.saturating_duration_since(now));
        w.pending(p);
    }
    w.u32(u32::try_from(sa.children.len()).unwrap_or(0));
    for c in &sa.children {
        w.u32(c.inbound_spi.0);
        w.u32(c.outbound_spi.0);
        let (eid, ebits) = c.algs.encr.id();
        w.u16(eid.0);
        w.u16(ebits.unwrap_or(0));
        w.u16(c.algs.integ.map_or(0, |i| i.id().0));
        w.bool(c.algs.esn);
        w.u16(c.algs.dh.map_or(0, |d| d.id().0));
        w.bool(c.keys_initiator);
        for part in c.keys.parts() {
            w.bytes(part);
        }
        w.ts(&c.local_ts);
        w.ts(&c.remote_ts);
        w.u8(match c.state {
            ChildState::Installed | ChildState::Rekeying => 0,
            ChildState::Rekeyed => 1,
            ChildState::Deleting => 2,
        });
        w.dur(now.saturating_duration_since(c.installed_at));
        w.opt_remaining(c.timers.get(ChildTimer::Rekey), now);
        w.opt_remaining(c.timers.get(ChildTimer::Expire), now);
        w.bool(c.resource);
    }
    Some(w.0.to_vec())
}

/// A snapshot reader; `.1` is how long ago the snapshot was taken (timers have run that long).
struct R<'a>(Reader<'a>, Duration);

fn truncated(_: wire::ike::IkeWireError) -> Error {
    Error::Snapshot("truncated")
}

impl R<'_> {
    fn u8(&mut self) -> Result<u8, Error> {
        self.0.u8().map_err(truncated)
    }
    /// The format version after the magic: one this reader knows.
    fn version(&mut self) -> Result<u8, Error> {
        let v = self.u8()?;
        if !(OLDEST_VERSION..=VERSION).contains(&v) {
            return Err(Error::Snapshot("unsupported snapshot version"));
        }
        Ok(v)
    }
    fn u16(&mut self) -> Result<u16, Error> {
        self.0.u16().map_err(truncated)
    }
    fn u32(&mut self) -> Result<u32, Error> {
        self.0.u32().map_err(truncated)
    }
    fn u64(&mut self) -> Result<u64, Error> {
        self.0.u64().map_err(truncated)
    }
    fn bool(&mut self) -> Result<bool, Error> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Error::Snapshot("invalid flag")),
        }
    }
    fn bytes(&mut self) -> Result<Vec<u8>, Error> {
        let n = self.u32()? as usize;
        Ok(self.0.take(n).map_err(truncated)?.to_vec())
    }
    fn ip(&mut self) -> Result<IpAddr, Error> {
        Ok(match self.u8()? {
            4 => {
                let b = <[u8; 4]>::try_from(self.0.take(4).map_err(truncated)?)
                    .map_err(|_| Error::Snapshot("address"))?;
                IpAddr::V4(Ipv4Addr::from(b))
            }
            6 => {
                let b = <[u8; 16]>::try_from(self.0.take(16).map_err(truncated)?)
                    .map_err(|_| Error::Snapshot("address"))?;
                IpAddr::V6(Ipv6Addr::from(b))
            }
            _ => return Err(Error::Snapshot("address family")),
        })
    }
    fn addr(&mut self) -> Result<SocketAddr, Error> {
        let ip = self.ip()?;
        Ok(SocketAddr::new(ip, self.u16()?))
    }
    fn dur(&mut self) -> Result<Duration, Error> {
        Ok(Duration::from_millis(self.u64()?))
    }
    fn ago(&mut self, now: Instant) -> Result<Instant, Error> {
        let d = self.dur()?.saturating_add(self.1);
        Ok(now.checked_sub(d).unwrap_or(now))
    }
    fn opt_remaining(&mut self, now: Instant) -> Result<Option<Instant>, Error> {
        Ok(if self.bool()? {
            let left = self.dur()?.saturating_sub(self.1);
            Some(now.checked_add(left).unwrap_or(now))
        } else {
            None
        })
    }
    fn count(&mut self) -> Result<usize, Error> {
        let n = self.u32()? as usize;
        // Every element takes at least one byte: bounds allocations on hostile input.
        if n > self.0.remaining() {
            return Err(Error::Snapshot("count exceeds data"));
        }
        Ok(n)
    }
    fn ts(&mut self) -> Result<Vec<TrafficSelector>, Error> {
        let n = self.count()?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let ip_proto = self.u8()?;
            let start_port = self.u16()?;
            let end_port = self.u16()?;
            let start = self.ip()?;
            let end = self.ip()?;
            if start.is_ipv4() != end.is_ipv4() {
                return Err(Error::Snapshot("selector family"));
            }
            v.push(TrafficSelector {
                ip_proto,
                start_port,
                end_port,
                start,
                end,
            });
        }
        Ok(v)
    }
    fn pending(&mut self) -> Result<Pending, Error> {
        Ok(match self.u8()? {
            0 => Pending::RekeyChild(EspSpi(self.u32()?)),
            1 => Pending::CreateChild,
            2 => Pending::RekeyIke,
            3 => {
                let n = self.count()?;
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(EspSpi(self.u32()?));
                }
                Pending::DeleteChildren(v, reason_from(self.u8()?)?)
            }
            4 => Pending::DeleteIke(reason_from(self.u8()?)?),
            5 => Pending::Dpd,
            6 => Pending::AddChild,
            _ => return Err(Error::Snapshot("unknown queued task")),
        })
    }
    fn encr(&mut self) -> Result<Encr, Error> {
        let id = EncrId(self.u16()?);
        let bits = self.u16()?;
        Encr::from_id(id, (bits != 0).then_some(bits))
            .ok_or(Error::Snapshot("encryption transform"))
    }
    fn integ(&mut self) -> Result<Option<Integ>, Error> {
        match self.u16()? {
            0 => Ok(None),
            i => Integ::from_id(IntegId(i))
                .map(Some)
                .ok_or(Error::Snapshot("integrity transform")),
        }
    }
}

/// The tunnel a snapshot belongs to (None for an SA without one), from its header only.
pub(crate) fn tunnel_of(bytes: &[u8]) -> Result<Option<TunnelId>, Error> {
    let mut r = R(Reader::new(bytes, "snapshot"), Duration::ZERO);
    if r.0.take(4).map_err(truncated)? != MAGIC {
        return Err(Error::Snapshot("not an IKE SA snapshot"));
    }
    r.version()?;
    for _ in 0..3 {
        r.u64()?;
    }
    r.bool()?;
    let tunnel_id = r.u32()?;
    Ok(r.bool()?.then_some(TunnelId(tunnel_id)))
}

/// Restores an SA written by [`encode`] `age` ago: its timers have run that long (those that
/// would have fired meanwhile are due at `now`).
pub(crate) fn decode(bytes: &[u8], now: Instant, age: Duration) -> Result<IkeSa, Error> {
    let mut r = R(Reader::new(bytes, "snapshot"), age);
    if r.0.take(4).map_err(truncated)? != MAGIC {
        return Err(Error::Snapshot("not an IKE SA snapshot"));
    }
    let version = r.version()?;
    let spi = IkeSpi(r.u64()?);
    let spis = IkeSpis {
        initiator: IkeSpi(r.u64()?),
        responder: IkeSpi(r.u64()?),
    };
    let initiator = r.bool()?;
    if spi
        != if initiator {
            spis.initiator
        } else {
            spis.responder
        }
    {
        return Err(Error::Snapshot("SPI does not match role"));
    }
    let tunnel_id = r.u32()?;
    let tunnel = r.bool()?.then_some(TunnelId(tunnel_id));
    let local = r.addr()?;
    let remote = r.addr()?;
    let mut sa = IkeSa::blank(now, spi, spis, initiator, local, remote);
    sa.tunnel = tunnel;
    sa.state = match r.u8()? {
        0 => SaState::Established,
        1 => SaState::Rekeyed,
        2 => SaState::Deleting,
        _ => return Err(Error::Snapshot("state")),
    };
    sa.nat = Nat {
        local: r.bool()?,
        remote: r.bool()?,
    };
    sa.next_request_id = r.u32()?;
    sa.next_peer_id = r.u32()?;
    if r.bool()? {
        let id = r.u32()?;
        sa.last_response = Some((id, r.bytes()?));
    }
    let active = if r.bool()? {
        let id = r.u32()?;
        let exchange = ExchangeType(r.u8()?);
        let retransmits = r.u32()?;
        let bytes = r.bytes()?;
        let task = match r.u8()? {
            0 => Task::Orphan,
            1 => Task::Dpd,
            2 => Task::DeleteIke(reason_from(r.u8()?)?),
            3 => match r.pending()? {
                Pending::DeleteChildren(spis, reason) => Task::DeleteChildren(spis, reason),
                _ => return Err(Error::Snapshot("outstanding task")),
            },
            _ => return Err(Error::Snapshot("outstanding task")),
        };
        Some(Active {
            id,
            exchange,
            bytes,
            retransmits,
            task,
        })
    } else {
        None
    };
    sa.iv_counter = r
        .u64()?
        .checked_add(RESTORE_IV_GAP)
        .ok_or(Error::Snapshot("IV counter exhausted"))?;
    sa.established = Some(r.ago(now)?);
    sa.last_received = r.ago(now)?;
    sa.last_sent = r.ago(now)?;
    if r.bool()? {
        let t = wire::ike::IdType(r.u8()?);
        let d = r.bytes()?;
        sa.peer_id = Some(Identity::from_wire(t, &d).ok_or(Error::Snapshot("identity"))?);
    }
    let encr = r.encr()?;
    let integ = r.integ()?;
    let prf = Prf::from_id(PrfId(r.u16()?)).ok_or(Error::Snapshot("PRF"))?;
    let dh = DhGroup::from_id(KeId(r.u16()?)).ok_or(Error::Snapshot("key exchange group"))?;
    let keymat = Zeroizing::new(r.bytes()?);
    let algs = IkeAlgs {
        encr,
        integ,
        prf,
        dh,
    };
    sa.keys = Some(IkeKeys::from_keymat(algs, keymat).map_err(|_| Error::Snapshot("IKE keys"))?);
    sa.ni = r.bytes()?;
    sa.nr = r.bytes()?;
    let mut timers = TimerTable::default();
    for t in Timer::ALL {
        if let Some(at) = r.opt_remaining(now)? {
            timers.set(t, at);
        }
    }
    sa.timers = timers;
    for _ in 0..r.count()? {
        sa.queue.push_back(r.pending()?);
    }
    for _ in 0..r.count()? {
        let left = r.dur()?.saturating_sub(age);
        let at = now.checked_add(left).unwrap_or(now);
        sa.deferred.push((at, r.pending()?));
    }
    for _ in 0..r.count()? {
        let inbound_spi = EspSpi(r.u32()?);
        let outbound_spi = EspSpi(r.u32()?);
        let encr = r.encr()?;
        let integ = r.integ()?;
        let esn = r.bool()?;
        let dh = match r.u16()? {
            0 => None,
            g => Some(DhGroup::from_id(KeId(g)).ok_or(Error::Snapshot("PFS group"))?),
        };
        let algs = EspAlgs {
            encr,
            integ,
            esn,
            dh,
        };
        let keys_initiator = r.bool()?;
        let keys = ChildKeyMat {
            encr_i: Zeroizing::new(r.bytes()?),
            integ_i: Zeroizing::new(r.bytes()?),
            encr_r: Zeroizing::new(r.bytes()?),
            integ_r: Zeroizing::new(r.bytes()?),
        };
        let e = encr.keymat_len();
        let a = integ.map_or(0, |i| i.key_len());
        if keys.encr_i.len() != e
            || keys.encr_r.len() != e
            || keys.integ_i.len() != a
            || keys.integ_r.len() != a
        {
            return Err(Error::Snapshot("CHILD_SA key lengths"));
        }
        let local_ts = r.ts()?;
        let remote_ts = r.ts()?;
        let state = match r.u8()? {
            0 => ChildState::Installed,
            1 => ChildState::Rekeyed,
            2 => ChildState::Deleting,
            _ => return Err(Error::Snapshot("CHILD_SA state")),
        };
        let installed_at = r.ago(now)?;
        let mut timers = ChildTimers::default();
        if let Some(t) = r.opt_remaining(now)? {
            timers.set(ChildTimer::Rekey, t);
        }
        if let Some(t) = r.opt_remaining(now)? {
            timers.set(ChildTimer::Expire, t);
        }
        let resource = version >= 3 && r.bool()?;
        sa.children.push(ChildSa {
            inbound_spi,
            outbound_spi,
            algs,
            keys,
            keys_initiator,
            local_ts,
            remote_ts,
            state,
            installed_at,
            timers,
            predecessor: None,
            resource,
        });
    }
    r.0.finish()
        .map_err(|_| Error::Snapshot("trailing bytes"))?;
    if let Some(a) = active {
        // Keep retransmitting the request the old node had in flight.
        sa.timers.set(Timer::Retransmit, now);
        sa.active = Some(a);
    }
    Ok(sa)
}
