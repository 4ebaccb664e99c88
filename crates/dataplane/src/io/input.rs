//! The input stage: fills a worker's receive batch from one lane's input. One `recvmmsg` per
//! batch on a socket (UDP GRO trains stay whole here: the classify stage walks their
//! segments), or one batch of frames read from the TUN device (GSO super-packets split into
//! IP packets, see `sys::tun_offload`), or the frames an attachment interface's AF_PACKET ring
//! holds, copied out with their outer VLAN tag written back (`netio::packet`): no system call at
//! all for those.

use crate::lane::LaneKind;
use crate::shared::{rx_slots, Shared, MAX_SEGMENTS_PER_SLOT};
use crate::stats::{DropCounts, DropReason};
use crate::sys::tun::TunReadBatch;
use crate::sys::tun_offload::TunDrop;
use netio::packet::FrameBatch;
use netio::xdp::Xsk;
use netio::{RecvBatch, RX_SLOT};
use std::net::{IpAddr, SocketAddr};
use wire::ip::{IpProtocol, Ipv4Packet, Ipv6Packet};
use wire::udp::UdpPacket;

/// A worker's receive batch: datagrams with their metadata (source, GRO segment size,
/// truncation), or for the TUN lane IP packets read from the device.
pub(crate) struct RxBatch {
    /// Received datagrams (and the `recvmmsg` scratch).
    pub(crate) datagrams: RecvBatch,
    /// Frames read from the TUN device (if there is one), GSO super-packets split.
    pub(crate) tun: Option<TunReadBatch>,
    /// Frames from an attachment interface's ring (if there is one).
    pub(crate) frames: Option<FrameBatch>,
}

impl RxBatch {
    /// Receive batches sized for `sh`'s configured batch.
    pub(crate) fn new(sh: &Shared) -> Self {
        let slots = rx_slots(sh.cfg.batch);
        Self {
            datagrams: RecvBatch::new(slots),
            tun: sh
                .io
                .tun
                .as_ref()
                .map(|_| TunReadBatch::new(slots * RX_SLOT, slots)),
            frames: (!sh.io.packet.is_empty())
                .then(|| FrameBatch::new(slots * MAX_SEGMENTS_PER_SLOT, slots * RX_SLOT)),
        }
    }
}

/// The most bytes of packets one receive batch of a lane can deliver for a configured
/// `batch`: a datagram batch, or a TUN read batch (which holds at least two of the largest
/// reads: a split 64 KiB super-packet takes about 67 KiB).
pub(crate) fn largest_batch(batch: usize) -> usize {
    TunReadBatch::bytes_for(rx_slots(batch) * RX_SLOT)
}

/// Fills `rx` from input `input` of the lane (0: its socket, TUN device or ring; `i` > 0: its
/// AF_XDP socket `i - 1`); returns the datagrams (or TUN frames) read and whether more is
/// probably waiting. Frames the TUN device delivered unusable are counted in `drops`.
pub(crate) fn receive(
    sh: &Shared,
    rx: &mut RxBatch,
    kind: LaneKind,
    input: usize,
    drops: &mut DropCounts,
) -> (usize, bool) {
    let io = &sh.io;
    if input > 0 {
        return match io.lane_xsks(kind).get(input - 1) {
            Some(x) => {
                let (n, more, frames) = receive_xsk(&x.xsk, &mut rx.datagrams, drops);
                x.frames
                    .fetch_add(frames, std::sync::atomic::Ordering::Relaxed);
                (n, more)
            }
            None => (0, false),
        };
    }
    let sock = match kind {
        LaneKind::Ike { listen } => io.listen[listen].ike,
        LaneKind::Natt { listen } => io.listen[listen].natt,
        LaneKind::Vtep { vtep } => io.vteps[vtep].recv,
        LaneKind::Relay => match io.relay_sock {
            Some(s) => s,
            None => return (0, false),
        },
        LaneKind::Attach { iface } => {
            let (Some(sock), Some(fb)) = (io.packet.get(iface), rx.frames.as_mut()) else {
                return (0, false);
            };
            let got = sock.read_batch(fb);
            drops.add_n(DropReason::AttachRingFull, sock.take_losses());
            drops.add_n(DropReason::TooBig, fb.too_big);
            drops.add_n(DropReason::AttachRingMalformed, fb.bad_headers);
            return got;
        }
        LaneKind::Tun => {
            let (Some(dev), Some(rb)) = (&io.tun, rx.tun.as_mut()) else {
                return (0, false);
            };
            return match dev.read_batch(rb, rb.frames().len().max(rx.datagrams.capacity())) {
                Ok(r) => {
                    for (why, n) in rb.drops().iter() {
                        drops.add_n(tun_drop(why), n);
                    }
                    (r.frames, !r.would_block)
                }
                Err(e) => {
                    tracing::debug!(device = dev.name(), error = %e, "TUN read failed");
                    (0, false)
                }
            };
        }
    };
    match io.socks[sock].recv_batch(&mut rx.datagrams) {
        Ok(n) => (n, n == rx.datagrams.capacity()),
        Err(e) => {
            tracing::debug!(lane = ?kind, error = %e, "receive failed");
            (0, false)
        }
    }
}

