//! The stored filter set's encoding, and changes of the running set checked as `[[filter]]`
//! tables are (objects compiled with clang-14 at test time).

use super::*;

/// `examples/filters/NAME.c` compiled into a scratch directory (removed after); `None`: the
/// test returns (no clang, not strict).
fn example(name: &str) -> Option<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!(
        "protego-filters-{}-{}",
        std::process::id(),
        testreq::this_test().replace("::", "-")
    ));
    std::fs::create_dir_all(&dir).ok()?;
    let bytes = testreq::bpf::example(name, &dir).map(|(_, b)| b);
    let _ = std::fs::remove_dir_all(&dir);
    bytes
}

/// The DNS rate limiter's and the SYN-cookie proxy's objects ([`example`]).
fn limiter_and_proxy() -> Option<(Vec<u8>, Vec<u8>)> {
    Some((example("dns_ratelimit")?, example("syncookie")?))
}

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).expect("tenant")
}

fn load(
    t: &str,
    direction: &str,
    object: &[u8],
    section: Option<&str>,
    weight: Option<u32>,
) -> FilterChange {
    FilterChange::Load {
        tenant: t.into(),
        direction: direction.into(),
        object_name: "prog.o".into(),
        object: object.to_vec(),
        section: section.map(str::to_owned),
        weight,
    }
}

#[test]
fn a_record_survives_encoding_with_each_object_once() {
    let a: Arc<[u8]> = Arc::from(&b"\x7fELF one"[..]);
    let b: Arc<[u8]> = Arc::from(&b"\x7fELF two"[..]);
    let f = |t: &str, d, o: &Arc<[u8]>, s: &str, w| FilterConfig {
        tenant: tenant(t),
        direction: d,
        object_name: format!("{s}.o"),
        object: Arc::clone(o),
        section: s.into(),
        weight: w,
    };
    let record = FilterRecord {
        generation: 7,
        filters: vec![
            f("acme", FilterDirection::ToCloud, &a, "xdp:in", 3),
            f("acme", FilterDirection::FromCloud, &a, "xdp:out", 0),
            f("beta", FilterDirection::ToCloud, &b, "xdp", 1000),
        ],
        set_stored: true,
        settings: vec![FilterMapSetting {
            tenant: tenant("acme"),
            map: "xdp:in.o:config".into(),
            key: vec![0, 0, 0, 0],
            value: vec![0xe8, 3, 0, 0],
        }],
    };
    let bytes = record.encode();
    let wire: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(wire["objects"].as_array().map(Vec::len), Some(2));
    assert_eq!(wire["settings"][0]["value"], "e8030000");
    assert_eq!(FilterRecord::decode(&bytes), Ok(record.clone()));
    // A record of version 1 (before the settings) is read with none.
    let mut old: serde_json::Value = wire.clone();
    old["version"] = 1.into();
    old.as_object_mut().expect("object").remove("settings");
    old.as_object_mut().expect("object").remove("set_stored");
    let old = FilterRecord::decode(&serde_json::to_vec(&old).expect("json")).expect("version 1");
    assert_eq!(old.filters, record.filters);
    assert!(old.set_stored, "a version 1 record is a stored set");
    assert!(old.settings.is_empty());
}

