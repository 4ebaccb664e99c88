//! The web console (issue 20 §3, docs/api.md "The web console") in a real browser: `protego up`
//! with `[api]` over TLS and two tenants, acme's tunnel up with a strongSwan 5.9 site and
//! carrying pings, globex's configured and down. A headless Chromium (Debian's `chromium`,
//! driven over the DevTools protocol, `protego_testbed::browser`) logs in with an operator's
//! token and sees both tunnels, opens acme's tunnel page and waits for its traffic chart to
//! draw, and the capacity view (none on `protego up`); then logs out and in with acme's token
//! and sees only acme: globex's tunnel is nowhere on its overview or its tenant page, the
//! capacity view is not offered and globex's tunnel page says "not found". No page holds a
//! PSK or a token. The screenshots go to `target/test-artifacts/console/`.
//!
//! Needs root and the tools from `scripts/setup.sh` (strongSwan, chromium, openssl), and the
//! `protego` binary built in the same profile (`make test` does both).

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

use protego_testbed::browser::{Browser, BrowserOptions};
use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::{workspace_bin, Cmd, Testbed, Topology};

/// Test results: the test bed's errors, I/O, parsing and the test's own complaints.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Where the gateway serves the API and the console, inside its namespace (the browser runs
/// there too).
const API: &str = "127.0.0.1:19443";
/// globex's PSK (acme's is `common::PSK`): neither may reach a page.
const GLOBEX_PSK: &str = "console-test-globex-psk-51c9";
/// How long a page may take to show what is waited for (the console refreshes every 2 s).
const PAGE: Duration = Duration::from_secs(20);

/// What the pages are checked against.
struct Expect {
    /// acme's tunnel (up).
    acme: String,
    /// globex's tunnel (down), which acme must not see.
    globex: String,
    /// acme's IKE SA's initiator SPI and CHILD_SA's inbound SPI, from `protego status`.
    spis: [String; 2],
    /// The PSKs and the tokens: on no page.
    secrets: Vec<String>,
}

/// An error unless `ok`.
fn check(ok: bool, what: impl std::fmt::Display) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(what.to_string().into())
    }
}

/// Runs `protego ARGS...` and returns what it printed on stdout, trimmed.
fn protego(args: &[&str]) -> Result<String> {
    let bin = workspace_bin("protego")?;
    Ok(Cmd::new(bin.display().to_string())
        .args(args.iter().copied())
        .run()?
        .trim()
        .to_owned())
}

/// The SHA-256 of `cert`'s public key (SPKI), Base64: what Chromium's
/// `--ignore-certificate-errors-spki-list` trusts.
fn spki_sha256(cert: &Path) -> Result<String> {
    let pipeline = "openssl x509 -in \"$1\" -pubkey -noout | openssl pkey -pubin -outform der \
                    | openssl dgst -sha256 -binary | openssl base64 -A";
    let cert = cert.display().to_string();
    Ok(Cmd::new("sh")
        .args(["-c", pipeline, "sh", &cert])
        .run()?
        .trim()
        .to_owned())
}

/// `target/test-artifacts/console/` (the test executable is `target/<profile>/deps/console-…`).
fn artifacts() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let target = exe
        .ancestors()
        .nth(3)
        .ok_or("the test executable is not under target/<profile>/deps")?;
    Ok(target.join("test-artifacts").join("console"))
}

/// Saves a screenshot as `name` among the artifacts and prints its path.
fn screenshot(browser: &mut Browser, name: &str) -> Result<()> {
    let path = artifacts()?.join(name);
    browser.screenshot(&path)?;
    eprintln!("screenshot: {}", path.display());
    Ok(())
}

