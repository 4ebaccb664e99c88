//! Mutual TLS between a node and a control node over 127.0.0.1, with certificates made by
//! `rpc::certs` in a temporary directory: who gets in, who is refused, and what the server
//! learns about the client.

use protego_rpc as rpc;
use rpc::certs::{generate_ca, issue, load_tls, NodeRole, NodeTls, SubjectAltName};
use rpc::pb::{self, node_message, ControlMessage, NodeMessage};
use rpc::{Cluster, ClusterClient, RpcError};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
use tonic::{Request, Response, Status, Streaming};

const TIMEOUT: Duration = Duration::from_secs(10);
const LOCALHOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// The name clients expect of the control node (a DNS subjectAltName of its certificate).
const CONTROL: &str = "control-1";

/// Two CAs, each with a control node and a data node certificate, in a temporary directory
/// removed when dropped.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        for ca_name in ["ca1", "ca2"] {
            let ca_dir = dir.path().join(ca_name);
            let ca = generate_ca(&ca_dir, &format!("Test {ca_name}")).expect("CA");
            let nodes = [
                (CONTROL, NodeRole::Control),
                ("data-1", NodeRole::Data),
                // A data node whose certificate also names the control node's address.
                ("impostor", NodeRole::Data),
            ];
            for (name, role) in nodes {
                let dns = if name == "impostor" { CONTROL } else { name };
                let sans = [
                    SubjectAltName::Dns(dns.to_owned()),
                    SubjectAltName::Ip(LOCALHOST),
                ];
                issue(&ca_dir, &ca, name, role, &sans).expect("node certificate");
            }
        }
        Pki { dir }
    }

    /// `name`'s TLS material from CA `ca` ("ca1" or "ca2"), trusting `trust` ("ca1" or "ca2").
    fn tls(&self, ca: &str, name: &str, trust: &str) -> NodeTls {
        let p = |dir: &str, file: &str| self.dir.path().join(dir).join(file);
        load_tls(
            &p(trust, "ca.pem"),
            &p(ca, &format!("{name}.pem")),
            &p(ca, &format!("{name}.key")),
        )
        .expect("load TLS files")
    }

    fn ca_pem(&self, ca: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(ca).join("ca.pem")).expect("read CA")
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The test's control node: checks Hello against the certificate, then answers Welcome with
/// the verified identity as `control_name` ("<CN>/<role>"), and keeps the stream open until
/// the node closes its side.
struct Echo;

#[tonic::async_trait]
impl Cluster for Echo {
    type SessionStream = ReceiverStream<Result<ControlMessage, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<NodeMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let peer = rpc::peer_identity(&request)?;
        let mut inbound = request.into_inner();
        let hello = match inbound.message().await? {
            Some(NodeMessage {
                msg: Some(node_message::Msg::Hello(hello)),
            }) => hello,
            _ => return Err(Status::invalid_argument("the first message must be Hello")),
        };
        rpc::verify_hello(&peer, &hello)?;
        let (tx, rx) = mpsc::channel(4);
        let welcome = pb::Welcome {
            node_id: 7,
            term: 0,
            report_interval_ms: 1000,
            control_name: format!("{}/{}", peer.name, peer.role),
        };
        tx.send(Ok(ControlMessage {
            msg: Some(pb::control_message::Msg::Welcome(welcome)),
        }))
        .await
        .map_err(|_| Status::internal("session gone"))?;
        tokio::spawn(async move {
            while let Ok(Some(_)) = inbound.message().await {}
            drop(tx);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    type FetchRoutesStream = ReceiverStream<Result<pb::RoutesChunk, Status>>;

    async fn fetch_routes(
        &self,
        _request: Request<pb::RoutesRequest>,
    ) -> Result<Response<Self::FetchRoutesStream>, Status> {
        Err(Status::unimplemented(
            "the test's control node holds no routes",
        ))
    }
}

/// A running test server. `stop` shuts it down and waits for it; dropping it (a test that
/// failed first) aborts its task.
struct TestServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), RpcError>>,
}

impl TestServer {
    async fn start(tls: NodeTls) -> Self {
        let listener = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            rpc::serve_on(listener, &tls, Echo, async {
                let _ = stopped.await;
            })
            .await
        });
        TestServer {
            addr,
            stop: Some(stop),
            task,
        }
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(TIMEOUT, &mut self.task)
            .await
            .expect("server stops")
            .expect("server task");
        result.expect("server ran without error");
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        // A test that failed before `stop`: do not leave the server running.
        self.task.abort();
    }
}

fn hello(name: &str, role: pb::Role) -> NodeMessage {
    NodeMessage {
        msg: Some(node_message::Msg::Hello(pb::Hello {
            name: name.to_owned(),
            role: role as i32,
            geneve: "127.0.0.1:6081".into(),
            workers: 1,
            boot_id: 1,
            installed_spis: Vec::new(),
            installed: Vec::new(),
            ports: Vec::new(),
            ce_macs: Vec::new(),
            ..pb::Hello::default()
        })),
    }
}

