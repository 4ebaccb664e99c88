//! Tests of the `[store]`, `[store.etcd]`, `[cluster]` and `[metrics]` sections, and of an
//! applied inventory.

use super::*;

#[test]
fn store_defaults_to_the_file_backend() {
    let s = Scratch::new();
    let c = s.parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert_eq!(
        c.store,
        StoreConfig::File {
            path: PathBuf::from(DEFAULT_STORE_PATH)
        }
    );
    // A relative path is resolved against the configuration file's directory.
    let text = format!(
        "{}\n[store]\npath = \"state/x.redb\"\n",
        with_tunnel(TUNNEL_A)
    );
    let c = s.parse(&text).unwrap();
    assert_eq!(
        c.store,
        StoreConfig::File {
            path: s.0.join("state/x.redb")
        }
    );
    let text = format!("{}\n[store]\nbackend = \"memory\"\n", with_tunnel(TUNNEL_A));
    assert_eq!(s.parse(&text).unwrap().store, StoreConfig::Memory);
}

#[test]
fn store_errors_name_the_key() {
    let base = with_tunnel(TUNNEL_A);
    let text = format!("{base}\n[store]\nbackend = \"etcd3\"\n");
    expect_error(&text, "etcd3", "backend", "unknown store backend");
    let text = format!("{base}\n[store]\nbackend = \"memory\"\npath = \"/x\"\n");
    expect_error(&text, "path = \"/x\"", "path", "only the \"file\" backend");
    let text = format!("{base}\n[store]\npath = \" \"\n");
    expect_error(&text, "path = \" \"", "path", "must not be empty");
}

#[test]
fn store_encryption_options() {
    let s = Scratch::new();
    let base = with_tunnel(TUNNEL_A);
    assert_eq!(
        s.parse(&base).unwrap().store_encryption,
        crate::store::EncryptionOptions::default(),
        "no key file by default: records in clear"
    );
    // Relative to the configuration file's directory, as psk_file; for every backend.
    for backend in [
        "file",
        "memory",
        "etcd\"\nendpoints = \"http://127.0.0.1:2379",
    ] {
        let text = format!(
            "{base}\n[store]\nbackend = \"{backend}\"\nencryption_key_file = \"keys/store.keys\"\n"
        );
        assert_eq!(
            s.parse(&text).unwrap().store_encryption,
            crate::store::EncryptionOptions {
                key_file: Some(s.0.join("keys/store.keys")),
                accept_cleartext: false,
            }
        );
    }
    let text = format!(
        "{base}\n[store]\nencryption_key_file = \"/etc/protego/store.keys\"\naccept_cleartext = true\n"
    );
    assert_eq!(
        s.parse(&text).unwrap().store_encryption,
        crate::store::EncryptionOptions {
            key_file: Some(PathBuf::from("/etc/protego/store.keys")),
            accept_cleartext: true,
        }
    );
}

#[test]
fn store_encryption_errors_name_the_key() {
    let base = with_tunnel(TUNNEL_A);
    let text = format!("{base}\n[store]\nencryption_key_file = \"\"\n");
    expect_error(
        &text,
        "encryption_key_file",
        "encryption_key_file",
        "must not be empty",
    );
    let text = format!("{base}\n[store]\naccept_cleartext = true\n");
    expect_error(
        &text,
        "accept_cleartext",
        "accept_cleartext",
        "only means something with encryption_key_file",
    );
    let text =
        format!("{base}\n[store]\nencryption_key_file = \"k\"\naccept_cleartext = \"yes\"\n");
    expect_error(&text, "accept_cleartext", "accept_cleartext", "bool");
}

