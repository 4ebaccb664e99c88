//! Tests of `[[filter]]` tables: tenants' eBPF programs, loaded and verified when the
//! configuration is read (the objects are compiled with clang-14 at test time).

use super::*;
use datapath::FilterDirection;
use std::path::Path;

/// Compiles `examples/filters/NAME.c` (or, with `refused`, the filter crate's refused
/// programs) into a scratch directory of its own; `None`: the test returns (no clang, not strict).
fn object(name: &str) -> Option<(Scratch, PathBuf)> {
    let dir = Scratch::new();
    let path = if name == "refused" {
        let source =
            testreq::bpf::examples_dir().join("../../crates/filter/tests/filters/refused.c");
        let out = dir.0.join("refused.o");
        testreq::bpf::compile(&source, &out, true)?;
        out
    } else {
        testreq::bpf::example(name, &dir.0)?.0
    };
    Some((dir, path))
}

fn with_filters(filters: &str) -> String {
    format!("{GATEWAY}\n{TENANTS}\n{filters}")
}

fn filter(tenant: &str, direction: &str, object: &Path, section: &str) -> String {
    format!(
        "[[filter]]\ntenant = \"{tenant}\"\ndirection = \"{direction}\"\nobject = \"{}\"\nsection = \"{section}\"\n",
        object.display()
    )
}

#[test]
fn filters_are_loaded_and_verified_with_the_configuration() {
    let Some((_dir, syncookie)) = object("syncookie") else {
        return;
    };
    let Some((_dir2, limiter)) = object("dns_ratelimit") else {
        return;
    };
    let text = with_filters(&format!(
        "{}{}[[filter]]\ntenant = \"globex\"\ndirection = \"to_cloud\"\nobject = \"{}\"\nweight = 7\n",
        filter("acme", "to_cloud", &syncookie, "xdp:syncookie_in"),
        filter("acme", "from_cloud", &syncookie, "xdp:syncookie_out"),
        limiter.display()
    ));
    let cfg = Scratch::new().parse(&text).expect("valid");
    let f = &cfg.filters;
    assert_eq!(f.len(), 3);
    assert_eq!(f[0].tenant.as_str(), "acme");
    assert_eq!(f[0].direction, FilterDirection::ToCloud);
    assert_eq!(f[0].section, "xdp:syncookie_in");
    assert_eq!(f[0].weight, 0);
    assert_eq!(f[1].direction, FilterDirection::FromCloud);
    // One object, the same bytes: the two programs will share its maps.
    assert_eq!(f[0].object, f[1].object);
    assert_eq!(
        &*f[0].object,
        std::fs::read(&syncookie).expect("object").as_slice()
    );
    assert_eq!(f[2].tenant.as_str(), "globex");
    // The section defaults to `xdp`, which holds the limiter alone.
    assert_eq!(f[2].section, "xdp");
    assert_eq!(f[2].weight, 7);
    // The bytes are not printed.
    assert!(!format!("{:?}", f[0]).contains("127, 69, 76, 70"));
    let summary = cfg.summary();
    assert!(
        summary.contains("filter xdp:syncookie_out of ")
            && summary.contains("(tenant acme, from_cloud, weight 0): verified"),
        "{summary}"
    );
}

#[test]
fn a_filter_names_a_known_tenant_and_direction() {
    let Some((_dir, limiter)) = object("dns_ratelimit") else {
        return;
    };
    expect_error(
        &with_filters(&filter("initech", "to_cloud", &limiter, "xdp")),
        "tenant = \"initech\"",
        "tenant",
        "unknown tenant \"initech\"",
    );
    expect_error(
        &with_filters(&filter("acme", "inbound", &limiter, "xdp")),
        "direction = \"inbound\"",
        "direction",
        "expected \"to_cloud\" or \"from_cloud\"",
    );
}

#[test]
fn an_object_that_cannot_be_read_is_refused() {
    let missing = std::env::temp_dir().join("protego-no-such-filter.o");
    expect_error(
        &with_filters(&filter("acme", "to_cloud", &missing, "xdp")),
        "object = ",
        "object",
        "cannot read",
    );
    let dir = Scratch::new();
    let junk = dir.0.join("junk.o");
    std::fs::write(&junk, b"not an ELF object").expect("write");
    expect_error(
        &with_filters(&filter("acme", "to_cloud", &junk, "xdp")),
        "object = ",
        "object",
        "not a readable eBPF object",
    );
}

#[test]
fn a_program_the_verifier_refuses_is_an_error_naming_the_instruction() {
    let Some((_dir, refused)) = object("refused") else {
        return;
    };
    let e = expect_error(
        &with_filters(&filter("acme", "to_cloud", &refused, "xdp:out_of_bounds")),
        "object = ",
        "object",
        "instruction",
    );
    assert!(e.to_string().contains("xdp:out_of_bounds"), "{e}");
}

#[test]
fn a_section_that_names_no_program_is_an_error_at_the_section() {
    let Some((_dir, syncookie)) = object("syncookie") else {
        return;
    };
    expect_error(
        &with_filters(&filter("acme", "to_cloud", &syncookie, "xdp:nonesuch")),
        "section = ",
        "section",
        "xdp:syncookie_in",
    );
    // `xdp` alone is ambiguous in an object of two programs.
    let text = with_filters(&format!(
        "[[filter]]\ntenant = \"acme\"\ndirection = \"to_cloud\"\nobject = \"{}\"\n",
        syncookie.display()
    ));
    expect_error(&text, "object = ", "object", "holds several programs");
}

