//! Prints what one run of a filter costs on this machine, in the JIT and in rbpf's
//! interpreter, on one synthetic packet:
//! `cargo run -p protego-filter --release --example run_cost -- FILE.o [SECTION] [PACKETS]`
//! (SECTION `xdp` by default). The packet is an IPv4/UDP datagram of 64 bytes to 10.0.0.9,
//! port 53; maps start empty (zeroed arrays).

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use filter::run::{Engine, FrameBuf, RunConfig};
use std::process::ExitCode;
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
use std::time::Instant;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: run_cost FILE.o [xdp | xdp:FUNCTION] [PACKETS]");
        return ExitCode::from(2);
    };
    let section = args.next().unwrap_or_else(|| "xdp".to_owned());
    let packets: u32 = args
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    let t = Instant::now();
    let program = match filter::Object::load(&bytes, &section) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let loaded = t.elapsed();
    let instance = match program.instantiate(RunConfig::default()) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "{path} {section}: {} instructions, {} after lowering; load+verify {:?}, instantiate {:?}",
        program.instructions().len(),
        instance.lowered().runnable.len(),
        loaded,
        t.elapsed() - loaded
    );
    let mut packet = vec![
        0x45, 0, 0, 64, 0, 1, 0x40, 0, 64, 17, 0, 0, 192, 0, 2, 1, 10, 0, 0, 9,
    ];
    packet.extend_from_slice(&[0x0f, 0xa0, 0, 53, 0, 44, 0, 0]);
    packet.resize(64, 0);
    let mut frame = FrameBuf::new(1500).expect("a frame below 4 GiB");
    for engine in [Engine::Jit, Engine::Interpreter] {
        let mut rt = instance
            .runtime(0, engine, 1)
            .expect("compiled at instantiate");
        let n = if engine == Engine::Jit {
            packets
        } else {
            packets / 10
        };
        let t = Instant::now();
        for i in 0..n {
            rt.set_now(u64::from(i) * 1000);
            frame.load_ip(&packet).expect("fits");
            std::hint::black_box(rt.run(&mut frame));
        }
        let ns = t.elapsed().as_nanos() as f64 / f64::from(n.max(1));
        println!(
            "{engine:?}: {ns:.1} ns per run (packet copy included), {:?}",
            rt.counters()
        );
    }
    ExitCode::SUCCESS
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn main() -> ExitCode {
    eprintln!("the filter runtime is x86-64 Linux only");
    ExitCode::FAILURE
}
