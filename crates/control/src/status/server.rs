//! The control socket: a Unix stream socket (mode 0600) speaking one request per line and one
//! JSON document per answer line. A request is either bare words (`status`, `ping`,
//! `initiate NAME`, `terminate NAME`, `rekey NAME`, `rekey-ike NAME`, and on a control node of
//! the distributed form `nodes`, `migrate NAME NODE` (a tunnel or an attachment), `drain NODE`,
//! `undrain NODE`) or a JSON object (`{"command":"status"}`), plus `rotate-store-key` (`protego ctl store
//! rotate-key`), and the per-VM routes' `route add TENANT VNET ADDRESS HOST`, `route del
//! TENANT VNET ADDRESS`, `route load FILE` (the node reads FILE); an answer is the command's
//! JSON document, or
//! `{"error":"..."}`. `apply` is JSON only: `{"command":"apply","file":PATH,"text":TEXT,
//! "dry_run":false}` (what `protego ctl apply -f FILE` sends); a request line may be up to
//! 16 MiB long for it. So are the tenant filters' `filter_load`, `filter_unload`,
//! `filter_show` and `filter_map` (docs/operations.md, "Tenant filters at run time").

use super::{StatusReport, TunnelDirectory, TunnelStatus};
use crate::error::Error;
use crate::routes::{Recorded, RouteStore};
use crate::runtime::{ApplyOutcome, ApplyRequest, ControlHandle};
use datapath::DataPath;
use ids::TenantId;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Longest request line accepted.
pub(crate) const MAX_LINE: usize = 16 * 1024 * 1024;
/// Connections served at once; more are refused with an error line.
const MAX_CONNECTIONS: usize = 16;
/// A client that sends nothing for this long is disconnected.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a client may take to read an answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long `query` waits for an answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request on the control socket.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// The [`StatusReport`].
    Status,
    /// Liveness check; answers `{"ok":true,"version":"..."}`.
    Ping,
    /// Initiate the named tunnel (as `swanctl --initiate`).
    Initiate {
        /// Tunnel name.
        tunnel: String,
    },
    /// Delete the named tunnel's SAs, telling the peer (as `swanctl --terminate`).
    Terminate {
        /// Tunnel name.
        tunnel: String,
    },
    /// Rekey the named tunnel's CHILD_SA now (as `swanctl --rekey --child`).
    Rekey {
        /// Tunnel name.
        tunnel: String,
    },
    /// Rekey the named tunnel's IKE SA now (as `swanctl --rekey --ike`).
    RekeyIke {
        /// Tunnel name.
        tunnel: String,
    },
    /// The data and steer nodes of the distributed form, with their load and tunnels.
    Nodes,
    /// The capacity advisor's view of the data nodes (distributed form).
    Capacity,
    /// Self-dispatch: the ring, who owns the virtual MACs, the nodes' loads and the last
    /// moves (distributed form).
    Dispatch,
    /// Move a tunnel to another data node without loss (distributed form).
    Migrate {
        /// Tunnel name.
        tunnel: String,
        /// The data node to move it to.
        to: String,
    },
    /// Move every tunnel off a data node without loss, and place nothing new on it.
    Drain {
        /// Node name.
        node: String,
    },
    /// Let a drained data node take tunnels again.
    Undrain {
        /// Node name.
        node: String,
    },
    /// Add a new current key to the store's encryption key file and re-encrypt the records
    /// under older keys in the background (`protego ctl store rotate-key`).
    RotateStoreKey,
    /// Adds a per-VM overlay route, or moves the VM to another host (`protego ctl route add
    /// TENANT VNET ADDRESS HOST`).
    RouteAdd {
        /// The VNet's tenant.
        tenant: String,
        /// The VNet's name.
        vnet: String,
        /// The VM's address.
        address: String,
        /// The VM's host VTEP address.
        host: String,
    },
    /// Removes a per-VM overlay route (`protego ctl route del TENANT VNET ADDRESS`).
    RouteDel {
        /// The VNet's tenant.
        tenant: String,
        /// The VNet's name.
        vnet: String,
        /// The VM's address.
        address: String,
    },
    /// Adds or replaces every per-VM route of a route file (CSV `tenant,vnet,address,host` or
    /// JSON lines), validated whole first; the node reads the file (`protego ctl route load
    /// FILE`).
    RouteLoad {
        /// The route file's path, as the node sees it.
        file: std::path::PathBuf,
    },
    /// Runs a program on a tenant's traffic, in place of the one in its place (tenant,
    /// direction, section) if there is one (`protego ctl filter load`).
    FilterLoad {
        /// The tenant.
        tenant: String,
        /// `to_cloud` or `from_cloud`.
        direction: String,
        /// The object file's name (for status and errors).
        object_name: String,
        /// The object's bytes in Base64.
        object: String,
        /// The section (`xdp` when absent).
        #[serde(default)]
        section: Option<String>,
        /// The order among the tenant's filters of the direction (when absent: the replaced
        /// program's, else 0).
        #[serde(default)]
        weight: Option<u32>,
    },
    /// Stops a tenant's filters (`protego ctl filter unload`).
    FilterUnload {
        /// The tenant.
        tenant: String,
        /// Only this direction.
        #[serde(default)]
        direction: Option<String>,
        /// Only this section.
        #[serde(default)]
        section: Option<String>,
    },
    /// A tenant's filters with their counters, and their maps (`protego ctl filter show`).
    FilterShow {
        /// The tenant.
        tenant: String,
    },
    /// Reads or changes a map of a tenant's filters (`protego ctl filter map dump|update|
    /// delete`).
    FilterMap {
        /// The tenant.
        tenant: String,
        /// The map's name (`OBJECT:NAME` when two objects declare maps of that name).
        map: String,
        /// `dump`, `update` or `delete`.
        op: String,
        /// The key in hex (`update`, `delete`).
        #[serde(default)]
        key: Option<String>,
        /// The value in hex (`update`; a per-CPU map takes every worker's value, in order).
        #[serde(default)]
        value: Option<String>,
        /// `any` (default), `noexist` (only a new key) or `exist` (only an existing key).
        #[serde(default)]
        flags: Option<String>,
    },
    /// Replace the running tenants, VNets and tunnels (`protego ctl apply -f FILE`).
    Apply {
        /// The file's path: relative `psk_file`s are read from its directory (by the node).
        file: std::path::PathBuf,
        /// The file's text.
        text: String,
        /// Only report what would change.
        #[serde(default)]
        dry_run: bool,
    },
}

