//! `protego-probe send BIND TO RATE SECONDS` sends a paced stream of numbered, timestamped
//! UDP datagrams; `protego-probe recv BIND FILE IDLE_MS LIMIT_SECONDS` receives them and
//! writes `seq,sent_ns,arrived_ns` per datagram to FILE (see `protego_testbed::probe`). The
//! receiver prints `listening` once bound and ends after IDLE_MS without a datagram (after
//! the first) or LIMIT_SECONDS in all.

use protego_testbed::probe;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

fn usage() -> ExitCode {
    eprintln!(
        "usage: protego-probe send BIND TO RATE SECONDS | recv BIND FILE IDLE_MS LIMIT_SECONDS"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = |s: &str| s.parse::<SocketAddr>().map_err(|e| format!("{s}: {e}"));
    let result = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["send", bind, to, rate, secs] => (|| {
            let rate: u32 = rate.parse().map_err(|e| format!("rate {rate}: {e}"))?;
            let secs: f64 = secs.parse().map_err(|e| format!("seconds {secs}: {e}"))?;
            if rate == 0 || !secs.is_finite() || secs <= 0.0 {
                return Err("rate and seconds must be positive".to_owned());
            }
            let sent = probe::send(addr(bind)?, addr(to)?, rate, Duration::from_secs_f64(secs))
                .map_err(|e| e.to_string())?;
            println!("sent {sent}");
            Ok(())
        })(),
        ["recv", bind, file, idle, limit] => (|| {
            let idle: u64 = idle.parse().map_err(|e| format!("idle {idle}: {e}"))?;
            let limit: u64 = limit.parse().map_err(|e| format!("limit {limit}: {e}"))?;
            let mut out = std::io::BufWriter::new(
                std::fs::File::create(file).map_err(|e| format!("{file}: {e}"))?,
            );
            let got = probe::receive(
                addr(bind)?,
                &mut out,
                Duration::from_millis(idle),
                Duration::from_secs(limit),
                || eprintln!("listening"),
            )
            .map_err(|e| e.to_string())?;
            println!("received {got}");
            Ok(())
        })(),
        _ => return usage(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("protego-probe: {e}");
            ExitCode::FAILURE
        }
    }
}
