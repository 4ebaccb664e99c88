//! `protego-preflight`: prints which programs and kernel features the tests will find, before
//! `make test` runs them. Under `make test` and in CI ([`testreq::strict`]) it exits with status 1
//! when a program of `scripts/requirements.tsv` is missing or network namespaces cannot be made,
//! naming what to install; kernel features the product adapts to (TUN offloads) are reported
//! only.

use protego_testreq as testreq;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::ExitCode;

fn main() -> ExitCode {
    println!("preflight: what the tests will find on this machine");
    let mut missing = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for r in testreq::requirements() {
        let Some(program) = r.program else { continue };
        if !seen.insert(program) {
            continue;
        }
        match testreq::find(program) {
            Some(path) => println!("  found    {:<28} {}", short(program), path.display()),
            None => {
                println!(
                    "  MISSING  {:<28} (Debian package {}: {})",
                    short(program),
                    r.package,
                    r.used_by
                );
                missing.push(r.package);
            }
        }
    }
    let ss6 = testreq::strongswan6_daemon();
    match &ss6 {
        Some(path) => println!(
            "  found    {:<28} {}",
            "strongSwan 6 (Debian 13)",
            path.display()
        ),
        None => {
            println!(
                "  MISSING  {:<28} ({}: scripts/strongswan6.sh, run by scripts/setup.sh)",
                "strongSwan 6 (Debian 13)",
                testreq::strongswan6_root().display()
            );
            missing.push("strongSwan 6 root");
        }
    }
    // cargo-deb comes from `cargo install`, not apt (the package test, `make deb`).
    match testreq::find("cargo-deb") {
        Some(path) => println!("  found    {:<28} {}", "cargo-deb", path.display()),
        None => {
            println!(
                "  MISSING  {:<28} (cargo install: scripts/deb.sh --install-tool, run by scripts/setup.sh)",
                "cargo-deb"
            );
            missing.push("cargo-deb");
        }
    }
    let netns = testreq::netns_allowed();
    match &netns {
        Ok(()) => println!("  kernel   network namespaces: yes"),
        Err(e) => println!("  kernel   network namespaces: NO ({e})"),
    }
    println!(
        "  kernel   TUN device (/dev/net/tun): {}",
        yes_no(std::path::Path::new("/dev/net/tun").exists())
    );
    match tun_offloads() {
        Ok(found) => println!("  kernel   TUN offloads: {found}"),
        Err(e) => println!("  kernel   TUN offloads: none ({e}); the data path falls back to one packet per syscall"),
    }
    let strict = testreq::strict();
    if missing.is_empty() && netns.is_ok() {
        println!("preflight: ok");
        return ExitCode::SUCCESS;
    }
    missing.sort_unstable();
    missing.dedup();
    if !missing.is_empty() {
        println!(
            "preflight: missing packages: {} (scripts/setup.sh installs them)",
            missing.join(" ")
        );
    }
    if netns.is_err() {
        println!("preflight: network namespaces are required: run the tests as root");
    }
    if strict {
        println!(
            "preflight: failing: under `make test` and in CI a missing requirement is an error"
        );
        ExitCode::FAILURE
    } else {
        println!("preflight: tests that need these will say SKIPPED");
        ExitCode::SUCCESS
    }
}

/// The last path component, for the report's first column.
fn short(program: &str) -> &str {
    program.rsplit('/').next().unwrap_or(program)
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

/// Which TUN offloads the kernel grants (the same negotiation as the data path's TUN device:
/// checksum + TSO + USO, then without USO), on a device made in a private network namespace
/// of a throw-away thread so nothing is left behind.
fn tun_offloads() -> Result<String, String> {
    std::thread::spawn(|| {
        // SAFETY: unshare(2) changes only this thread's namespaces; the thread ends here.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            return Err(format!(
                "cannot make a namespace: {}",
                std::io::Error::last_os_error()
            ));
        }
        let fd = open_vnet_tun().map_err(|e| format!("IFF_VNET_HDR refused: {e}"))?;
        let base = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6;
        let uso = libc::TUN_F_USO4 | libc::TUN_F_USO6;
        if set_offload(&fd, base | uso).is_ok() {
            Ok("checksum, TSO (IPv4, IPv6), USO (IPv4, IPv6)".to_owned())
        } else if set_offload(&fd, base).is_ok() {
            Ok("checksum, TSO (IPv4, IPv6); no USO".to_owned())
        } else {
            Err(format!(
                "TUNSETOFFLOAD refused: {}",
                std::io::Error::last_os_error()
            ))
        }
    })
    .join()
    .unwrap_or_else(|_| Err("the probe thread panicked".into()))
}

fn open_vnet_tun() -> std::io::Result<OwnedFd> {
    // SAFETY: plain open(2) of a constant NUL-terminated path; the result is checked.
    let raw = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: an all-zero ifreq is valid (empty name: the kernel picks one).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_ifru.ifru_flags =
        (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETIFF as _,
            &mut req as *mut libc::ifreq,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

fn set_offload(fd: &OwnedFd, flags: libc::c_uint) -> std::io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes an integer argument.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETOFFLOAD as _,
            flags as libc::c_ulong,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
