//! End-to-end tests of the `protego` command: `check` on valid and invalid files, `status`
//! without a running node, and a real `protego up` on loopback that serves `status` and stops
//! cleanly on SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn protego() -> Command {
    Command::new(env!("CARGO_BIN_EXE_protego"))
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../control/testdata/example.toml")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("protego runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("protego-cli-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn check_accepts_the_example() {
    let out = run(protego().args(["check", "--config"]).arg(example()));
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("tunnel acme-hq (tenant acme, vnet prod)"),
        "{stdout}"
    );
    assert!(stdout.trim_end().ends_with(": OK"), "{stdout}");
}

#[test]
fn check_rejects_an_invalid_file_with_its_location() {
    let dir = scratch("invalid");
    let original = std::fs::read_to_string(example()).unwrap();
    let broken = original.replace("vni = 2001", "vni = 1001");
    let path = dir.join("protego.toml");
    std::fs::write(&path, broken).unwrap();
    let out = run(protego().args(["check", "-c"]).arg(&path));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let line = original.lines().position(|l| l == "vni = 2001").unwrap() + 1;
    assert!(
        stderr.contains(&format!(
            "{}:{line}:7: key `vni` in [[vnet]] \"main\"",
            path.display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("already used by vnet \"prod\""), "{stderr}");
    assert!(
        stderr.contains(&format!("{line} | vni = 1001")),
        "excerpt missing: {stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn up_refuses_an_invalid_file_before_starting_anything() {
    let dir = scratch("up-invalid");
    let path = dir.join("protego.toml");
    std::fs::write(
        &path,
        "[gateway]\nlisten = [\"127.0.0.1\"]\ncontrol_socket = \"x.sock\"\nbogus = 1\n",
    )
    .unwrap();
    let out = run(protego().args(["up", "--config"]).arg(&path));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(":4:1: key `bogus` in [gateway]: unknown key"),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.join("x.sock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn up_without_its_etcd_stops_at_once_naming_it() {
    let dir = scratch("up-etcd");
    let path = dir.join("protego.toml");
    // Port 1 on loopback: nothing listens there.
    std::fs::write(
        &path,
        "[gateway]\nlisten = [\"127.0.0.1\"]\ncontrol_socket = \"x.sock\"\n\n[store]\nbackend = \"etcd\"\nendpoints = \"http://127.0.0.1:1\"\ntimeout = \"1s\"\n",
    )
    .unwrap();
    let started = Instant::now();
    let out = run(protego().args(["up", "--config"]).arg(&path));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot open the state store") && err.contains("127.0.0.1:1"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!dir.join("x.sock").exists(), "nothing started");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn status_without_a_node_explains() {
    let out = run(protego().args(["status", "--socket", "/nonexistent/protego.sock"]));
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("/nonexistent/protego.sock"), "{stderr}");
    assert!(stderr.contains("is `protego up` running"), "{stderr}");
}

/// Ports unlikely to collide with other tests: derived from the process id.
fn ports() -> (u16, u16, u16) {
    let base = 20_000 + (std::process::id() % 10_000) as u16 * 3;
    (base, base + 1, base + 2)
}

#[test]
fn up_serves_status_and_stops_on_sigterm() {
    let dir = scratch("up");
    let (ike, natt, vxlan) = ports();
    let socket = dir.join("run/protego.sock");
    std::fs::write(dir.join("peer.psk"), "a test secret\n").unwrap();
    let config = format!(
        r#"[gateway]
listen = ["127.0.0.1"]
control_socket = "{socket}"
log_format = "json"
ike_port = {ike}
natt_port = {natt}
vxlan_port = {vxlan}

[[tenant]]
name = "acme"

[[vnet]]
tenant = "acme"
name = "prod"
vni = 42
gateway_ip = "10.2.0.1"
vtep = "127.0.0.1"

[[tunnel]]
name = "branch"
tenant = "acme"
vnet = "prod"
remote_addrs = "%any"
local_id = "gw.example"
remote_id = "branch.example"
psk_file = "peer.psk"
local_ts = "10.2.0.0/24"
remote_ts = "10.3.0.0/24"

[store]
path = "state/protego.redb"
"#,
        socket = socket.display()
    );
    let path = dir.join("protego.toml");
    std::fs::write(&path, config).unwrap();

    let mut child = protego()
        .args(["up", "--config"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !socket.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output().unwrap();
            panic!("protego up exited early ({status}): {}", text(&out.stderr));
        }
        assert!(Instant::now() < deadline, "control socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }

    let out = run(protego()
        .args(["status", "--json", "--socket"])
        .arg(&socket));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["tunnels"][0]["name"], "branch");
    assert_eq!(doc["tunnels"][0]["state"], "down");
    assert_eq!(doc["tunnels"][0]["inside"], "vnet:prod");

    let out = run(protego().args(["status", "--config"]).arg(&path));
    assert!(out.status.success(), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains("branch: DOWN, tenant acme, inside vnet:prod"),
        "{table}"
    );
    assert!(table.contains("remote 'branch.example' @ %any"), "{table}");

    // The IKE state store: created beside the configuration (a relative path), private.
    use std::os::unix::fs::PermissionsExt;
    let store = dir.join("state/protego.redb");
    let mode = std::fs::metadata(&store).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", store.display());
    // A second instance on the same store stops at once, naming it, before taking any socket.
    let second = run(protego().args(["up", "--config"]).arg(&path));
    assert!(!second.status.success());
    let err = text(&second.stderr);
    assert!(
        err.contains("state store") && err.contains("protego.redb"),
        "{err}"
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "protego up did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().unwrap();
    let logs = text(&out.stderr);
    assert!(status.success(), "exit {status}: {logs}");
    assert!(!socket.exists(), "socket removed on exit");
    // JSON log lines, one object per line.
    let up_line = logs
        .lines()
        .find(|l| l.contains("protego is up"))
        .unwrap_or_else(|| panic!("{logs}"));
    let v: serde_json::Value = serde_json::from_str(up_line).unwrap();
    assert_eq!(v["tunnels"], 1);
    assert!(logs.contains("stopped"), "{logs}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn certs_init_issue_and_show() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("certs").join("pki");
    let mode = |name: &str| {
        std::fs::metadata(dir.join(name))
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    };

    let out = run(protego()
        .args(["certs", "init", "--ca-name", "CLI Test CA", "--dir"])
        .arg(&dir));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("created CA \"CLI Test CA\""),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("development CA"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(mode("ca.key"), 0o600);

    let out = run(protego()
        .args(["certs", "issue", "--name", "gw1", "--role", "data"])
        .args([
            "--ip",
            "127.0.0.1",
            "--ip",
            "::1",
            "--dns",
            "gw1.test",
            "--days",
            "30",
        ])
        .arg("--dir")
        .arg(&dir));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("issued gw1 (role data)"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(mode("gw1.key"), 0o600);

    let out = run(protego().args(["certs", "show"]).arg(dir.join("gw1.pem")));
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for expect in [
        "subject:     CN=gw1, OU=data",
        "role:        data",
        "issuer:      CN=CLI Test CA",
        "SANs:        IP:127.0.0.1, IP:::1, DNS:gw1.test",
        "(valid, 29 days left)",
        "ext. usage:  serverAuth, clientAuth",
    ] {
        assert!(shown.contains(expect), "{expect:?} not in\n{shown}");
    }
    // `show` never prints a key, even when pointed at one.
    let key = std::fs::read_to_string(dir.join("gw1.key")).unwrap();
    let out = run(protego().args(["certs", "show"]).arg(dir.join("gw1.key")));
    assert_eq!(out.status.code(), Some(1));
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(all.contains("gw1.key"), "{all}");
    for line in key.lines().filter(|l| !l.starts_with("-----")) {
        assert!(!all.contains(line), "key material printed: {all}");
    }

    // A second init without --force fails and keeps the CA; with --force it replaces it.
    let before = std::fs::read(dir.join("ca.pem")).unwrap();
    let out = run(protego().args(["certs", "init", "--dir"]).arg(&dir));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--force"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), before);
    let out = run(protego()
        .args(["certs", "init", "--force", "--dir"])
        .arg(&dir));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_ne!(std::fs::read(dir.join("ca.pem")).unwrap(), before);

    // Bad requests fail with a message naming the problem.
    let out = run(protego()
        .args([
            "certs", "issue", "--name", "../x", "--role", "steer", "--dir",
        ])
        .arg(&dir));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("node name"),
        "{}",
        text(&out.stderr)
    );
    let out = run(protego()
        .args(["certs", "show"])
        .arg(dir.join("missing.pem")));
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("missing.pem: not found"),
        "{}",
        text(&out.stderr)
    );

    let _ = std::fs::remove_dir_all(dir.parent().unwrap());
}