/// Fills `batch` from AF_XDP socket `x`: each frame's UDP payload, with its sender, in
/// arrival order, equal-size datagrams of one sender joined into trains as UDP GRO would
/// (`RecvBatch::push_segment`). A frame takes at most one slot, so asking for as many frames
/// as slots are free never loses one. Returns the slots filled, whether more is waiting, and
/// the frames read.
fn receive_xsk(x: &Xsk, batch: &mut RecvBatch, drops: &mut DropCounts) -> (usize, bool, u64) {
    batch.clear();
    let mut bad = 0;
    let mut more = false;
    let mut frames = 0u64;
    // Bounded as a GRO receive is: at most a full train per slot.
    for _ in 0..batch.capacity() {
        let room = batch.free_slots();
        if room == 0 {
            break;
        }
        let got = x.receive(room, |frame| match udp_in_frame(frame) {
            Some((src, payload)) => {
                let pushed = batch.push_segment(src, &frame[payload]);
                debug_assert!(pushed, "a frame takes at most one free slot");
            }
            None => bad += 1,
        });
        more = got.more;
        frames += got.frames as u64;
        if got.descriptors == 0 || !got.more {
            break;
        }
    }
    drops.add_n(DropReason::XdpMalformed, bad);
    (batch.len(), more, frames)
}

/// The sender and UDP payload of an Ethernet frame holding an IPv4 (valid header checksum, not
/// a fragment) or IPv6 UDP datagram, as the steering program passes them; `None` for anything
/// else. Link-layer padding after the IP packet is ignored. The UDP checksum is not checked:
/// a veth peer's stack leaves it to offload, ESP's ICV authenticates what it carries, and
/// VXLAN's frames carry checksums of their own (RFC 7348 §5: zero is the norm).
fn udp_in_frame(frame: &[u8]) -> Option<(SocketAddr, std::ops::Range<usize>)> {
    const ETH: usize = 14;
    let ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    let (src, ip_header, ip_payload) = match ethertype {
        0x0800 => {
            let ip = Ipv4Packet::new_checked(frame.get(ETH..)?).ok()?;
            if !ip.verify_checksum() || ip.is_fragment() || ip.protocol() != IpProtocol::UDP {
                return None;
            }
            (
                IpAddr::V4(ip.src_addr()),
                ip.header_len(),
                ip.payload().len(),
            )
        }
        0x86dd => {
            let ip = Ipv6Packet::new_checked(frame.get(ETH..)?).ok()?;
            if ip.next_header() != IpProtocol::UDP {
                return None;
            }
            (IpAddr::V6(ip.src_addr()), 40, ip.payload().len())
        }
        _ => return None,
    };
    let at = ETH + ip_header;
    let udp = UdpPacket::new_checked(frame.get(at..at + ip_payload)?).ok()?;
    let start = at + 8;
    Some((
        SocketAddr::new(src, udp.src_port()),
        start..start + udp.payload().len(),
    ))
}

