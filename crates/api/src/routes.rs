//! The routes of docs/api.md: who may call each, and the control socket request it becomes.
//!
//! Authorisation is decided here, before the handler is asked: operator-only routes answer a
//! tenant `403`; routes naming an object (a tunnel, a tenant, an attachment) answer `404`
//! when the object is another tenant's, with the same message as for a missing one. Routes
//! are registered through [`Table`], which records each (method, path): the OpenAPI document
//! is checked against that list ([`route_table`]).

use crate::auth::Principal;
use crate::view;
use crate::{Api, Connection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter};
use axum::{Json, Router};
use control::status::{ErrorKind, FilterLoad, Request, StatusReport, TunnelStatus};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

type Shared = Arc<Api>;

/// An error answer: `{"error": {"code", "message"}}` with its status.
#[derive(Debug)]
pub(crate) struct HttpError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl HttpError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    fn forbidden() -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "only an operator may do this",
        )
    }

    fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }

    /// The error of a control socket answer `{"error": .., "kind": ..}`.
    fn of_answer(answer: &Value) -> Self {
        let message = answer["error"]
            .as_str()
            .map_or_else(|| answer["error"].to_string(), str::to_owned);
        match serde_json::from_value::<ErrorKind>(answer["kind"].clone()) {
            Ok(ErrorKind::NotFound) => Self::not_found(message),
            Ok(ErrorKind::DistributedOnly) => {
                Self::new(StatusCode::NOT_IMPLEMENTED, "not_implemented", message)
            }
            Ok(ErrorKind::Unavailable) => Self::unavailable(message),
            Ok(ErrorKind::Refused) | Err(_) => Self::bad_request(message),
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = Json(json!({ "error": { "code": self.code, "message": self.message } }));
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"protego\""),
            );
        }
        response
    }
}

type Answer = Result<Response, HttpError>;

fn ok(value: Value) -> Answer {
    Ok(Json(value).into_response())
}

/// The authenticated caller of a request: a bearer token if one is sent (it wins over a
/// certificate), else the connection's client certificate.
pub(crate) struct Caller(Principal);

impl FromRequestParts<Shared> for Caller {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, api: &Shared) -> Result<Self, HttpError> {
        let refused = |reason: &str| {
            tracing::info!(path = %parts.uri.path(), reason, "API request refused");
        };
        if let Some(value) = parts.headers.get(header::AUTHORIZATION) {
            let token = value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
                .ok_or_else(|| {
                    refused("malformed Authorization header");
                    HttpError::unauthorized("expected `Authorization: Bearer TOKEN`")
                })?;
            let Some(tokens) = &api.tokens else {
                refused("token sent, no tokens file");
                return Err(HttpError::unauthorized(
                    "this node takes no tokens ([api] tokens_file is not set)",
                ));
            };
            return match tokens.authenticate(token) {
                Ok(Some(p)) => Ok(Caller(p)),
                Ok(None) => {
                    refused("unknown or revoked token");
                    Err(HttpError::unauthorized("unknown or revoked token"))
                }
                Err(e) => Err(HttpError::unavailable(format!(
                    "the tokens file is unusable, no token is accepted: {e}"
                ))),
            };
        }
        match parts
            .extensions
            .get::<Arc<Connection>>()
            .and_then(|c| c.certificate.clone())
        {
            Some(Ok(p)) => Ok(Caller(p)),
            Some(Err(reason)) => {
                refused(&reason);
                Err(HttpError::unauthorized(reason))
            }
            None => Err(HttpError::unauthorized(
                "no credentials: send `Authorization: Bearer TOKEN` or a client certificate",
            )),
        }
    }
}

/// A JSON body whose errors are answered as JSON `400`s.
struct Body<T>(T);

impl<T: DeserializeOwned> FromRequest<Shared> for Body<T> {
    type Rejection = HttpError;

    async fn from_request(req: axum::extract::Request, api: &Shared) -> Result<Self, HttpError> {
        Json::<T>::from_request(req, api)
            .await
            .map(|Json(v)| Body(v))
            .map_err(|e| HttpError::bad_request(e.body_text()))
    }
}

