//! `protego bench --scrape-every`: a Prometheus-like scraper of the gateway's `[metrics]`
//! listener while the cases run, so that the cost of a scrape with many tunnels (its
//! duration and size) and its effect on forwarding (the cases' figures beside a run without
//! it) are measured as an operator would see them (issue 20 §1).

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use testbed::Netns;

/// Where the gateway under test serves its metrics, inside its namespace.
pub(crate) const METRICS_ADDR: &str = "127.0.0.1:19180";

/// One scrape.
#[derive(Debug, Clone, Copy)]
struct Scrape {
    took: Duration,
    /// What the gateway says its reading and formatting took
    /// (`protego_scrape_duration_seconds`): the rest of `took` is the transfer.
    server: Option<Duration>,
    bytes: usize,
    series: usize,
}

/// A scraper thread; [`Scraper::finish`] stops it and summarises.
pub(crate) struct Scraper {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<(Vec<Scrape>, Vec<String>)>>,
}

impl Scraper {
    /// Scrapes `METRICS_ADDR` in `ns` every `every` until finished.
    pub(crate) fn start(ns: &Netns, every: Duration) -> Scraper {
        let stop = Arc::new(AtomicBool::new(false));
        let ns = ns.clone();
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("bench-scraper".into())
            .spawn(move || {
                let (mut done, mut errors) = (Vec::new(), Vec::new());
                while !flag.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    match scrape_once(&ns) {
                        Ok(s) => done.push(s),
                        Err(e) => errors.push(e),
                    }
                    let left = every.saturating_sub(started.elapsed());
                    std::thread::sleep(left.max(Duration::from_millis(1)));
                }
                (done, errors)
            })
            .ok();
        Scraper { stop, thread }
    }

    /// Stops scraping; the summary line (count, median/p99/max duration, size, series).
    pub(crate) fn finish(mut self) -> String {
        self.stop.store(true, Ordering::Relaxed);
        let Some((done, errors)) = self.thread.take().and_then(|t| t.join().ok()) else {
            return "scraper: could not run".to_owned();
        };
        summary("scrapes during the cases", done, &errors)
    }
}

impl Drop for Scraper {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `rounds` scrapes one after the other on an idle gateway (its tunnels up, no load): what a
/// scrape costs by itself. The summary line.
pub(crate) fn idle(ns: &Netns, rounds: usize) -> String {
    let (mut done, mut errors) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        match scrape_once(ns) {
            Ok(s) => done.push(s),
            Err(e) => errors.push(e),
        }
    }
    summary("scrapes of the idle gateway", done, &errors)
}

/// The summary line of a set of scrapes: count, median/p99/max/first duration, size, series.
fn summary(what: &str, mut done: Vec<Scrape>, errors: &[String]) -> String {
    if done.is_empty() {
        return format!("{what}: none succeeded ({})", errors.join("; "));
    }
    // The first of a set is shown apart: the idle set's first is the listener's first scrape,
    // which allocates and faults in its text buffer (later ones reuse it).
    let first = done[0].took;
    done.sort_by_key(|s| s.took);
    let pick = |q: f64| done[((done.len() - 1) as f64 * q).round() as usize].took;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let last = done
        .iter()
        .max_by_key(|s| s.bytes)
        .copied()
        .unwrap_or(done[0]);
    let mut server: Vec<Duration> = done.iter().filter_map(|s| s.server).collect();
    server.sort();
    let server = match server.len() {
        0 => String::new(),
        n => format!(
            " (the gateway's reading and formatting: median {:.1} ms, max {:.1} ms)",
            ms(server[n / 2]),
            ms(server[n - 1])
        ),
    };
    format!(
        "{what}: {} (failed {}), duration median {:.1} ms, p99 {:.1} ms, max {:.1} ms, first {:.1} ms{server}; {:.1} MB, {} series",
        done.len(),
        errors.len(),
        ms(pick(0.5)),
        ms(pick(0.99)),
        ms(done[done.len() - 1].took),
        ms(first),
        last.bytes as f64 / 1e6,
        last.series,
    )
}

/// One GET of `/metrics`, timed from the connection to the last byte.
fn scrape_once(ns: &Netns) -> Result<Scrape, String> {
    let to: SocketAddr = METRICS_ADDR.parse().map_err(|e| format!("{e}"))?;
    let started = Instant::now();
    let mut s = ns
        .tcp_connect(
            "0.0.0.0:0".parse().map_err(|e| format!("{e}"))?,
            to,
            Duration::from_secs(5),
        )
        .map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut body = Vec::new();
    s.read_to_end(&mut body).map_err(|e| e.to_string())?;
    let took = started.elapsed();
    let text = String::from_utf8_lossy(&body);
    if !text.starts_with("HTTP/1.1 200") {
        return Err(text.lines().next().unwrap_or_default().to_owned());
    }
    let series = text.lines().filter(|l| l.starts_with("protego_")).count();
    let server = (text.lines())
        .filter(|l| l.starts_with("protego_scrape_duration_seconds{"))
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok());
    Ok(Scrape {
        took,
        server,
        bytes: body.len(),
        series,
    })
}