/// A JavaScript string literal of `s`.
fn js(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A JS expression: the text of the element `selector` selects ("" if there is none).
fn text_of(selector: &str) -> String {
    format!(
        "((document.querySelector({}) || {{}}).innerText || '')",
        js(selector)
    )
}

/// A JS expression: whether the element `selector` selects exists.
fn exists(selector: &str) -> String {
    format!("!!document.querySelector({})", js(selector))
}

/// A JS expression: the number of points of the chart's polyline of class `class`.
fn points(class: &str) -> String {
    format!(
        "(document.querySelector('#traffic-chart polyline.{class}')?.getAttribute('points') || '')\
         .trim().split(/\\s+/).filter(Boolean).length"
    )
}

/// The page's text, as a string.
fn page_text(browser: &mut Browser) -> Result<String> {
    let v = browser.eval("document.body.innerText")?;
    Ok(v.as_str().unwrap_or_default().to_owned())
}

/// Fails if the page's markup, text or form fields hold a secret.
fn check_no_secret(browser: &mut Browser, page: &str, expect: &Expect) -> Result<()> {
    let all = browser.eval(
        "document.documentElement.outerHTML + '\\n' + document.body.innerText + '\\n' + \
         [...document.querySelectorAll('input')].map((i) => i.value).join('\\n')",
    )?;
    let all = all.as_str().unwrap_or_default();
    check(all.len() > 1000, format!("{page}: no page? {all}"))?;
    for (i, s) in expect.secrets.iter().enumerate() {
        check(
            !all.contains(s),
            format!("{page}: secret #{i} is on the page"),
        )?;
    }
    Ok(())
}

/// Logs in with `token`: types it into the form and clicks the button, as a user does.
fn log_in(browser: &mut Browser, token: &str) -> Result<()> {
    browser.wait_until(
        "the login form",
        "!document.getElementById('login-view').hidden",
        PAGE,
    )?;
    browser.type_into("#token", token)?;
    browser.click("#login")?;
    Ok(())
}

/// The operator's pages: the overview with both tunnels, acme's tunnel page with its chart,
/// the capacity view; then logs out.
fn operator_views(browser: &mut Browser, token: &str, expect: &Expect) -> Result<()> {
    log_in(browser, token)?;
    let both = format!(
        "{t}.includes({a}) && {t}.includes({g}) && {t}.includes('established')",
        t = text_of("#tunnels"),
        a = js(&expect.acme),
        g = js(&expect.globex)
    );
    browser.wait_until("both tunnels in the operator's table", &both, PAGE)?;
    check(
        browser.eval(&text_of("#who"))? == "operator alice",
        "#who does not name the operator",
    )?;
    check(
        browser.eval(&exists("#nav a[href=\"#/capacity\"]"))? == true,
        "no capacity view offered to the operator",
    )?;
    let nodes = browser.eval(&text_of("#nodes"))?;
    check(
        nodes.to_string().contains("Single-process gateway"),
        format!("nodes: {nodes}"),
    )?;
    check_no_secret(browser, "operator overview", expect)?;
    screenshot(browser, "operator-overview.png")?;

    // acme's tunnel page: its SAs, and the chart draws (two points a series at least) with
    // the pings' traffic above the time axis.
    browser.click(&format!(
        "#tunnels a[href={}]",
        js(&format!("#/tunnels/{}", expect.acme))
    ))?;
    let sas = format!(
        "{t}.includes({}) && {t}.includes({})",
        js(&expect.spis[0]),
        js(&expect.spis[1]),
        t = text_of("#view")
    );
    browser.wait_until("the tunnel page with its SPIs", &sas, PAGE)?;
    let (p_in, p_out) = (points("series-in"), points("series-out"));
    let drawn = format!("{p_in} >= 2 && {p_out} >= 2 && [{p_in}, {p_out}]");
    let counts = browser.wait_until("the traffic chart's points", &drawn, PAGE)?;
    eprintln!("chart points (in, out): {counts}");
    let above_axis = "(() => { const c = document.getElementById('traffic-chart'); \
         const axis = +c.querySelectorAll('line.axis')[1].getAttribute('y1'); \
         return c.querySelector('polyline.series-in').getAttribute('points').trim() \
         .split(/\\s+/).some((p) => +p.split(',')[1] < axis - 1); })()";
    browser.wait_until("traffic in above the chart's axis", above_axis, PAGE)?;
    let labels = browser.eval("document.getElementById('traffic-chart').textContent")?;
    check(
        labels.to_string().contains("rate (bit/s)")
            && labels.to_string().contains("time before now"),
        format!("axis labels: {labels}"),
    )?;
    let text = page_text(browser)?;
    check(
        text.contains("AES_GCM_16_256"),
        format!("no proposal: {text}"),
    )?;
    check_no_secret(browser, "operator tunnel page", expect)?;
    // A few more points, so that the screenshot shows a line rather than a dot.
    browser.wait_until("six points a series", &format!("{p_in} >= 6"), PAGE)?;
    screenshot(browser, "operator-tunnel.png")?;

    // The capacity view: `protego up` has no autoscaler, and says so.
    browser.click("#nav a[href=\"#/capacity\"]")?;
    let none = format!("{}.includes('single-process gateway')", text_of("#view"));
    browser.wait_until("the capacity view of a single process", &none, PAGE)?;

    // Log out: the form again, nothing kept in the tab.
    browser.click("#logout")?;
    browser.wait_until(
        "the login form after logging out",
        "!document.getElementById('login-view').hidden && sessionStorage.length === 0",
        PAGE,
    )?;
    Ok(())
}

/// acme's pages: its overview and tenant page without a trace of globex, no operator views,
/// and "not found" for globex's tunnel.
fn tenant_views(browser: &mut Browser, token: &str, expect: &Expect) -> Result<()> {
    log_in(browser, token)?;
    let mine = format!("{}.includes({})", text_of("#tunnels"), js(&expect.acme));
    browser.wait_until("acme's tunnel in its overview", &mine, PAGE)?;
    let all = browser.eval("document.documentElement.outerHTML + document.body.innerText")?;
    check(
        !all.to_string().contains(&expect.globex) && !all.to_string().contains("globex"),
        "globex or its tunnel shown to acme",
    )?;
    check(
        browser.eval(&text_of("#who"))? == "tenant acme (acme-ci)",
        "#who does not name the tenant",
    )?;
    let operator_only = format!(
        "{} || {} || {}.includes('Capacity')",
        exists("a[href=\"#/capacity\"]"),
        exists("#nodes"),
        text_of("#nav")
    );
    check(
        browser.eval(&operator_only)? == false,
        "capacity or nodes offered to a tenant",
    )?;
    check_no_secret(browser, "tenant overview", expect)?;
    screenshot(browser, "tenant-overview.png")?;

    // Its tenant page: its tunnel, no filters, no globex.
    browser.click("#nav a[href=\"#/tenants/acme\"]")?;
    let page = format!(
        "{t}.includes('Tenant acme') && {t}.includes({a}) && {t}.includes('No filters loaded')",
        t = text_of("#view"),
        a = js(&expect.acme)
    );
    browser.wait_until("acme's tenant page", &page, PAGE)?;
    check(
        !page_text(browser)?.contains("globex"),
        "globex on acme's tenant page",
    )?;
    check_no_secret(browser, "tenant page", expect)?;
    screenshot(browser, "tenant-page.png")?;

    // globex's tunnel, asked for by its name: as if it did not exist.
    let hash = js(&format!("#/tunnels/{}", expect.globex));
    browser.eval(&format!("location.hash = {hash}"))?;
    let missing = format!("{}.includes('not found')", text_of("#view"));
    browser.wait_until("'not found' for globex's tunnel", &missing, PAGE)?;
    check_no_secret(browser, "tenant asking for globex's tunnel", expect)?;
    screenshot(browser, "tenant-other-tunnel.png")?;
    Ok(())
}

#[test]
fn operator_and_tenant_see_their_own_pages_and_the_traffic_chart_draws() -> Result<()> {
    let test = "console";
    if !["chromium", "swanctl", "openssl"]
        .iter()
        .all(|p| testreq::program(test, p))
    {
        return Ok(());
    }
    // This run's screenshots only (no failure.png of an earlier run).
    let shots = artifacts()?;
    if shots.exists() {
        std::fs::remove_dir_all(&shots)?;
    }
    std::fs::create_dir_all(&shots)?;

    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, numbered_tenants(&[("acme", 4311), ("globex", 4312)])?)?;
    let acme = GatewayTunnel::for_site(&topo, 0, PSK);
    let globex = GatewayTunnel::for_site(&topo, 1, GLOBEX_PSK);

    // The API's certificate from a development CA, and a token of each kind.
    let pki = bed.dir().join("pki");
    let dir = pki.display().to_string();
    protego(&["certs", "init", "--dir", &dir])?;
    let issue = [
        "certs", "issue", "--dir", &dir, "--name", "api", "--role", "control",
    ];
    protego(&[&issue[..], &["--ip", "127.0.0.1", "--dns", "localhost"]].concat())?;
    let tokens = pki.join("api-tokens").display().to_string();
    let operator = protego(&["token", "add", "--file", &tokens, "--operator", "alice"])?;
    let tenant = protego(&[
        "token", "add", "--file", &tokens, "--tenant", "acme", "acme-ci",
    ])?;
    check(
        operator.len() >= 32 && tenant.len() >= 32 && operator != tenant,
        "protego token add printed no tokens",
    )?;
    let api_table = format!(
        "[api]\nlisten = \"{API}\"\ncert_file = {:?}\nkey_file = {:?}\ntokens_file = {tokens:?}\n",
        pki.join("api.pem").display().to_string(),
        pki.join("api.key").display().to_string(),
    );
    let tunnels = [acme.clone(), globex.clone()];
    let gw = ProtegoGateway::start_with_tables(&bed, &topo, &tunnels, &[], &api_table)?;

    // acme's tunnel up, with traffic through it while the browser looks.
    let _site = site_up(&topo, &acme)?;
    ping_all_vms(&topo, 0, 20)?;
    let (site, vm) = (&topo.sites[0], &topo.tenants[0].vms[0]);
    let pings = site.ns.spawn(
        "pings",
        Cmd::new("ping")
            .args(["-n", "-q", "-i", "0.05", "-s", "1200", "-I"])
            .args([site.lan_addr.to_string(), vm.addr.addr.to_string()]),
    )?;
    let status = tunnel_status(&gw, &acme.name)?;
    let sa = &status["ike_sas"][0];
    let spi = |v: &serde_json::Value| v.as_str().unwrap_or("no SPI in status").to_owned();
    let expect = Expect {
        acme: acme.name.clone(),
        globex: globex.name.clone(),
        spis: [spi(&sa["spi_i"]), spi(&sa["children"][0]["spi_in"])],
        secrets: vec![
            PSK.to_owned(),
            GLOBEX_PSK.to_owned(),
            operator.clone(),
            tenant.clone(),
        ],
    };

    let options = BrowserOptions {
        // The list matches the keys of the chain the server presents: its own certificate's
        // (the CA's certificate is not sent).
        trust_spki: vec![spki_sha256(&pki.join("api.pem"))?],
    };
    let mut browser = Browser::start(&topo.gateway.ns, "chromium", &options)?;
    let result = browser
        .navigate(&format!("https://{API}/"))
        .map_err(Into::into)
        .and_then(|()| operator_views(&mut browser, &operator, &expect))
        .and_then(|()| tenant_views(&mut browser, &tenant, &expect));
    if let Err(e) = &result {
        let _ = screenshot(&mut browser, "failure.png");
        eprintln!(
            "console test failed: {e}\nbrowser log:\n{}\ngateway log:\n{}",
            browser.log(),
            gw.process().log_tail(60)
        );
    }
    drop(browser);
    pings.stop();
    result?;
    drop(gw);
    bed.teardown()?;
    Ok(())
}
