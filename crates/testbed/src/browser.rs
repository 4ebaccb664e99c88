//! A headless Chromium inside a test namespace, driven over the Chrome DevTools Protocol
//! (CDP): open a page, type, click, evaluate script, take a screenshot (the web console's
//! test, `tests/console.rs`).
//!
//! The browser is Debian's `chromium`, started with `--remote-debugging-pipe`: CDP messages
//! are JSON texts ending in a NUL byte, written to the browser's file descriptor 3 and read
//! from its descriptor 4. The Rust crates for CDP were considered and not taken:
//! `headless_chrome` 1.0 (blocking, tungstenite without TLS: no `ring`) and `chromiumoxide`
//! 0.9 (async, on a runtime of its own) both speak CDP over a WebSocket to a TCP port the
//! browser opens on its loopback, which is the test namespace's (where the console's server
//! listens), out of this process's reach without entering the namespace; and they bring a
//! WebSocket stack and a generated protocol binding for the dozen commands a test sends. A
//! pipe crosses the namespace boundary as it is, and the client is a page of serde_json.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use base64ct::Encoding as _;
use serde_json::{json, Value};

use crate::error::{Error, Result};
use crate::{Cmd, Netns};

/// The browser's program (Debian's package `chromium`, in `scripts/requirements.tsv`).
pub const CHROMIUM: &str = "chromium";

/// How long one DevTools command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The window the pages are laid out in (and the screenshots' size).
const WINDOW: (u32, u32) = (1280, 1000);

/// A headless Chromium with one page (tab) open, stopped when dropped.
pub struct Browser {
    child: Child,
    commands: File,
    messages: Receiver<Value>,
    next_id: u64,
    session: String,
    log: PathBuf,
}

/// Options of [`Browser::start`].
#[derive(Debug, Clone, Default)]
pub struct BrowserOptions {
    /// Accept TLS certificates whose chain, as the server sends it, holds a key with one of
    /// these SPKI hashes (SHA-256, Base64; `--ignore-certificate-errors-spki-list`): how a
    /// test trusts its server's key without touching the machine's trust store (a CA the
    /// server does not send never matches).
    pub trust_spki: Vec<String>,
}

