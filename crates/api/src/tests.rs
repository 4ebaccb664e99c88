//! Tests of the API over real HTTP (and HTTPS with client certificates) against a handler
//! that answers a fixed status report and records what it was asked: who sees what, what
//! reaches the handler, the errors, the tokens file read again, and the OpenAPI document
//! against the routes. The API in front of a real gateway and strongSwan peer is tested in
//! crates/testbed/tests/console.rs.

use crate::{ApiServer, Role, TokenFile};
use control::config::{ApiConfig, ApiTls, Config};
use control::status::{distributed_only, Request, RequestHandler};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Tunnels `a1` (tenant acme, established) and `b1` (tenant globex, down).
fn report() -> Value {
    let traffic = json!({"bytes_in": 1000, "packets_in": 10, "bytes_out": 2000, "packets_out": 20, "drops_in": 0});
    let tunnel = |name: &str, tenant: &str, up: bool| {
        json!({
            "name": name, "tenant": tenant, "inside": "vnet prod", "state": if up { "established" } else { "down" },
            "remote_addrs": ["192.0.2.2"], "local_id": "gw.example", "remote_id": format!("{name}.example"),
            "ike_sas": if up { json!([{
                "spi_i": "0102030405060708", "spi_r": "1112131415161718", "initiator": false,
                "state": "established", "local": "198.51.100.1:500", "remote": "192.0.2.2:500",
                "proposal": "AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519", "established_secs": 5,
                "rekey_in_secs": 3000,
                "children": [{"spi_in": "c0000001", "spi_out": "c0000002", "proposal": "AES_GCM_16_256",
                    "local_ts": ["10.2.0.0/24"], "remote_ts": ["10.1.0.0/24"], "installed_secs": 5,
                    "bytes_in": 1000, "packets_in": 10, "bytes_out": 2000, "packets_out": 20, "drops_in": 0}]
            }]) } else { json!([]) },
            "events": {"ike_established": 1, "ike_rekeys": 0, "child_installed": 1, "child_rekeys": 0,
                       "dpd_answered": 0, "ike_deleted": {}},
            "traffic": traffic,
        })
    };
    json!({
        "version": 1, "uptime_secs": 9,
        "tunnels": [tunnel("a1", "acme", true), tunnel("b1", "globex", false)],
        "unmatched_ike_sas": 2, "drops": {"no_sa": 7}, "ike_drops": {"cookie": 1},
        "workers": [{"worker": 0, "cpu": 1, "packets": 5, "batches": 1, "busy_ns": 10, "spin_ns": 0}],
        "store": null,
    })
}

/// A handler answering [`report`] and recording every request it gets.
#[derive(Default)]
struct Fake {
    asked: Mutex<Vec<Request>>,
}

impl Fake {
    fn asked(&self) -> Vec<Request> {
        self.asked.lock().unwrap().clone()
    }
}

impl RequestHandler for Fake {
    fn handle(&self, request: Request) -> Value {
        self.asked.lock().unwrap().push(request.clone());
        match request {
            Request::Status => report(),
            Request::Nodes => distributed_only("nodes"),
            Request::Capacity => json!({"mode": "advise", "decisions": []}),
            Request::Dispatch => json!({"mode": "steer"}),
            Request::FilterShow { tenant } => {
                json!({"tenant": tenant, "filters": [], "maps": []})
            }
            Request::FilterMap { map, .. } if map == "missing" => {
                json!({"error": "no map \"missing\"", "kind": "refused"})
            }
            Request::FilterMap { map, .. } => json!({"map": {"name": map}, "entries": []}),
            Request::Apply { dry_run, .. } => {
                json!({"ok": true, "dry_run": dry_run, "changed": false, "generation": 3, "changes": {}})
            }
            _ => json!({"ok": true}),
        }
    }
}

impl metrics::Source for Fake {
    fn collect(&self, out: &mut metrics::Families<'_, '_>) -> Result<(), metrics::Collect> {
        out.gauge(
            "protego_tunnel_up",
            "test",
            [
                (&[("tenant", "acme"), ("tunnel", "a1")][..], 1),
                (&[("tenant", "globex"), ("tunnel", "b1")][..], 0),
            ],
        )?;
        out.counter(
            "protego_drops",
            "test",
            [(&[("reason", "no_sa")][..], 7u64)],
        )?;
        Ok(())
    }
}