/// How a session attempt ended.
#[derive(Debug)]
enum Outcome {
    /// Welcome received.
    Welcome(pb::Welcome),
    /// `rpc::connect` failed.
    Connect(RpcError),
    /// The session call (or its first message) failed.
    Call(Status),
}

/// Sends Hello on a new session of `client` and waits for the first answer. The sending side
/// stays open until the answer came.
async fn session(
    mut client: ClusterClient<tonic::transport::Channel>,
    hello: NodeMessage,
) -> Outcome {
    let (tx, rx) = mpsc::channel(4);
    tx.send(hello).await.expect("queue Hello");
    let call = tokio::time::timeout(TIMEOUT, async {
        let mut inbound = client.session(ReceiverStream::new(rx)).await?.into_inner();
        inbound.message().await
    })
    .await
    .expect("an answer within the timeout");
    drop(tx);
    match call {
        Ok(Some(ControlMessage {
            msg: Some(pb::control_message::Msg::Welcome(w)),
        })) => Outcome::Welcome(w),
        Ok(other) => panic!("unexpected answer {other:?}"),
        Err(status) => Outcome::Call(status),
    }
}

async fn connect_and_greet(
    server: &TestServer,
    tls: &NodeTls,
    name: &str,
    role: pb::Role,
) -> Outcome {
    match rpc::connect(&server.url(), tls, CONTROL, TIMEOUT).await {
        Ok(client) => session(client, hello(name, role)).await,
        Err(e) => Outcome::Connect(e),
    }
}

/// The server refused the client in the TLS handshake with the TLS alert `alert`. With TLS 1.3
/// the client may learn it at connect or only at the first call, depending on timing: either
/// must be a TLS failure naming the alert.
fn assert_refused_by_tls(outcome: Outcome, alert: &str) {
    let reason = match outcome {
        Outcome::Connect(RpcError::Tls { reason, .. }) => reason,
        Outcome::Connect(e) => panic!("expected a TLS failure, got: {e}"),
        Outcome::Call(status) => rpc::tls_failure(&status).unwrap_or_else(|| {
            panic!(
                "expected a TLS failure, got status {:?}: {}",
                status.code(),
                status.message()
            )
        }),
        Outcome::Welcome(w) => panic!("admitted: {w:?}"),
    };
    assert!(
        reason.contains(&format!("received fatal alert: {alert}")),
        "expected alert {alert}, got: {reason}"
    );
}

