//! `protego man --out DIR` (hidden): writes a manual page (roff, section 1) for `protego` and
//! for every subcommand its `--help` lists, recursively (`protego-ctl-route-add.1`...), rendered
//! from the same `clap` definitions as `--help` by `clap_mangen`.
//!
//! A hidden subcommand rather than a separate xtask binary: the command definitions live in
//! this binary crate (no library exposes them), and rendering them from the binary being
//! packaged means the pages cannot drift from it. `scripts/deb.sh` runs it at package build
//! time; the pages are not kept in the repository.

use clap::CommandFactory;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Options of `protego man`.
#[derive(Debug, clap::Args)]
pub(crate) struct ManArgs {
    /// Directory for the pages (created if missing): protego.1, protego-up.1, ...
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The pages' date (their `.TH` line), e.g. the release commit's: the same sources give
    /// the same pages.
    #[arg(long, value_name = "YYYY-MM-DD", value_parser = iso_date)]
    date: String,
}

/// Accepts a date written YYYY-MM-DD.
fn iso_date(text: &str) -> Result<String, String> {
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if b.len() == 10
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
    {
        Ok(text.to_owned())
    } else {
        Err("expected a date written YYYY-MM-DD".to_owned())
    }
}

/// Writes the pages and prints their paths, one per line.
pub(crate) fn run(args: &ManArgs) -> ExitCode {
    match write_pages(crate::Cli::command(), &args.out, &args.date) {
        Ok(pages) => {
            for page in pages {
                println!("{}", page.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!(
                "error: cannot write the manual pages to {}: {e}",
                args.out.display()
            );
            ExitCode::FAILURE
        }
    }
}

/// Writes the page of `root` and of each subcommand below it that is not hidden into `dir`,
/// dated `date`; returns the files written, parents before their subcommands.
fn write_pages(root: clap::Command, dir: &Path, date: &str) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    // clap's own `help` subcommand is no command of ours. Building names every subcommand
    // after its path (`protego-ctl-apply`), which becomes the page's file name and title.
    let mut root = root.disable_help_subcommand(true);
    root.build();
    let mut written = Vec::new();
    write_tree(&root, dir, date, &mut written)?;
    Ok(written)
}

fn write_tree(
    cmd: &clap::Command,
    dir: &Path,
    date: &str,
    written: &mut Vec<PathBuf>,
) -> io::Result<()> {
    // Every field set: clap_mangen writes an empty one as nothing, which would shift the
    // `.TH` arguments after it.
    let page = clap_mangen::Man::new(cmd.clone())
        .date(date)
        .source(format!("protego {}", env!("CARGO_PKG_VERSION")))
        .manual("Protego");
    written.push(page.generate_to(dir)?);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_tree(sub, dir, date, written)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One page per visible command path, named after it; no page for `man` itself or for
    /// clap's `help`; each page is roff with its whole title line and the command's own
    /// options. A date that is not YYYY-MM-DD is refused.
    #[test]
    fn writes_a_page_per_visible_subcommand() {
        let dir = std::env::temp_dir().join(format!("protego-man-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let pages = write_pages(crate::Cli::command(), &dir, "2025-01-31").expect("pages written");
        let names: Vec<String> = pages
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        for expected in [
            "protego.1",
            "protego-up.1",
            "protego-ctl.1",
            "protego-ctl-apply.1",
            "protego-ctl-route-add.1",
            "protego-ctl-filter-map.1",
            "protego-certs.1",
        ] {
            assert!(names.iter().any(|n| n == expected), "{expected}: {names:?}");
        }
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("protego-man") || n.contains("help")),
            "{names:?}"
        );
        let apply = std::fs::read_to_string(dir.join("protego-ctl-apply.1")).unwrap();
        assert!(
            apply.contains(&format!(
                "\n.TH protego-ctl-apply 1 2025-01-31 \"protego {}\" Protego\n",
                env!("CARGO_PKG_VERSION")
            )),
            "{apply}"
        );
        assert!(apply.contains("dry\\-run"), "{apply}");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(iso_date("2025-1-31").is_err() && iso_date("").is_err());
    }
}