/// Query parameters whose errors are answered as JSON `400`s.
struct Params<T>(T);

impl<T: DeserializeOwned> FromRequestParts<Shared> for Params<T> {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, api: &Shared) -> Result<Self, HttpError> {
        Query::<T>::from_request_parts(parts, api)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|e| HttpError::bad_request(e.body_text()))
    }
}

fn operator(who: &Principal) -> Result<(), HttpError> {
    match who.role.tenant() {
        None => Ok(()),
        Some(_) => Err(HttpError::forbidden()),
    }
}

/// Runs a control socket request on a blocking thread; an error answer becomes its status.
async fn call(api: &Shared, who: &Principal, request: Request) -> Result<Value, HttpError> {
    let changes = !matches!(
        request,
        Request::Status
            | Request::Ping
            | Request::Nodes
            | Request::Capacity
            | Request::Dispatch
            | Request::FilterShow { .. }
    ) && !matches!(&request, Request::FilterMap { op, .. } if op == "dump")
        && !matches!(&request, Request::Apply { dry_run: true, .. });
    let what = request_name(&request);
    let api = Arc::clone(api);
    let answer = tokio::task::spawn_blocking(move || api.backend.handle(request))
        .await
        .map_err(|e| HttpError::unavailable(format!("the request failed: {e}")))?;
    if changes {
        tracing::info!(principal = %who.name, role = %who.role, request = what, ok = answer.get("error").is_none(), "API change");
    }
    match answer.get("error") {
        Some(_) => Err(HttpError::of_answer(&answer)),
        None => Ok(answer),
    }
}

/// A request's name for the audit log (no argument: they may be large).
fn request_name(request: &Request) -> &'static str {
    match request {
        Request::Status => "status",
        Request::Ping => "ping",
        Request::Initiate { .. } => "initiate",
        Request::Terminate { .. } => "terminate",
        Request::Rekey { .. } => "rekey",
        Request::RekeyIke { .. } => "rekey_ike",
        Request::Nodes => "nodes",
        Request::Capacity => "capacity",
        Request::Dispatch => "dispatch",
        Request::Migrate { .. } => "migrate",
        Request::Drain { .. } => "drain",
        Request::Undrain { .. } => "undrain",
        Request::RotateStoreKey => "rotate_store_key",
        Request::RouteAdd { .. } => "route_add",
        Request::RouteDel { .. } => "route_del",
        Request::RouteLoad { .. } => "route_load",
        Request::FilterLoad { .. } => "filter_load",
        Request::FilterUnload { .. } => "filter_unload",
        Request::FilterShow { .. } => "filter_show",
        Request::FilterMap { .. } => "filter_map",
        Request::Apply { .. } => "apply",
    }
}

/// The status report as `who` may see it.
async fn report(api: &Shared, who: &Principal) -> Result<StatusReport, HttpError> {
    let a = Arc::clone(api);
    let report = tokio::task::spawn_blocking(move || a.backend.status_report())
        .await
        .map_err(|e| HttpError::unavailable(format!("the status request failed: {e}")))?
        .map_err(|answer| HttpError::of_answer(&answer))?;
    Ok(view::status_for(who, report))
}

/// The tunnel `name` if `who` may see it; else `404`, whether it exists or not. Built for
/// that tunnel alone (not the whole report: with 10 000 tunnels that is a scrape's work per
/// request).
async fn visible_tunnel(
    api: &Shared,
    who: &Principal,
    name: &str,
) -> Result<TunnelStatus, HttpError> {
    let a = Arc::clone(api);
    let wanted = name.to_owned();
    let found = tokio::task::spawn_blocking(move || a.backend.tunnel_status(&wanted))
        .await
        .map_err(|e| HttpError::unavailable(format!("the status request failed: {e}")))?
        .map_err(|answer| HttpError::of_answer(&answer))?;
    found
        .filter(|t| who.sees(t.tenant.as_str()))
        .ok_or_else(|| HttpError::not_found(format!("no tunnel {name:?}")))
}