#[test]
fn a_bad_record_is_refused_with_a_reason() {
    let bad = |text: &str| FilterRecord::decode(text.as_bytes()).unwrap_err();
    assert!(bad("{").contains("unreadable"));
    assert!(bad(r#"{"version":9,"generation":1,"objects":[],"filters":[]}"#).contains("version 9"));
    let filter = |object: usize, direction: &str| {
        format!(
            r#"{{"version":1,"generation":1,"objects":["AAEC"],"filters":[{{"tenant":"acme","direction":"{direction}","section":"xdp","weight":0,"object_name":"x.o","object":{object}}}]}}"#
        )
    };
    assert!(bad(&filter(1, "to_cloud")).contains("no object 1"));
    assert!(bad(&filter(0, "up")).contains("\"up\""));
    assert!(
        bad(r#"{"version":1,"generation":1,"objects":["!!"],"filters":[]}"#).contains("Base64")
    );
}

#[test]
fn a_load_replaces_its_place_or_adds_one_and_unload_removes() {
    let Some((dns, cookie)) = limiter_and_proxy() else {
        return;
    };
    let tenants = [tenant("acme"), tenant("beta")];
    let first =
        change(&[], &tenants, load("acme", "to_cloud", &dns, None, Some(5))).expect("loads");
    assert_eq!(first.filters.len(), 1);
    assert!(first.replaced.is_empty());
    assert_eq!(first.filters[0].section, "xdp");
    let two = change(
        &first.filters,
        &tenants,
        load(
            "acme",
            "from_cloud",
            &cookie,
            Some("xdp:syncookie_out"),
            None,
        ),
    )
    .expect("loads");
    assert_eq!(two.filters.len(), 2);
    // Another file with the same section: beside it, not in its place.
    let mut other = load("acme", "to_cloud", &dns, None, None);
    if let FilterChange::Load { object_name, .. } = &mut other {
        *object_name = "other.o".into();
    }
    let beside = change(&two.filters, &tenants, other).expect("loads");
    assert_eq!(beside.filters.len(), 3);
    assert!(beside.replaced.is_empty());
    // The same file under another path: the same place.
    let mut moved = load("acme", "to_cloud", &dns, None, None);
    if let FilterChange::Load { object_name, .. } = &mut moved {
        *object_name = "/srv/filters/prog.o".into();
    }
    assert_eq!(
        change(&two.filters, &tenants, moved)
            .expect("loads")
            .replaced
            .len(),
        1
    );
    // The same place again: replaced where it was, keeping its weight.
    let again = change(
        &two.filters,
        &tenants,
        load("acme", "to_cloud", &dns, None, None),
    )
    .expect("loads");
    assert_eq!(again.filters.len(), 2);
    assert_eq!(again.replaced.len(), 1);
    assert_eq!(again.filters[0].direction, FilterDirection::ToCloud);
    assert_eq!(again.filters[0].weight, 5);
    // Unload by direction, then nothing left to unload there.
    let unload = |set: &[FilterConfig], direction: Option<&str>| {
        change(
            set,
            &tenants,
            FilterChange::Unload {
                tenant: "acme".into(),
                direction: direction.map(str::to_owned),
                section: None,
            },
        )
    };
    let out = unload(&again.filters, Some("from_cloud")).expect("unloads");
    assert_eq!(out.filters.len(), 1);
    assert_eq!(out.replaced[0].section, "xdp:syncookie_out");
    assert!(unload(&out.filters, Some("from_cloud"))
        .unwrap_err()
        .contains("runs no filter from_cloud"));
    assert!(unload(&out.filters, None)
        .expect("unloads")
        .filters
        .is_empty());
}

#[test]
fn a_load_is_checked_as_a_filter_table_is() {
    let Some(dns) = example("dns_ratelimit") else {
        return;
    };
    let tenants = [tenant("acme")];
    let refused = |c| change(&[], &tenants, c).unwrap_err();
    assert!(refused(load("nobody", "to_cloud", &dns, None, None)).contains("not configured"));
    assert!(refused(load("acme", "in", &dns, None, None)).contains("unknown direction \"in\""));
    assert!(refused(load("acme", "to_cloud", &dns, None, Some(1001))).contains("weight"));
    assert!(refused(load("acme", "to_cloud", &dns, Some("xdp:nope"), None)).contains("prog.o"));
    assert!(refused(load("acme", "to_cloud", b"not an object", None, None)).contains("prog.o"));
    let big = vec![0u8; MAX_OBJECT_BYTES as usize + 1];
    assert!(refused(load("acme", "to_cloud", &big, None, None)).contains("at most"));
    // At most MAX_PER_DIRECTION per tenant and direction (a replacement does not count).
    let mut set: Vec<FilterConfig> = Vec::new();
    for i in 0..MAX_PER_DIRECTION {
        let mut f = change(&[], &tenants, load("acme", "to_cloud", &dns, None, None))
            .expect("loads")
            .filters
            .remove(0);
        f.section = format!("xdp:copy{i}");
        set.push(f);
    }
    let more = change(&set, &tenants, load("acme", "to_cloud", &dns, None, None)).unwrap_err();
    assert!(more.contains("16 filters"), "{more}");
    let mut replace = set.clone();
    replace[0].section = "xdp".into();
    assert!(change(
        &replace,
        &tenants,
        load("acme", "to_cloud", &dns, None, None)
    )
    .is_ok());
}

fn update(key: &[u8], value: &[u8]) -> FilterMapOp {
    FilterMapOp::Update {
        key: key.to_vec(),
        value: value.to_vec(),
        flags: 0,
    }
}

#[test]
fn map_settings_keep_the_latest_value_per_key_and_forget_deleted_keys() {
    let Some(cookie) = example("syncookie") else {
        return;
    };
    let acme = tenant("acme");
    let set = change(
        &[],
        std::slice::from_ref(&acme),
        load("acme", "to_cloud", &cookie, Some("xdp:syncookie_in"), None),
    )
    .expect("loads")
    .filters;
    let port = |p: u16| p.to_be_bytes().to_vec();
    let record = |settings: &[FilterMapSetting], map: &str, op: &FilterMapOp| {
        record_setting(settings, &set, &acme, map, op)
    };
    let s = record(&[], "protected_ports", &update(&port(80), &[1])).expect("a setting");
    let s = record(&s, "protected_ports", &update(&port(443), &[1])).expect("a setting");
    // The same value again changes nothing; a new value replaces the key's.
    assert_eq!(
        record(&s, "protected_ports", &update(&port(80), &[1])),
        None
    );
    let s = record(&s, "protected_ports", &update(&port(80), &[0])).expect("a setting");
    assert_eq!(s.len(), 2);
    assert_eq!((s[1].key.clone(), s[1].value.clone()), (port(80), vec![0]));
    // A delete forgets the key; of a key no setting wrote (the program's own), changes nothing.
    let s = record(
        &s,
        "protected_ports",
        &FilterMapOp::Delete { key: port(443) },
    )
    .expect("forgotten");
    assert_eq!(s.len(), 1);
    assert_eq!(
        record(
            &s,
            "protected_ports",
            &FilterMapOp::Delete { key: port(22) }
        ),
        None
    );
    assert_eq!(record(&s, "protected_ports", &FilterMapOp::Dump), None);
    // No more settings than the map has entries (64): the oldest go.
    let mut many = s.clone();
    for p in 1000..1070u16 {
        many = record(&many, "protected_ports", &update(&port(p), &[1])).expect("a setting");
    }
    assert_eq!(many.len(), 64);
    assert_eq!(many[0].key, port(1006));
    assert_eq!(many[63].key, port(1069));
}

#[test]
fn a_new_set_keeps_the_settings_of_maps_declared_alike() {
    let Some((dns, cookie)) = limiter_and_proxy() else {
        return;
    };
    let tenants = [tenant("acme")];
    let dns_set = change(&[], &tenants, load("acme", "to_cloud", &dns, None, None))
        .expect("loads")
        .filters;
    let both = change(
        &dns_set,
        &tenants,
        load(
            "acme",
            "from_cloud",
            &cookie,
            Some("xdp:syncookie_out"),
            None,
        ),
    )
    .expect("loads")
    .filters;
    let settings = vec![
        FilterMapSetting {
            tenant: tenant("acme"),
            map: "config".into(),
            key: vec![0; 4],
            value: vec![1; 16],
        },
        FilterMapSetting {
            tenant: tenant("acme"),
            map: "protected_ports".into(),
            key: vec![0, 80],
            value: vec![1],
        },
    ];
    // The limiter stays (declared alike), the proxy goes: only the limiter's setting stays.
    assert_eq!(keep_settings(&settings, &both, &dns_set), settings[..1]);
    // A new version of the limiter's file, declared alike: kept.
    let again = change(
        &dns_set,
        &tenants,
        load("acme", "to_cloud", &dns, None, None),
    )
    .expect("loads")
    .filters;
    assert_eq!(
        keep_settings(&settings[..1], &dns_set, &again),
        settings[..1]
    );
    // Unloaded: forgotten.
    assert!(keep_settings(&settings, &both, &[]).is_empty());
}