/// A running API over a [`Fake`], with an operator token and a token of tenant acme.
struct Setup {
    _dir: tempfile::TempDir,
    tokens_path: std::path::PathBuf,
    fake: Arc<Fake>,
    server: ApiServer,
    operator: String,
    acme: String,
    tls: Option<Arc<rustls::ClientConfig>>,
}

fn config(dir: &Path) -> Config {
    let path = dir.join("protego.toml");
    Config::parse("[gateway]\nlisten = [\"127.0.0.1\"]\n", &path).unwrap()
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let tokens_path = dir.path().join("tokens");
    let mut tokens = TokenFile::default();
    let operator = tokens.add("alice", Role::Operator).unwrap();
    let acme = tokens
        .add("acme-ci", Role::parse("tenant:acme").unwrap())
        .unwrap();
    tokens.save(&tokens_path).unwrap();
    let api = ApiConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls: None,
        client_ca_file: None,
        tokens_file: Some(tokens_path.clone()),
    };
    let fake = Arc::new(Fake::default());
    let server = ApiServer::start(&config(dir.path()), &api, "test", fake.clone()).unwrap();
    Setup {
        _dir: dir,
        tokens_path,
        fake,
        server,
        operator,
        acme,
        tls: None,
    }
}

/// An answer: status, headers (lower-case names), body.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request on a connection of its own (`Connection: close`).
fn http(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> Answer {
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    head.push_str("\r\n");
    let tcp = TcpStream::connect(addr).unwrap();
    let mut raw = Vec::new();
    match tls {
        None => {
            let mut s = tcp;
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(body.as_bytes()).unwrap();
            s.read_to_end(&mut raw).unwrap();
        }
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let conn = rustls::ClientConnection::new(Arc::clone(config), name).unwrap();
            let mut s = rustls::StreamOwned::new(conn, tcp);
            s.write_all(head.as_bytes()).unwrap();
            s.write_all(body.as_bytes()).unwrap();
            let _ = s.read_to_end(&mut raw);
        }
    }
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    // Bodies of these answers are small: hyper sends them with a length, not chunked.
    Answer {
        status,
        headers,
        body: body.to_owned(),
    }
}

impl Setup {
    fn get(&self, path: &str, token: Option<&str>) -> Answer {
        http(
            self.server.local_addr(),
            self.tls.as_ref(),
            "GET",
            path,
            token,
            None,
        )
    }

    fn send(&self, method: &str, path: &str, token: Option<&str>, body: Option<&Value>) -> Answer {
        http(
            self.server.local_addr(),
            self.tls.as_ref(),
            method,
            path,
            token,
            body,
        )
    }
}

fn error_code(a: &Answer) -> String {
    a.json()["error"]["code"].as_str().unwrap_or("?").to_owned()
}

#[test]
fn the_openapi_document_lists_exactly_the_implemented_routes() {
    let doc: Value = serde_json::from_str(crate::OPENAPI).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let mut documented = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            documented.insert((method.to_ascii_uppercase(), path.clone()));
        }
    }
    let implemented: BTreeSet<(String, String)> = crate::route_table()
        .into_iter()
        .map(|(m, p)| (m.to_owned(), p.to_owned()))
        .collect();
    let undocumented: Vec<_> = implemented.difference(&documented).collect();
    let missing: Vec<_> = documented.difference(&implemented).collect();
    assert!(
        undocumented.is_empty() && missing.is_empty(),
        "routes not in openapi.json: {undocumented:?}; documented but not implemented: {missing:?}"
    );
    // Every operation names its responses, and every reference resolves.
    let text = crate::OPENAPI;
    for r in text.split("\"$ref\": \"#/components/").skip(1) {
        let target = r.split('"').next().unwrap();
        let mut node = &doc["components"];
        for part in target.split('/') {
            node = &node[part];
        }
        assert!(!node.is_null(), "unresolved $ref {target}");
    }
}