#[test]
fn etcd_store_options() {
    let s = Scratch::new();
    let base = with_tunnel(TUNNEL_A);
    let text = format!(
        "{base}\n[store]\nbackend = \"etcd\"\nendpoints = [\"http://10.0.0.1:2379\", \"http://etcd.example:2379\"]\nprefix = \"/protego/prod/\"\ntimeout = \"500ms\"\n"
    );
    assert_eq!(
        s.parse(&text).unwrap().store,
        StoreConfig::Etcd(crate::store::EtcdOptions {
            endpoints: vec![
                "http://10.0.0.1:2379".into(),
                "http://etcd.example:2379".into()
            ],
            prefix: "/protego/prod".into(),
            timeout: Duration::from_millis(500),
            connect_timeout: DEFAULT_ETCD_CONNECT_TIMEOUT,
            access: Default::default(),
        })
    );
    let text =
        format!("{base}\n[store]\nbackend = \"etcd\"\nendpoints = \"http://127.0.0.1:2379\"\n");
    assert_eq!(
        s.parse(&text).unwrap().store,
        StoreConfig::Etcd(crate::store::EtcdOptions {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: DEFAULT_ETCD_PREFIX.into(),
            timeout: DEFAULT_ETCD_TIMEOUT,
            connect_timeout: DEFAULT_ETCD_CONNECT_TIMEOUT,
            access: Default::default(),
        })
    );
}

#[test]
fn etcd_store_errors_name_the_key() {
    let base = with_tunnel(TUNNEL_A);
    let text = format!("{base}\n[store]\nbackend = \"etcd\"\n");
    expect_error(&text, "backend = \"etcd\"", "endpoints", "needs endpoints");
    let text = format!("{base}\n[store]\nbackend = \"etcd\"\nendpoints = [\"127.0.0.1:2379\"]\n");
    expect_error(&text, "endpoints =", "endpoints", "not an etcd client URL");
    let text = format!("{base}\n[store]\nbackend = \"etcd\"\nendpoints = [\"https://e:2379\"]\n");
    expect_error(&text, "endpoints =", "ca", "https:// endpoints need `ca`");
    let text = format!(
        "{base}\n[store]\nbackend = \"etcd\"\nendpoints = \"http://h:1\"\nprefix = \"protego\"\n"
    );
    expect_error(&text, "prefix =", "prefix", "absolute key path");
    let text = format!(
        "{base}\n[store]\nbackend = \"etcd\"\nendpoints = \"http://h:1\"\ntimeout = \"0s\"\n"
    );
    expect_error(&text, "timeout =", "timeout", "more than 0");
    let text =
        format!("{base}\n[store]\nbackend = \"etcd\"\nendpoints = \"http://h:1\"\npath = \"x\"\n");
    expect_error(&text, "path =", "path", "only the \"file\" backend");
    let text = format!("{base}\n[store]\nendpoints = \"http://h:1\"\n");
    expect_error(
        &text,
        "endpoints =",
        "endpoints",
        "only the \"etcd\" backend",
    );
}

#[test]
fn etcd_store_connect_timeout() {
    let s = Scratch::new();
    let base = format!(
        "{}\n[store]\nbackend = \"etcd\"\nendpoints = \"http://h:1\"\n",
        with_tunnel(TUNNEL_A)
    );
    let connect_timeout = |text: &str| match s.parse(text).unwrap().store {
        StoreConfig::Etcd(options) => (options.timeout, options.connect_timeout),
        other => panic!("{other:?}"),
    };
    // Its own value, independent of the requests' timeout.
    assert_eq!(
        connect_timeout(&format!(
            "{base}timeout = \"100ms\"\nconnect_timeout = \"10s\"\n"
        )),
        (Duration::from_millis(100), Duration::from_secs(10))
    );
    // The default, and never shorter than the timeout.
    assert_eq!(
        connect_timeout(&format!("{base}timeout = \"100ms\"\n")),
        (Duration::from_millis(100), DEFAULT_ETCD_CONNECT_TIMEOUT)
    );
    assert_eq!(
        connect_timeout(&format!("{base}timeout = \"30s\"\n")),
        (Duration::from_secs(30), Duration::from_secs(30))
    );
    assert_eq!(
        connect_timeout(&format!(
            "{base}timeout = \"2s\"\nconnect_timeout = \"2s\"\n"
        )),
        (Duration::from_secs(2), Duration::from_secs(2))
    );

    let text = format!("{base}connect_timeout = \"0s\"\n");
    expect_error(&text, "connect_timeout =", "connect_timeout", "more than 0");
    let text = format!("{base}timeout = \"3s\"\nconnect_timeout = \"500ms\"\n");
    expect_error(
        &text,
        "connect_timeout =",
        "connect_timeout",
        "must not be shorter than timeout (3s)",
    );
    let text = format!("{base}connect_timeout = \"soon\"\n");
    expect_error(&text, "connect_timeout =", "connect_timeout", "soon");
    let text = format!(
        "{}\n[store]\nconnect_timeout = \"5s\"\n",
        with_tunnel(TUNNEL_A)
    );
    expect_error(
        &text,
        "connect_timeout =",
        "connect_timeout",
        "only the \"etcd\" backend",
    );
}

