//! `protego certs`: a development CA and node certificates for mutual TLS between Protego's
//! processes (`rpc::certs` does the work; see it for what the certificates contain).

use clap::{Subcommand, ValueEnum};
use rpc::certs::{
    self, CaOptions, CertAuthority, CertError, NodeRequest, NodeRole, SubjectAltName, Validity,
    DEFAULT_CA_DAYS, DEFAULT_CA_NAME, DEFAULT_NODE_DAYS,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Shown under every `protego certs` help text.
const DEV_WARNING: &str = "This is a DEVELOPMENT CA: production deployments should use their \
own PKI, issuing node certificates with subject CN=<node>, OU=<control|data|steer> and \
extendedKeyUsage serverAuth and clientAuth.";

/// Options of `protego certs`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = DEV_WARNING)]
pub(crate) struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Debug, Clone, Subcommand)]
enum CertsCommand {
    /// Create a development CA: DIR/ca.pem (certificate) and DIR/ca.key (private key, mode
    /// 0600). Refuses to replace an existing CA unless --force.
    #[command(after_help = DEV_WARNING)]
    Init {
        /// Certificate directory (created, mode 0700, if missing).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The CA's common name.
        #[arg(long, value_name = "NAME", default_value = DEFAULT_CA_NAME)]
        ca_name: String,
        /// Validity in days.
        #[arg(long, value_name = "N", default_value_t = DEFAULT_CA_DAYS)]
        days: u32,
        /// Replace an existing CA; certificates it issued stop verifying.
        #[arg(long)]
        force: bool,
    },
    /// Issue a node certificate signed by DIR's CA: DIR/NODE.pem and DIR/NODE.key (mode
    /// 0600), subject CN=NODE, OU=ROLE, usable as TLS server and client. Replaces an earlier
    /// certificate of the same node.
    #[command(after_help = DEV_WARNING)]
    Issue {
        /// Certificate directory holding ca.pem and ca.key (from `protego certs init`).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Node name: the certificate's CN and the files' name (A-Z a-z 0-9 . _ -).
        #[arg(long, value_name = "NODE")]
        name: String,
        /// The node's role, recorded as the subject's OU.
        #[arg(long, value_enum, value_name = "ROLE")]
        role: RoleArg,
        /// An IP address peers reach the node at (subjectAltName); repeatable.
        #[arg(long = "ip", value_name = "ADDR")]
        ips: Vec<IpAddr>,
        /// A DNS name peers reach the node by (subjectAltName); repeatable.
        #[arg(long = "dns", value_name = "NAME")]
        dns: Vec<String>,
        /// Validity in days (at most the CA's remaining validity).
        #[arg(long, value_name = "N", default_value_t = DEFAULT_NODE_DAYS)]
        days: u32,
    },
    /// Issue a client certificate for the HTTP API signed by DIR's CA: DIR/NAME.pem and
    /// DIR/NAME.key (mode 0600), subject CN=NAME and OU=operator (--operator) or
    /// OU=tenant:TENANT (--tenant), usable only as a TLS client. The API accepts it when its
    /// `[api] client_ca_file` is DIR/ca.pem (docs/api.md).
    #[command(after_help = DEV_WARNING)]
    #[command(group(clap::ArgGroup::new("role").required(true).args(["operator", "tenant"])))]
    Client {
        /// Certificate directory holding ca.pem and ca.key (from `protego certs init`).
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// The principal's name: the certificate's CN and the files' name.
        #[arg(long, value_name = "NAME")]
        name: String,
        /// An operator's certificate (sees and does everything).
        #[arg(long)]
        operator: bool,
        /// A tenant's certificate (sees only that tenant).
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
        /// Validity in days (at most the CA's remaining validity).
        #[arg(long, value_name = "N", default_value_t = DEFAULT_NODE_DAYS)]
        days: u32,
    },
    /// Print a certificate: subject, role, issuer, SANs, validity, usages. Never prints keys.
    Show {
        /// A PEM certificate file.
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

/// `--role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum RoleArg {
    /// `protego control`.
    Control,
    /// `protego data`.
    Data,
    /// `protego steer`.
    Steer,
}

impl From<RoleArg> for NodeRole {
    fn from(role: RoleArg) -> Self {
        match role {
            RoleArg::Control => NodeRole::Control,
            RoleArg::Data => NodeRole::Data,
            RoleArg::Steer => NodeRole::Steer,
        }
    }
}

/// Runs `protego certs`.
pub(crate) fn run(args: &CertsArgs) -> ExitCode {
    let result = match &args.command {
        CertsCommand::Init {
            dir,
            ca_name,
            days,
            force,
        } => init(dir, ca_name, *days, *force),
        CertsCommand::Issue {
            dir,
            name,
            role,
            ips,
            dns,
            days,
        } => issue(dir, name, (*role).into(), ips, dns, *days),
        CertsCommand::Client {
            dir,
            name,
            operator,
            tenant,
            days,
        } => client(dir, name, *operator, tenant.as_deref(), *days),
        CertsCommand::Show { file } => certs::describe(file).map(|info| print!("{info}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init(dir: &Path, name: &str, days: u32, force: bool) -> Result<(), CertError> {
    let options = CaOptions {
        name: name.to_owned(),
        days,
        force,
    };
    let ca = certs::generate_ca_with(dir, &options).map_err(|e| match e {
        CertError::Exists { path } => CertError::Request(format!(
            "{} already exists: pass --force to replace the CA (certificates it issued will \
             stop verifying)",
            path.display()
        )),
        other => other,
    })?;
    println!("created CA {:?}", ca.name());
    println!("  certificate: {}", ca.cert_path().display());
    println!(
        "  private key: {} (mode 0600; needed only to issue, keep it off the nodes)",
        ca.key_path().display()
    );
    println!("  valid until: {}", certs::rfc3339(ca.not_after()));
    eprintln!("warning: this is a development CA; production deployments should use their own PKI");
    Ok(())
}

/// DIR's CA, or an error saying how to make one.
fn load_ca(dir: &Path) -> Result<CertAuthority, CertError> {
    CertAuthority::load(dir).map_err(|e| match e {
        CertError::Missing { path } => CertError::Request(format!(
            "{}: not found: create the CA first with `protego certs init --dir {}`",
            path.display(),
            dir.display()
        )),
        other => other,
    })
}

fn client(
    dir: &Path,
    name: &str,
    operator: bool,
    tenant: Option<&str>,
    days: u32,
) -> Result<(), CertError> {
    let ou = match (operator, tenant) {
        (true, _) => "operator".to_owned(),
        (false, Some(t)) => {
            ids::TenantId::new(t).map_err(|e| CertError::Request(format!("--tenant: {e}")))?;
            format!("tenant:{t}")
        }
        (false, None) => return Err(CertError::Request("say --operator or --tenant".into())),
    };
    let ca = load_ca(dir)?;
    let issued = certs::issue_api_client(dir, &ca, name, &ou, days)?;
    println!("issued API client {name} (OU {ou}) by CA {:?}", ca.name());
    println!("  certificate: {}", issued.cert_path.display());
    println!("  private key: {} (mode 0600)", issued.key_path.display());
    println!("  valid until: {}", certs::rfc3339(issued.not_after));
    Ok(())
}

fn issue(
    dir: &Path,
    name: &str,
    role: NodeRole,
    ips: &[IpAddr],
    dns: &[String],
    days: u32,
) -> Result<(), CertError> {
    let ca = load_ca(dir)?;
    let mut request = NodeRequest::new(name, role)?;
    request.validity = Validity::days_from_now(days)?;
    request.sans = ips
        .iter()
        .map(|ip| SubjectAltName::Ip(*ip))
        .chain(dns.iter().map(|d| SubjectAltName::Dns(d.clone())))
        .collect();
    let issued = certs::issue_with(dir, &ca, &request)?;
    println!("issued {name} (role {role}) by CA {:?}", ca.name());
    println!("  certificate: {}", issued.cert_path.display());
    println!("  private key: {} (mode 0600)", issued.key_path.display());
    let sans: Vec<String> = request.sans.iter().map(|s| s.to_string()).collect();
    println!(
        "  SANs:        {}",
        if sans.is_empty() {
            "none".to_owned()
        } else {
            sans.join(", ")
        }
    );
    println!("  valid until: {}", certs::rfc3339(issued.not_after));
    if sans.is_empty() {
        eprintln!(
            "warning: no --ip or --dns: TLS clients cannot verify this node as a server, only \
             as a client"
        );
    }
    Ok(())
}
