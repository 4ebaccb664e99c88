//! Tests of the AF_PACKET ring walk and socket (`netio::packet`).

use super::*;
use crate::testutil::in_veth_namespace;

#[test]
fn the_outer_tag_is_written_back_after_the_addresses() {
    let mut b = FrameBatch::new(4, 4096);
    let mut frame = vec![0xaa; 12];
    frame.extend_from_slice(&[0x81, 0x00, 0x00, 0x0a, 0x08, 0x00, 0x45]);
    assert!(b.push(&frame, Some((0x88a8, 100)), false));
    assert!(b.push(&frame, None, true));
    let f = b.frames().to_vec();
    assert_eq!(f[0].len, frame.len() + 4);
    let first = b.frame_mut(0).to_vec();
    assert_eq!(&first[..12], &[0xaa; 12]);
    assert_eq!(&first[12..16], &[0x88, 0xa8, 0x00, 0x64]);
    assert_eq!(&first[16..], &frame[12..]);
    assert_eq!(b.frame_mut(1), &frame[..]);
    assert!(f[1].truncated && !f[0].truncated);
}

#[test]
fn a_full_batch_refuses_and_copies_nothing() {
    let mut b = FrameBatch::new(2, FRAME_SIZE);
    assert!(b.push(&[1; 100], None, false));
    assert!(b.push(&[2; 100], None, false));
    assert!(!b.push(&[3; 100], None, false), "frame limit");
    let mut b = FrameBatch::new(8, FRAME_SIZE);
    assert!(b.push(&[1; 2000], None, false));
    assert!(!b.push(&[2; 100], None, false), "byte limit");
    assert_eq!(b.frames().len(), 1);
    b.clear();
    assert!(b.frames().is_empty());
}

/// A frame in a test block: its bytes, whether we sent it, its ring VLAN tag.
struct TestFrame<'a> {
    bytes: &'a [u8],
    outgoing: bool,
    vlan: Option<(u16, u16)>,
    csum_not_ready: bool,
}

fn frame(bytes: &[u8]) -> TestFrame<'_> {
    TestFrame {
        bytes,
        outgoing: false,
        vlan: None,
        csum_not_ready: false,
    }
}