#[tokio::test]
async fn data_node_with_valid_certificate_is_admitted_and_identified() {
    let pki = Pki::new();
    let server = TestServer::start(pki.tls("ca1", CONTROL, "ca1")).await;
    let outcome = connect_and_greet(
        &server,
        &pki.tls("ca1", "data-1", "ca1"),
        "data-1",
        pb::Role::Data,
    )
    .await;
    match outcome {
        Outcome::Welcome(w) => {
            assert_eq!(
                w.control_name, "data-1/data",
                "the server saw the certificate's CN/OU"
            );
            assert_eq!(w.node_id, 7);
        }
        other => panic!("not admitted: {other:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn server_is_reachable_by_ip_address_san() {
    let pki = Pki::new();
    let server = TestServer::start(pki.tls("ca1", CONTROL, "ca1")).await;
    let client = rpc::connect(
        &server.url(),
        &pki.tls("ca1", "data-1", "ca1"),
        "127.0.0.1",
        TIMEOUT,
    )
    .await
    .expect("connect by IP address");
    assert!(matches!(
        session(client, hello("data-1", pb::Role::Data)).await,
        Outcome::Welcome(_)
    ));
    server.stop().await;
}

#[tokio::test]
async fn hello_that_contradicts_the_certificate_is_denied() {
    let pki = Pki::new();
    let server = TestServer::start(pki.tls("ca1", CONTROL, "ca1")).await;
    let tls = pki.tls("ca1", "data-1", "ca1");
    for (name, role) in [("data-2", pb::Role::Data), ("data-1", pb::Role::Steer)] {
        match connect_and_greet(&server, &tls, name, role).await {
            Outcome::Call(status) => {
                assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}")
            }
            other => panic!("{name}/{role:?}: expected PERMISSION_DENIED, got {other:?}"),
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn client_certificate_from_another_ca_is_refused() {
    let pki = Pki::new();
    let server = TestServer::start(pki.tls("ca1", CONTROL, "ca1")).await;
    // The client trusts the server's CA but holds a certificate from CA 2 (which
    // `rpc::connect` cannot be given: `load_tls` insists on a certificate from the CA it
    // trusts), so build its configuration by hand.
    let file = |name: &str| std::fs::read(pki.path().join("ca2").join(name)).expect("read");
    let (cert, key) = (file("data-1.pem"), file("data-1.key"));
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem("ca1")))
        .identity(tonic::transport::Identity::from_pem(cert, key))
        .domain_name(CONTROL);
    let outcome = raw_connect_and_greet(&server, config).await;
    assert_refused_by_tls(outcome, "UnknownCA");
    server.stop().await;
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    let pki = Pki::new();
    let server = TestServer::start(pki.tls("ca1", CONTROL, "ca1")).await;
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(pki.ca_pem("ca1")))
        .domain_name(CONTROL);
    let outcome = raw_connect_and_greet(&server, config).await;
    assert_refused_by_tls(outcome, "CertificateRequired");
    server.stop().await;
}

/// Connects with a hand-made client configuration (what `rpc::connect` will not build).
async fn raw_connect_and_greet(server: &TestServer, config: ClientTlsConfig) -> Outcome {
    let endpoint = Endpoint::from_shared(server.url())
        .expect("endpoint")
        .tls_config(config)
        .expect("TLS configuration");
    match tokio::time::timeout(TIMEOUT, endpoint.connect())
        .await
        .expect("connect in time")
    {
        Ok(channel) => session(ClusterClient::new(channel), hello("data-1", pb::Role::Data)).await,
        Err(e) => {
            let reason = rpc::tls_failure(&e);
            Outcome::Connect(match reason {
                Some(reason) => RpcError::Tls {
                    endpoint: server.url(),
                    reason,
                },
                None => RpcError::Connect {
                    endpoint: server.url(),
                    reason: e.to_string(),
                },
            })
        }
    }
}

#[tokio::test]
async fn server_certificate_from_another_ca_is_refused_by_the_client() {
    let pki = Pki::new();
    let server = TestServer::start(pki.tls("ca2", CONTROL, "ca2")).await;
    let err = rpc::connect(
        &server.url(),
        &pki.tls("ca1", "data-1", "ca1"),
        CONTROL,
        TIMEOUT,
    )
    .await
    .expect_err("a server from another CA must be refused");
    assert!(err.is_tls(), "expected a TLS failure, got: {err}");
    server.stop().await;
}

#[tokio::test]
async fn server_that_is_not_a_control_node_is_refused_by_the_client() {
    let pki = Pki::new();
    // Same CA, the expected name in its SANs, but OU=data.
    let server = TestServer::start(pki.tls("ca1", "impostor", "ca1")).await;
    let err = rpc::connect(
        &server.url(),
        &pki.tls("ca1", "data-1", "ca1"),
        CONTROL,
        TIMEOUT,
    )
    .await
    .expect_err("a data node serving must be refused");
    assert!(err.is_tls(), "expected a TLS failure, got: {err}");
    assert!(err.to_string().contains("not a control node"), "{err}");
    server.stop().await;
}

#[tokio::test]
async fn server_with_another_name_is_refused_by_the_client() {
    let pki = Pki::new();
    let server = TestServer::start(pki.tls("ca1", CONTROL, "ca1")).await;
    let err = rpc::connect(
        &server.url(),
        &pki.tls("ca1", "data-1", "ca1"),
        "control-2",
        TIMEOUT,
    )
    .await
    .expect_err("a server not named control-2 must be refused");
    assert!(err.is_tls(), "expected a TLS failure, got: {err}");
    server.stop().await;
}

#[tokio::test]
async fn connect_errors_are_told_apart() {
    let pki = Pki::new();
    let tls = pki.tls("ca1", "data-1", "ca1");

    // Nothing listening: a connection failure, not a TLS one.
    let closed = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let port = closed.local_addr().expect("address").port();
    drop(closed);
    let err = rpc::connect(&format!("https://127.0.0.1:{port}"), &tls, CONTROL, TIMEOUT)
        .await
        .expect_err("nothing listens");
    assert!(matches!(err, RpcError::Connect { .. }), "{err}");

    // A peer that accepts TCP and never answers the TLS handshake: a timeout.
    let silent = TcpListener::bind((LOCALHOST, 0)).await.expect("bind");
    let url = format!("https://{}", silent.local_addr().expect("address"));
    let err = rpc::connect(&url, &tls, CONTROL, Duration::from_millis(300))
        .await
        .expect_err("no handshake");
    assert!(matches!(err, RpcError::Timeout { .. }), "{err}");
    drop(silent);

    for bad in [
        "http://127.0.0.1:1",
        "https://127.0.0.1",
        "127.0.0.1:1",
        "https://127.0.0.1:1/x",
    ] {
        let err = rpc::connect(bad, &tls, CONTROL, TIMEOUT)
            .await
            .expect_err(bad);
        assert!(
            matches!(err, RpcError::InvalidEndpoint { .. }),
            "{bad}: {err}"
        );
    }
    let err = rpc::connect("https://127.0.0.1:1", &tls, "not a name!", TIMEOUT)
        .await
        .expect_err("bad server name");
    assert!(matches!(err, RpcError::InvalidServerName { .. }), "{err}");
}