#[test]
fn an_applied_inventory_is_planned_by_name() {
    let s = Scratch::new();
    let node = s.parse(&with_tunnel(TUNNEL_A)).unwrap();
    let tunnel_b = TUNNEL_A
        .replace("name = \"a\"", "name = \"b\"")
        .replace(
            "tenant = \"acme\"\nvnet = \"prod\"",
            "tenant = \"globex\"\nvnet = \"main\"",
        )
        .replace("remote_id = \"a.example\"", "remote_id = \"b.example\"");
    // b before a, a VNet changed, a tenant added: only TENANTS and tunnels, no [gateway].
    let tenants = TENANTS.replace("vni = 200", "vni = 201") + "\n[[tenant]]\nname = \"initech\"\n";
    let text = format!(
        "{tenants}\n{tunnel_b}\n{}",
        TUNNEL_A.replace("a.psk", "b.psk")
    );
    let applied = s.0.join("sub/applied.toml");
    // Relative PSK files are read from the applied file's directory.
    let e = node
        .with_inventory(&text, &applied, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("sub/a.psk") && e.contains("applied.toml"), "{e}");
    std::fs::create_dir_all(s.0.join("sub")).unwrap();
    for f in ["a.psk", "b.psk"] {
        std::fs::copy(s.0.join(f), s.0.join("sub").join(f)).unwrap();
    }
    let mut new = node.with_inventory(&text, &applied, None).unwrap();
    assert_eq!(new.gateway, node.gateway, "the node's own [gateway] stays");
    let mut next = node.next_free_id();
    assert_eq!(next, 2);
    new.keep_ids(&node.tunnel_ids(), &mut next);
    assert_eq!(new.tunnel_named("a").unwrap().peer.id, TunnelId(1));
    assert_eq!(new.tunnel_named("b").unwrap().peer.id, TunnelId(2));
    assert_eq!(next, 3);
    assert!(new
        .dataplane
        .tunnels
        .iter()
        .all(|b| new.tunnel(b.tunnel).unwrap().peer.name == b.name));
    let p = plan(&node, &new);
    assert_eq!(p.tenants_added, ["initech"]);
    assert_eq!(p.vnets_changed, ["globex/main"]);
    assert_eq!(p.tunnels_added, ["b"]);
    assert_eq!(p.tunnels_replaced, ["a"], "a new PSK means new SAs");
    assert!(p.tunnels_removed.is_empty() && p.tunnels_updated.is_empty());
    assert!(plan(&new, &new).is_empty());
    let back = plan(&new, &node);
    assert_eq!(back.tunnels_removed, ["b"]);
    assert_eq!(back.tenants_removed, ["initech"]);
}