/// The answer of a command that only a control node of the distributed form serves.
pub fn distributed_only(command: &str) -> Value {
    json!({
        "error": format!(
            "{command} needs the distributed form (`protego control`); this node runs every role in one process"
        ),
        "kind": ErrorKind::DistributedOnly,
    })
}

/// What kind of failure an `{"error": ..}` answer reports, in its `kind` field: what the HTTP
/// API turns into a status code (docs/api.md, "Errors"). An answer without `kind` is a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request named something that does not exist (a tunnel, a node).
    NotFound,
    /// The request was malformed, or the node refused it; the message says why.
    Refused,
    /// Only the distributed form's control node serves the command.
    DistributedOnly,
    /// The control loop did not answer (stopping, or stopped).
    Unavailable,
}

impl ErrorKind {
    /// The kind of `error`.
    pub fn of(error: &Error) -> Self {
        match error {
            Error::ControlStopped | Error::ShuttingDown => ErrorKind::Unavailable,
            _ => ErrorKind::Refused,
        }
    }
}

/// The `{"error": .., "kind": ..}` answer of a failed request.
pub fn error_answer(error: &Error) -> Value {
    json!({ "error": error.to_string(), "kind": ErrorKind::of(error) })
}

impl Request {
    /// Parses one request line (bare words or a JSON object).
    pub fn parse_line(line: &str) -> Result<Self, String> {
        let line = line.trim();
        if line.starts_with('{') {
            return serde_json::from_str(line).map_err(|e| format!("invalid request: {e}"));
        }
        let mut words = line.split_whitespace();
        let command = words.next().ok_or_else(|| "empty request".to_owned())?;
        if command == "route" {
            return route_words(words.collect());
        }
        let argument = words.next();
        if command == "migrate" {
            return match (argument, words.next(), words.next()) {
                (Some(t), Some(n), None) => Ok(Request::Migrate {
                    tunnel: t.to_owned(),
                    to: n.to_owned(),
                }),
                _ => Err("migrate needs a tunnel or attachment name and a node name".to_owned()),
            };
        }
        if words.next().is_some() {
            return Err(format!("too many arguments to {command:?}"));
        }
        match (command, argument) {
            ("nodes", None) => Ok(Request::Nodes),
            ("capacity", None) => Ok(Request::Capacity),
            ("dispatch", None) => Ok(Request::Dispatch),
            ("drain", Some(n)) => Ok(Request::Drain { node: n.to_owned() }),
            ("undrain", Some(n)) => Ok(Request::Undrain { node: n.to_owned() }),
            ("drain" | "undrain", None) => Err(format!("{command} needs a node name")),
            ("status", None) => Ok(Request::Status),
            ("ping", None) => Ok(Request::Ping),
            ("rotate-store-key", None) => Ok(Request::RotateStoreKey),
            ("initiate", Some(t)) => Ok(Request::Initiate {
                tunnel: t.to_owned(),
            }),
            ("terminate", Some(t)) => Ok(Request::Terminate {
                tunnel: t.to_owned(),
            }),
            ("rekey", Some(t)) => Ok(Request::Rekey {
                tunnel: t.to_owned(),
            }),
            ("rekey-ike", Some(t)) => Ok(Request::RekeyIke {
                tunnel: t.to_owned(),
            }),
            ("initiate" | "terminate" | "rekey" | "rekey-ike", None) => {
                Err(format!("{command} needs a tunnel name"))
            }
            ("status" | "ping" | "nodes" | "capacity" | "dispatch" | "rotate-store-key", Some(_)) => {
                Err(format!("{command} takes no argument"))
            }
            (other, _) => Err(format!(
                "unknown command {other:?} (status, ping, initiate NAME, terminate NAME, \
                 rekey NAME, rekey-ike NAME, nodes, capacity, dispatch, migrate NAME NODE, drain NODE, \
                 undrain NODE, rotate-store-key, route add|del|load ...)"
            )),
        }
    }
}

/// A `route ...` request line's words after `route`.
fn route_words(w: Vec<&str>) -> Result<Request, String> {
    let s = |x: &&str| (*x).to_owned();
    match w[..] {
        ["add", ref rest @ ..] => match rest {
            [t, v, a, h] => Ok(Request::RouteAdd {
                tenant: s(t),
                vnet: s(v),
                address: s(a),
                host: s(h),
            }),
            _ => Err("route add needs TENANT VNET ADDRESS HOST".to_owned()),
        },
        ["del", ref rest @ ..] => match rest {
            [t, v, a] => Ok(Request::RouteDel {
                tenant: s(t),
                vnet: s(v),
                address: s(a),
            }),
            _ => Err("route del needs TENANT VNET ADDRESS".to_owned()),
        },
        ["load", file] => Ok(Request::RouteLoad { file: file.into() }),
        ["load", ..] => Err("route load needs one FILE".to_owned()),
        _ => Err(
            "route needs add TENANT VNET ADDRESS HOST, del TENANT VNET ADDRESS or load FILE"
                .to_owned(),
        ),
    }
}