fn tun_drop(why: TunDrop) -> DropReason {
    match why {
        TunDrop::Short => DropReason::TunShortRead,
        TunDrop::Truncated => DropReason::TunReadTruncated,
        TunDrop::BadHeader => DropReason::TunVnetBadHeader,
        TunDrop::GsoMalformed => DropReason::TunGsoMalformed,
        TunDrop::GsoTooLarge => DropReason::TunGsoTooLarge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet frame holding an IPv4 UDP datagram from 192.0.2.7:4500 with `payload`,
    /// `pad` bytes of link-layer padding after it.
    fn v4_frame(payload: &[u8], pad: usize) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        let repr = wire::ip::Ipv4Repr {
            src_addr: "192.0.2.7".parse().expect("ip"),
            dst_addr: "192.0.2.1".parse().expect("ip"),
            protocol: IpProtocol::UDP,
            payload_len: 8 + payload.len(),
            ttl: 64,
            dscp: 0,
            ecn: 0,
            ident: 1,
            dont_frag: false,
        };
        repr.emit(&mut f[14..34]).expect("header");
        f[34..36].copy_from_slice(&4500u16.to_be_bytes());
        f[36..38].copy_from_slice(&4500u16.to_be_bytes());
        f[38..40].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
        f.extend_from_slice(payload);
        f.extend(std::iter::repeat_n(0xee, pad));
        f
    }

    #[test]
    fn a_steered_frame_gives_its_sender_and_payload_and_nothing_else_passes() {
        let f = v4_frame(b"esp", 20);
        let (src, at) = udp_in_frame(&f).expect("a datagram");
        assert_eq!(src, "192.0.2.7:4500".parse::<SocketAddr>().expect("addr"));
        assert_eq!(&f[at], b"esp", "padding after the IP packet is not payload");
        // A bad header checksum, a fragment, another protocol, a short frame, ARP: none.
        let mut bad = f.clone();
        bad[14 + 10] ^= 1;
        assert!(udp_in_frame(&bad).is_none());
        let mut frag = v4_frame(b"esp", 0);
        frag[14 + 6] = 0x20;
        let ck = {
            let mut p = Ipv4Packet::new_unchecked(&mut frag[14..34]);
            p.fill_checksum();
            p.checksum()
        };
        assert_ne!(ck, 0);
        assert!(udp_in_frame(&frag).is_none());
        let mut tcp = v4_frame(b"esp", 0);
        tcp[14 + 9] = 6;
        assert!(udp_in_frame(&tcp).is_none());
        assert!(udp_in_frame(&f[..30]).is_none());
        let mut arp = f.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert!(udp_in_frame(&arp).is_none());
        // A UDP length beyond the IP packet: none.
        let mut long = v4_frame(b"esp", 0);
        long[38..40].copy_from_slice(&100u16.to_be_bytes());
        assert!(udp_in_frame(&long).is_none());
    }

    #[test]
    fn an_ipv6_frame_gives_its_sender_and_payload() {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let mut ip = vec![0u8; 40];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&11u16.to_be_bytes());
        ip[6] = 17;
        ip[7] = 64;
        let src: std::net::Ipv6Addr = "2001:db8::7".parse().expect("ip");
        ip[8..24].copy_from_slice(&src.octets());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&4789u16.to_be_bytes());
        f.extend_from_slice(&4789u16.to_be_bytes());
        f.extend_from_slice(&11u16.to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(b"vni");
        let (from, at) = udp_in_frame(&f).expect("a datagram");
        assert_eq!(from, SocketAddr::new(src.into(), 4789));
        assert_eq!(&f[at], b"vni");
    }

    #[test]
    fn the_largest_batch_holds_a_split_super_packet_even_at_batch_one() {
        // A 64 KiB TCP super-packet of 1448-byte segments is about 67 KiB once split.
        for batch in [1, 2, 32, 64, 1000] {
            let n = largest_batch(batch);
            assert!(n >= 67 * 1024, "batch {batch}: {n}");
            assert!(n >= rx_slots(batch) * RX_SLOT, "batch {batch}: {n}");
        }
    }
}
