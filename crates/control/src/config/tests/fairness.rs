//! Tests of `[gateway] cpu_fairness` and `[[tenant]] cpu_weight` (issue 18 §3).

use super::*;

#[test]
fn cpu_fairness_is_off_and_weights_one_by_default() {
    let c = Scratch::new().parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert_eq!(c.gateway.cpu_fairness, datapath::CpuFairness::Off);
    let f = c.cpu_fairness();
    assert_eq!(f.mode, datapath::CpuFairness::Off);
    let weights: Vec<(&str, u16)> = f.weights.iter().map(|(t, w)| (t.as_str(), *w)).collect();
    assert_eq!(weights, vec![("acme", 1), ("globex", 1)]);
}

#[test]
fn cpu_fairness_modes_and_weights_are_read() {
    for (mode, want) in [
        ("off", datapath::CpuFairness::Off),
        ("account", datapath::CpuFairness::Account),
        ("enforce", datapath::CpuFairness::Enforce),
    ] {
        let text = with_tunnel(TUNNEL_A)
            .replace(
                "[gateway]\n",
                &format!("[gateway]\ncpu_fairness = \"{mode}\"\n"),
            )
            .replace("name = \"globex\"\n", "name = \"globex\"\ncpu_weight = 3\n");
        let c = Scratch::new().parse(&text).unwrap();
        assert_eq!(c.gateway.cpu_fairness, want);
        assert_eq!(c.cpu_weights, vec![1, 3]);
        assert_eq!(c.cpu_fairness().mode, want);
    }
}

#[test]
fn unknown_cpu_fairness_mode() {
    let text =
        with_tunnel(TUNNEL_A).replace("[gateway]\n", "[gateway]\ncpu_fairness = \"strict\"\n");
    expect_error(
        &text,
        "cpu_fairness",
        "cpu_fairness",
        "unknown mode \"strict\"",
    );
}

#[test]
fn cpu_weight_out_of_range() {
    for bad in ["0", "-1", "65536"] {
        let text = with_tunnel(TUNNEL_A).replace(
            "name = \"globex\"\n",
            &format!("name = \"globex\"\ncpu_weight = {bad}\n"),
        );
        expect_error(&text, "cpu_weight", "cpu_weight", "from 1 to 65535");
    }
    let text = with_tunnel(TUNNEL_A).replace(
        "name = \"globex\"\n",
        "name = \"globex\"\ncpu_weight = \"high\"\n",
    );
    let err = match Scratch::new().parse(&text) {
        Err(Error::Config(e)) => e,
        other => panic!("expected a type error, got {other:?}"),
    };
    assert_eq!(err.line, line_of(&text, "cpu_weight"));
}

#[test]
fn the_distributed_form_takes_cpu_fairness_to_its_data_nodes() {
    let cluster = "[cluster]\nname = \"control1\"\ngrpc = \"10.0.0.1:7300\"\n\
         geneve = \"10.0.0.1:6081\"\nca = \"pki/ca.pem\"\ncert = \"pki/c1.pem\"\nkey = \"pki/c1.key\"\n";
    for mode in ["off", "account", "enforce"] {
        let text = format!(
            "{}\n{cluster}",
            with_tunnel(TUNNEL_A).replace(
                "[gateway]\n",
                &format!("[gateway]\ncpu_fairness = \"{mode}\"\n")
            )
        );
        let config = Scratch::new().parse(&text).expect(mode);
        assert_eq!(config.gateway.cpu_fairness.as_str(), mode);
    }
}

#[test]
fn the_kernel_gate_is_off_unless_turned_on() {
    let c = Scratch::new().parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert!(!c.dataplane.fair_kernel_gate);
    let text = with_tunnel(TUNNEL_A).replace(
        "[gateway]\n",
        "[gateway]\ncpu_fairness = \"enforce\"\ncpu_fairness_kernel = true\n",
    );
    let c = Scratch::new().parse(&text).unwrap();
    assert!(c.dataplane.fair_kernel_gate);
    let text =
        with_tunnel(TUNNEL_A).replace("[gateway]\n", "[gateway]\ncpu_fairness_kernel = \"no\"\n");
    assert!(Scratch::new().parse(&text).is_err());
}
