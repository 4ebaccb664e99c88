//! A minimal UDP driver for the IKE engine, for manual interoperability checks against
//! strongSwan: binds ports 500 and 4500 on one address, strips/adds the RFC 3948 non-ESP
//! marker, prints events, and optionally initiates and rekeys.
//!
//! ```text
//! cargo run -p protego-ike --example ike_peer -- --local 10.99.0.2 --remote 10.99.0.1 \
//!     --local-id gw.example --remote-id hq.example --psk secret \
//!     --local-ts 10.2.0.0/24 --remote-ts 10.1.0.0/24 [--initiate] [--rekey-child 20] \
//!     [--rekey-ike 40] [--terminate 60] [--run 90] [--ike PROPOSAL] [--esp PROPOSAL]
//! ```

use protego_ike::*;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut args: HashMap<String, String> = HashMap::new();
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let k = k.trim_start_matches("--").to_string();
        if k == "initiate" {
            args.insert(k, "1".into());
        } else {
            args.insert(k, it.next().ok_or("missing value")?);
        }
    }
    let get = |k: &str, d: &str| args.get(k).cloned().unwrap_or_else(|| d.to_string());
    let local: IpAddr = get("local", "10.99.0.2").parse()?;
    let remote: IpAddr = get("remote", "10.99.0.1").parse()?;
    let secs = |k: &str| {
        args.get(k)
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_secs)
    };
    let peer = PeerConfig {
        id: TunnelId(1),
        name: "interop".into(),
        local_addrs: vec![local],
        remote_addrs: vec![remote],
        local_id: Identity::parse(&get("local-id", "gw.example"))?,
        remote_id: Identity::parse(&get("remote-id", "hq.example"))?,
        psk: Zeroizing::new(get("psk", "secret").into_bytes()),
        ike_proposals: get("ike", "aes256gcm16-prfsha256-x25519")
            .split(',')
            .map(IkeProposal::parse)
            .collect::<Result<_, _>>()?,
        esp_proposals: get("esp", "aes256gcm16")
            .split(',')
            .map(EspProposal::parse)
            .collect::<Result<_, _>>()?,
        local_ts: get("local-ts", "10.2.0.0/24")
            .split(',')
            .map(TrafficSelector::parse)
            .collect::<Result<_, _>>()?,
        remote_ts: get("remote-ts", "10.1.0.0/24")
            .split(',')
            .map(TrafficSelector::parse)
            .collect::<Result<_, _>>()?,
        ike_rekey_time: secs("ike-rekey-time").unwrap_or(Duration::ZERO),
        ike_over_time: secs("ike-over-time").unwrap_or(Duration::ZERO),
        child_rekey_time: secs("child-rekey-time").unwrap_or(Duration::ZERO),
        child_life_time: Duration::ZERO,
        rand_time: Duration::ZERO,
        dpd_delay: secs("dpd"),
        dpd_action: DpdAction::Clear,
        start_action: StartAction::None,
        replay_window: 64,
        resource_sas: protego_ike::DEFAULT_RESOURCE_SAS,
    };
    let s500 = UdpSocket::bind(SocketAddr::new(local, 500))?;
    let s4500 = UdpSocket::bind(SocketAddr::new(local, 4500))?;
    s500.set_nonblocking(true)?;
    s4500.set_nonblocking(true)?;
    let start = Instant::now();
    let mut ep = Endpoint::new(
        EndpointConfig {
            key_log: true,
            ..Default::default()
        },
        Box::new(crypto::SystemRng),
        start,
    );
    ep.add_peer(start, peer)?;
    if args.contains_key("initiate") {
        ep.initiate(start, TunnelId(1))?;
    }
    let run = secs("run").unwrap_or(Duration::from_secs(60));
    let mut actions: Vec<(Duration, &str)> = Vec::new();
    for k in ["rekey-child", "rekey-ike", "terminate"] {
        if let Some(d) = secs(k) {
            actions.push((d, k));
        }
    }
    let mut child: Option<wire::EspSpi> = None;
    let mut buf = vec![0u8; 65536];
    let mut out = Vec::new();
    loop {
        let now = Instant::now();
        if now - start > run {
            break;
        }
        actions.retain(|(at, what)| {
            if now - start < *at {
                return true;
            }
            let r = match *what {
                "rekey-child" => child.map_or(Ok(()), |s| ep.rekey_child(now, s)),
                "rekey-ike" => ep.rekey_ike(now, TunnelId(1)),
                _ => ep.terminate(now, TunnelId(1)),
            };
            println!("ACTION {what}: {r:?}");
            false
        });
        let mut got = false;
        for (sock, natt) in [(&s500, false), (&s4500, true)] {
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                got = true;
                let data = &buf[..n];
                let ike = if natt {
                    if n == 1 && data[0] == 0xff {
                        continue;
                    }
                    if n < 4 || data[..4] != [0, 0, 0, 0] {
                        println!("ESP packet from {from} ({n} bytes)");
                        continue;
                    }
                    &data[4..]
                } else {
                    data
                };
                ep.handle_datagram(Instant::now(), sock.local_addr()?, from, ike);
            }
        }
        let now = Instant::now();
        if ep.poll_timeout().is_some_and(|t| t <= now) {
            ep.handle_timeout(now);
        }
        while let Some(t) = ep.poll_transmit(&mut out) {
            let natt = t.local.port() == 4500;
            let sock = if natt { &s4500 } else { &s500 };
            let mut pkt = Vec::new();
            if natt && !(t.size == 1 && out[0] == 0xff) {
                pkt.extend_from_slice(&[0, 0, 0, 0]);
            }
            pkt.extend_from_slice(&out[..t.size]);
            sock.send_to(&pkt, t.remote)?;
        }
        while let Some(e) = ep.poll_event() {
            match &e {
                Event::ChildSaInstalled(info) => {
                    child = Some(info.inbound_spi);
                    println!(
                        "EVENT ChildSaInstalled in={} out={} {} {:?} <-> {:?} replaces={:?} local={} remote={}",
                        info.inbound_spi, info.outbound_spi, info.proposal, info.local_ts, info.remote_ts, info.replaces, info.local, info.remote
                    );
                }
                Event::KeyLog { line, .. } => println!("KEYLOG {line}"),
                other => println!("EVENT {other:?}"),
            }
        }
        if !got {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for s in ep.status(Instant::now()) {
        println!("STATUS {s:?}");
    }
    Ok(())
}
