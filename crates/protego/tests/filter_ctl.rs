//! `protego ctl filter` against a running `protego up` on loopback: load, show, map update
//! and dump, refusals that change nothing, the set and the tenant's map settings kept in the
//! store across restarts, unload, and `ctl apply` refusing to remove a tenant that runs a
//! filter.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn protego() -> Command {
    Command::new(env!("CARGO_BIN_EXE_protego"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A node on loopback with tenants acme and other, no filter in its file.
struct Node {
    dir: PathBuf,
    config: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
}

impl Node {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(format!("protego-filter-ctl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let base = 30_000 + (std::process::id() % 10_000) as u16 * 3;
        let socket = dir.join("protego.sock");
        let config = dir.join("protego.toml");
        std::fs::write(
            &config,
            format!(
                r#"[gateway]
listen = ["127.0.0.1"]
control_socket = "{socket}"
ike_port = {ike}
natt_port = {natt}
vxlan_port = {vxlan}

[[tenant]]
name = "acme"

[[tenant]]
name = "other"

[store]
path = "state.redb"
"#,
                socket = socket.display(),
                ike = base,
                natt = base + 1,
                vxlan = base + 2,
            ),
        )
        .unwrap();
        let mut node = Self {
            dir,
            config,
            socket,
            child: None,
        };
        node.start();
        node
    }

    fn start(&mut self) {
        let mut child = protego()
            .args(["up", "--config"])
            .arg(&self.config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while protego()
            .args(["status", "--socket"])
            .arg(&self.socket)
            .output()
            .map_or(true, |o| !o.status.success())
        {
            if let Ok(Some(status)) = child.try_wait() {
                let out = child.wait_with_output().unwrap();
                panic!("protego up exited early ({status}): {}", text(&out.stderr));
            }
            assert!(Instant::now() < deadline, "protego up never answered");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    /// Stops the node (SIGTERM) and returns its log.
    fn stop(&mut self) -> String {
        let Some(mut child) = self.child.take() else {
            return String::new();
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        text(&child.wait_with_output().unwrap().stderr)
    }

    fn ctl(&self, args: &[&str]) -> Output {
        protego()
            .arg("ctl")
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// A `ctl` command that must succeed, its JSON answer.
    fn json(&self, args: &[&str]) -> Value {
        let out = self.ctl(args);
        assert!(out.status.success(), "ctl {args:?}: {}", text(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
    }

    /// A `ctl` command that must fail, its error.
    fn refused(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            !out.status.success(),
            "ctl {args:?} was accepted: {}",
            text(&out.stdout)
        );
        text(&out.stderr)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn compile_refused(dir: &Path) -> Option<PathBuf> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("../filter/tests/filters/refused.c");
    let out = dir.join("refused.o");
    testreq::bpf::compile(&source, &out, true)?;
    Some(out)
}

#[test]
fn filters_are_loaded_shown_tuned_kept_and_unloaded_at_run_time() {
    let mut node = Node::new();
    let Some((dns, _)) = testreq::bpf::example("dns_ratelimit", &node.dir) else {
        return;
    };
    let Some(refused) = compile_refused(&node.dir) else {
        return;
    };
    let dns = dns.to_str().unwrap().to_owned();
    let show = |node: &Node| node.json(&["filter", "show", "acme", "--json"]);
    let load_dns = |node: &Node| {
        node.json(&[
            "filter",
            "load",
            "acme",
            "--direction",
            "to_cloud",
            "--object",
            &dns,
            "--json",
        ])
    };

    // Load: the answer names the place; show and status list it with its maps.
    let loaded = load_dns(&node);
    assert_eq!(loaded["ok"], true);
    assert_eq!(loaded["generation"], 1);
    assert_eq!(loaded["loaded"]["section"], "xdp");
    assert_eq!(loaded["replaced"].as_array().unwrap().len(), 0);
    let shown = show(&node);
    let filters = shown["filters"].as_array().unwrap();
    assert_eq!(filters.len(), 1, "{shown}");
    assert_eq!(filters[0]["direction"], "to_cloud");
    assert_eq!(filters[0]["passed"], 0);
    let mut maps: Vec<&str> = (shown["maps"].as_array().unwrap().iter())
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    maps.sort_unstable();
    assert_eq!(maps, ["buckets", "config", "verdicts"], "{shown}");
    let status = node.json(&["filter", "show", "other", "--json"]);
    assert_eq!(status["filters"].as_array().unwrap().len(), 0);
    let out = protego()
        .args(["status", "--json", "--socket"])
        .arg(&node.socket)
        .output()
        .unwrap();
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["filters"][0]["tenant"], "acme", "{status}");

    // Tune the limiter: rate 5, burst 10 (two little-endian u64s), read back.
    node.json(&[
        "filter",
        "map",
        "update",
        "acme",
        "config",
        "--key-u32",
        "0",
        "--value",
        "0500000000000000 0a00000000000000",
    ]);
    let dump = node.json(&["filter", "map", "dump", "acme", "config", "--json"]);
    assert_eq!(dump["entries"][0]["key"], "00000000");
    assert_eq!(
        dump["entries"][0]["value"],
        "05000000000000000a00000000000000"
    );
    // A per-CPU map dumps one value per worker.
    let dump = node.json(&["filter", "map", "dump", "acme", "verdicts", "--json"]);
    assert!(dump["entries"][0]["values"].is_array(), "{dump}");

    // Refusals change nothing and say why.
    let e = node.refused(&[
        "filter",
        "map",
        "update",
        "acme",
        "config",
        "--key-u32",
        "0",
        "--value",
        "01",
    ]);
    assert!(e.contains("config"), "{e}");
    let e = node.refused(&["filter", "map", "dump", "acme", "nosuch"]);
    assert!(e.contains("config") && e.contains("buckets"), "{e}");
    let refused_path = refused.to_str().unwrap();
    let e = node.refused(&[
        "filter",
        "load",
        "acme",
        "--direction",
        "to_cloud",
        "--object",
        refused_path,
        "--section",
        "xdp:out_of_bounds",
    ]);
    assert!(
        e.contains("out_of_bounds") && e.contains("instruction"),
        "{e}"
    );
    let e = node.refused(&[
        "filter",
        "load",
        "nobody",
        "--direction",
        "to_cloud",
        "--object",
        &dns,
    ]);
    assert!(e.contains("nobody") && e.contains("not configured"), "{e}");
    let e = node.refused(&[
        "filter",
        "load",
        "acme",
        "--direction",
        "sideways",
        "--object",
        &dns,
    ]);
    assert!(e.contains("sideways"), "{e}");
    assert_eq!(show(&node)["filters"].as_array().unwrap().len(), 1);

    // `ctl apply` may not remove a tenant that runs a filter.
    let inventory = node.dir.join("inventory.toml");
    std::fs::write(&inventory, "[[tenant]]\nname = \"other\"\n").unwrap();
    let e = node.refused(&["apply", "-f", inventory.to_str().unwrap()]);
    assert!(e.contains("acme") && e.contains("filter"), "{e}");

    // The set is kept in the store, and so is the tenant's setting of `config`: after a
    // restart the filter runs again with the limiter tuned as before, while what the program
    // writes itself (`buckets`) starts empty, as the object declares it.
    node.stop();
    node.start();
    let shown = show(&node);
    assert_eq!(shown["filters"].as_array().unwrap().len(), 1, "{shown}");
    let tuned = |node: &Node| {
        let dump = node.json(&["filter", "map", "dump", "acme", "config", "--json"]);
        dump["entries"][0]["value"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(tuned(&node), "05000000000000000a00000000000000");
    let dump = node.json(&["filter", "map", "dump", "acme", "buckets", "--json"]);
    assert_eq!(dump["entries"].as_array().map(Vec::len), Some(0), "{dump}");

    // Loading into the same place replaces the program (generation 3: the load, the
    // setting, this load) and keeps the setting of its map declared alike; unload empties
    // the set and forgets the setting, and that too survives a restart.
    let again = load_dns(&node);
    assert_eq!(again["generation"], 3);
    assert_eq!(again["replaced"].as_array().unwrap().len(), 1);
    node.stop();
    node.start();
    assert_eq!(tuned(&node), "05000000000000000a00000000000000");
    let gone = node.json(&["filter", "unload", "acme", "--json"]);
    assert_eq!(gone["removed"].as_array().unwrap().len(), 1);
    let e = node.refused(&["filter", "unload", "acme"]);
    assert!(e.contains("runs no filter"), "{e}");
    node.stop();
    node.start();
    assert_eq!(show(&node)["filters"].as_array().unwrap().len(), 0);
    // Loaded again, the limiter starts as the object declares it: the setting went with it.
    load_dns(&node);
    assert_eq!(tuned(&node), "00000000000000000000000000000000");
    let log = node.stop();
    assert!(!log.contains("panicked"), "{log}");
}