/// Checks the fields of a `route add` or `route del` request; errors name the field.
pub fn vm_route(
    tenant: &str,
    vnet: &str,
    address: &str,
    host: Option<&str>,
) -> Result<datapath::VmRoute, String> {
    let tenant = ids::TenantId::new(tenant).map_err(|e| format!("field tenant: {e}"))?;
    ids::check_name(vnet).map_err(|e| format!("field vnet: {e}"))?;
    let ip = |field: &str, s: &str| {
        s.parse::<std::net::IpAddr>()
            .map_err(|_| format!("field {field}: {s:?} is not an IP address"))
    };
    let address = ip("address", address)?;
    let host = match host {
        Some(h) => ip("host", h)?,
        None => address,
    };
    Ok(datapath::VmRoute {
        tenant,
        vnet: vnet.to_owned(),
        address,
        host,
    })
}

/// The largest route file `route load` reads: 4 GiB, about 40 M IPv6 entries as JSON lines
/// (the table's target is 16 M). The text is held while it is loaded.
pub const MAX_ROUTE_FILE: u64 = 4 << 30;

/// Reads the route file `path` for `route load`: a regular file of at most `limit` bytes
/// (checked before reading, and the read stops past it should the file grow meanwhile), in
/// UTF-8.
pub fn read_route_file(path: &Path, limit: u64) -> Result<String, Error> {
    let err = |reason: String| Error::RouteStore {
        path: path.to_owned(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if !meta.is_file() {
        return Err(err("not a regular file".to_owned()));
    }
    let too_big = |size: u64| {
        err(format!(
            "{size} bytes is more than a route file may have ({limit} bytes)"
        ))
    };
    if meta.len() > limit {
        return Err(too_big(meta.len()));
    }
    let mut text = String::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(limit.saturating_add(1))
        .read_to_string(&mut text)
        .map_err(|e| err(format!("cannot read: {e}")))?;
    if text.len() as u64 > limit {
        return Err(too_big(text.len() as u64));
    }
    Ok(text)
}

/// Bytes written in hex: digits, optionally `0x`-prefixed, in one word or in words
/// separated by spaces, `:` or `-`, each word whole bytes (a separated word of one digit is
/// one byte): `0a000001`, `0a 00 00 01`, `0x0a 0x0 0x0 0x1`.
pub(crate) fn parse_hex(text: &str) -> Result<Vec<u8>, String> {
    let words: Vec<&str> = text
        .split(|c: char| c.is_whitespace() || c == ':' || c == '-')
        .filter(|w| !w.is_empty())
        .map(|w| {
            w.strip_prefix("0x")
                .or_else(|| w.strip_prefix("0X"))
                .unwrap_or(w)
        })
        .collect();
    let bad = || format!("{text:?} is not bytes in hex");
    let mut out = Vec::new();
    for w in &words {
        let padded;
        let w = if w.len() == 1 && words.len() > 1 {
            padded = format!("0{w}");
            padded.as_str()
        } else {
            w
        };
        out.extend(hex::decode(w).map_err(|_| bad())?);
    }
    if out.is_empty() {
        return Err("no bytes".into());
    }
    Ok(out)
}

/// The control socket's answer to a route change.
/// A cluster's control node adds `"nodes": {"applied", "fetching", "failed"}`: the data
/// nodes that applied a single change, kept it while fetching the snapshot, or were told to
/// fetch it.
pub fn route_answer(r: &datapath::RouteChangeReport, elapsed: Duration) -> Value {
    let mut answer = json!({
        "ok": true,
        "added": r.added,
        "replaced": r.replaced,
        "removed": r.removed,
        "skipped": r.skipped,
        "us": elapsed.as_micros() as u64,
    });
    if let Some(n) = r.nodes {
        answer["nodes"] = json!({
            "applied": n.applied,
            "fetching": n.fetching,
            "failed": n.failed,
        });
    }
    answer
}

/// The control socket's answer to an apply: `{"ok":true,"dry_run":..,"generation":..,
/// "changes":{..}}`.
pub fn apply_answer(outcome: &ApplyOutcome, dry_run: bool) -> Value {
    json!({
        "ok": true,
        "dry_run": dry_run,
        "changed": !outcome.plan.is_empty(),
        "generation": outcome.generation,
        "changes": outcome.plan,
    })
}

/// Answers control socket requests.
pub trait RequestHandler: Send + Sync {
    /// The JSON answer to `request` (`{"error": ...}` on failure).
    fn handle(&self, request: Request) -> Value;

    /// The status report as a value (what the HTTP API filters for a tenant); the
    /// `{"error": ..}` answer on failure. By default the `status` request's answer, read back.
    fn status_report(&self) -> Result<StatusReport, Value> {
        let answer = self.handle(Request::Status);
        if answer.get("error").is_some() {
            return Err(answer);
        }
        serde_json::from_value(answer).map_err(|e| {
            json!({ "error": format!("unexpected status document: {e}"), "kind": ErrorKind::Unavailable })
        })
    }

    /// The status of the configured tunnel `name` (`None`: there is none), as
    /// [`RequestHandler::status_report`] shows it. By default found in the whole report;
    /// [`Responder`] builds the one tunnel's only.
    fn tunnel_status(&self, name: &str) -> Result<Option<TunnelStatus>, Value> {
        let report = self.status_report()?;
        Ok(report.tunnels.into_iter().find(|t| t.name == name))
    }

    /// Every configured tunnel's name, tenant and traffic counters (the console's charts).
    /// By default taken from the whole report; [`Responder`] reads the data path's counters
    /// only.
    fn tunnel_traffic(&self) -> Result<Vec<(String, TenantId, datapath::TunnelTraffic)>, Value> {
        let report = self.status_report()?;
        Ok((report.tunnels.into_iter())
            .map(|t| (t.name, t.tenant, t.traffic))
            .collect())
    }
}

/// A filter to load, apart from its tenant: the body of `POST /api/v1/tenants/{tenant}/filters`
/// and what `protego ctl filter load` sends, both as [`Request::FilterLoad`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterLoad {
    /// `to_cloud` or `from_cloud`.
    pub direction: String,
    /// The object file's name (for status and errors).
    pub object_name: String,
    /// The object's bytes in Base64.
    pub object: String,
    /// The section (`xdp` when absent).
    #[serde(default)]
    pub section: Option<String>,
    /// The order among the tenant's filters of the direction (when absent: the replaced
    /// program's, else 0).
    #[serde(default)]
    pub weight: Option<u32>,
}

impl FilterLoad {
    /// The request that loads it for `tenant`.
    pub fn request(self, tenant: String) -> Request {
        Request::FilterLoad {
            tenant,
            direction: self.direction,
            object_name: self.object_name,
            object: self.object,
            section: self.section,
            weight: self.weight,
        }
    }
}

/// The real handler: IKE state from the control loop, counters from the data path.
pub struct Responder {
    control: ControlHandle,
    datapath: Arc<dyn DataPath>,
    directory: std::sync::RwLock<TunnelDirectory>,
    /// Held by an apply from its request to its last effect.
    apply_lock: std::sync::Mutex<()>,
    /// Where per-VM route changes are recorded (None: not kept across restarts).
    routes: Option<Arc<RouteStore>>,
    started: Instant,
}

impl Responder {
    /// A handler for a running control loop.
    pub fn new(
        control: ControlHandle,
        datapath: Arc<dyn DataPath>,
        directory: TunnelDirectory,
    ) -> Self {
        Self {
            control,
            datapath,
            directory: std::sync::RwLock::new(directory),
            apply_lock: std::sync::Mutex::new(()),
            routes: None,
            started: Instant::now(),
        }
    }

    /// Records per-VM route changes in `store` (already restored into the data path).
    pub fn with_routes(mut self, store: Arc<RouteStore>) -> Self {
        self.routes = Some(store);
        self
    }

    /// Applies a per-VM route request (`RouteAdd`, `RouteDel`, `RouteLoad`) and records it.
    pub fn route(&self, request: Request) -> Result<Value, Error> {
        let started = Instant::now();
        let bad = |reason: String| {
            Error::Route(datapath::DataplaneError::Route {
                line: None,
                field: None,
                reason,
            })
        };
        let dp = &*self.datapath;
        let report = match request {
            Request::RouteAdd {
                tenant,
                vnet,
                address,
                host,
            } => {
                let r = vm_route(&tenant, &vnet, &address, Some(&host)).map_err(bad)?;
                let change = Recorded::Add(r);
                match &self.routes {
                    Some(store) => store.apply(dp, change)?,
                    None => dp.change_routes(change.change())?,
                }
            }
            Request::RouteDel {
                tenant,
                vnet,
                address,
            } => {
                let r = vm_route(&tenant, &vnet, &address, None).map_err(bad)?;
                let change = Recorded::Del {
                    tenant: r.tenant,
                    vnet: r.vnet,
                    address: r.address,
                };
                match &self.routes {
                    Some(store) => store.apply(dp, change)?,
                    None => dp.change_routes(change.change())?,
                }
            }
            Request::RouteLoad { file } => {
                let text: Arc<str> = Arc::from(read_route_file(&file, MAX_ROUTE_FILE)?);
                match &self.routes {
                    Some(store) => store.load(dp, text)?,
                    None => dp.change_routes(datapath::RouteChange::Load(text))?,
                }
            }
            other => return Err(bad(format!("not a route request: {other:?}"))),
        };
        Ok(route_answer(&report, started.elapsed()))
    }

    /// Carries out a filter request (`FilterLoad`, `FilterUnload`, `FilterShow`, `FilterMap`).
    ///
    /// A load or unload is serialised with applies (which check the filters' tenants): the
    /// new set is checked and the new program verified here, outside the control loop (a
    /// verification may take a while and IKE must not wait for it), then the data path takes
    /// the new set, then the control loop stores it; if the store refuses, the data path gets
    /// the old set back.
    pub fn filter(&self, request: Request) -> Result<Value, Error> {
        let change = match request {
            Request::FilterShow { tenant } => return self.filter_show(&tenant),
            Request::FilterMap {
                tenant,
                map,
                op,
                key,
                value,
                flags,
            } => return self.filter_map(&tenant, &map, &op, key, value, flags),
            Request::FilterLoad {
                tenant,
                direction,
                object_name,
                object,
                section,
                weight,
            } => {
                use base64ct::{Base64, Encoding};
                let object = Base64::decode_vec(&object)
                    .map_err(|_| Error::Filter("object: not Base64".into()))?;
                crate::filters::FilterChange::Load {
                    tenant,
                    direction,
                    object_name,
                    object,
                    section,
                    weight,
                }
            }
            Request::FilterUnload {
                tenant,
                direction,
                section,
            } => crate::filters::FilterChange::Unload {
                tenant,
                direction,
                section,
            },
            other => return Err(Error::Filter(format!("not a filter request: {other:?}"))),
        };
        let _one_at_a_time = self
            .apply_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let state = self.control.filter_state()?;
        let changed = crate::filters::change(&state.filters, &state.tenants, change)
            .map_err(Error::Filter)?;
        self.datapath
            .set_filters(&changed.filters)
            .map_err(|e| Error::Filter(e.to_string()))?;
        let generation = match self.control.commit_filters(changed.filters.clone()) {
            Ok(commit) => {
                self.keep_settings(&commit.settings);
                commit.generation
            }
            // No answer: the control loop may still store the new set. The data path keeps
            // it, so that a later commit leaves the two alike.
            Err(Error::ControlStopped) => {
                tracing::error!("the control loop did not answer the commit of the new filter set: the data path runs it, the store may or may not keep it");
                return Err(Error::Filter(
                    "the control loop did not answer: the data path runs the new set, and the \
                     store may or may not keep it (check with `protego ctl filter show` after \
                     a restart, or load again)"
                        .into(),
                ));
            }
            Err(e) => {
                if let Err(back) = self.datapath.set_filters(&state.filters) {
                    tracing::error!(error = %back, "cannot put the data path's filters back after the store refused the new set: the data path runs the new set, the store keeps the old one");
                }
                return Err(e);
            }
        };
        let place = |f: &datapath::FilterConfig| {
            json!({
                "direction": f.direction.as_str(),
                "section": f.section,
                "object": f.object_name,
                "weight": f.weight,
            })
        };
        let mut answer = json!({ "ok": true, "generation": generation });
        match &changed.loaded {
            Some(f) => {
                tracing::info!(tenant = %f.tenant, direction = %f.direction, section = %f.section, object = %f.object_name, replaced = !changed.replaced.is_empty(), generation, "filter loaded");
                answer["loaded"] = place(f);
                answer["replaced"] = json!(changed.replaced.iter().map(place).collect::<Vec<_>>());
            }
            None => {
                tracing::info!(
                    removed = changed.replaced.len(),
                    generation,
                    "filters unloaded"
                );
                answer["removed"] = json!(changed.replaced.iter().map(place).collect::<Vec<_>>());
            }
        }
        Ok(answer)
    }

    /// Hands the stored map settings to the data path, which writes them into data nodes that
    /// register later (the distributed form).
    fn keep_settings(&self, settings: &[datapath::FilterMapSetting]) {
        if let Err(e) = self.datapath.keep_filter_settings(settings) {
            tracing::error!(error = %e, "the data path did not take the tenants' map settings");
        }
    }

    /// `filter show`: the tenant's filters with their counters, and their maps.
    fn filter_show(&self, tenant: &str) -> Result<Value, Error> {
        let tenant =
            ids::TenantId::new(tenant).map_err(|e| Error::Filter(format!("tenant: {e}")))?;
        let report = self.datapath.filter_report(Some(&tenant));
        let filters: Vec<super::FilterStatus> = report
            .programs
            .iter()
            .map(super::FilterStatus::of)
            .collect();
        let maps: Vec<super::FilterMapStatus> =
            report.maps.iter().map(super::FilterMapStatus::of).collect();
        Ok(json!({ "tenant": tenant.as_str(), "filters": filters, "maps": maps }))
    }

    /// `filter map dump|update|delete`.
    fn filter_map(
        &self,
        tenant: &str,
        map: &str,
        op: &str,
        key: Option<String>,
        value: Option<String>,
        flags: Option<String>,
    ) -> Result<Value, Error> {
        let tenant =
            ids::TenantId::new(tenant).map_err(|e| Error::Filter(format!("tenant: {e}")))?;
        let bytes = |field: &str, text: Option<String>| {
            let text = text.ok_or_else(|| Error::Filter(format!("{op} needs a {field}")))?;
            parse_hex(&text).map_err(|e| Error::Filter(format!("{field}: {e}")))
        };
        let op = match op {
            "dump" => datapath::FilterMapOp::Dump,
            "update" => datapath::FilterMapOp::Update {
                key: bytes("key", key)?,
                value: bytes("value", value)?,
                flags: match flags.as_deref() {
                    None | Some("any") => 0,
                    Some("noexist") => 1,
                    Some("exist") => 2,
                    Some(other) => {
                        return Err(Error::Filter(format!(
                            "flags: {other:?} is not any, noexist or exist"
                        )))
                    }
                },
            },
            "delete" => datapath::FilterMapOp::Delete {
                key: bytes("key", key)?,
            },
            other => {
                return Err(Error::Filter(format!(
                    "unknown map operation {other:?} (dump, update, delete)"
                )))
            }
        };
        let changes = !matches!(op, datapath::FilterMapOp::Dump);
        // A change and the setting it makes are kept in the order they were carried out.
        let _one_at_a_time = changes.then(|| {
            self.apply_lock
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        });
        let answer = self
            .datapath
            .filter_map(&tenant, map, op.clone())
            .map_err(|e| Error::Filter(e.to_string()))?;
        if changes {
            match self
                .control
                .commit_map_setting(tenant.clone(), map.to_owned(), op)
            {
                Ok(Some(commit)) => self.keep_settings(&commit.settings),
                Ok(None) => {}
                Err(e) => {
                    tracing::error!(tenant = %tenant, map, error = %e, "a map change the filters run was not kept in the store");
                    return Err(Error::Filter(format!(
                        "the running maps have the change, but it was not kept (a restarted \
                         node, or a data node that registers, will not have it): {e}"
                    )));
                }
            }
        }
        let status = super::FilterMapStatus::of(&answer.map);
        let nodes: Vec<&str> = answer.nodes.iter().map(|n| n.node.as_str()).collect();
        if changes {
            tracing::info!(tenant = %tenant, map = %status.name, object = %status.object, nodes = ?nodes, "filter map changed");
            let mut done = json!({ "ok": true, "map": status });
            if !nodes.is_empty() {
                done["nodes"] = json!(nodes);
            }
            return Ok(done);
        }
        let size = answer.map.value_size as usize;
        let entries = |list: &[(Vec<u8>, Vec<u8>)]| -> Vec<Value> {
            list.iter()
                .map(|(k, v)| {
                    if answer.map.copies > 1 && size > 0 {
                        json!({ "key": hex::encode(k), "values": v.chunks(size).map(hex::encode).collect::<Vec<_>>() })
                    } else {
                        json!({ "key": hex::encode(k), "value": hex::encode(v) })
                    }
                })
                .collect()
        };
        if answer.nodes.is_empty() {
            return Ok(json!({ "map": status, "entries": entries(&answer.entries) }));
        }
        // The distributed form: each data node's own copy, by name.
        let per_node: Vec<Value> = answer
            .nodes
            .iter()
            .map(|n| json!({ "node": n.node, "entries": entries(&n.entries) }))
            .collect();
        Ok(json!({ "map": status, "nodes": per_node }))
    }

    /// The current status report.
    pub fn status(&self) -> Result<StatusReport, Error> {
        let ike = self.control.ike_report()?;
        let directory = self.directory();
        let mut report = self.join(&directory, ike);
        drop(directory);
        report.store = Some(self.control.store_stats()?);
        (report.routes, report.filters) = self.route_and_filter_status();
        Ok(report)
    }

    /// The data path's route table and tenant filters, as a report shows them.
    fn route_and_filter_status(&self) -> (Option<super::RouteStatus>, Vec<super::FilterStatus>) {
        let routes = super::RouteStatus::of(&self.datapath.route_stats());
        let filters = (self.datapath.filter_report(None).programs.iter())
            .map(super::FilterStatus::of)
            .collect();
        (routes, filters)
    }

    /// The status of the tunnel `name` alone (`None`: no such tunnel): the same as its entry
    /// in [`Responder::status`], built from the control loop's SAs of that tunnel only.
    pub fn tunnel_status(&self, name: &str) -> Result<Option<TunnelStatus>, Error> {
        let one = {
            let directory = self.directory();
            match directory.0.iter().find(|e| e.name == name) {
                Some(entry) => TunnelDirectory(vec![entry.clone()]),
                None => return Ok(None),
            }
        };
        let ike = self.control.ike_report_of(Some(one.0[0].id))?;
        Ok(self.join(&one, ike).tunnels.pop())
    }

    /// The report of `directory`'s tunnels: the control loop's `ike` report joined with the
    /// data path's counters.
    fn join(&self, directory: &TunnelDirectory, ike: crate::runtime::IkeReport) -> StatusReport {
        let stats = self.datapath.stats();
        let uptime = self.started.elapsed().as_secs();
        let mut report = StatusReport::build(directory, &ike.sas, &ike.drops, &stats, uptime);
        report.set_events(directory, ike.events);
        report
    }

    /// Every configured tunnel's name, tenant and traffic over all its CHILD_SAs, from the
    /// data path's counters alone (no IKE report).
    pub fn tunnel_traffic(&self) -> Vec<(String, TenantId, datapath::TunnelTraffic)> {
        let stats = self.datapath.stats();
        let traffic: std::collections::HashMap<ike::TunnelId, datapath::TunnelTraffic> =
            stats.tunnels.iter().copied().collect();
        (self.directory().0.iter())
            .map(|e| {
                let t = traffic.get(&e.id).copied().unwrap_or_default();
                (e.name.clone(), e.tenant.clone(), t)
            })
            .collect()
    }

    /// Applies a new inventory (see [`ControlHandle::apply`]) and, unless dry, points the
    /// tunnel directory at the new tunnels and runs `after` (e.g. the cluster's rate limits).
    /// Applies are serialised here, so the directory and what `after` sets always follow the
    /// last apply.
    pub fn apply(
        &self,
        file: std::path::PathBuf,
        text: String,
        dry_run: bool,
        after: impl FnOnce(&ApplyOutcome),
    ) -> Result<ApplyOutcome, Error> {
        let _one_at_a_time = self
            .apply_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let outcome = self.control.apply(ApplyRequest {
            text,
            source: file,
            dry_run,
        })?;
        if !dry_run && !outcome.plan.is_empty() {
            *self.directory_mut() = TunnelDirectory::from_config(&outcome.config);
            after(&outcome);
        }
        let plan = &outcome.plan;
        if !dry_run && (!plan.vnets_removed.is_empty() || !plan.vnets_changed.is_empty()) {
            let vnets: Vec<&str> = (plan.vnets_removed.iter())
                .chain(&plan.vnets_changed)
                .map(String::as_str)
                .collect();
            self.forget_dropped_routes(&vnets);
        }
        Ok(outcome)
    }

    /// The data path dropped the per-VM routes of removed VNets (and of changed ones whose
    /// VTEP changed address family); a new snapshot drops them from the route store too, or
    /// they would come back at the next start if a VNet of the same name is configured again
    /// (or the family changes back).
    fn forget_dropped_routes(&self, removed: &[&str]) {
        let Some(store) = &self.routes else { return };
        match store.compact(&*self.datapath) {
            Ok(n) => {
                tracing::info!(vnets = ?removed, entries = n, "route store rewritten after VNets were removed or changed")
            }
            Err(e) => {
                tracing::error!(vnets = ?removed, error = %e, "route store not rewritten: per-VM routes the data path dropped with these VNets come back at the next start if VNets of those names are configured again")
            }
        }
    }

    fn directory(&self) -> std::sync::RwLockReadGuard<'_, TunnelDirectory> {
        self.directory
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn directory_mut(&self) -> std::sync::RwLockWriteGuard<'_, TunnelDirectory> {
        self.directory
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn tunnel_id(&self, name: &str) -> Result<ike::TunnelId, Value> {
        self.directory()
            .0
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.id)
            .ok_or_else(|| {
                json!({ "error": format!("unknown tunnel {name:?}"), "kind": ErrorKind::NotFound })
            })
    }
}

