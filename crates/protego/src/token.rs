//! `protego token`: the HTTP API's bearer tokens (docs/api.md, "Tokens"). The file holds
//! only their hashes; a new token is printed once.

use api::{Role, TokenFile};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Default tokens file (`[api] tokens_file` of the packaged configuration).
const DEFAULT_TOKENS: &str = "/etc/protego/api-tokens";

/// Options of `protego token`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct TokenArgs {
    /// The tokens file (`[api] tokens_file`).
    #[arg(short, long, value_name = "FILE", default_value = DEFAULT_TOKENS, global = true)]
    file: PathBuf,
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
enum TokenCommand {
    /// Make a token for NAME: an operator's (--operator) or a tenant's (--tenant T). Prints
    /// the token once and adds its SHA-256 to the file (created with mode 0600 if missing);
    /// a running node accepts it at once.
    #[command(group(clap::ArgGroup::new("role").required(true).args(["operator", "tenant"])))]
    Add {
        /// The token's name (A-Z a-z 0-9 . _ - @), for logs and `revoke`.
        name: String,
        /// The token may do everything.
        #[arg(long)]
        operator: bool,
        /// The token sees and changes only this tenant's objects.
        #[arg(long, value_name = "TENANT")]
        tenant: Option<String>,
    },
    /// List the tokens' names and roles (the tokens themselves are not kept).
    List,
    /// Remove the token NAME; a running node refuses it from its next request.
    Revoke {
        /// The token's name.
        name: String,
    },
}

/// Runs `protego token`.
pub(crate) fn run(args: &TokenArgs) -> ExitCode {
    match command(&args.file, &args.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn command(file: &Path, command: &TokenCommand) -> Result<(), String> {
    let mut tokens = TokenFile::load(file)?;
    match command {
        TokenCommand::Add {
            name,
            operator,
            tenant,
        } => {
            let role = match (operator, tenant) {
                (true, _) => Role::Operator,
                (false, Some(t)) => Role::parse(&format!("tenant:{t}"))?,
                (false, None) => return Err("say --operator or --tenant TENANT".into()),
            };
            let token = tokens.add(name, role.clone())?;
            tokens.save(file)?;
            eprintln!(
                "token {name:?} ({role}) added to {}; it is shown only now:",
                file.display()
            );
            println!("{token}");
        }
        TokenCommand::List => {
            println!("{:<24} ROLE", "NAME");
            for e in tokens.entries() {
                println!("{:<24} {}", e.name, e.role);
            }
        }
        TokenCommand::Revoke { name } => {
            if !tokens.revoke(name) {
                return Err(format!("no token named {name:?} in {}", file.display()));
            }
            tokens.save(file)?;
            eprintln!("token {name:?} revoked");
        }
    }
    Ok(())
}