/// Checks `value` against the required properties and types of `schema` (resolving `$ref`,
/// following arrays, objects and `allOf`); returns the first mismatch.
fn conforms(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema["$ref"].as_str() {
        let mut node = doc;
        for part in r.trim_start_matches("#/").split('/') {
            node = &node[part];
        }
        return conforms(doc, node, value, at);
    }
    if let Some(all) = schema["allOf"].as_array() {
        return all.iter().try_for_each(|s| conforms(doc, s, value, at));
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => return Ok(()),
    };
    let fits = |t: &str| match t {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_u64() || value.is_i64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => false,
    };
    if !types.iter().any(|t| fits(t)) {
        return Err(format!("{at}: {value} is not {types:?}"));
    }
    if let Some(required) = schema["required"].as_array() {
        for key in required.iter().filter_map(Value::as_str) {
            if value.get(key).is_none() {
                return Err(format!("{at}: no {key:?} in {value}"));
            }
        }
    }
    if let (Some(props), Some(obj)) = (schema["properties"].as_object(), value.as_object()) {
        for (key, s) in props {
            if let Some(v) = obj.get(key) {
                conforms(doc, s, v, &format!("{at}.{key}"))?;
            }
        }
    }
    if let (Some(items), Some(list)) = (schema.get("items"), value.as_array()) {
        for (i, v) in list.iter().enumerate() {
            conforms(doc, items, v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[test]
fn every_documented_get_answers_as_its_schema_says() {
    let s = setup();
    let doc: Value = serde_json::from_str(crate::OPENAPI).unwrap();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        let Some(op) = ops.get("get") else { continue };
        let concrete = path
            .replace("{name}", "a1")
            .replace("{tenant}", "acme")
            .replace("{map}", "counts");
        let a = s.get(&concrete, Some(&s.operator));
        let status = a.status.to_string();
        let Some(response) = op["responses"].get(&status) else {
            panic!(
                "GET {concrete}: status {status} is not documented: {}",
                a.body
            );
        };
        let Some(schema) = response["content"]["application/json"].get("schema") else {
            continue;
        };
        let schema = match response.get("$ref") {
            Some(_) => {
                &doc["components"]["responses"]["Error"]["content"]["application/json"]["schema"]
            }
            None => schema,
        };
        conforms(&doc, schema, &a.json(), &format!("GET {concrete}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn a_tenant_sees_only_its_own_and_another_tenants_object_is_not_found() {
    let s = setup();
    let who = s.get("/api/v1/whoami", Some(&s.acme)).json();
    assert_eq!(
        who,
        json!({"kind": "tenant", "name": "acme-ci", "tenant": "acme", "via": "token"})
    );
    let tunnels = s.get("/api/v1/tunnels", Some(&s.acme)).json();
    let names: Vec<&str> = tunnels["tunnels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a1"]);
    let everything = s.get("/api/v1/tunnels", Some(&s.operator)).json();
    assert_eq!(everything["tunnels"].as_array().unwrap().len(), 2);

    // Another tenant's tunnel and a missing one get the same answer.
    let theirs = s.get("/api/v1/tunnels/b1", Some(&s.acme));
    let missing = s.get("/api/v1/tunnels/b2", Some(&s.acme));
    assert_eq!((theirs.status, missing.status), (404, 404));
    assert_eq!(
        theirs.json()["error"]["message"]
            .as_str()
            .unwrap()
            .replace("b1", "X"),
        missing.json()["error"]["message"]
            .as_str()
            .unwrap()
            .replace("b2", "X")
    );
    assert!(!theirs.body.contains("globex"), "{}", theirs.body);
    for path in [
        "/api/v1/tunnels/b1/sas",
        "/api/v1/tunnels/b1/traffic",
        "/api/v1/tenants/globex",
        "/api/v1/tenants/globex/filters",
        "/api/v1/tenants/globex/filters/maps/counts",
    ] {
        let a = s.get(path, Some(&s.acme));
        assert_eq!(
            (a.status, error_code(&a)),
            (404, "not_found".into()),
            "{path}"
        );
    }
    let before = s.fake.asked().len();
    for path in [
        "/api/v1/tunnels/b1/initiate",
        "/api/v1/tunnels/b1/terminate",
    ] {
        assert_eq!(s.send("POST", path, Some(&s.acme), None).status, 404);
    }
    let a = s.send(
        "PUT",
        "/api/v1/tenants/globex/filters/maps/counts/entries",
        Some(&s.acme),
        Some(&json!({"key": "00", "value": "01"})),
    );
    assert_eq!(a.status, 404);
    let reached: Vec<Request> = s.fake.asked()[before..]
        .iter()
        .filter(|r| !matches!(r, Request::Status))
        .cloned()
        .collect();
    assert!(
        reached.is_empty(),
        "refused requests reached the node: {reached:?}"
    );

    // Its own tunnel: the action reaches the node.
    let a = s.send("POST", "/api/v1/tunnels/a1/rekey", Some(&s.acme), None);
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(s.fake.asked().contains(&Request::Rekey {
        tunnel: "a1".into()
    }));

    // Loading a filter for itself: the body's fields reach the node as the request's; a
    // field the body does not have is refused before.
    let load =
        json!({"direction": "to_cloud", "object_name": "f.o", "object": "AAAA", "weight": 3});
    let a = s.send(
        "POST",
        "/api/v1/tenants/acme/filters",
        Some(&s.acme),
        Some(&load),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(s.fake.asked().contains(&Request::FilterLoad {
        tenant: "acme".into(),
        direction: "to_cloud".into(),
        object_name: "f.o".into(),
        object: "AAAA".into(),
        section: None,
        weight: Some(3),
    }));
    let mut odd = load.clone();
    odd["priority"] = json!(1);
    let a = s.send(
        "POST",
        "/api/v1/tenants/acme/filters",
        Some(&s.acme),
        Some(&odd),
    );
    assert_eq!(
        (a.status, error_code(&a)),
        (400, "bad_request".into()),
        "{}",
        a.body
    );

    // Node-wide figures are not a tenant's.
    let status = s.get("/api/v1/status", Some(&s.acme)).json();
    assert_eq!(status["tunnels"].as_array().unwrap().len(), 1);
    assert_eq!(status["workers"], json!([]));
    assert_eq!(status["drops"], json!({}));
    assert_eq!(status["unmatched_ike_sas"], 0);
    let sas = s.get("/api/v1/sas", Some(&s.acme)).json();
    assert_eq!(sas["sas"][0]["tunnel"], "a1");
    let tenants = s.get("/api/v1/tenants", Some(&s.acme)).json();
    assert_eq!(tenants["tenants"].as_array().unwrap().len(), 1);
    assert_eq!(tenants["tenants"][0]["name"], "acme");

    // Operator-only resources are forbidden, and do not reach the node.
    let before = s.fake.asked().len();
    for (method, path, body) in [
        ("GET", "/api/v1/nodes", None),
        ("GET", "/api/v1/capacity", None),
        ("GET", "/api/v1/routes", None),
        ("POST", "/api/v1/apply", Some(json!({"config": ""}))),
        ("POST", "/api/v1/nodes/d1/drain", None),
        (
            "POST",
            "/api/v1/tunnels/a1/migrate",
            Some(json!({"to": "d2"})),
        ),
        ("POST", "/api/v1/store/rotate-key", None),
        (
            "POST",
            "/api/v1/routes",
            Some(
                json!({"tenant": "acme", "vnet": "prod", "address": "10.2.0.5", "host": "203.0.113.9"}),
            ),
        ),
    ] {
        let a = s.send(method, path, Some(&s.acme), body.as_ref());
        assert_eq!(
            (a.status, error_code(&a)),
            (403, "forbidden".into()),
            "{method} {path}"
        );
    }
    assert_eq!(
        s.fake.asked().len(),
        before,
        "forbidden requests reached the node"
    );

    // Metrics: only the tenant's series.
    let m = s.get("/api/v1/metrics", Some(&s.acme));
    assert_eq!(m.status, 200);
    assert!(m.body.contains("tenant=\"acme\""), "{}", m.body);
    assert!(!m.body.contains("globex"), "{}", m.body);
    assert!(!m.body.contains("reason=\"no_sa\""), "{}", m.body);
    let all = s.get("/api/v1/metrics", Some(&s.operator)).body;
    assert!(
        all.contains("globex") && all.contains("reason=\"no_sa\""),
        "{all}"
    );
}

#[test]
fn credentials_are_checked_and_the_tokens_file_is_read_again_when_it_changes() {
    let s = setup();
    let a = s.get("/api/v1/whoami", None);
    assert_eq!((a.status, error_code(&a)), (401, "unauthorized".into()));
    assert_eq!(
        a.header("www-authenticate"),
        Some("Bearer realm=\"protego\"")
    );
    let a = s.get("/api/v1/tunnels", Some("pgo_not-a-token"));
    assert_eq!(a.status, 401);
    assert!(
        !a.body.contains("pgo_not-a-token"),
        "the answer repeats the token"
    );

    // Revoked: refused at the next request, without a restart.
    let mut file = TokenFile::load(&s.tokens_path).unwrap();
    assert!(file.revoke("acme-ci"));
    let bob = file.add("bob", Role::Operator).unwrap();
    file.save(&s.tokens_path).unwrap();
    assert_eq!(s.get("/api/v1/whoami", Some(&s.acme)).status, 401);
    let who = s.get("/api/v1/whoami", Some(&bob)).json();
    assert_eq!(who["name"], "bob");

    // A broken file: no token is accepted, and the answer says why.
    std::fs::write(&s.tokens_path, "bob operator sha256:zz\n").unwrap();
    let a = s.get("/api/v1/whoami", Some(&bob));
    assert_eq!((a.status, error_code(&a)), (503, "unavailable".into()));
    assert!(a.body.contains("line 1"), "{}", a.body);
    // Fixed again.
    file.save(&s.tokens_path).unwrap();
    assert_eq!(s.get("/api/v1/whoami", Some(&bob)).status, 200);
    // A file others may write could be given any token: refused until fixed.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&s.tokens_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let a = s.get("/api/v1/whoami", Some(&bob));
    assert_eq!((a.status, error_code(&a)), (503, "unavailable".into()));
    assert!(
        a.body.contains("writable by its group or others"),
        "{}",
        a.body
    );
    std::fs::set_permissions(&s.tokens_path, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(s.get("/api/v1/whoami", Some(&bob)).status, 200);

    // The page and the document need no credentials; nothing else does without them.
    assert_eq!(s.get("/", None).status, 200);
    assert_eq!(s.get("/api/openapi.json", None).status, 200);
}

#[test]
fn errors_are_json_with_their_status() {
    let s = setup();
    let op = Some(s.operator.as_str());
    let a = s.get("/api/v1/nothing", op);
    assert_eq!((a.status, error_code(&a)), (404, "not_found".into()));
    let a = s.send("DELETE", "/api/v1/tunnels", op, None);
    assert_eq!(
        (a.status, error_code(&a)),
        (405, "method_not_allowed".into())
    );
    let a = s.send("POST", "/api/v1/apply", op, Some(&json!({"confg": "x"})));
    assert_eq!((a.status, error_code(&a)), (400, "bad_request".into()));
    assert!(
        a.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("confg"),
        "{}",
        a.body
    );
    // `protego up` has no nodes.
    let a = s.get("/api/v1/nodes", op);
    assert_eq!((a.status, error_code(&a)), (501, "not_implemented".into()));
    // A refusal of the node is a 400 with its reason.
    let a = s.get("/api/v1/tenants/acme/filters/maps/missing", op);
    assert_eq!((a.status, error_code(&a)), (400, "bad_request".into()));
    assert!(a.body.contains("no map"), "{}", a.body);

    // Apply reads relative psk_files beside the node's configuration.
    let a = s.send(
        "POST",
        "/api/v1/apply",
        op,
        Some(&json!({"config": "", "dry_run": true})),
    );
    assert_eq!(a.status, 200, "{}", a.body);
    let applied = s.fake.asked().into_iter().find_map(|r| match r {
        Request::Apply { file, dry_run, .. } => Some((file, dry_run)),
        _ => None,
    });
    let (file, dry) = applied.expect("the apply reached the node");
    assert!(file.ends_with("protego.toml") && dry, "{file:?}");
}

#[test]
fn client_certificates_name_operators_and_tenants_and_node_certificates_none() {
    use rpc::certs;
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let ca = certs::generate_ca(&pki, "test CA").unwrap();
    let server = certs::issue(
        &pki,
        &ca,
        "api",
        certs::NodeRole::Control,
        &[certs::SubjectAltName::Ip("127.0.0.1".parse().unwrap())],
    )
    .unwrap();
    let api = ApiConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls: Some(ApiTls {
            cert_file: server.cert_path.clone(),
            key_file: server.key_path.clone(),
        }),
        client_ca_file: Some(pki.join("ca.pem")),
        tokens_file: None,
    };
    let fake = Arc::new(Fake::default());
    let running = ApiServer::start(&config(dir.path()), &api, "test", fake).unwrap();
    let client = |cert: Option<&certs::IssuedCert>| {
        let mut roots = rustls::RootCertStore::empty();
        let ca_pem = std::fs::read(pki.join("ca.pem")).unwrap();
        use rustls_pki_types::pem::PemObject;
        for c in rustls_pki_types::CertificateDer::pem_slice_iter(&ca_pem) {
            roots.add(c.unwrap()).unwrap();
        }
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        Arc::new(match cert {
            None => builder.with_no_client_auth(),
            Some(c) => builder
                .with_client_auth_cert(
                    vec![rustls_pki_types::CertificateDer::from_pem_file(&c.cert_path).unwrap()],
                    rustls_pki_types::PrivateKeyDer::from_pem_file(&c.key_path).unwrap(),
                )
                .unwrap(),
        })
    };
    let addr = running.local_addr();
    let ask = |cert: Option<&certs::IssuedCert>| {
        http(
            addr,
            Some(&client(cert)),
            "GET",
            "/api/v1/whoami",
            None,
            None,
        )
    };
    let acme = certs::issue_api_client(&pki, &ca, "acme-portal", "tenant:acme", 30).unwrap();
    let who = ask(Some(&acme)).json();
    assert_eq!(
        who,
        json!({"kind": "tenant", "name": "acme-portal", "tenant": "acme", "via": "certificate"})
    );
    let ops = certs::issue_api_client(&pki, &ca, "ops", "operator", 30).unwrap();
    assert_eq!(ask(Some(&ops)).json()["kind"], "operator");
    // A node's certificate from the same CA is no API principal.
    let node = certs::issue(&pki, &ca, "data1", certs::NodeRole::Data, &[]).unwrap();
    let a = ask(Some(&node));
    assert_eq!(a.status, 401);
    assert!(a.body.contains("names no API role"), "{}", a.body);
    // Without a certificate and without tokens, nobody.
    assert_eq!(ask(None).status, 401);
    // The console is served over the same TLS listener.
    let page = http(addr, Some(&client(None)), "GET", "/", None, None);
    assert_eq!(page.status, 200);
    assert!(page.header("content-security-policy").is_some());
}

#[test]
fn a_tenant_with_nothing_running_sees_itself_and_nothing_else() {
    let s = setup();
    let mut file = TokenFile::load(&s.tokens_path).unwrap();
    let initech = file
        .add("initech", Role::parse("tenant:initech").unwrap())
        .unwrap();
    file.save(&s.tokens_path).unwrap();
    let list = s.get("/api/v1/tenants", Some(&initech)).json();
    assert_eq!(list["tenants"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(list["tenants"][0]["name"], "initech");
    assert_eq!(list["tenants"][0]["tunnels"], json!([]));
    let own = s.get("/api/v1/tenants/initech", Some(&initech));
    assert_eq!(own.status, 200, "{}", own.body);
    assert_eq!(
        s.get("/api/v1/tunnels", Some(&initech)).json()["tunnels"],
        json!([])
    );
    assert_eq!(
        s.get("/api/v1/sas", Some(&initech)).json()["sas"],
        json!([])
    );
    // An operator is told a tenant with nothing is not there.
    assert_eq!(
        s.get("/api/v1/tenants/initech", Some(&s.operator)).status,
        404
    );
}