/// A ring block of `size` bytes holding `frames` as the kernel lays them out (TPACKET_V3:
/// the block descriptor, then per frame its header, `sockaddr_ll` and data, each frame
/// pointing at the next).
fn block(size: usize, frames: &[TestFrame<'_>]) -> Vec<u8> {
    let mut b = vec![0u8; size];
    let put32 = |b: &mut [u8], at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    let first = 48;
    put32(&mut b, BLOCK_NUM_PKTS, frames.len() as u32);
    put32(&mut b, BLOCK_FIRST_PKT, first as u32);
    let data_at = HDR_ALIGNED + std::mem::size_of::<libc::sockaddr_ll>() + 2;
    let mut at = first;
    for (i, f) in frames.iter().enumerate() {
        let len = (data_at + f.bytes.len() + 15) & !15;
        let next = if i + 1 == frames.len() { 0 } else { len };
        let hdr = |field: usize| at + field;
        put32(
            &mut b,
            hdr(std::mem::offset_of!(libc::tpacket3_hdr, tp_next_offset)),
            next as u32,
        );
        put32(
            &mut b,
            hdr(std::mem::offset_of!(libc::tpacket3_hdr, tp_snaplen)),
            f.bytes.len() as u32,
        );
        put32(
            &mut b,
            hdr(std::mem::offset_of!(libc::tpacket3_hdr, tp_len)),
            f.bytes.len() as u32,
        );
        let mut status = libc::TP_STATUS_USER;
        if f.csum_not_ready {
            status |= libc::TP_STATUS_CSUMNOTREADY;
        }
        if let Some((tpid, tci)) = f.vlan {
            status |= libc::TP_STATUS_VLAN_VALID | libc::TP_STATUS_VLAN_TPID_VALID;
            let hv1 = std::mem::offset_of!(libc::tpacket3_hdr, hv1);
            put32(
                &mut b,
                hdr(hv1 + std::mem::offset_of!(libc::tpacket_hdr_variant1, tp_vlan_tci)),
                u32::from(tci),
            );
            let tp = hdr(hv1 + std::mem::offset_of!(libc::tpacket_hdr_variant1, tp_vlan_tpid));
            b[tp..tp + 2].copy_from_slice(&tpid.to_ne_bytes());
        }
        put32(
            &mut b,
            hdr(std::mem::offset_of!(libc::tpacket3_hdr, tp_status)),
            status,
        );
        let mac = hdr(std::mem::offset_of!(libc::tpacket3_hdr, tp_mac));
        b[mac..mac + 2].copy_from_slice(&(data_at as u16).to_ne_bytes());
        b[at + HDR_ALIGNED + SLL_PKTTYPE] = if f.outgoing {
            libc::PACKET_OUTGOING
        } else {
            libc::PACKET_HOST
        };
        b[at + data_at..at + data_at + f.bytes.len()].copy_from_slice(f.bytes);
        at += len;
    }
    b
}

fn start() -> Cursor {
    Cursor {
        block: 0,
        read: 0,
        offset: 0,
    }
}

#[test]
fn a_frame_too_big_for_an_empty_batch_is_counted_and_skipped() {
    // The batch holds 2048 bytes; the first frame is 3000: it can never fit, so it must
    // not stop the ring (the walk used to stop there for good).
    let big = vec![7u8; 3000];
    let small = [9u8; 100];
    let b = block(8192, &[frame(&big), frame(&small)]);
    let mut out = FrameBatch::new(8, FRAME_SIZE);
    let mut cur = start();
    assert_eq!(walk_block(&b, &mut cur, &mut out), Walk::Done);
    assert_eq!(out.too_big, 1);
    assert_eq!(out.frames().len(), 1);
    assert_eq!(out.frame_mut(0), &small[..]);
    assert_eq!(cur.read, 2);
}

#[test]
fn a_full_batch_resumes_at_the_frame_that_did_not_fit() {
    let (a, c) = ([1u8; 100], [3u8; 60]);
    let mine = [2u8; 80];
    let b = block(
        8192,
        &[
            frame(&a),
            TestFrame {
                bytes: &mine,
                outgoing: true,
                vlan: None,
                csum_not_ready: false,
            },
            TestFrame {
                bytes: &c,
                outgoing: false,
                vlan: Some((0x88a8, 100)),
                csum_not_ready: true,
            },
        ],
    );
    let mut out = FrameBatch::new(1, FRAME_SIZE);
    let mut cur = start();
    assert_eq!(walk_block(&b, &mut cur, &mut out), Walk::BatchFull);
    assert_eq!(out.frame_mut(0), &a[..]);
    assert!(!out.frames()[0].csum_not_ready);
    out.clear();
    assert_eq!(walk_block(&b, &mut cur, &mut out), Walk::Done);
    assert_eq!(out.frames().len(), 1, "our own frame is skipped");
    let f = out.frame_mut(0).to_vec();
    assert_eq!(f.len(), c.len() + 4);
    assert!(
        out.frames()[0].csum_not_ready,
        "TP_STATUS_CSUMNOTREADY carried"
    );
    assert_eq!(&f[12..16], &[0x88, 0xa8, 0x00, 100]);
    assert_eq!((out.too_big, out.bad_headers), (0, 0));
}

#[test]
fn a_header_outside_the_block_gives_the_block_back_and_counts_the_rest() {
    let a = [1u8; 100];
    let mut b = block(8192, &[frame(&a), frame(&a), frame(&a)]);
    // The second frame's header claims a next frame far beyond the block.
    let first = 48;
    let second = first + u32::from_ne_bytes(b[first..first + 4].try_into().unwrap()) as usize;
    b[second..second + 4].copy_from_slice(&1_000_000u32.to_ne_bytes());
    let mut out = FrameBatch::new(8, FRAME_SIZE);
    let mut cur = start();
    assert_eq!(walk_block(&b, &mut cur, &mut out), Walk::Done);
    assert_eq!(out.frames().len(), 2);
    assert_eq!(out.bad_headers, 1);
    // A frame whose data runs past the end of the block.
    let mut b = block(8192, &[frame(&a)]);
    let snap = first + std::mem::offset_of!(libc::tpacket3_hdr, tp_snaplen);
    b[snap..snap + 4].copy_from_slice(&9000u32.to_ne_bytes());
    let mut out = FrameBatch::new(8, FRAME_SIZE);
    assert_eq!(walk_block(&b, &mut start(), &mut out), Walk::Done);
    assert_eq!((out.frames().len(), out.bad_headers), (0, 1));
}

#[test]
fn an_open_socket_makes_its_interface_promiscuous() {
    // Needs CAP_NET_RAW (root), as the data plane and the stage tests do.
    let sock = PacketSocket::open("lo").expect("open lo (needs CAP_NET_RAW)");
    let flags = std::fs::read_to_string("/sys/class/net/lo/flags").expect("lo flags");
    let flags = u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).expect("hex");
    assert_ne!(flags & libc::IFF_PROMISC as u32, 0, "flags {flags:#x}");
    drop(sock);
}