#[test]
fn the_same_program_twice_and_bad_weights_are_refused() {
    let Some((_dir, limiter)) = object("dns_ratelimit") else {
        return;
    };
    let once = filter("acme", "to_cloud", &limiter, "xdp");
    let text = with_filters(&format!("{once}\n{once}"));
    let line = nth_line_of(&text, "object = ", 1);
    expect_error_at(
        &text,
        line,
        "object",
        "already runs xdp of this object to_cloud",
    );
    // The same program in the other direction is another filter.
    let other = filter("acme", "from_cloud", &limiter, "xdp");
    Scratch::new()
        .parse(&with_filters(&format!("{once}\n{other}")))
        .expect("one each way");
    // Another program in a file of the same name (in another directory) would share its place.
    let Some((_fw_dir, firewall)) = object("udp_firewall") else {
        return;
    };
    let renamed = Scratch::new();
    let name = limiter.file_name().expect("a file name");
    let twin = renamed.0.join(name);
    std::fs::copy(&firewall, &twin).expect("copy");
    let text = with_filters(&format!(
        "{once}\n{}",
        filter("acme", "to_cloud", &twin, "xdp")
    ));
    let line = nth_line_of(&text, "object = ", 1);
    expect_error_at(
        &text,
        line,
        "object",
        &format!(
            "already runs xdp of a file named {} to_cloud",
            name.to_string_lossy()
        ),
    );
    std::fs::copy(&firewall, renamed.0.join("firewall.o")).expect("copy");
    let text = with_filters(&format!(
        "{once}\n{}",
        filter("acme", "to_cloud", &renamed.0.join("firewall.o"), "xdp")
    ));
    Scratch::new().parse(&text).expect("two files of two names");
    expect_error(
        &with_filters(&format!("{once}weight = 1001\n")),
        "weight = ",
        "weight",
        "between 0 and 1000",
    );
}

#[test]
fn apply_keeps_filters_and_refuses_to_remove_their_tenant() {
    let Some((_dir, limiter)) = object("dns_ratelimit") else {
        return;
    };
    let s = Scratch::new();
    let text = with_filters(&filter("globex", "to_cloud", &limiter, "xdp"));
    let node = s.parse(&text).expect("valid");
    // An applied file may carry [[filter]] tables: they are ignored (fixed at start).
    let same = node
        .with_inventory(&text, &s.0.join("same.toml"), None)
        .expect("applied");
    assert_eq!(same.filters, node.filters);
    let without_globex = "[[tenant]]\nname = \"acme\"\n";
    match node.with_inventory(without_globex, &s.0.join("less.toml"), None) {
        Err(Error::Config(e)) => {
            let shown = e.to_string();
            assert!(shown.contains("\"globex\" runs the filter xdp"), "{shown}");
            assert_eq!(e.key.as_deref(), Some("tenant"));
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("a filter's tenant was removed"),
    }
}

#[test]
fn the_distributed_form_takes_filters_to_its_data_nodes() {
    let Some((_dir, limiter)) = object("dns_ratelimit") else {
        return;
    };
    let cluster = "[cluster]\nname = \"control1\"\ngrpc = \"10.0.0.1:7300\"\n\
         geneve = \"10.0.0.1:6081\"\nca = \"pki/ca.pem\"\ncert = \"pki/c1.pem\"\nkey = \"pki/c1.key\"\n";
    let text = format!(
        "{}\n{cluster}",
        with_filters(&filter("acme", "to_cloud", &limiter, "xdp"))
    );
    let config = Scratch::new().parse(&text).expect("filters with [cluster]");
    assert_eq!(config.filters.len(), 1);
    assert!(config.cluster.is_some());
}

/// Review: a `filter map update` on the file's filters stored the running set with the
/// setting, and from then on the stored set ran instead of the file's tables, as if the
/// filters had been loaded with `ctl filter`. A record of settings alone leaves the file's
/// tables running; a stored set runs instead of them.
#[test]
fn map_settings_alone_leave_the_files_filters_running() {
    let Some((_dir, limiter)) = object("dns_ratelimit") else {
        return;
    };
    let Some((_dir2, syncookie)) = object("syncookie") else {
        return;
    };
    let text = with_filters(&filter("acme", "to_cloud", &limiter, "xdp"));
    let scratch = Scratch::new();
    let file = scratch.parse(&text).expect("valid");
    let proxy = Scratch::new()
        .parse(&with_filters(&filter(
            "acme",
            "to_cloud",
            &syncookie,
            "xdp:syncookie_in",
        )))
        .expect("valid")
        .filters;
    let setting = datapath::FilterMapSetting {
        tenant: ids::TenantId::new("acme").expect("tenant"),
        map: "config".into(),
        key: vec![0; 4],
        value: vec![5; 16],
    };
    for set_stored in [false, true] {
        let mut store = crate::store::MemoryStore::new();
        let record = crate::filters::FilterRecord {
            generation: 3,
            filters: proxy.clone(),
            set_stored,
            settings: vec![setting.clone()],
        };
        crate::store::Store::commit(
            &mut store,
            &[crate::store::Change::PutFilters {
                record: record.encode(),
            }],
        )
        .expect("stored");
        let mut config = file.clone();
        let settings =
            crate::filters::effective(&mut config, &mut store, false).expect("effective");
        assert_eq!(settings, vec![setting.clone()]);
        let runs = if set_stored { &proxy } else { &file.filters };
        assert_eq!(&config.filters, runs, "set_stored {set_stored}");
    }
}
