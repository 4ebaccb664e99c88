//! The `protego` command: `up` runs a gateway node (data plane, IKEv2 control loop per
//! RFC 7296, status socket) from a configuration file, `check` validates a configuration,
//! `status` shows the tunnels of a running node, `bench` measures the data plane, `certs`
//! makes a development CA and node certificates for the distributed form's mutual TLS,
//! `control`/`data`/`steer` run the distributed form's nodes, `ctl` operates a running node,
//! and `sim` replays a day of tunnel demand through the elastic provisioning model.

mod bench;
mod certs;
mod cluster;
mod filterctl;
mod man;
mod sim;
mod token;
mod up;

use clap::{Parser, Subcommand};
use control::config::DEFAULT_CONTROL_SOCKET;
use control::{Config, Error};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The allocator: mimalloc instead of glibc's. Status reports, metrics scrapes and IKE
/// state are many small objects made and freed together; with glibc a 10 000-tunnel scrape
/// spent almost half its time in `free` and chunk consolidation (docs/performance.md,
/// "Metrics scrapes").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Default configuration file.
const DEFAULT_CONFIG: &str = "/etc/protego/protego.toml";
/// Default configuration file of a data node.
const DEFAULT_DATA_CONFIG: &str = "/etc/protego/data.toml";
/// Default configuration file of a steer node.
const DEFAULT_STEER_CONFIG: &str = "/etc/protego/steer.toml";

/// Protego: an IPsec (IKEv2/ESP) VPN gateway for many tenants.
#[derive(Debug, Parser)]
#[command(name = "protego", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a gateway node: validate the configuration, start the data plane, the IKE control
    /// loop and the status socket; SIGINT/SIGTERM delete every IKE SA and stop.
    Up {
        /// Configuration file (TOML, see docs/configuration.md).
        #[arg(short, long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Log filter: error, warn, info, debug, trace, or tracing directives such as
        /// `info,protego_ike=debug`. RUST_LOG overrides it.
        #[arg(long, value_name = "FILTER", default_value = "info")]
        log_level: String,
        /// Delete the tenants, VNets and tunnels last applied with `protego ctl apply` from the
        /// store and run the file's (by default the applied ones win over the file's).
        #[arg(long)]
        discard_applied: bool,
    },
    /// Validate a configuration file and print what it sets up; nothing is started.
    Check {
        /// Configuration file.
        #[arg(short, long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
    },
    /// Show the tunnels of a running node: state, SPIs, proposals, bytes and packets.
    Status {
        /// Control socket of the node (default: the configuration's `control_socket`, else
        /// /run/protego/protego.sock).
        #[arg(short, long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Read the socket path from this configuration file.
        #[arg(short, long, value_name = "FILE", conflicts_with = "socket")]
        config: Option<PathBuf>,
        /// Print the raw JSON document instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Benchmark the data plane: real ESP traffic through this binary's gateway (`protego up`
    /// in a network namespace) and optionally strongSwan; prints rates, CPU per byte and
    /// packet, losses and latency per case (needs root; see docs/performance.md).
    Bench(Box<bench::BenchArgs>),
    /// Make a development CA and node certificates for mutual TLS between nodes, and show
    /// certificates (development only: production deployments should use their own PKI).
    Certs(certs::CertsArgs),
    /// Make, list and revoke the bearer tokens of the HTTP API (`[api] tokens_file`): an
    /// operator's, or a tenant's that sees only that tenant (docs/api.md).
    Token(token::TokenArgs),
    /// Run a control node of the distributed form: the IKE control loop of `protego up` from
    /// the same configuration (plus `[cluster]`), driving data and steer nodes over gRPC.
    Control {
        /// Configuration file (as for `up`, with a [cluster] section).
        #[arg(short, long, value_name = "FILE", default_value = DEFAULT_CONFIG)]
        config: PathBuf,
        /// Log filter (as for `up`).
        #[arg(long, value_name = "FILTER", default_value = "info")]
        log_level: String,
        /// As for `up`: run the file's tenants, VNets and tunnels, deleting the applied ones
        /// from the store.
        #[arg(long)]
        discard_applied: bool,
    },
    /// Run a data node of the distributed form: ESP and VXLAN behind the steer nodes, as the
    /// control node directs.
    Data {
        /// Node configuration file ([node] and [data], see docs/operations.md).
        #[arg(short, long, value_name = "FILE", default_value = DEFAULT_DATA_CONFIG)]
        config: PathBuf,
        /// Log filter (as for `up`).
        #[arg(long, value_name = "FILTER", default_value = "info")]
        log_level: String,
    },
    /// Run a steer node of the distributed form: owns the public VIP and steers IKE to the
    /// control node, ESP and VXLAN to data nodes, with rate limits and health probes.
    Steer {
        /// Node configuration file ([node] and [steer], see docs/operations.md).
        #[arg(short, long, value_name = "FILE", default_value = DEFAULT_STEER_CONFIG)]
        config: PathBuf,
        /// Log filter (as for `up`).
        #[arg(long, value_name = "FILTER", default_value = "info")]
        log_level: String,
    },
    /// Operate a running node: apply a changed configuration, rotate the store's encryption
    /// key; on a control node of the distributed form also list nodes, migrate a tunnel, drain a
    /// data node.
    Ctl(cluster::CtlArgs),
    /// Replay a day of tunnel demand (a CSV trace or a generated one) through the elastic
    /// provisioning model and its baselines: active capacity, violations, the daily bandwidth
    /// guarantee and the saving against dedicated VM pairs (the paper's §7.4, Table 2,
    /// Figure 11).
    Sim(sim::SimArgs),
    /// Write the manual pages of `protego` and every subcommand (roff) into a directory; the
    /// Debian package's build runs it (scripts/deb.sh).
    #[command(hide = true)]
    Man(man::ManArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Up {
            config,
            log_level,
            discard_applied,
        } => up::run(&config, &log_level, discard_applied),
        Command::Check { config } => check(&config),
        Command::Status {
            socket,
            config,
            json,
        } => status(socket, config.as_deref(), json),
        Command::Bench(args) => bench::run(&args),
        Command::Certs(args) => certs::run(&args),
        Command::Token(args) => token::run(&args),
        Command::Control {
            config,
            log_level,
            discard_applied,
        } => cluster::run_control(&config, &log_level, discard_applied),
        Command::Data { config, log_level } => {
            cluster::run_node(cluster::NodeKind::Data, &config, &log_level)
        }
        Command::Steer { config, log_level } => {
            cluster::run_node(cluster::NodeKind::Steer, &config, &log_level)
        }
        Command::Ctl(args) => cluster::run_ctl(&args),
        Command::Sim(args) => sim::run(&args),
        Command::Man(args) => man::run(&args),
    }
}