/// `404` unless `who` may see `tenant`'s objects.
fn visible_tenant(who: &Principal, tenant: &str) -> Result<(), HttpError> {
    if who.sees(tenant) {
        Ok(())
    } else {
        Err(HttpError::not_found(format!("no tenant {tenant:?}")))
    }
}

async fn whoami(Caller(who): Caller) -> Answer {
    let (kind, tenant) = match who.role.tenant() {
        None => ("operator", None),
        Some(t) => ("tenant", Some(t.as_str())),
    };
    let via = match who.via {
        crate::Via::Token => "token",
        crate::Via::Certificate => "certificate",
    };
    ok(json!({ "kind": kind, "name": who.name, "tenant": tenant, "via": via }))
}

async fn status(State(api): State<Shared>, Caller(who): Caller) -> Answer {
    let report = report(&api, &who).await?;
    Ok(Json(report).into_response())
}

async fn tunnels(State(api): State<Shared>, Caller(who): Caller) -> Answer {
    let report = report(&api, &who).await?;
    ok(json!({ "tunnels": report.tunnels }))
}

async fn tunnel(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(name): Path<String>,
) -> Answer {
    let t = visible_tunnel(&api, &who, &name).await?;
    Ok(Json(t).into_response())
}

async fn tunnel_sas(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(name): Path<String>,
) -> Answer {
    let t = visible_tunnel(&api, &who, &name).await?;
    ok(json!({ "tunnel": t.name, "tenant": t.tenant.as_str(), "ike_sas": t.ike_sas }))
}

async fn tunnel_traffic(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(name): Path<String>,
) -> Answer {
    let t = visible_tunnel(&api, &who, &name).await?;
    ok(json!({
        "tunnel": t.name,
        "interval_secs": crate::history::INTERVAL.as_secs(),
        "samples": api.history.samples(&t.name),
    }))
}

/// What `POST /api/v1/tunnels/{name}/ACTION` does.
#[derive(Debug, Clone, Copy)]
enum Action {
    Initiate,
    Terminate,
    Rekey,
    RekeyIke,
}

async fn tunnel_action(api: Shared, who: Principal, name: String, action: Action) -> Answer {
    let t = visible_tunnel(&api, &who, &name).await?;
    let tunnel = t.name;
    let request = match action {
        Action::Initiate => Request::Initiate { tunnel },
        Action::Terminate => Request::Terminate { tunnel },
        Action::Rekey => Request::Rekey { tunnel },
        Action::RekeyIke => Request::RekeyIke { tunnel },
    };
    ok(call(&api, &who, request).await?)
}

/// `{"to": NODE}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveTo {
    to: String,
}

async fn tunnel_migrate(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(name): Path<String>,
    Body(body): Body<MoveTo>,
) -> Answer {
    operator(&who)?;
    visible_tunnel(&api, &who, &name).await?;
    ok(call(
        &api,
        &who,
        Request::Migrate {
            tunnel: name,
            to: body.to,
        },
    )
    .await?)
}

async fn sas(State(api): State<Shared>, Caller(who): Caller) -> Answer {
    let report = report(&api, &who).await?;
    ok(json!({ "sas": view::sas(&report.tunnels) }))
}

async fn attachments(State(api): State<Shared>, Caller(who): Caller) -> Answer {
    let mine: Vec<&datapath::AttachmentConfig> = (api.attachments.iter())
        .filter(|a| who.sees(a.tenant.as_str()))
        .collect();
    // The distributed form says where each is steered and counts its frames.
    let running = if mine.is_empty() {
        None
    } else {
        let a = Arc::clone(&api);
        tokio::task::spawn_blocking(move || a.backend.handle(Request::Nodes))
            .await
            .ok()
            .filter(|v| v.get("error").is_none())
    };
    let list: Vec<Value> = mine
        .iter()
        .map(|a| {
            let r = running.as_ref().and_then(|r| {
                r["attachments"]
                    .as_array()
                    .and_then(|l| l.iter().find(|x| x["name"] == a.name.as_str()))
            });
            view::attachment(a, r)
        })
        .collect();
    ok(json!({ "attachments": list }))
}

