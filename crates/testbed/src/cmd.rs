//! Running external commands (ip, nft, swanctl, ping, iperf3, ...) with a time
//! limit, captured output, and errors that quote the command line and its stderr.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How long to wait for a finished command's output pipes to close.
const PIPE_GRACE: Duration = Duration::from_secs(5);

/// Default time limit for one command.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// A command line to run, optionally inside a network namespace.
#[derive(Clone, Debug)]
pub struct Cmd {
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    timeout: Duration,
}

/// What a finished command produced.
#[derive(Clone, Debug)]
pub struct Output {
    /// How it exited.
    pub status: ExitStatus,
    /// Its standard output (lossily decoded as UTF-8).
    pub stdout: String,
    /// Its standard error (lossily decoded as UTF-8).
    pub stderr: String,
}

impl Output {
    /// Whether the command exited with status 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// The exit code, if it exited normally.
    pub fn code(&self) -> Option<i32> {
        self.status.code()
    }
}

impl Cmd {
    /// A command running `program` with no arguments and the default time limit.
    pub fn new(program: impl Into<String>) -> Cmd {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Cmd {
        self.args.push(arg.into());
        self
    }

    /// Appends several arguments.
    pub fn args<I, S>(mut self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets an environment variable for the command.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Cmd {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Sets the time limit after which the command is killed.
    pub fn timeout(mut self, timeout: Duration) -> Cmd {
        self.timeout = timeout;
        self
    }

    /// Wraps the command in `ip netns exec <netns>`.
    pub fn in_netns(self, netns: &str) -> Cmd {
        let mut args = vec![
            "netns".to_owned(),
            "exec".to_owned(),
            netns.to_owned(),
            self.program,
        ];
        args.extend(self.args);
        Cmd {
            program: "ip".to_owned(),
            args,
            env: self.env,
            timeout: self.timeout,
        }
    }

    /// The program to execute.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// The arguments.
    pub fn arguments(&self) -> &[String] {
        &self.args
    }

    /// The command line as a shell would show it (environment first), for messages.
    pub fn display(&self) -> String {
        let mut parts: Vec<String> = self
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", shell_quote(v)))
            .collect();
        parts.push(shell_quote(&self.program));
        parts.extend(self.args.iter().map(|a| shell_quote(a)));
        parts.join(" ")
    }

    /// A `std::process::Command` for this command line (stdin closed).
    pub fn to_command(&self) -> Command {
        let mut c = Command::new(&self.program);
        c.args(&self.args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.stdin(Stdio::null());
        c
    }

    /// Runs the command to completion (or until the time limit) and returns what
    /// it produced, whatever its exit status.
    pub fn output(&self) -> Result<Output> {
        let mut command = self.to_command();
        command.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = command.spawn().map_err(|source| Error::Spawn {
            command: self.display(),
            source,
        })?;
        let stdout = child.stdout.take().map(reader_thread);
        let stderr = child.stderr.take().map(reader_thread);
        let status = match wait_deadline(&mut child, self.timeout) {
            Some(status) => status,
            None => {
                // Our own child: kill it by pid and reap it.
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::CommandTimeout {
                    command: self.display(),
                    timeout: self.timeout,
                });
            }
        };
        // A grandchild that inherited the pipes (a daemonizing tool) could keep
        // them open forever; collect what arrived within a short grace period.
        let collect = |rx: Option<mpsc::Receiver<Vec<u8>>>| {
            rx.and_then(|rx| rx.recv_timeout(PIPE_GRACE).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        Ok(Output {
            status,
            stdout: collect(stdout),
            stderr: collect(stderr),
        })
    }

    /// Runs the command and requires exit status 0; returns its stdout.
    pub fn run(&self) -> Result<String> {
        let out = self.output()?;
        if out.success() {
            Ok(out.stdout)
        } else {
            Err(self.failure(&out))
        }
    }

    /// The [`Error::Command`] describing `out` as a failure of this command.
    pub fn failure(&self, out: &Output) -> Error {
        let text = if out.stderr.trim().is_empty() {
            out.stdout.trim()
        } else {
            out.stderr.trim()
        };
        Error::Command {
            command: self.display(),
            status: describe_status(out.status),
            stderr: shorten(text, 2000),
        }
    }
}

/// Polls `child` until it exits or `timeout` passes; `None` on timeout.
pub(crate) fn wait_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            // try_wait only fails if the child was already reaped, which we never do
            // elsewhere; treat it as gone.
            Err(_) => return None,
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

fn reader_thread<R: Read + Send + 'static>(mut r: R) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(buf);
    });
    rx
}

/// Describes an exit status as "exit code N" or "killed by signal N".
pub(crate) fn describe_status(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        (None, None) => "unknown status".to_owned(),
    }
}

/// Cuts `s` to at most `max` bytes (on a char boundary), marking the cut.
pub(crate) fn shorten(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=,@%+".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Whether `program` can be found on `PATH` (or is an existing absolute path); see
/// [`testreq::find`].
pub fn program_exists(program: &str) -> bool {
    testreq::find(program).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_and_reports_failures() {
        let out = Cmd::new("sh")
            .args(["-c", "echo hi; echo oops >&2; exit 3"])
            .output()
            .expect("sh runs");
        assert_eq!(out.stdout, "hi\n");
        assert_eq!(out.code(), Some(3));
        let err = Cmd::new("sh")
            .args(["-c", "echo oops >&2; exit 3"])
            .run()
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("exit code 3") && msg.contains("oops"), "{msg}");
    }

    #[test]
    fn kills_on_timeout() {
        let start = Instant::now();
        let err = Cmd::new("sleep")
            .arg("10")
            .timeout(Duration::from_millis(100))
            .output()
            .unwrap_err();
        assert!(matches!(err, Error::CommandTimeout { .. }));
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn netns_wrapping_and_display() {
        let c = Cmd::new("ping")
            .args(["-c", "1", "a b"])
            .env("X", "1")
            .in_netns("pt-ns");
        assert_eq!(c.display(), "X=1 ip netns exec pt-ns ping -c 1 'a b'");
    }

    #[test]
    fn missing_program_is_a_spawn_error() {
        let err = Cmd::new("/nonexistent/prog").output().unwrap_err();
        assert!(matches!(err, Error::Spawn { .. }));
        assert!(!program_exists("/nonexistent/prog"));
        assert!(program_exists("sh"));
    }
}
