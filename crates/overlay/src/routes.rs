//! The route file of `protego ctl route add|del|load FILE`: one entry a line, as CSV
//! (`tenant,vnet,address,host`) or as a JSON object
//! (`{"tenant":"acme","vnet":"prod","address":"10.2.0.7","host":"192.0.2.10"}`), the two
//! mixed freely. Blank lines and lines starting with `#` are skipped, and so is a first CSV line
//! `tenant,vnet,address,host` (a header). Tenant and VNet are names by the configuration's
//! rule ([`ids::check_name`]); the VNI is not in the file: it comes from the VNet's
//! configuration.
//!
//! Every error names its 1-based line and, where one is at fault, the field.

use core::fmt;
use std::borrow::Cow;
use std::net::IpAddr;

use crate::key::{Key, VnetId};
use crate::table::usable;

/// A field of a route line.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Field {
    /// `tenant`.
    Tenant,
    /// `vnet`.
    Vnet,
    /// `address`: the VM's address.
    Address,
    /// `host`: the host VTEP's address.
    Host,
}

impl Field {
    const ALL: [Field; 4] = [Field::Tenant, Field::Vnet, Field::Address, Field::Host];

    /// The field's name in the file.
    pub fn name(self) -> &'static str {
        match self {
            Field::Tenant => "tenant",
            Field::Vnet => "vnet",
            Field::Address => "address",
            Field::Host => "host",
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What is wrong with a route line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Problem {
    /// A CSV line without exactly four fields.
    #[error("expected 4 comma-separated fields (tenant,vnet,address,host), found {found}")]
    FieldCount {
        /// Fields found.
        found: usize,
    },
    /// A JSON line that is not a JSON object.
    #[error("not a JSON object: {0}")]
    Json(String),
    /// A JSON object without this field.
    #[error("missing")]
    Missing,
    /// A JSON field whose value is not a string.
    #[error("must be a string")]
    NotString,
    /// A JSON object with a field the format does not have.
    #[error("unknown field {0:?} (fields: tenant, vnet, address, host)")]
    UnknownField(String),
    /// A tenant or VNet name that breaks the naming rule.
    #[error("{0}")]
    Name(#[from] ids::InvalidName),
    /// Not an IPv4 or IPv6 address.
    #[error("{0:?} is not an IP address")]
    NotAnAddress(String),
    /// An address that cannot be a VM's or a host's: unspecified, multicast, broadcast.
    #[error("{0} is not a unicast address")]
    NotUnicast(IpAddr),
    /// The (tenant, VNet) pair is not configured.
    #[error("no VNet {vnet:?} of tenant {tenant:?} is configured")]
    UnknownVnet {
        /// The tenant.
        tenant: String,
        /// The VNet.
        vnet: String,
    },
}

/// A route line that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}{}: {problem}", field.map(|f| format!(", field {f}")).unwrap_or_default())]
pub struct RouteFileError {
    /// 1-based line number.
    pub line: usize,
    /// The field at fault, if one is.
    pub field: Option<Field>,
    /// What is wrong.
    pub problem: Problem,
}

/// One entry of a route file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteLine<'a> {
    /// 1-based line number.
    pub line: usize,
    /// The tenant's name (checked).
    pub tenant: Cow<'a, str>,
    /// The VNet's name (checked).
    pub vnet: Cow<'a, str>,
    /// The VM's address (a unicast address).
    pub address: IpAddr,
    /// The host VTEP's address (a unicast address).
    pub host: IpAddr,
}

/// The entries of route file `text`, in order, each or its error. Reads lazily: a 16 M-line file
/// is never held parsed.
pub fn parse_routes(text: &str) -> impl Iterator<Item = Result<RouteLine<'_>, RouteFileError>> {
    let mut header_allowed = true;
    text.lines().enumerate().filter_map(move |(i, raw)| {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let first = core::mem::replace(&mut header_allowed, false);
        if first && is_header(line) {
            return None;
        }
        Some(parse_line(i + 1, line))
    })
}

/// The entries of route file `text` as table entries: `vnet_of(tenant, vnet)` gives the number
/// of each configured VNet (None: not configured, an error naming the line).
pub fn resolve_routes<'a, F>(
    text: &'a str,
    mut vnet_of: F,
) -> impl Iterator<Item = Result<(Key, IpAddr), RouteFileError>> + 'a
where
    F: FnMut(&str, &str) -> Option<VnetId> + 'a,
{
    parse_routes(text).map(move |r| {
        let r = r?;
        let vnet = vnet_of(&r.tenant, &r.vnet).ok_or_else(|| RouteFileError {
            line: r.line,
            field: Some(Field::Vnet),
            problem: Problem::UnknownVnet {
                tenant: r.tenant.clone().into_owned(),
                vnet: r.vnet.clone().into_owned(),
            },
        })?;
        Ok((Key::new(vnet, r.address), r.host))
    })
}