async fn attachment_migrate(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(name): Path<String>,
    Body(body): Body<MoveTo>,
) -> Answer {
    operator(&who)?;
    if !api.attachments.iter().any(|a| a.name == name) {
        return Err(HttpError::not_found(format!("no attachment {name:?}")));
    }
    ok(call(
        &api,
        &who,
        Request::Migrate {
            tunnel: name,
            to: body.to,
        },
    )
    .await?)
}

async fn tenants(State(api): State<Shared>, Caller(who): Caller) -> Answer {
    let report = report(&api, &who).await?;
    let mut list = view::tenants(&report);
    // A tenant with nothing running yet still sees itself.
    if let Some(t) = who.role.tenant() {
        if list.is_empty() {
            list.push(view::TenantSummary::empty(t.as_str()));
        }
    }
    ok(json!({ "tenants": list }))
}

async fn tenant(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(tenant): Path<String>,
) -> Answer {
    visible_tenant(&who, &tenant)?;
    let report = report(&api, &who).await?;
    let found = view::tenants(&report)
        .into_iter()
        .find(|s| s.name == tenant);
    match (found, who.role.tenant()) {
        (Some(s), _) => Ok(Json(s).into_response()),
        // Its own, with nothing running yet.
        (None, Some(_)) => Ok(Json(view::TenantSummary::empty(&tenant)).into_response()),
        (None, None) => Err(HttpError::not_found(format!("no tenant {tenant:?}"))),
    }
}

async fn filters_show(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(tenant): Path<String>,
) -> Answer {
    visible_tenant(&who, &tenant)?;
    ok(call(&api, &who, Request::FilterShow { tenant }).await?)
}

/// `POST /api/v1/tenants/{tenant}/filters`.
async fn filters_load(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(tenant): Path<String>,
    Body(f): Body<FilterLoad>,
) -> Answer {
    visible_tenant(&who, &tenant)?;
    ok(call(&api, &who, f.request(tenant)).await?)
}

/// `DELETE /api/v1/tenants/{tenant}/filters?direction=&section=`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilterUnload {
    #[serde(default)]
    direction: Option<String>,
    #[serde(default)]
    section: Option<String>,
}

async fn filters_unload(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(tenant): Path<String>,
    Params(p): Params<FilterUnload>,
) -> Answer {
    visible_tenant(&who, &tenant)?;
    let request = Request::FilterUnload {
        tenant,
        direction: p.direction,
        section: p.section,
    };
    ok(call(&api, &who, request).await?)
}

fn map_request(
    tenant: String,
    map: String,
    op: &str,
    key: Option<String>,
    value: Option<String>,
    flags: Option<String>,
) -> Request {
    Request::FilterMap {
        tenant,
        map,
        op: op.to_owned(),
        key,
        value,
        flags,
    }
}

async fn map_dump(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path((tenant, map)): Path<(String, String)>,
) -> Answer {
    visible_tenant(&who, &tenant)?;
    let request = map_request(tenant, map, "dump", None, None, None);
    ok(call(&api, &who, request).await?)
}

/// `PUT /api/v1/tenants/{tenant}/filters/maps/{map}/entries`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapEntry {
    key: String,
    value: String,
    #[serde(default)]
    flags: Option<String>,
}

async fn map_update(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path((tenant, map)): Path<(String, String)>,
    Body(e): Body<MapEntry>,
) -> Answer {
    visible_tenant(&who, &tenant)?;
    let request = map_request(tenant, map, "update", Some(e.key), Some(e.value), e.flags);
    ok(call(&api, &who, request).await?)
}

async fn map_delete(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path((tenant, map, key)): Path<(String, String, String)>,
) -> Answer {
    visible_tenant(&who, &tenant)?;
    let request = map_request(tenant, map, "delete", Some(key), None, None);
    ok(call(&api, &who, request).await?)
}

/// An operator-only request without arguments, answered as the control socket answers it.
async fn operator_request(api: Shared, who: Principal, request: Request) -> Answer {
    operator(&who)?;
    ok(call(&api, &who, request).await?)
}