/// The control socket to talk to: `--socket`, else the configuration's, else the default.
pub(crate) fn socket_path(
    socket: Option<PathBuf>,
    config: Option<&Path>,
) -> Result<PathBuf, ExitCode> {
    match (socket, config) {
        (Some(s), _) => Ok(s),
        (None, Some(c)) => match Config::load(c) {
            Ok(config) => Ok(config.gateway.control_socket),
            Err(e) => {
                report_error(&e);
                Err(ExitCode::FAILURE)
            }
        },
        (None, None) => Ok(PathBuf::from(DEFAULT_CONTROL_SOCKET)),
    }
}

/// Prints a configuration error with its excerpt to stderr.
pub(crate) fn report_error(error: &Error) {
    eprintln!("error: {error}");
    if let Error::Config(e) = error {
        if let Some(snippet) = e.snippet() {
            eprintln!("{snippet}");
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match Config::load(path) {
        Ok(config) => {
            print!("{}", config.summary());
            for w in &config.warnings {
                eprintln!("warning: {w}");
            }
            println!("{}: OK", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            report_error(&e);
            ExitCode::FAILURE
        }
    }
}

fn status(socket: Option<PathBuf>, config: Option<&Path>, json: bool) -> ExitCode {
    let socket = match socket_path(socket, config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    match control::status::query_status(&socket) {
        Ok(report) if json => match serde_json::to_string_pretty(&report) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot format the status: {e}");
                ExitCode::FAILURE
            }
        },
        Ok(report) => {
            print!("{}", control::status::render_text(&report));
            ExitCode::SUCCESS
        }
        Err(e @ Error::Socket { .. }) => {
            eprintln!("error: {e}");
            eprintln!("hint: is `protego up` running, and is this its control_socket?");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_subcommands() {
        let cli = Cli::try_parse_from([
            "protego",
            "up",
            "--config",
            "x.toml",
            "--log-level",
            "debug",
        ])
        .unwrap();
        assert!(
            matches!(cli.command, Command::Up { ref config, ref log_level, discard_applied: false }
            if config == Path::new("x.toml") && log_level == "debug")
        );
        let cli = Cli::try_parse_from(["protego", "status", "--json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Status {
                socket: None,
                config: None,
                json: true
            }
        ));
        assert!(
            Cli::try_parse_from(["protego", "status", "--socket", "a", "--config", "b"]).is_err()
        );
        let cli = Cli::try_parse_from([
            "protego", "bench", "--quick", "--sizes", "1400", "--dirs", "in", "--json",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Bench(_)));
        let cli = Cli::try_parse_from([
            "protego",
            "sim",
            "--generate",
            "paper",
            "--seed",
            "3",
            "--json",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Sim(_)));
        assert!(
            Cli::try_parse_from(["protego", "bench", "--strongswan-only"]).is_err(),
            "--strongswan-only needs --compare-strongswan"
        );
        let cli = Cli::try_parse_from(["protego", "bench", "failover", "--json"]).unwrap();
        assert!(matches!(cli.command, Command::Bench(_)));
        let cli = Cli::try_parse_from([
            "protego",
            "bench",
            "edge",
            "--quick",
            "--entries",
            "1,16M",
            "--dirs",
            "to-ce",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Bench(_)));
        let cli = Cli::try_parse_from([
            "protego",
            "bench",
            "site",
            "--streams",
            "1,8",
            "--rounds",
            "2",
            "--gateway-option",
            "workers = 1",
            "--json",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Bench(_)));
        let cli = Cli::try_parse_from([
            "protego", "bench", "--quick", "--loads", "50,10", "--peers", "single",
        ])
        .unwrap();
        assert!(matches!(cli.command, Command::Bench(_)));
        let cli =
            Cli::try_parse_from(["protego", "ctl", "migrate", "t1", "--to", "data2"]).unwrap();
        assert!(matches!(cli.command, Command::Ctl(_)));
        assert!(Cli::try_parse_from(["protego", "ctl", "migrate", "t1"]).is_err());
        let cli = Cli::try_parse_from(["protego", "ctl", "store", "rotate-key"]).unwrap();
        assert!(matches!(cli.command, Command::Ctl(_)));
        assert!(Cli::try_parse_from(["protego", "ctl", "store"]).is_err());
        let cli = Cli::try_parse_from(["protego", "data", "-c", "d.toml"]).unwrap();
        assert!(matches!(cli.command, Command::Data { .. }));
        let cli = Cli::try_parse_from(["protego", "check"]).unwrap();
        assert!(
            matches!(cli.command, Command::Check { ref config } if config == Path::new(DEFAULT_CONFIG))
        );
    }
}