impl RequestHandler for Responder {
    fn status_report(&self) -> Result<StatusReport, Value> {
        self.status().map_err(|e| error_answer(&e))
    }

    fn tunnel_status(&self, name: &str) -> Result<Option<TunnelStatus>, Value> {
        Responder::tunnel_status(self, name).map_err(|e| error_answer(&e))
    }

    fn tunnel_traffic(&self) -> Result<Vec<(String, TenantId, datapath::TunnelTraffic)>, Value> {
        Ok(Responder::tunnel_traffic(self))
    }

    fn handle(&self, request: Request) -> Value {
        let result = match request {
            Request::Status => self.status().map(|r| {
                serde_json::to_value(r)
                    .expect("a StatusReport has only string map keys and always serializes")
            }),
            Request::Ping => Ok(json!({ "ok": true, "version": env!("CARGO_PKG_VERSION") })),
            Request::Initiate { tunnel } => match self.tunnel_id(&tunnel) {
                Ok(id) => self.control.initiate(id).map(|()| json!({ "ok": true })),
                Err(v) => return v,
            },
            Request::Terminate { tunnel } => match self.tunnel_id(&tunnel) {
                Ok(id) => self.control.terminate(id).map(|()| json!({ "ok": true })),
                Err(v) => return v,
            },
            Request::Rekey { tunnel } => match self.tunnel_id(&tunnel) {
                Ok(id) => self.control.rekey_child(id).map(|()| json!({ "ok": true })),
                Err(v) => return v,
            },
            Request::RekeyIke { tunnel } => match self.tunnel_id(&tunnel) {
                Ok(id) => self.control.rekey_ike(id).map(|()| json!({ "ok": true })),
                Err(v) => return v,
            },
            Request::RotateStoreKey => self.control.rotate_store_key().map(|r| {
                json!({
                    "ok": true,
                    "key_id": r.key_id,
                    "key_file": r.key_file,
                    "generated": r.generated,
                    "reencrypt_pending": r.reencrypt_pending,
                })
            }),
            Request::Nodes => return distributed_only("nodes"),
            Request::Capacity => return distributed_only("capacity"),
            Request::Dispatch => return distributed_only("dispatch"),
            Request::Migrate { .. } => return distributed_only("migrate"),
            Request::Drain { .. } => return distributed_only("drain"),
            Request::Undrain { .. } => return distributed_only("undrain"),
            r @ (Request::RouteAdd { .. }
            | Request::RouteDel { .. }
            | Request::RouteLoad { .. }) => self.route(r),
            r @ (Request::FilterLoad { .. }
            | Request::FilterUnload { .. }
            | Request::FilterShow { .. }
            | Request::FilterMap { .. }) => self.filter(r),
            Request::Apply {
                file,
                text,
                dry_run,
            } => match self.apply(file, text, dry_run, |_| {}) {
                Ok(outcome) => Ok(apply_answer(&outcome, dry_run)),
                Err(e) => Err(e),
            },
        };
        result.unwrap_or_else(|e| error_answer(&e))
    }
}

