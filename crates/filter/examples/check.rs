//! Loads and verifies one program of an eBPF object as the gateway would, and prints its maps
//! or why it is refused: `cargo run -p protego-filter --example check -- FILE.o [SECTION]`
//! (SECTION `xdp` by default, or `xdp:FUNCTION`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: check FILE.o [xdp | xdp:FUNCTION]");
        return ExitCode::from(2);
    };
    let section = args.next().unwrap_or_else(|| "xdp".to_owned());
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    match filter::Object::load(&bytes, &section) {
        Ok(p) => {
            println!(
                "{path} {section}: accepted `{}`, {} instructions, loops bounded at {} iterations, verified in {:?}",
                p.function(),
                p.instructions().len(),
                p.loop_bound(),
                started.elapsed()
            );
            for (i, m) in p.maps().iter().enumerate() {
                println!(
                    "  map {} `{}`: {}, key {} B, value {} B, {} entries, flags {:#x}",
                    i + 1,
                    m.name,
                    m.kind,
                    m.key_size,
                    m.value_size,
                    m.max_entries,
                    m.flags
                );
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("{path} {section}: refused: {e}");
            ExitCode::FAILURE
        }
    }
}