async fn node_drain(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(node): Path<String>,
) -> Answer {
    operator_request(api, who, Request::Drain { node }).await
}

async fn node_undrain(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path(node): Path<String>,
) -> Answer {
    operator_request(api, who, Request::Undrain { node }).await
}

/// `POST /api/v1/apply`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Apply {
    config: String,
    #[serde(default)]
    dry_run: bool,
}

async fn apply(State(api): State<Shared>, Caller(who): Caller, Body(a): Body<Apply>) -> Answer {
    operator(&who)?;
    let request = Request::Apply {
        file: api.config_path.clone(),
        text: a.config,
        dry_run: a.dry_run,
    };
    ok(call(&api, &who, request).await?)
}

async fn routes_show(State(api): State<Shared>, Caller(who): Caller) -> Answer {
    operator(&who)?;
    let report = report(&api, &who).await?;
    ok(json!({ "routes": report.routes }))
}

/// `POST /api/v1/routes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteAdd {
    tenant: String,
    vnet: String,
    address: String,
    host: String,
}

async fn routes_add(
    State(api): State<Shared>,
    Caller(who): Caller,
    Body(r): Body<RouteAdd>,
) -> Answer {
    operator(&who)?;
    let request = Request::RouteAdd {
        tenant: r.tenant,
        vnet: r.vnet,
        address: r.address,
        host: r.host,
    };
    ok(call(&api, &who, request).await?)
}

async fn routes_del(
    State(api): State<Shared>,
    Caller(who): Caller,
    Path((tenant, vnet, address)): Path<(String, String, String)>,
) -> Answer {
    operator(&who)?;
    let request = Request::RouteDel {
        tenant,
        vnet,
        address,
    };
    ok(call(&api, &who, request).await?)
}

async fn metrics(State(api): State<Shared>, Caller(who): Caller) -> Answer {
    let a = Arc::clone(&api);
    let tenant = who.role.tenant().map(|t| t.as_str().to_owned());
    let (text, missing) = tokio::task::spawn_blocking(move || {
        let source: Arc<dyn metrics::Source> = a.backend.clone();
        match tenant {
            Some(t) => metrics::render_for_tenant(&source, &a.node, &t),
            None => metrics::render(&source, &a.node),
        }
    })
    .await
    .map_err(|e| HttpError::unavailable(format!("the scrape failed: {e}")))?;
    if let Some(reason) = missing {
        tracing::warn!(%reason, "API metrics incomplete (protego_up 0)");
    }
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::OPENAPI,
    )
        .into_response()
}

/// The console's page.
const CONSOLE: &str = include_str!("console.html");

async fn console() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // The page's own script and style only; no frames, no other origin.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; \
                 form-action 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        CONSOLE,
    )
        .into_response()
}

async fn no_route() -> HttpError {
    HttpError::not_found("no such route (docs/api.md; the routes are listed at /api/openapi.json)")
}

async fn no_method() -> HttpError {
    HttpError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "the route does not take this method (see /api/openapi.json)",
    )
}

/// The routes, registered with their (method, path).
struct Table {
    paths: BTreeMap<&'static str, MethodRouter<Shared>>,
    list: Vec<(&'static str, &'static str)>,
}

impl Table {
    /// Registers `handler` for `method` (GET, POST, PUT or DELETE) at `path`.
    fn at<H, T>(&mut self, method: &'static str, path: &'static str, handler: H)
    where
        H: axum::handler::Handler<T, Shared>,
        T: 'static,
    {
        let filter = match method {
            "GET" => MethodFilter::GET,
            "POST" => MethodFilter::POST,
            "PUT" => MethodFilter::PUT,
            "DELETE" => MethodFilter::DELETE,
            other => unreachable!("no route takes {other}"),
        };
        let route = axum::routing::on(filter, handler);
        let merged = match self.paths.remove(path) {
            Some(existing) => existing.merge(route),
            None => route,
        };
        self.paths.insert(path, merged);
        self.list.push((method, path));
    }
}