/// `[metrics] listen`: what the status report holds, as metric families, read at each
/// scrape from the engine's view without assembling a report of the tunnels.
impl ::metrics::Source for Responder {
    fn collect(&self, out: &mut ::metrics::Families<'_, '_>) -> Result<(), ::metrics::Collect> {
        let unavailable = |e: Error| ::metrics::Collect::Unavailable(e.to_string());
        let now = super::metrics::unix_now();
        // The control loop copies its SAs while this thread reads the data path's counters.
        let ike = self.control.ike_report_pending(None).map_err(unavailable)?;
        let store = self.control.store_stats_pending().map_err(unavailable)?;
        let stats = self.datapath.stats();
        let (routes, filters) = self.route_and_filter_status();
        let ike = ike.wait().map_err(unavailable)?;
        let uptime = self.started.elapsed().as_secs();
        let mut node = StatusReport::node(&ike.drops, &stats, uptime);
        node.store = Some(store.wait().map_err(unavailable)?);
        node.routes = routes;
        node.filters = filters;
        let directory = self.directory();
        let view = super::metrics::GatewayView {
            directory: &directory,
            sas: &ike.sas,
            events: &ike.events,
            stats: &stats,
        };
        super::metrics::write_gateway(out, &view, &node, now)?;
        Ok(())
    }
}