#[test]
fn an_interface_that_is_not_ethernet_is_refused() {
    // A TUN device (no link-layer header) in a network namespace of this thread's own.
    let run = || {
        // SAFETY: plain system call; affects this thread only.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        let st = std::process::Command::new("ip")
            .args(["tuntap", "add", "dev", "t0", "mode", "tun"])
            .status()
            .expect("ip");
        assert!(st.success(), "ip tuntap");
        match PacketSocket::open("t0") {
            Err(e) => {
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
                assert!(e.to_string().contains("not an Ethernet interface"), "{e}");
            }
            Ok(_) => panic!("a TUN device was taken for Ethernet"),
        }
    };
    std::thread::spawn(run)
        .join()
        .expect("in its own namespace");
}

#[test]
fn block_offsets_match_the_kernel_layout() {
    let hdr = std::mem::offset_of!(libc::tpacket_block_desc, hdr);
    assert_eq!(
        hdr + std::mem::offset_of!(libc::tpacket_hdr_v1, block_status),
        BLOCK_STATUS
    );
    assert_eq!(
        hdr + std::mem::offset_of!(libc::tpacket_hdr_v1, num_pkts),
        BLOCK_NUM_PKTS
    );
    assert_eq!(
        hdr + std::mem::offset_of!(libc::tpacket_hdr_v1, offset_to_first_pkt),
        BLOCK_FIRST_PKT
    );
}

#[test]
fn header_offsets_match_the_kernel_layout() {
    // struct tpacket3_hdr is 48 bytes; TPACKET_ALIGN keeps it there.
    assert_eq!(std::mem::size_of::<libc::tpacket3_hdr>(), 48);
    assert_eq!(HDR_ALIGNED, 48);
    assert_eq!(
        std::mem::offset_of!(libc::sockaddr_ll, sll_pkttype),
        SLL_PKTTYPE
    );
}

/// An experimental EtherType (IEEE 802 local use): the kernel's stack leaves these frames
/// alone, and the namespace's own traffic (IPv6 neighbour discovery) is told apart by it.
const TEST_TYPE: [u8; 2] = [0x88, 0xb5];

/// A frame to `dst` of `len` bytes (at least 18) carrying `seq`; with `tag`, an 802.1Q tag
/// after the addresses.
fn test_frame(dst: [u8; 6], seq: u32, len: usize, tag: bool) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
    let at = if tag {
        f[12..16].copy_from_slice(&[0x81, 0x00, 0x00, 0x0a]);
        16
    } else {
        12
    };
    f[at..at + 2].copy_from_slice(&TEST_TYPE);
    f[at + 2..at + 6].copy_from_slice(&seq.to_be_bytes());
    f
}