/// A pipe's read and write ends, from pipe2(2) with `O_CLOEXEC`.
fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(Error::io(
            "create pipe",
            "pipe2",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: pipe2 succeeded: both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

impl Browser {
    /// Starts Chromium in `ns` (`ip netns exec`) with its profile, its home and its log
    /// (`label.log`) in a directory of the namespace's run directory, and opens a blank page.
    pub fn start(ns: &Netns, label: &str, options: &BrowserOptions) -> Result<Browser> {
        let dir = ns.run_dir().join(label);
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let log = dir.join(format!("{label}.log"));
        let out = File::create(&log).map_err(|e| Error::io("create log", &log, e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io("duplicate log handle", &log, e))?;
        let home = dir.display().to_string();
        let mut cmd = Cmd::new(CHROMIUM)
            .args([
                "--headless",
                // Chromium refuses to run as root with its sandbox; the test bed is root.
                "--no-sandbox",
                "--remote-debugging-pipe",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-default-apps",
                "--disable-extensions",
                "--disable-sync",
                "--disable-gpu",
                "--mute-audio",
                "--hide-scrollbars",
            ])
            .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
            .arg(format!("--user-data-dir={home}/profile"))
            .env("HOME", home.clone())
            .env("XDG_CONFIG_HOME", format!("{home}/config"))
            .env("XDG_CACHE_HOME", format!("{home}/cache"));
        if !options.trust_spki.is_empty() {
            cmd = cmd.arg(format!(
                "--ignore-certificate-errors-spki-list={}",
                options.trust_spki.join(",")
            ));
        }
        let cmd = cmd.arg("about:blank").in_netns(ns.name());

        // Descriptor 3: the browser reads commands; descriptor 4: it writes answers.
        let (browser_reads, we_write) = pipe()?;
        let (we_read, browser_writes) = pipe()?;
        let (r, w) = (
            std::os::fd::AsRawFd::as_raw_fd(&browser_reads),
            std::os::fd::AsRawFd::as_raw_fd(&browser_writes),
        );
        let mut command = cmd.to_command();
        command.stdout(Stdio::from(out)).stderr(Stdio::from(err));
        // SAFETY: the closure only calls fcntl and dup2, which are async-signal-safe, on
        // descriptors open in the child (inherited copies of `browser_reads` and
        // `browser_writes`).
        unsafe {
            command.pre_exec(move || {
                // First above 10, so that dup2 onto 3 and 4 cannot overwrite the other end
                // (the pipes may themselves be 3 and 4); dup2 clears O_CLOEXEC.
                let high_r = libc::fcntl(r, libc::F_DUPFD_CLOEXEC, 10);
                let high_w = libc::fcntl(w, libc::F_DUPFD_CLOEXEC, 10);
                if high_r < 0
                    || high_w < 0
                    || libc::dup2(high_r, 3) < 0
                    || libc::dup2(high_w, 4) < 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|source| Error::Spawn {
            command: cmd.display(),
            source,
        })?;
        // The child has its copies; ours of the browser's ends must close, so that reading
        // sees the end of the pipe when the browser exits.
        drop((browser_reads, browser_writes));

        let (tx, messages) = mpsc::channel();
        let reader = File::from(we_read);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(reader);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                if buf.last() == Some(&0) {
                    buf.pop();
                }
                let Ok(message) = serde_json::from_slice::<Value>(&buf) else {
                    continue;
                };
                if tx.send(message).is_err() {
                    break;
                }
            }
        });
        let mut browser = Browser {
            child,
            commands: File::from(we_write),
            messages,
            next_id: 1,
            session: String::new(),
            log,
        };
        let target = browser.browser_call("Target.createTarget", json!({"url": "about:blank"}))?;
        let target_id = target["targetId"].as_str().unwrap_or_default().to_owned();
        let attached = browser.browser_call(
            "Target.attachToTarget",
            json!({"targetId": target_id, "flatten": true}),
        )?;
        browser.session = attached["sessionId"]
            .as_str()
            .ok_or_else(|| Error::Browser {
                method: "Target.attachToTarget".to_owned(),
                detail: format!("no sessionId in {attached}"),
            })?
            .to_owned();
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": WINDOW.0, "height": WINDOW.1, "deviceScaleFactor": 1, "mobile": false}),
        )?;
        Ok(browser)
    }

    /// The browser's log (its stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends `method` to the browser itself (no page session) and waits for its result.
    fn browser_call(&mut self, method: &str, params: Value) -> Result<Value> {
        self.send(method, params, None)
    }

    /// Sends `method` to the page and waits for its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value> {
        let session = self.session.clone();
        self.send(method, params, Some(&session))
    }

    fn send(&mut self, method: &str, params: Value, session: Option<&str>) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(s) = session {
            message["sessionId"] = s.into();
        }
        let gone = |detail: String| Error::Browser {
            method: method.to_owned(),
            detail,
        };
        let mut bytes = message.to_string().into_bytes();
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .map_err(|e| gone(format!("cannot write to the browser: {e}")))?;
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // Events (no `id`) and answers to abandoned commands are skipped.
            match self.messages.recv_timeout(left) {
                Ok(m) if m["id"] == id => {
                    if let Some(e) = m.get("error") {
                        return Err(gone(e.to_string()));
                    }
                    return Ok(m["result"].clone());
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    return Err(gone(format!("no answer within {COMMAND_TIMEOUT:?}")))
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(gone(format!(
                        "the browser exited; its log:\n{}",
                        self.log()
                    )))
                }
            }
        }
    }

    /// Opens `url` in the page (it may still be loading when this returns; wait for what
    /// the test needs with [`Browser::wait_until`]).
    pub fn navigate(&mut self, url: &str) -> Result<()> {
        let r = self.call("Page.navigate", json!({"url": url}))?;
        match r.get("errorText").and_then(Value::as_str) {
            Some(e) if !e.is_empty() => Err(Error::Browser {
                method: "Page.navigate".to_owned(),
                detail: format!("{url}: {e}"),
            }),
            _ => Ok(()),
        }
    }

    /// Evaluates `expression` in the page (a promise is awaited) and returns its value as
    /// JSON; an exception is an [`Error::Browser`].
    pub fn eval(&mut self, expression: &str) -> Result<Value> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            let text = e["exception"]["description"]
                .as_str()
                .or(e["text"].as_str())
                .unwrap_or_default();
            return Err(Error::Browser {
                method: "Runtime.evaluate".to_owned(),
                detail: format!("{expression}: {text}"),
            });
        }
        Ok(r["result"]["value"].clone())
    }

    /// Evaluates `expression` every 200 ms until it is truthy (true, a non-empty string or
    /// array, a non-zero number) and returns that value; after `timeout` an
    /// [`Error::WaitTimeout`] naming `what` with the last value. A throwing expression counts
    /// as not yet true (the page may not have loaded).
    pub fn wait_until(&mut self, what: &str, expression: &str, timeout: Duration) -> Result<Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.eval(expression) {
                Ok(v) if truthy(&v) => return Ok(v),
                Ok(v) => v.to_string(),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(Error::WaitTimeout {
                    what: what.to_owned(),
                    timeout,
                    last,
                });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The centre of the element `selector` selects, scrolled into view, in CSS pixels.
    fn centre(&mut self, selector: &str) -> Result<(f64, f64)> {
        let sel = serde_json::to_string(selector).unwrap_or_default();
        let v = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return [r.left + r.width / 2, r.top + r.height / 2]; }})()"
        ))?;
        match (v[0].as_f64(), v[1].as_f64()) {
            (Some(x), Some(y)) => Ok((x, y)),
            _ => Err(Error::Browser {
                method: "DOM".to_owned(),
                detail: format!("no element {selector}"),
            }),
        }
    }

    /// Clicks the element `selector` selects with the left mouse button, as a user does.
    pub fn click(&mut self, selector: &str) -> Result<()> {
        let (x, y) = self.centre(selector)?;
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}),
            )?;
        }
        Ok(())
    }

    /// Focuses the element `selector` selects and types `text` into it.
    pub fn type_into(&mut self, selector: &str, text: &str) -> Result<()> {
        self.click(selector)?;
        self.call("Input.insertText", json!({"text": text}))?;
        Ok(())
    }

    /// A PNG of the page's viewport, written to `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<()> {
        let r = self.call("Page.captureScreenshot", json!({"format": "png"}))?;
        let data = r["data"].as_str().unwrap_or_default();
        let png = base64ct::Base64::decode_vec(data).map_err(|e| Error::Browser {
            method: "Page.captureScreenshot".to_owned(),
            detail: format!("the image is not Base64: {e}"),
        })?;
        std::fs::write(path, png).map_err(|e| Error::io("write screenshot", path, e))
    }
}

/// JavaScript's truthiness of a JSON value.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(_) => true,
    }
}

impl Drop for Browser {
    /// Closes the browser (`Browser.close`), and kills it by its pid if it has not exited
    /// within 5 s.
    fn drop(&mut self) {
        let _ = self.browser_call("Browser.close", json!({}));
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Child::kill sends SIGKILL to this pid only.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