#[test]
fn an_applied_inventory_cannot_open_a_tun_device() {
    let s = Scratch::new();
    let node = s.parse(&with_tunnel(TUNNEL_A)).unwrap();
    let tun = TUNNEL_A.replace("vnet = \"prod\"", "inside = \"tun\"");
    let e = node
        .with_inventory(&format!("{TENANTS}\n{tun}"), &s.0.join("x.toml"), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("opened no TUN device") && e.contains("--discard-applied"),
        "{e}"
    );
    // An inventory with syntax errors names its own file.
    let e = node
        .with_inventory("[[tunnel]\n", &s.0.join("broken.toml"), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("broken.toml"), "{e}");
}

#[test]
fn cluster_section_defaults_and_limits() {
    let s = Scratch::new();
    let cluster = |extra: &str| {
        format!(
            "{}\n[cluster]\nname = \"control1\"\ngrpc = \"10.0.0.1:7300\"\ngeneve = \"10.0.0.1:6081\"\n\
             ca = \"pki/ca.pem\"\ncert = \"pki/c1.pem\"\nkey = \"pki/c1.key\"\n{extra}\n",
            with_tunnel(TUNNEL_A)
        )
    };
    let c = s.parse(&cluster("")).unwrap().cluster.unwrap();
    assert_eq!(c.name, "control1");
    assert_eq!(c.ca, s.0.join("pki/ca.pem"));
    assert_eq!(c.report_interval, Duration::from_secs(1));
    assert_eq!(c.directive_timeout, Duration::from_secs(2));
    assert_eq!(c.lease, Duration::from_secs(1));
    let c = s
        .parse(&cluster("lease = \"5s\""))
        .unwrap()
        .cluster
        .unwrap();
    assert_eq!(c.lease, Duration::from_secs(5));
    let e = s
        .parse(&cluster("lease = \"1500ms\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("lease") && e.contains("whole seconds"), "{e}");
    let e = s.parse(&cluster("lease = \"2m\"")).unwrap_err().to_string();
    assert!(
        e.contains("lease") && e.contains("between 1s and 1m"),
        "{e}"
    );
    let e = s
        .parse(&cluster("report_interval = \"10ms\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("report_interval"), "{e}");
}

#[test]
fn cluster_autoscale_defaults_values_and_errors() {
    let s = Scratch::new();
    let cluster = |extra: &str| {
        format!(
            "{}\n[cluster]\nname = \"control1\"\ngrpc = \"10.0.0.1:7300\"\ngeneve = \"10.0.0.1:6081\"\n\
             ca = \"pki/ca.pem\"\ncert = \"pki/c1.pem\"\nkey = \"pki/c1.key\"\n\
             report_interval = \"15s\"\n{extra}\n",
            with_tunnel(TUNNEL_A)
        )
    };
    // Without the table: advise, τ = the report interval (at least 10 s), the paper's values.
    let a = s.parse(&cluster("")).unwrap().cluster.unwrap().autoscale;
    assert_eq!(a.mode, crate::config::AutoscaleMode::Advise);
    assert_eq!(a.interval, Duration::from_secs(15));
    assert_eq!(a.consolidation_interval, Duration::from_secs(600));
    assert_eq!(
        (a.hotspot_threshold, a.epsilon, a.min_nodes),
        (0.9, 0.05, 1)
    );
    assert!(a.local.is_none());
    assert_eq!(a.sizing, provision::Sizing::Adaptive);
    assert!(a.drain);
    assert_eq!(a.guarantee_target, 0.97);
    let a = s
        .parse(&cluster(
            "[cluster.autoscale]\nmode = \"act\"\ninterval = \"2s\"\nhotspot_threshold = 0.8\n\
             epsilon = 0.01\nstart_latency = \"20s\"\nmin_nodes = 2\n\
             sizing = \"measured\"\ndrain = false\nwindow = 60\nguarantee_target = 0.99\n\
             [cluster.autoscale.local]\nrun_dir = \"run\"\n\
             [[cluster.autoscale.local.node]]\nconfig = \"data3.toml\"\nnetns = \"dn3\"\n\
             [[cluster.autoscale.local.node]]\nconfig = \"/etc/protego/data4.toml\"\n",
        ))
        .unwrap()
        .cluster
        .unwrap()
        .autoscale;
    assert_eq!(a.mode, crate::config::AutoscaleMode::Act);
    assert_eq!(a.interval, Duration::from_secs(2));
    assert_eq!(
        (a.hotspot_threshold, a.epsilon, a.min_nodes),
        (0.8, 0.01, 2)
    );
    assert_eq!(a.start_latency, Duration::from_secs(20));
    assert_eq!(a.sizing, provision::Sizing::Measured);
    assert!(!a.drain);
    assert_eq!(a.window, 60);
    assert_eq!(a.guarantee_target, 0.99);
    let local = a.local.unwrap();
    assert_eq!(local.run_dir, s.0.join("run"));
    assert_eq!(local.command, None);
    assert_eq!(local.stop_timeout, Duration::from_secs(10));
    assert_eq!(local.nodes.len(), 2);
    assert_eq!(local.nodes[0].config, s.0.join("data3.toml"));
    assert_eq!(local.nodes[0].netns.as_deref(), Some("dn3"));
    assert_eq!(
        local.nodes[1].config,
        std::path::PathBuf::from("/etc/protego/data4.toml")
    );
    // The lowest guarantee taken; adaptive sizing steps no faster than the reports come.
    let a = s
        .parse(&cluster(
            "[cluster.autoscale]\nsizing = \"adaptive\"\ninterval = \"15s\"\n\
             guarantee_target = 0.75\n",
        ))
        .unwrap()
        .cluster
        .unwrap()
        .autoscale;
    assert_eq!(
        (a.sizing, a.interval, a.guarantee_target),
        (provision::Sizing::Adaptive, Duration::from_secs(15), 0.75)
    );
    for (bad, key) in [
        ("mode = \"auto\"", "mode"),
        ("interval = \"500ms\"", "interval"),
        ("hotspot_threshold = 1.5", "hotspot_threshold"),
        ("epsilon = 1.0", "epsilon"),
        ("min_nodes = 0", "min_nodes"),
        ("stop_slack = -1", "stop_slack"),
        ("sizing = \"envelope:0\"", "sizing"),
        ("sizing = \"envelope:5000\"", "sizing"),
        ("drain = \"yes\"", "drain"),
        ("window = 5", "window"),
        ("guarantee_target = 1.0", "guarantee_target"),
        ("guarantee_target = 0.0", "guarantee_target"),
        ("guarantee_target = 0.5", "at least 0.75 and below 1"),
        ("guarantee_target = 0.7499", "guarantee_target"),
        ("guarantee_target = nan", "guarantee_target"),
        (
            "sizing = \"adaptive\"\ninterval = \"10s\"",
            "key `interval` in cluster.autoscale: with sizing = \"adaptive\" must be at least [cluster] report_interval (15s)",
        ),
        (
            "sizing = \"adaptive\"\ninterval = \"1s\"\nstart_latency = \"10m\"",
            "601 steps",
        ),
        ("surprise = 1", "surprise"),
    ] {
        let e = s
            .parse(&cluster(&format!("[cluster.autoscale]\n{bad}")))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{bad}: {e}");
    }
    for (bad, key) in [
        ("run_dir = \"\"", "run_dir"),
        (
            "run_dir = \"r\"\n[[cluster.autoscale.local.node]]\nconfig = \"d.toml\"\nnetns = \"a/b\"",
            "netns",
        ),
        (
            "run_dir = \"r\"\n[[cluster.autoscale.local.node]]\nconfig = \"d.toml\"\n\
             [[cluster.autoscale.local.node]]\nconfig = \"d.toml\"",
            "same data node twice",
        ),
    ] {
        let e = s
            .parse(&cluster(&format!("[cluster.autoscale.local]\n{bad}")))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{bad}: {e}");
    }
}

#[test]
fn cluster_dispatch_defaults_values_and_errors() {
    use crate::config::DispatchMode;
    let s = Scratch::new();
    let cluster = |extra: &str| {
        format!(
            "{}\n[cluster]\nname = \"control1\"\ngrpc = \"10.0.0.1:7300\"\ngeneve = \"10.0.0.1:6081\"\n\
             ca = \"pki/ca.pem\"\ncert = \"pki/c1.pem\"\nkey = \"pki/c1.key\"\n{extra}\n",
            with_tunnel(TUNNEL_A)
        )
    };
    // Without the table: steer mode; self mode's values are the paper's ring.
    let d = s.parse(&cluster("")).unwrap().cluster.unwrap().dispatch;
    assert_eq!(d.mode, DispatchMode::Steer);
    assert_eq!(d.vmacs, 1024);
    assert_eq!(d.announce_interval, Duration::from_secs(10));
    assert_eq!(d.ring, dispatch::Params::paper());
    let d = s
        .parse(&cluster(
            "[cluster.dispatch]\nmode = \"self\"\nvmacs = 4096\nannounce_interval = \"2s\"\n\
             linger = \"3s\"\nload_interval = \"500ms\"\nmove_interval = \"2s\"\n\
             load_difference = 0.05\nmove_vmacs = 8\n",
        ))
        .unwrap()
        .cluster
        .unwrap()
        .dispatch;
    assert_eq!(d.mode, DispatchMode::SelfDispatch);
    assert_eq!(d.vmacs, 4096);
    assert_eq!(d.announce_interval, Duration::from_secs(2));
    assert_eq!(d.ring.linger, Duration::from_secs(3));
    assert_eq!(d.ring.load_interval, Duration::from_millis(500));
    assert_eq!(d.ring.move_interval, Duration::from_secs(2));
    assert_eq!((d.ring.threshold, d.ring.batch), (0.05, 8));
    for (extra, key, says) in [
        ("mode = \"ring\"", "mode", "\"steer\""),
        ("vmacs = 0", "vmacs", "between 1 and 65536"),
        ("vmacs = 70000", "vmacs", "between 1 and 65536"),
        (
            "load_difference = 1.5",
            "load_difference",
            "above 0 and below 1",
        ),
        ("move_vmacs = 0", "move_vmacs", "between 1 and 4096"),
        (
            "announce_interval = \"10m\"",
            "announce_interval",
            "between",
        ),
        (
            "load_interval = \"5s\"\nmove_interval = \"2s\"",
            "move_interval",
            "T_M must be at least T_L",
        ),
        ("speed = 3", "speed", "unknown key"),
    ] {
        let e = s
            .parse(&cluster(&format!("[cluster.dispatch]\n{extra}\n")))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key) && e.contains(says), "{extra}: {e}");
    }
}

#[test]
fn metrics_listen_is_an_address_and_port() {
    let s = Scratch::new();
    let c = s.parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert_eq!(c.metrics, None, "no [metrics]: no listener");
    let text = format!(
        "{}\n[metrics]\nlisten = \"[::1]:9180\"\n",
        with_tunnel(TUNNEL_A)
    );
    let c = s.parse(&text).unwrap();
    assert_eq!(
        c.metrics.map(|m| m.listen),
        Some("[::1]:9180".parse().unwrap())
    );
    for bad in ["\"9180\"", "\"localhost:9180\"", "\"10.0.0.1\""] {
        let text = format!("{}\n[metrics]\nlisten = {bad}\n", with_tunnel(TUNNEL_A));
        let line = line_of(&text, "[metrics]") + 1;
        expect_error_at(&text, line, "listen", "must be an address and port");
    }
    let text = format!("{}\n[metrics]\nport = 9180\n", with_tunnel(TUNNEL_A));
    assert!(s.parse(&text).is_err(), "unknown key in [metrics]");
}

#[test]
fn an_applied_file_may_carry_a_metrics_section() {
    // `ctl apply` takes whole configuration files; their node-wide tables are ignored.
    let text = format!(
        "{}\n[metrics]\nlisten = \"127.0.0.1:9180\"\n",
        with_tunnel(TUNNEL_A)
    );
    let raw: crate::config::raw::RawInventory = toml::from_str(&text).unwrap();
    assert_eq!(raw.tunnel.len(), 1);
}

#[test]
fn api_serves_tls_unless_told_otherwise_on_loopback_and_needs_a_way_in() {
    let s = Scratch::new();
    let with = |api: &str| format!("{}\n[api]\n{api}\n", with_tunnel(TUNNEL_A));
    assert_eq!(s.parse(&with_tunnel(TUNNEL_A)).unwrap().api, None);
    let c = s
        .parse(&with(
            "listen = \"0.0.0.0:8443\"\ncert_file = \"api.pem\"\nkey_file = \"/etc/protego/api.key\"\ntokens_file = \"tokens\"",
        ))
        .unwrap();
    let api = c.api.unwrap();
    assert_eq!(api.listen, "0.0.0.0:8443".parse().unwrap());
    let tls = api.tls.unwrap();
    // Relative paths are the configuration file's directory's.
    assert_eq!(tls.cert_file, c.path.parent().unwrap().join("api.pem"));
    assert_eq!(tls.key_file, std::path::Path::new("/etc/protego/api.key"));
    assert_eq!(
        api.tokens_file,
        Some(c.path.parent().unwrap().join("tokens"))
    );
    assert_eq!(api.client_ca_file, None);

    let plain = s
        .parse(&with(
            "listen = \"127.0.0.1:8080\"\ntls = false\ntokens_file = \"t\"",
        ))
        .unwrap();
    assert_eq!(plain.api.unwrap().tls, None);

    for (api, at, key, says) in [
        (
            "listen = \"0.0.0.0:8080\"\ntls = false\ntokens_file = \"t\"",
            "tls = false",
            "tls",
            "only allowed on a loopback address",
        ),
        (
            "listen = \"127.0.0.1:8443\"\ncert_file = \"c\"\ntokens_file = \"t\"",
            "[api]",
            "key_file",
            "is required",
        ),
        (
            "listen = \"127.0.0.1:8443\"\ntokens_file = \"t\"",
            "[api]",
            "cert_file",
            "is required",
        ),
        (
            "listen = \"127.0.0.1:8443\"\ncert_file = \"c\"\nkey_file = \"k\"",
            "[api]",
            "tokens_file",
            "nobody could authenticate",
        ),
        (
            "listen = \"127.0.0.1:8080\"\ntls = false\nclient_ca_file = \"ca\"\ntokens_file = \"t\"",
            "client_ca_file",
            "client_ca_file",
            "need TLS",
        ),
        (
            "listen = \"127.0.0.1:8443\"\ncert_file = \"\"\nkey_file = \"k\"\ntokens_file = \"t\"",
            "cert_file",
            "cert_file",
            "must not be empty",
        ),
        (
            "listen = \"8443\"\ntls = false\ntokens_file = \"t\"",
            "listen = \"8443\"",
            "listen",
            "address and port",
        ),
    ] {
        expect_error(&with(api), at, key, says);
    }
    assert!(s
        .parse(&with(
            "listen = \"127.0.0.1:1\"\ntls = false\ntokens_file = \"t\"\nport = 1"
        ))
        .is_err());
    // `ctl apply` ignores a whole file's [api].
    let raw: crate::config::raw::RawInventory =
        toml::from_str(&with("listen = \"127.0.0.1:1\"")).unwrap();
    assert_eq!(raw.tunnel.len(), 1);
}