/// The sequence numbers and lengths of our test frames `rx` received within `within`, until
/// `want` arrived.
fn receive(rx: &PacketSocket, want: usize, within: std::time::Duration) -> Vec<(u32, usize)> {
    let deadline = std::time::Instant::now() + within;
    let mut batch = FrameBatch::new(1024, 1 << 20);
    let mut got = Vec::new();
    while got.len() < want && std::time::Instant::now() < deadline {
        let (n, _) = rx.read_batch(&mut batch);
        if n == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
            continue;
        }
        for i in 0..n {
            let f = batch.frame_mut(i);
            // The ring hands the 802.1Q tag back in the data, as it was on the wire.
            let at = if f[12..14] == [0x81, 0x00] { 16 } else { 12 };
            if f.len() >= at + 6 && f[at..at + 2] == TEST_TYPE {
                let seq = u32::from_be_bytes(f[at + 2..at + 6].try_into().expect("4 bytes"));
                got.push((seq, f.len()));
            }
        }
    }
    got
}

#[test]
fn the_transmit_ring_sends_every_frame_in_order() {
    in_veth_namespace(1500, || {
        let tx = PacketSocket::open("v0").expect("open v0");
        assert!(tx.has_tx_ring(), "the kernel refused the transmit ring");
        // MTU 1500: a slot of 2048 bytes, 1990 of them for the frame.
        assert_eq!(tx.tx_ring_room(), Some(2048 - tx::TX_FRAME));
        let rx = PacketSocket::open("v1").expect("open v1");
        let dst = rx.mac();
        // Twice the ring's 2048 slots, in batches of 700 (so batches wrap around the ring),
        // of every size from 60 to 1514 bytes.
        let count = 4096u32;
        let frames: Vec<Vec<u8>> = (0..count)
            .map(|i| test_frame(dst, i, 60 + (i as usize * 37) % 1455, false))
            .collect();
        let mut scratch = PacketScratch::default();
        let mut sent = 0;
        let mut got = Vec::new();
        for chunk in frames.chunks(700) {
            let r = tx.send_frames(chunk.iter().map(|f| &f[..]), &mut scratch);
            assert_eq!(r.failed(), 0, "{r:?}");
            sent += r.sent;
            got.extend(receive(&rx, chunk.len(), std::time::Duration::from_secs(5)));
        }
        assert_eq!(sent, u64::from(count));
        let want: Vec<(u32, usize)> = frames
            .iter()
            .enumerate()
            .map(|(i, f)| (i as u32, f.len()))
            .collect();
        assert_eq!(got.len(), want.len());
        assert!(got == want, "frames lost, reordered or resized");
    });
}

#[test]
fn frames_the_kernel_would_refuse_are_counted_and_the_rest_sent() {
    in_veth_namespace(1500, || {
        let tx = PacketSocket::open("v0").expect("open v0");
        assert!(tx.has_tx_ring());
        let rx = PacketSocket::open("v1").expect("open v1");
        let dst = rx.mac();
        let frames = [
            test_frame(dst, 0, 1514, false),
            // One byte over MTU + Ethernet header, untagged: the kernel refuses it.
            test_frame(dst, 1, 1515, false),
            // With an 802.1Q tag, 4 bytes more are allowed.
            test_frame(dst, 2, 1518, true),
            test_frame(dst, 3, 1519, true),
            // Larger than a slot.
            test_frame(dst, 4, 3000, false),
            // Shorter than an Ethernet header.
            vec![0u8; 10],
            test_frame(dst, 5, 64, false),
        ];
        let r = tx.send_frames(frames.iter().map(|f| &f[..]), &mut PacketScratch::default());
        assert_eq!(
            r,
            FrameSendReport {
                sent: 3,
                refused: 4,
                queue_full: 0
            }
        );
        let got = receive(&rx, 3, std::time::Duration::from_secs(5));
        assert_eq!(got, vec![(0, 1514), (2, 1518), (5, 64)]);
    });
}

