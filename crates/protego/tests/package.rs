//! The Debian package of `make deb`, built by the same script (scripts/deb.sh) from this test
//! build's `protego` (the dev profile: `make deb` builds the release profile, whose thin-LTO
//! build would take most of the test's time), unpacked into a scratch root and checked: the
//! control data (Depends computed from the binary's libraries: libc6 only, no strongSwan; the
//! example configuration a conffile; maintainer scripts that enable, start and restart nothing
//! and stop every unit on removal), the binary runs, a manual page for every command that `--help` lists, each rendered by groff
//! without a warning and indexed by man-db, the example configuration accepted by `protego
//! check` (also with its commented tunnel enabled), the units' commands and directories
//! agreeing with the binary's defaults, `systemd-analyze verify` on every installed unit, and
//! systemd's offline security analysis of what each unit may do (capabilities, address
//! families, system calls), also with the shipped xdp drop-in.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Programs the test runs (scripts/requirements.tsv names their packages).
const PROGRAMS: &[&str] = &[
    "dpkg-deb",
    "dpkg-shlibdeps",
    "strip",
    "systemd-analyze",
    "groff",
    "lexgrog",
    "gzip",
];

/// Where the units are installed (cargo-deb's directory; /lib is /usr/lib on Debian 12).
const UNIT_DIR: &str = "usr/lib/systemd/system";

/// A scratch directory, removed when the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd`, panicking with its output unless it succeeds.
fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The subcommands the "Commands:" section of a `--help` text lists (clap's `help` left out).
fn commands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_owned)
        .collect()
}

/// Every command path `bin --help` reaches, walking the subcommands: `[]`, `["up"]`, ...
fn command_paths(bin: &Path) -> Vec<Vec<String>> {
    let mut paths = vec![Vec::new()];
    let mut i = 0;
    while i < paths.len() {
        let path = paths[i].clone();
        let help = run(Command::new(bin).args(&path).arg("--help"));
        for c in commands(&text(&help.stdout)) {
            let mut sub = path.clone();
            sub.push(c);
            paths.push(sub);
        }
        i += 1;
    }
    paths
}

/// The `[default: ...]` of `--config` in `protego ROLE --help`.
fn default_config(bin: &Path, role: &str) -> String {
    let help = text(&run(Command::new(bin).args([role, "--help"])).stdout);
    let after = help
        .split("--config <FILE>")
        .nth(1)
        .unwrap_or_else(|| panic!("no --config in `{role} --help`: {help}"));
    let start = after.find("[default: ").expect("a default") + "[default: ".len();
    after[start..].split(']').next().unwrap().to_owned()
}

/// The values of `key` in a unit file, in order.
fn unit_values(unit: &str, key: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_owned)
        .collect()
}

/// systemd's offline security analysis of `unit` under `root`: setting name -> whether it is
/// restricted (`true`: what the name's `~` denies is denied).
fn security(root: &Path, unit: &str) -> BTreeMap<String, Option<bool>> {
    let out = run(Command::new("systemd-analyze").args([
        "security",
        "--offline=yes",
        &format!("--root={}", root.display()),
        "--json=short",
        "--no-pager",
        unit,
    ]));
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).expect("JSON");
    entries
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_owned(), e["set"].as_bool()))
        .collect()
}

/// What systemd's offline security analysis calls the settings checked per unit.
const NET_ADMIN: &str = "CapabilityBoundingSet=~CAP_NET_ADMIN";
const NET_BIND_RAW: &str = "CapabilityBoundingSet=~CAP_NET_(BIND_SERVICE|BROADCAST|RAW)";
const BPF: &str = "CapabilityBoundingSet=~CAP_BPF";
const WRITE_EXECUTE: &str = "MemoryDenyWriteExecute=";
const PACKET: &str = "RestrictAddressFamilies=~AF_PACKET";
const UNIX: &str = "RestrictAddressFamilies=~AF_UNIX";
const NETLINK: &str = "RestrictAddressFamilies=~AF_NETLINK";
const EXOTIC: &str = "RestrictAddressFamilies=~…";
const PRIVILEGED: &str = "SystemCallFilter=~@privileged";
/// Every setting checked: a unit must restrict each one except those it lists as open.
const CHECKED: &[&str] = &[
    NET_ADMIN,
    NET_BIND_RAW,
    BPF,
    WRITE_EXECUTE,
    PACKET,
    UNIX,
    NETLINK,
    EXOTIC,
    PRIVILEGED,
    "NoNewPrivileges=",
    "ProtectSystem=",
    "ProtectHome=",
    "PrivateTmp=",
    "ProtectKernelTunables=",
    "ProtectKernelModules=",
    "ProtectControlGroups=",
    "RestrictNamespaces=~net",
    "CapabilityBoundingSet=~CAP_SYS_ADMIN",
    "CapabilityBoundingSet=~CAP_(DAC_*|FOWNER|IPC_OWNER)",
    "CapabilityBoundingSet=~CAP_SYS_MODULE",
];

