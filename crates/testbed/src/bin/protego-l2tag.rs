//! `protego-l2tag --trunk IF --port IF:S_TAG:C_TAG [--port …]`: joins untagged ports to an
//! 802.1ad / 802.1Q trunk in userspace (see `protego_testbed::l2tag`), standing in for a
//! customer edge router's VLAN sub-interfaces on kernels without VLAN support. Runs until
//! killed.

use protego_testbed::l2tag::{self, Port};
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut trunk = None;
    let mut ports: Vec<Port> = Vec::new();
    while let Some(a) = args.next() {
        let value = args.next();
        match (a.as_str(), value) {
            ("--trunk", Some(v)) => trunk = Some(v),
            ("--port", Some(v)) => match v.parse() {
                Ok(p) => ports.push(p),
                Err(e) => {
                    eprintln!("protego-l2tag: {e}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("usage: protego-l2tag --trunk IF --port IF:S_TAG:C_TAG [--port ...]");
                return ExitCode::from(2);
            }
        }
    }
    let Some(trunk) = trunk else {
        eprintln!("protego-l2tag: --trunk is required");
        return ExitCode::from(2);
    };
    match l2tag::run(&trunk, &ports) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("protego-l2tag: {e}");
            ExitCode::FAILURE
        }
    }
}