fn table() -> Table {
    let mut t = Table {
        paths: BTreeMap::new(),
        list: Vec::new(),
    };
    t.at("GET", "/", console);
    t.at("GET", "/api/openapi.json", openapi);
    t.at("GET", "/api/v1/whoami", whoami);
    t.at("GET", "/api/v1/status", status);
    t.at("GET", "/api/v1/tunnels", tunnels);
    t.at("GET", "/api/v1/tunnels/{name}", tunnel);
    t.at("GET", "/api/v1/tunnels/{name}/sas", tunnel_sas);
    t.at("GET", "/api/v1/tunnels/{name}/traffic", tunnel_traffic);
    for (path, action) in [
        ("/api/v1/tunnels/{name}/initiate", Action::Initiate),
        ("/api/v1/tunnels/{name}/terminate", Action::Terminate),
        ("/api/v1/tunnels/{name}/rekey", Action::Rekey),
        ("/api/v1/tunnels/{name}/rekey-ike", Action::RekeyIke),
    ] {
        t.at(
            "POST",
            path,
            move |State(api): State<Shared>, Caller(who): Caller, Path(name): Path<String>| {
                tunnel_action(api, who, name, action)
            },
        );
    }
    t.at("POST", "/api/v1/tunnels/{name}/migrate", tunnel_migrate);
    t.at("GET", "/api/v1/sas", sas);
    t.at("GET", "/api/v1/attachments", attachments);
    t.at(
        "POST",
        "/api/v1/attachments/{name}/migrate",
        attachment_migrate,
    );
    t.at("GET", "/api/v1/tenants", tenants);
    t.at("GET", "/api/v1/tenants/{tenant}", tenant);
    t.at("GET", "/api/v1/tenants/{tenant}/filters", filters_show);
    t.at("POST", "/api/v1/tenants/{tenant}/filters", filters_load);
    t.at("DELETE", "/api/v1/tenants/{tenant}/filters", filters_unload);
    t.at(
        "GET",
        "/api/v1/tenants/{tenant}/filters/maps/{map}",
        map_dump,
    );
    t.at(
        "PUT",
        "/api/v1/tenants/{tenant}/filters/maps/{map}/entries",
        map_update,
    );
    t.at(
        "DELETE",
        "/api/v1/tenants/{tenant}/filters/maps/{map}/entries/{key}",
        map_delete,
    );
    for (path, request) in [
        ("/api/v1/nodes", Request::Nodes),
        ("/api/v1/capacity", Request::Capacity),
        ("/api/v1/dispatch", Request::Dispatch),
    ] {
        t.at(
            "GET",
            path,
            move |State(api): State<Shared>, Caller(who): Caller| {
                operator_request(api, who, request.clone())
            },
        );
    }
    t.at("POST", "/api/v1/nodes/{node}/drain", node_drain);
    t.at("POST", "/api/v1/nodes/{node}/undrain", node_undrain);
    t.at("POST", "/api/v1/apply", apply);
    t.at("GET", "/api/v1/routes", routes_show);
    t.at("POST", "/api/v1/routes", routes_add);
    t.at(
        "DELETE",
        "/api/v1/routes/{tenant}/{vnet}/{address}",
        routes_del,
    );
    t.at(
        "POST",
        "/api/v1/store/rotate-key",
        |State(api): State<Shared>, Caller(who): Caller| {
            operator_request(api, who, Request::RotateStoreKey)
        },
    );
    t.at("GET", "/api/v1/metrics", metrics);
    t
}

/// Every implemented (method, path), in registration order (paths as OpenAPI writes them).
pub fn route_table() -> Vec<(&'static str, &'static str)> {
    table().list
}

/// The router over `api`.
pub(crate) fn router(api: Shared) -> Router {
    let mut router = Router::new();
    for (path, route) in table().paths {
        router = router.route(path, route);
    }
    router
        .fallback(no_route)
        .method_not_allowed_fallback(no_method)
        .layer(axum::extract::DefaultBodyLimit::max(crate::MAX_BODY))
        .with_state(api)
}