/// The control socket server: one thread accepting, one short-lived thread per connection.
pub struct StatusServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StatusServer {
    /// Creates the socket's directory if needed, removes a stale socket left by a dead process
    /// (refusing if a live one answers), binds with mode 0600 and starts serving.
    pub fn start(path: &Path, handler: Arc<dyn RequestHandler>) -> Result<Self, Error> {
        let sock_err = |source: std::io::Error| Error::Socket {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(sock_err)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(sock_err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "exists and is not a socket; refusing to replace it",
                )));
            }
            Ok(_) => {
                if UnixStream::connect(path).is_ok() {
                    return Err(sock_err(std::io::Error::new(
                        std::io::ErrorKind::AddrInUse,
                        "another process is serving it (is protego already running?)",
                    )));
                }
                tracing::info!(socket = %path.display(), "removing stale control socket");
                std::fs::remove_file(path).map_err(sock_err)?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(sock_err(e)),
        }
        let listener = UnixListener::bind(path).map_err(sock_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(sock_err)?;

        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("protego-ctl".into())
                .spawn(move || accept_loop(&listener, &stop, &handler))
                .map_err(|source| Error::Spawn {
                    name: "protego-ctl",
                    source,
                })?
        };
        Ok(Self {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting, waits for the accept thread and removes the socket file.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let Some(thread) = self.thread.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        if UnixStream::connect(&self.path).is_ok() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn accept_loop(listener: &UnixListener, stop: &AtomicBool, handler: &Arc<dyn RequestHandler>) {
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "control socket accept failed");
                // Avoid spinning on persistent errors such as EMFILE.
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if active.load(Ordering::SeqCst) >= MAX_CONNECTIONS {
            let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
            let _ = writeln!(
                stream,
                "{}",
                json!({ "error": "too many connections, try again" })
            );
            continue;
        }
        active.fetch_add(1, Ordering::SeqCst);
        let handler = Arc::clone(handler);
        let guard = ActiveGuard(Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("protego-ctl-conn".into())
            .spawn(move || {
                let _guard = guard;
                serve_connection(stream, handler.as_ref());
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start a control connection thread");
        }
    }
}

/// Decrements the active-connection count when a connection thread ends (or fails to start).
struct ActiveGuard(Arc<AtomicUsize>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn serve_connection(stream: UnixStream, handler: &dyn RequestHandler) {
    let _ = stream.set_read_timeout(Some(READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        let read = (&mut reader).take(MAX_LINE as u64 + 1).read_line(&mut line);
        let answer = match read {
            Ok(0) => return,
            Ok(_) if line.len() > MAX_LINE => {
                let _ = writeln!(writer, "{}", json!({ "error": "request line too long" }));
                return;
            }
            Ok(_) if line.trim().is_empty() => continue,
            Ok(_) => match Request::parse_line(&line) {
                Ok(request) => handler.handle(request),
                Err(e) => json!({ "error": e }),
            },
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                let _ = writeln!(writer, "{}", json!({ "error": "request is not UTF-8" }));
                return;
            }
            Err(_) => return,
        };
        // One write of the whole answer: `writeln!` on the socket itself would be a system
        // call per JSON token (millions for a status report of 10 000 tunnels).
        let mut text = answer.to_string().into_bytes();
        text.push(b'\n');
        if writer.write_all(&text).is_err() {
            return;
        }
    }
}

/// Sends one request to the control socket at `path` and returns the answer. An
/// `{"error": ...}` answer becomes [`Error::Protocol`].
pub fn query(path: &Path, request: &Request) -> Result<Value, Error> {
    query_with_timeout(path, request, CLIENT_TIMEOUT)
}

/// As [`query`], waiting at most `timeout` for the answer (moves in the distributed form wait
/// for a rekey with the peer).
pub fn query_with_timeout(
    path: &Path,
    request: &Request,
    timeout: Duration,
) -> Result<Value, Error> {
    let sock_err = |source: std::io::Error| Error::Socket {
        path: path.to_owned(),
        source,
    };
    let protocol = |reason: String| Error::Protocol {
        path: path.to_owned(),
        reason,
    };
    let mut stream = UnixStream::connect(path).map_err(sock_err)?;
    stream.set_read_timeout(Some(timeout)).map_err(sock_err)?;
    stream
        .set_write_timeout(Some(CLIENT_TIMEOUT))
        .map_err(sock_err)?;
    let text = serde_json::to_string(request).map_err(|e| protocol(e.to_string()))?;
    writeln!(stream, "{text}").map_err(sock_err)?;
    let mut line = String::new();
    BufReader::new(&stream)
        .take(64 * 1024 * 1024)
        .read_line(&mut line)
        .map_err(sock_err)?;
    if line.is_empty() {
        return Err(protocol(
            "the server closed the connection without answering".into(),
        ));
    }
    let value: Value =
        serde_json::from_str(&line).map_err(|e| protocol(format!("invalid answer: {e}")))?;
    if let Some(error) = value.get("error") {
        return Err(protocol(
            error
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned),
        ));
    }
    Ok(value)
}

/// Fetches the [`StatusReport`] from the control socket at `path`.
pub fn query_status(path: &Path) -> Result<StatusReport, Error> {
    let value = query(path, &Request::Status)?;
    serde_json::from_value(value).map_err(|e| Error::Protocol {
        path: path.to_owned(),
        reason: format!("unexpected status document: {e}"),
    })
}
