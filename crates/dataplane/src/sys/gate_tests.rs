//! The gate against the real kernel: datagrams on a loopback socket with the program attached.

use super::*;
use std::net::UdpSocket;
use std::os::fd::AsRawFd;
use std::time::Duration;

/// A gate for two workers, or None (the test returns) where `bpf(2)` is refused and the run
/// is not strict.
fn gate() -> Option<Gate> {
    let g = Gate::new(2);
    let test = testreq::this_test();
    let ok = testreq::need(
        &test,
        g.is_ok(),
        &format!("bpf(2) socket filters: {:?}", g.as_ref().err()),
        "run as root (CAP_BPF and CAP_NET_ADMIN) on Linux 5.5 or later",
    );
    ok.then(|| g.expect("checked"))
}

/// A receiving socket with `keyed`'s program, and a sender.
fn pair(g: &Gate, keyed: Keyed) -> (UdpSocket, UdpSocket) {
    let rx = UdpSocket::bind("127.0.0.1:0").expect("bind");
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    g.attach(rx.as_raw_fd(), keyed).expect("attach");
    let tx = UdpSocket::bind("127.0.0.1:0").expect("bind");
    tx.connect(rx.local_addr().expect("addr")).expect("connect");
    (rx, tx)
}

/// Sends each payload, then reads what arrived (in order), tagged by its first 8 bytes.
fn through(rx: &UdpSocket, tx: &UdpSocket, payloads: &[Vec<u8>]) -> Vec<Vec<u8>> {
    for p in payloads {
        tx.send(p).expect("send");
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    while let Ok(n) = rx.recv(&mut buf) {
        got.push(buf[..n].to_vec());
    }
    got
}

fn esp(spi: u32, seq: u32) -> Vec<u8> {
    let mut p = spi.to_be_bytes().to_vec();
    p.extend(seq.to_be_bytes());
    p.extend([0xab; 40]);
    p
}

fn vxlan(vni: u32, seq: u8) -> Vec<u8> {
    let mut p = vec![0x08, 0, 0, 0];
    p.extend((vni << 8).to_be_bytes());
    p.extend([seq; 50]);
    p
}

#[test]
fn a_tenant_is_dropped_by_its_spi_only_while_every_worker_refuses_it() {
    let Some(g) = gate() else { return };
    let (rx, tx) = pair(&g, Keyed::Spi);
    assert_eq!(
        g.sync(Keyed::Spi, [(0x1000, 3), (0x2000, 4)].into_iter()),
        0
    );
    let ike = {
        let mut p = vec![0, 0, 0, 0];
        p.extend([0x11; 30]);
        p
    };
    let sent = vec![
        esp(0x1000, 1),
        esp(0x2000, 2),
        ike.clone(),
        vec![0x10, 0],
        esp(0x3000, 3),
    ];
    assert_eq!(through(&rx, &tx, &sent), sent, "nobody refused: all pass");

    // One of two workers refuses slot 3: the other may still serve it.
    g.refuse(3, 0, true);
    assert_eq!(through(&rx, &tx, &sent), sent);
    assert_eq!(g.drops(3), 0);

    // Both refuse it: its SPI's datagrams are dropped and counted, nothing else.
    g.refuse(3, 1, true);
    let got = through(&rx, &tx, &sent);
    assert_eq!(got, sent[1..].to_vec());
    assert_eq!(g.drops(3), 1);
    assert_eq!(g.drops(4), 0);

    // One worker admits it again.
    g.refuse(3, 0, false);
    assert_eq!(through(&rx, &tx, &sent), sent);
    assert_eq!(g.drops(3), 1);

    // The keys follow the tables: SPI 0x1000 removed, 0x3000 now slot 3's.
    g.refuse(3, 0, true);
    assert_eq!(
        g.sync(Keyed::Spi, [(0x2000, 4), (0x3000, 3)].into_iter()),
        0
    );
    let got = through(&rx, &tx, &sent);
    assert_eq!(got, sent[..4].to_vec());
    assert_eq!(g.drops(3), 2);
}

#[test]
fn a_tenant_is_dropped_by_its_vni() {
    let Some(g) = gate() else { return };
    let (rx, tx) = pair(&g, Keyed::Vni);
    g.sync(Keyed::Vni, [(77, 5), (78, 6)].into_iter());
    let sent = vec![vxlan(77, 1), vxlan(78, 2), vxlan(79, 3), vec![8, 0, 0]];
    g.refuse(5, 0, true);
    g.refuse(5, 1, true);
    let got = through(&rx, &tx, &sent);
    assert_eq!(got, sent[1..].to_vec());
    assert_eq!(g.drops(5), 1);
    // The SPI program's keys are not the VNI program's.
    assert_eq!(g.drops(6), 0);
    g.refuse(5, 1, false);
    assert_eq!(through(&rx, &tx, &sent), sent);
}

#[test]
fn the_programs_load_for_any_number_of_workers() {
    if gate().is_none() {
        return;
    }
    for workers in [1, 3, 63, MAX_WORKERS] {
        if let Err(e) = Gate::new(workers) {
            panic!("{workers} workers: {e}");
        }
    }
}

#[test]
fn more_workers_than_the_masks_hold_are_refused() {
    let err = Gate::new(MAX_WORKERS + 1).err().expect("refused");
    assert!(err.to_string().contains("64"), "{err}");
}

/// `UDP_SEGMENT` and `UDP_GRO` (linux/udp.h).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Sets an integer UDP socket option.
fn udp_opt(s: &UdpSocket, opt: libc::c_int, v: libc::c_int) {
    // SAFETY: a c_int option of the right length on a valid socket.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_UDP,
            opt,
            std::ptr::from_ref(&v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(
        r,
        0,
        "setsockopt {opt}: {}",
        std::io::Error::last_os_error()
    );
}

/// A GSO train of ten datagrams (one send with `UDP_SEGMENT`) counts ten drops, whether the
/// receiving socket takes it whole (UDP GRO, as the gateway's sockets) or segmented.
#[test]
fn a_train_counts_each_of_its_datagrams() {
    let Some(g) = gate() else { return };
    g.sync(Keyed::Spi, [(0x1000, 3)].into_iter());
    g.refuse(3, 0, true);
    g.refuse(3, 1, true);
    let mut expected = 0;
    for gro in [true, false] {
        let (rx, tx) = pair(&g, Keyed::Spi);
        if gro {
            udp_opt(&rx, UDP_GRO, 1);
        }
        let seg = esp(0x1000, 1);
        udp_opt(&tx, UDP_SEGMENT, seg.len() as libc::c_int);
        let train: Vec<u8> = (0..10).flat_map(|_| seg.clone()).collect();
        tx.send(&train).expect("send");
        let mut buf = [0u8; 2048];
        assert!(rx.recv(&mut buf).is_err(), "a refused train arrived");
        expected += 10;
        assert_eq!(g.drops(3), expected, "GRO {gro}");
    }
}

/// A train whose datagrams have different keys (one peer's tunnels of two tenants) passes
/// whole: the workers refuse what is to be refused in it.
#[test]
fn a_train_of_several_keys_passes() {
    let Some(g) = gate() else { return };
    g.sync(Keyed::Spi, [(0x1000, 3), (0x2000, 4)].into_iter());
    g.refuse(3, 0, true);
    g.refuse(3, 1, true);
    let (rx, tx) = pair(&g, Keyed::Spi);
    udp_opt(&rx, UDP_GRO, 1);
    let seg = esp(0x1000, 1);
    udp_opt(&tx, UDP_SEGMENT, seg.len() as libc::c_int);
    // The refused tenant's SPI first, the other's last.
    let mut train: Vec<u8> = (0..9).flat_map(|_| seg.clone()).collect();
    train.extend(esp(0x2000, 2));
    tx.send(&train).expect("send");
    let mut buf = [0u8; 4096];
    let n = rx.recv(&mut buf).expect("the mixed train arrives");
    assert_eq!(n, train.len(), "whole, as one GRO buffer");
    assert_eq!(g.drops(3), 0);
}

/// A refused tenant's budget lets that many datagrams through, then the rest is dropped; a
/// train takes its datagrams from it (and passes if any was left).
#[test]
fn a_refused_tenant_passes_on_its_budget() {
    let Some(g) = gate() else { return };
    g.sync(Keyed::Spi, [(0x1000, 3)].into_iter());
    let (rx, tx) = pair(&g, Keyed::Spi);
    g.refuse(3, 0, true);
    g.refuse(3, 1, true);
    g.grant(3, 2);
    let sent: Vec<Vec<u8>> = (0..5).map(|i| esp(0x1000, i)).collect();
    assert_eq!(through(&rx, &tx, &sent), sent[..2].to_vec());
    assert_eq!(g.drops(3), 3);
    // A new grant replaces what is left.
    g.grant(3, 1);
    assert_eq!(through(&rx, &tx, &sent), sent[..1].to_vec());
    assert_eq!(g.drops(3), 7);
    // A train of ten takes ten: dropped on a budget of nine (which it leaves), through on
    // a budget of fifteen, leaving five.
    udp_opt(&rx, UDP_GRO, 1);
    let seg = esp(0x1000, 9);
    udp_opt(&tx, UDP_SEGMENT, seg.len() as libc::c_int);
    let train: Vec<u8> = (0..10).flat_map(|_| seg.clone()).collect();
    let mut buf = [0u8; 4096];
    g.grant(3, 9);
    tx.send(&train).expect("send");
    assert!(
        rx.recv(&mut buf).is_err(),
        "a train larger than the budget is dropped"
    );
    assert_eq!(g.drops(3), 17);
    g.grant(3, 15);
    tx.send(&train).expect("send");
    assert_eq!(rx.recv(&mut buf).expect("through"), train.len());
    assert_eq!(through(&rx, &tx, &sent), sent[..5].to_vec());
    assert_eq!(g.drops(3), 17);
}