#[test]
fn debian_package_installs_units_man_pages_and_a_valid_example() {
    let test = "debian_package_installs_units_man_pages_and_a_valid_example";
    for program in PROGRAMS {
        if !testreq::program(test, program) {
            return;
        }
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let cargo_deb = Command::new(&cargo).args(["deb", "--version"]).output();
    if !testreq::need(
        test,
        cargo_deb.is_ok_and(|o| o.status.success()),
        "cargo-deb is not installed",
        "scripts/setup.sh installs it (scripts/deb.sh --install-tool)",
    ) {
        return;
    }
    let scratch = Scratch(std::env::temp_dir().join(format!("protego-deb-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&scratch.0);
    let dir = &scratch.0;

    let deb = build(dir, &cargo);
    let root = dir.join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root));
    check_control(&deb, &dir.join("control"));
    let bin = root.join("usr/bin/protego");
    let version = run(Command::new(&bin).arg("--version"));
    assert_eq!(
        text(&version.stdout).trim(),
        format!("protego {}", env!("CARGO_PKG_VERSION"))
    );
    check_man_pages(&bin, &root.join("usr/share/man/man1"));
    check_example(&bin, &root.join("etc/protego/protego.toml.example"), dir);
    check_units(&bin, &root.join(UNIT_DIR));
    check_hardening(&root);
    for doc in [
        "README.md",
        "docs/operations.md",
        "docs/configuration.md",
        "copyright",
        "examples/grafana/protego.json",
        "examples/filters/udp_firewall.c",
    ] {
        assert!(
            root.join("usr/share/doc/protego").join(doc).is_file(),
            "{doc}"
        );
    }
}

/// Runs scripts/deb.sh as `make deb` does, on a copy of this test build's binary put where
/// the script and cargo-deb look for the build (`--no-build`); returns the package.
fn build(dir: &Path, cargo: &std::ffi::OsStr) -> PathBuf {
    let release = dir.join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_protego"), release.join("protego")).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = dir.join("out");
    let built = run(Command::new("bash")
        .arg(repo.join("scripts/deb.sh"))
        .args(["--no-build", "--output"])
        .arg(&out)
        .args(["--", "--fast"])
        .env("CARGO", cargo)
        .env("CARGO_TARGET_DIR", dir.join("target")));
    let debs: Vec<PathBuf> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    assert_eq!(debs.len(), 1, "{debs:?}\n{}", text(&built.stderr));
    debs.into_iter().next().unwrap()
}

/// The control fields, the conffile, and maintainer scripts that enable, start and restart
/// nothing on installation and upgrade and stop every unit on removal.
fn check_control(deb: &Path, control: &Path) {
    let field = |name: &str| {
        let out = run(Command::new("dpkg-deb").arg("--field").arg(deb).arg(name));
        text(&out.stdout).trim().to_owned()
    };
    assert_eq!(field("Package"), "protego");
    assert_eq!(field("Version"), format!("{}-1", env!("CARGO_PKG_VERSION")));
    assert_eq!(field("Architecture"), "amd64");
    // Computed from the binary's libraries (libc, libm, libgcc_s): libc6 only, which is what
    // docs/operations.md says. strongSwan, etcd, clang are never run-time dependencies.
    let depends = field("Depends");
    assert!(
        depends.split(',').all(|d| d.trim().starts_with("libc6 ")),
        "Depends: {depends}"
    );
    run(Command::new("dpkg-deb").arg("-e").arg(deb).arg(control));
    assert_eq!(
        read(&control.join("conffiles")).trim(),
        "/etc/protego/protego.toml.example"
    );
    for script in ["postinst", "prerm", "postrm"] {
        run(Command::new("sh").arg("-n").arg(control.join(script)));
    }
    let postinst = read(&control.join("postinst"));
    assert!(!postinst.contains("deb-systemd-invoke"), "{postinst}");
    assert!(
        !postinst.contains("Enables the unit on first installation"),
        "{postinst}"
    );
    let prerm = read(&control.join("prerm"));
    assert!(prerm.contains("[ \"$1\" = remove ]"), "{prerm}");
    let stop =
        "deb-systemd-invoke stop protego-control.service protego-steer.service protego.service";
    assert!(prerm.contains(stop), "{prerm}");
    assert!(prerm.contains("'protego-data@*.service'"), "{prerm}");
    assert!(read(&control.join("postrm")).contains("daemon-reload"));
}

/// One page per command path `--help` reaches, valid roff without a groff warning, its NAME
/// line read by man-db.
fn check_man_pages(bin: &Path, man1: &Path) {
    let version = env!("CARGO_PKG_VERSION");
    let installed: BTreeSet<String> = std::fs::read_dir(man1)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = command_paths(bin)
        .iter()
        .map(|p| {
            let mut name = vec!["protego".to_owned()];
            name.extend(p.iter().cloned());
            format!("{}.1.gz", name.join("-"))
        })
        .collect();
    assert!(
        expected.len() > 30 && expected.contains("protego-ctl-route-add.1.gz"),
        "{expected:?}"
    );
    assert_eq!(installed, expected);
    for page in &installed {
        let path = man1.join(page);
        let name = page.trim_end_matches(".1.gz");
        let roff = text(&run(Command::new("gzip").arg("-dc").arg(&path)).stdout);
        let title = roff.lines().find(|l| l.starts_with(".TH ")).unwrap_or("");
        let date = title
            .strip_prefix(&format!(".TH {name} 1 "))
            .and_then(|rest| rest.strip_suffix(&format!(" \"protego {version}\" Protego")));
        assert!(
            date.is_some_and(|d| d.len() == 10 && d.as_bytes()[4] == b'-'),
            "{page}: {title}"
        );
        let rendered = run(Command::new("sh")
            .arg("-c")
            .arg("gzip -dc \"$1\" | groff -k -man -Tutf8 -ww -z")
            .arg("sh")
            .arg(&path));
        assert!(
            rendered.stderr.is_empty(),
            "{page}: groff: {}",
            text(&rendered.stderr)
        );
        let whatis = text(&run(Command::new("lexgrog").arg(&path)).stdout);
        assert!(
            whatis.contains(&format!("\"{name} - ")),
            "{page}: lexgrog: {whatis}"
        );
    }
}

/// The example is valid as shipped and with its commented tunnel enabled (and a PSK file),
/// and names the store and control socket the code uses by default.
fn check_example(bin: &Path, example: &Path, dir: &Path) {
    let check = |file: &Path| {
        let out = run(Command::new(bin).args(["check", "--config"]).arg(file));
        text(&out.stdout)
    };
    let checked = check(example);
    assert!(
        checked.contains("1 tenant(s), 1 vnet(s), 0 tunnel(s)"),
        "{checked}"
    );
    let shipped = read(example);
    for (key, default) in [
        ("path", control::config::DEFAULT_STORE_PATH),
        ("control_socket", control::config::DEFAULT_CONTROL_SOCKET),
    ] {
        assert!(
            shipped.contains(&format!("\n{key} = \"{default}\"")),
            "{key}"
        );
    }
    let etc = dir.join("etc");
    std::fs::create_dir_all(etc.join("psk")).unwrap();
    std::fs::write(etc.join("psk/acme-hq.psk"), "a test secret\n").unwrap();
    let mut in_tunnel = false;
    let enabled: String = shipped
        .lines()
        .map(|l| {
            in_tunnel = (in_tunnel || l == "# [[tunnel]]") && l.starts_with("# ");
            format!("{}\n", if in_tunnel { &l[2..] } else { l })
        })
        .collect();
    std::fs::write(etc.join("protego.toml"), enabled).unwrap();
    let checked = check(&etc.join("protego.toml"));
    assert!(
        checked.contains("1 tunnel(s)") && checked.contains("acme-hq"),
        "{checked}"
    );
}

/// The units run the binary's default files, keep its default store and socket in their
/// directories, reload with `ctl apply`, and hold the capabilities docs/operations.md lists.
fn check_units(bin: &Path, units: &Path) {
    let unit = |name: &str| read(&units.join(name));
    let exec = |name: &str| unit_values(&unit(name), "ExecStart");
    let gateway = default_config(bin, "up");
    assert_eq!(default_config(bin, "control"), gateway);
    let steer = default_config(bin, "steer");
    assert_eq!(
        exec("protego.service"),
        [format!("/usr/bin/protego up --config {gateway}")]
    );
    assert_eq!(
        exec("protego-control.service"),
        [format!("/usr/bin/protego control --config {gateway}")]
    );
    assert_eq!(
        exec("protego-steer.service"),
        [format!("/usr/bin/protego steer --config {steer}")]
    );
    let data = exec("protego-data@.service");
    assert_eq!(
        data,
        ["/usr/bin/protego data --config /etc/protego/%i.toml"]
    );
    let data_default = default_config(bin, "data");
    assert_eq!(
        data[0].replace("%i", "data"),
        format!("/usr/bin/protego data --config {data_default}")
    );
    for name in ["protego.service", "protego-control.service"] {
        let u = unit(name);
        let reload = format!("/usr/bin/protego ctl --config {gateway} apply --file {gateway}");
        assert_eq!(unit_values(&u, "ExecReload"), [reload], "{name}");
        let state = format!("/var/lib/{}/", unit_values(&u, "StateDirectory")[0]);
        let runtime = format!("/run/{}/", unit_values(&u, "RuntimeDirectory")[0]);
        assert!(control::config::DEFAULT_STORE_PATH.starts_with(&state));
        assert!(control::config::DEFAULT_CONTROL_SOCKET.starts_with(&runtime));
    }
    for (name, caps) in [
        (
            "protego.service",
            "CAP_NET_ADMIN CAP_NET_BIND_SERVICE CAP_NET_RAW",
        ),
        ("protego-control.service", ""),
        (
            "protego-steer.service",
            "CAP_NET_ADMIN CAP_NET_BIND_SERVICE CAP_NET_RAW",
        ),
        ("protego-data@.service", "CAP_NET_ADMIN"),
    ] {
        assert_eq!(
            unit_values(&unit(name), "CapabilityBoundingSet"),
            [caps],
            "{name}"
        );
    }
}

/// systemd's own reading of the installed units: `verify` (ExecStart resolved in the root,
/// every man: page of Documentation= among the installed pages), then its offline security
/// analysis of what each may do, also of a data node with the xdp drop-in.
fn check_hardening(root: &Path) {
    for name in [
        "protego.service",
        "protego-control.service",
        "protego-steer.service",
        "protego-data@data.service",
    ] {
        let verified = run(Command::new("systemd-analyze")
            .args(["verify", "--recursive-errors=no"])
            .arg(format!("--root={}", root.display()))
            .arg(name)
            .env("MANPATH", root.join("usr/share/man")));
        assert!(
            verified.stderr.is_empty(),
            "{name}: {}",
            text(&verified.stderr)
        );
    }
    let assert_open = |name: &str, open: &[&str]| {
        let found = security(root, name);
        for setting in CHECKED {
            let restricted = !open.contains(setting);
            assert_eq!(
                found.get(*setting),
                Some(&Some(restricted)),
                "{name}: {setting}"
            );
        }
    };
    assert_open(
        "protego.service",
        &[NET_ADMIN, NET_BIND_RAW, WRITE_EXECUTE, PACKET, UNIX],
    );
    assert_open("protego-control.service", &[UNIX]);
    assert_open("protego-steer.service", &[NET_ADMIN, NET_BIND_RAW, PACKET]);
    assert_open("protego-data@data.service", &[NET_ADMIN, WRITE_EXECUTE]);
    let dropin = root.join("etc/systemd/system/protego-data@.service.d");
    std::fs::create_dir_all(&dropin).unwrap();
    let xdp = root.join("usr/share/doc/protego/examples/systemd/xdp.conf");
    std::fs::copy(xdp, dropin.join("xdp.conf")).unwrap();
    assert_open(
        "protego-data@data.service",
        &[
            NET_ADMIN,
            WRITE_EXECUTE,
            NET_BIND_RAW,
            BPF,
            NETLINK,
            EXOTIC,
            PRIVILEGED,
        ],
    );
}