#[test]
fn a_full_transmit_ring_drops_within_the_bound_and_recovers() {
    in_veth_namespace(1500, || {
        let tx = PacketSocket::open("v0").expect("open v0");
        assert!(tx.has_tx_ring());
        let rx = PacketSocket::open("v1").expect("open v1");
        let dst = rx.mac();
        // With the peer down the interface drops every frame at once; the kernel leaves the
        // first marked and stops there, so the ring fills.
        let st = std::process::Command::new("ip")
            .args(["link", "set", "v1", "down"])
            .status()
            .expect("ip");
        assert!(st.success());
        let frames: Vec<Vec<u8>> = (0..3000).map(|i| test_frame(dst, i, 64, false)).collect();
        let started = std::time::Instant::now();
        let r = tx.send_frames(frames.iter().map(|f| &f[..]), &mut PacketScratch::default());
        let took = started.elapsed();
        assert_eq!(r.sent, 0, "{r:?}");
        assert_eq!(
            r.queue_full,
            3000 - 2048,
            "{r:?}: the frames that found no slot"
        );
        assert_eq!(
            r.refused, 2048,
            "{r:?}: the frames the kernel left in the ring"
        );
        assert!(
            took < std::time::Duration::from_millis(500),
            "the wait is bounded: {took:?}"
        );
        // Up again: the ring was emptied, frames flow again, in order.
        let st = std::process::Command::new("ip")
            .args(["link", "set", "v1", "up"])
            .status()
            .expect("ip");
        assert!(st.success());
        let frames: Vec<Vec<u8>> = (0..100).map(|i| test_frame(dst, i, 64, false)).collect();
        let mut r = FrameSendReport::default();
        // The carrier comes back asynchronously.
        for _ in 0..100 {
            r = tx.send_frames(frames.iter().map(|f| &f[..]), &mut PacketScratch::default());
            if r.sent == 100 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(r.sent, 100, "{r:?}");
        let got = receive(&rx, 100, std::time::Duration::from_secs(5));
        let seqs: Vec<u32> = got.iter().map(|(s, _)| *s).collect();
        assert_eq!(seqs, (0..100).collect::<Vec<u32>>());
    });
}

#[test]
fn without_a_ring_frames_go_with_sendmmsg() {
    in_veth_namespace(1500, || {
        let tx = PacketSocket::open_with("v0", TxMode::Sendmmsg).expect("open v0");
        assert!(!tx.has_tx_ring());
        assert_eq!(tx.tx_ring_room(), None);
        let rx = PacketSocket::open("v1").expect("open v1");
        let frames: Vec<Vec<u8>> = (0..10)
            .map(|i| test_frame(rx.mac(), i, 100, false))
            .collect();
        let r = tx.send_frames(frames.iter().map(|f| &f[..]), &mut PacketScratch::default());
        assert_eq!(r.sent, 10, "{r:?}");
        let seqs: Vec<u32> = receive(&rx, 10, std::time::Duration::from_secs(5))
            .iter()
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(seqs, (0..10).collect::<Vec<u32>>());
    });
}

#[test]
fn transmit_ring_geometry_fits_the_mtu() {
    assert_eq!(tx::geometry(1500), (2048, 2048));
    assert_eq!(tx::geometry(9000), (16384, 256));
    // Loopback's 64 KiB MTU: the largest slot; longer frames are refused.
    assert_eq!(tx::geometry(65536), (16384, 256));
    for mtu in [576, 1500, 9000, 65536] {
        let (slot, slots) = tx::geometry(mtu);
        let req = tx::request(slot, slots);
        assert_eq!(
            req.tp_block_size as usize * req.tp_block_nr as usize,
            slot * slots
        );
        assert_eq!(req.tp_block_size as usize % slot, 0);
        assert_eq!(req.tp_block_size as usize % 4096, 0);
    }
}