fn is_header(line: &str) -> bool {
    let mut fields = line.split(',').map(str::trim);
    Field::ALL.iter().all(|f| {
        fields
            .next()
            .is_some_and(|x| x.eq_ignore_ascii_case(f.name()))
    }) && fields.next().is_none()
}

/// Parses one non-blank, non-comment line (trimmed).
pub fn parse_line(line: usize, text: &str) -> Result<RouteLine<'_>, RouteFileError> {
    let err = |field, problem| RouteFileError {
        line,
        field,
        problem,
    };
    let [tenant, vnet, address, host] = if text.starts_with('{') {
        json_fields(text).map_err(|(field, problem)| err(field, problem))?
    } else {
        let mut fields = text.split(',').map(|f| Cow::Borrowed(f.trim()));
        let found = [fields.next(), fields.next(), fields.next(), fields.next()];
        match (found, fields.next()) {
            ([Some(t), Some(v), Some(a), Some(h)], None) => [t, v, a, h],
            _ => {
                let found = text.split(',').count();
                return Err(err(None, Problem::FieldCount { found }));
            }
        }
    };
    ids::check_name(&tenant).map_err(|e| err(Some(Field::Tenant), e.into()))?;
    ids::check_name(&vnet).map_err(|e| err(Some(Field::Vnet), e.into()))?;
    let address = ip(&address).map_err(|p| err(Some(Field::Address), p))?;
    let host = ip(&host).map_err(|p| err(Some(Field::Host), p))?;
    Ok(RouteLine {
        line,
        tenant,
        vnet,
        address,
        host,
    })
}

fn ip(s: &str) -> Result<IpAddr, Problem> {
    let a: IpAddr = s.parse().map_err(|_| Problem::NotAnAddress(s.to_owned()))?;
    if usable(a) {
        Ok(a)
    } else {
        Err(Problem::NotUnicast(a))
    }
}

/// The four fields of a JSON line: fast through a borrowed struct, and when that fails, again
/// through a generic map to say which field is at fault.
fn json_fields(text: &str) -> Result<[Cow<'_, str>; 4], (Option<Field>, Problem)> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Line<'a> {
        #[serde(borrow)]
        tenant: Cow<'a, str>,
        #[serde(borrow)]
        vnet: Cow<'a, str>,
        #[serde(borrow)]
        address: Cow<'a, str>,
        #[serde(borrow)]
        host: Cow<'a, str>,
    }
    if let Ok(l) = serde_json::from_str::<Line<'_>>(text) {
        return Ok([l.tenant, l.vnet, l.address, l.host]);
    }
    let map: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(text).map_err(|e| (None, Problem::Json(e.to_string())))?;
    if let Some(unknown) = map
        .keys()
        .find(|k| Field::ALL.iter().all(|f| f.name() != k.as_str()))
    {
        return Err((None, Problem::UnknownField(unknown.clone())));
    }
    let mut out: [Cow<'_, str>; 4] = Default::default();
    for (slot, f) in out.iter_mut().zip(Field::ALL) {
        match map.get(f.name()) {
            None => return Err((Some(f), Problem::Missing)),
            Some(serde_json::Value::String(s)) => *slot = Cow::Owned(s.clone()),
            Some(_) => return Err((Some(f), Problem::NotString)),
        }
    }
    Ok(out)
}
