//! The `[gateway]` section: listen addresses and ports, the data plane's workers and CPUs, logs,
//! the control socket.

use super::*;

impl Validator<'_, '_> {
    pub(super) fn gateway(
        &mut self,
        g: &Spanned<RawGateway>,
    ) -> Result<(Gateway, ike::EndpointConfig, DataplaneExtra), Box<ConfigError>> {
        const S: &str = "[gateway]";
        let g = g.get_ref();

        let mut listen: Vec<IpAddr> = Vec::new();
        for text in &g.listen.get_ref().0 {
            let addr: IpAddr = text.parse().map_err(|_| {
                self.err(
                    g.listen.span(),
                    S,
                    "listen",
                    format!("{text:?} is not an IP address"),
                )
            })?;
            if addr.is_unspecified() || addr.is_multicast() {
                return Err(self.err(
                    g.listen.span(),
                    S,
                    "listen",
                    format!("{addr} is not a unicast address; list the concrete addresses peers connect to"),
                ));
            }
            if listen.contains(&addr) {
                return Err(self.err(
                    g.listen.span(),
                    S,
                    "listen",
                    format!("{addr} is listed twice"),
                ));
            }
            listen.push(addr);
        }
        if listen.is_empty() {
            return Err(self.err(
                g.listen.span(),
                S,
                "listen",
                "at least one address is required",
            ));
        }

        let control_socket = match &g.control_socket {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(self.err(p.span(), S, "control_socket", "must not be empty"));
            }
            Some(p) => PathBuf::from(p.get_ref()),
            None => PathBuf::from(DEFAULT_CONTROL_SOCKET),
        };
        let log_format = match &g.log_format {
            None => LogFormat::Text,
            Some(f) => match f.get_ref().as_str() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    return Err(self.err(
                        f.span(),
                        S,
                        "log_format",
                        format!("unknown log format {other:?} (use \"text\" or \"json\")"),
                    ));
                }
            },
        };
        let key_log = match &g.key_log {
            Some(p) if p.get_ref().trim().is_empty() => {
                return Err(self.err(
                    p.span(),
                    S,
                    "key_log",
                    "must not be empty (omit the key to disable)",
                ));
            }
            Some(p) => Some(self.relative_path(p.get_ref())),
            None => None,
        };
        let ike_port = self.port(g.ike_port.as_ref(), "ike_port", DEFAULT_IKE_PORT)?;
        let natt_port = self.port(g.natt_port.as_ref(), "natt_port", DEFAULT_NATT_PORT)?;
        let vxlan_port = self.port(g.vxlan_port.as_ref(), "vxlan_port", DEFAULT_VXLAN_PORT)?;
        if ike_port == natt_port {
            let span = g
                .natt_port
                .as_ref()
                .or(g.ike_port.as_ref())
                .map_or(0..0, Spanned::span);
            return Err(self.err(
                span,
                S,
                "natt_port",
                format!("must differ from ike_port ({ike_port})"),
            ));
        }
        let tun_name = match &g.tun_name {
            None => DEFAULT_TUN_NAME.to_owned(),
            Some(n) => {
                let name = n.get_ref();
                // IFNAMSIZ is 16 including the terminating NUL.
                let ok = !name.is_empty()
                    && name.len() < 16
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                if !ok {
                    return Err(self.err(
                        n.span(),
                        S,
                        "tun_name",
                        format!("{name:?} is not a valid interface name (1-15 characters: letters, digits, - _ .)"),
                    ));
                }
                name.clone()
            }
        };
        let batch = match &g.batch {
            None => DEFAULT_BATCH,
            Some(b) => usize::try_from(*b.get_ref())
                .ok()
                .filter(|n| (1..=1024).contains(n))
                .ok_or_else(|| self.err(b.span(), S, "batch", "must be between 1 and 1024"))?,
        };
        let workers = match &g.workers {
            // 0: one worker per CPU the process may run on (the data plane counts them).
            None => 0,
            Some(w) => usize::try_from(*w.get_ref())
                .ok()
                .filter(|n| (1..=MAX_WORKERS).contains(n))
                .ok_or_else(|| {
                    self.err(
                        w.span(),
                        S,
                        "workers",
                        format!("must be between 1 and {MAX_WORKERS}"),
                    )
                })?,
        };
        let cpus = match &g.cpus {
            None => Vec::new(),
            Some(list) => {
                if list.get_ref().is_empty() {
                    return Err(self.err(
                        list.span(),
                        S,
                        "cpus",
                        "must list at least one CPU (leave it out for all CPUs; pin_workers = false to not pin)",
                    ));
                }
                let mut cpus = Vec::with_capacity(list.get_ref().len());
                for c in list.get_ref() {
                    let cpu = usize::try_from(*c)
                        .ok()
                        .filter(|c| *c < MAX_CPU)
                        .ok_or_else(|| {
                            self.err(
                                list.span(),
                                S,
                                "cpus",
                                format!("{c} is not a CPU number (0..{MAX_CPU})"),
                            )
                        })?;
                    if cpus.contains(&cpu) {
                        return Err(self.err(
                            list.span(),
                            S,
                            "cpus",
                            format!("CPU {cpu} is listed twice"),
                        ));
                    }
                    cpus.push(cpu);
                }
                cpus
            }
        };
        let pin_workers = g.pin_workers.as_ref().is_none_or(|p| *p.get_ref());
        let busy_poll = match &g.busy_poll {
            None => DEFAULT_BUSY_POLL,
            Some(b) if b.get_ref().0 > MAX_BUSY_POLL => {
                return Err(self.err(
                    b.span(),
                    S,
                    "busy_poll",
                    format!("must be at most {}ms", MAX_BUSY_POLL.as_millis()),
                ))
            }
            Some(b) => b.get_ref().0,
        };
        let busy_poll_budget = match &g.busy_poll_budget {
            None => datapath::DEFAULT_BUSY_POLL_BUDGET,
            Some(b) => u8::try_from(*b.get_ref())
                .ok()
                .filter(|n| (1..=100).contains(n))
                .ok_or_else(|| {
                    self.err(
                        b.span(),
                        S,
                        "busy_poll_budget",
                        "must be between 1 and 100 (percent of a worker's time)",
                    )
                })?,
        };
        let xdp = match &g.xdp {
            None => datapath::XdpMode::Off,
            Some(x) => datapath::XdpMode::from_name(x.get_ref()).ok_or_else(|| {
                self.err(
                    x.span(),
                    S,
                    "xdp",
                    "must be \"off\", \"auto\", \"native\" or \"generic\"",
                )
            })?,
        };

        let mut endpoint = ike::EndpointConfig {
            key_log: key_log.is_some(),
            ..Default::default()
        };
        if let Some(t) = &g.retransmit_timeout {
            if t.get_ref().0.is_zero() {
                return Err(self.err(t.span(), S, "retransmit_timeout", "must be at least 1s"));
            }
            endpoint.retransmit_timeout = t.get_ref().0;
        }
        if let Some(b) = &g.retransmit_base {
            let base = *b.get_ref();
            if !(1.0..=10.0).contains(&base) {
                return Err(self.err(
                    b.span(),
                    S,
                    "retransmit_base",
                    "must be between 1.0 and 10.0",
                ));
            }
            endpoint.retransmit_base = base;
        }
        if let Some(t) = &g.retransmit_tries {
            endpoint.retransmit_tries = u32::try_from(*t.get_ref())
                .ok()
                .filter(|n| *n <= 100)
                .ok_or_else(|| {
                    self.err(t.span(), S, "retransmit_tries", "must be between 0 and 100")
                })?;
        }
        if let Some(c) = &g.cookie_threshold {
            endpoint.cookie_threshold = usize::try_from(*c.get_ref())
                .map_err(|_| self.err(c.span(), S, "cookie_threshold", "must not be negative"))?;
        }
        if let Some(t) = &g.half_open_timeout {
            if t.get_ref().0.is_zero() {
                return Err(self.err(t.span(), S, "half_open_timeout", "must be at least 1s"));
            }
            endpoint.half_open_timeout = t.get_ref().0;
        }
        if let Some(t) = &g.keep_alive {
            if t.get_ref().0.is_zero() {
                return Err(self.err(t.span(), S, "keep_alive", "must be at least 1s"));
            }
            endpoint.nat_keepalive = t.get_ref().0;
        }

        let cpu_fairness = match &g.cpu_fairness {
            None => datapath::CpuFairness::Off,
            Some(f) => match f.get_ref().as_str() {
                "off" => datapath::CpuFairness::Off,
                "account" => datapath::CpuFairness::Account,
                "enforce" => datapath::CpuFairness::Enforce,
                other => {
                    return Err(self.err(
                        f.span(),
                        S,
                        "cpu_fairness",
                        format!("unknown mode {other:?} (use \"off\", \"account\" or \"enforce\")"),
                    ));
                }
            },
        };

        let gateway = Gateway {
            listen,
            control_socket,
            log_format,
            key_log,
            ike_port,
            natt_port,
            cpu_fairness,
        };
        Ok((
            gateway,
            endpoint,
            DataplaneExtra {
                vxlan_port,
                tun_name,
                batch,
                workers,
                cpus,
                pin_workers,
                busy_poll,
                busy_poll_budget,
                xdp,
                fair_kernel_gate: g.cpu_fairness_kernel.as_ref().is_some_and(|k| *k.get_ref()),
            },
        ))
    }

    pub(super) fn port(
        &self,
        value: Option<&Spanned<i64>>,
        key: &str,
        default: u16,
    ) -> Result<u16, Box<ConfigError>> {
        match value {
            None => Ok(default),
            Some(p) => u16::try_from(*p.get_ref())
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| {
                    self.err(
                        p.span(),
                        "[gateway]",
                        key,
                        "must be a port number between 1 and 65535",
                    )
                }),
        }
    }
}
