//! The `[cluster]` section: the distributed form's timings and limits, the autoscaler and its
//! node provider.

use super::*;

/// The lowest `guarantee_target` (G*) taken: the calibrator aims at
/// `provision::forecast::SATURATED_PER_VIOLATION · (1 − G*)` saturated steps, at most half of
/// them, so every G* up to `1 − 0.5 / 2` behaves the same.
const MIN_GUARANTEE_TARGET: f64 = 1.0 - 0.5 / provision::forecast::SATURATED_PER_VIOLATION;

impl Validator<'_, '_> {
    /// `[cluster]`: every key checked; addresses must be explicit (not a wildcard) because
    /// nodes are told to reach them.
    pub(super) fn cluster(
        &self,
        raw: &Spanned<RawCluster>,
    ) -> Result<ClusterConfig, Box<ConfigError>> {
        const S: &str = "cluster";
        let c = raw.get_ref();
        self.check_name(&c.name, "[cluster]")?;
        let socket = |value: &Spanned<String>, key: &str| {
            value
                .get_ref()
                .trim()
                .parse::<std::net::SocketAddr>()
                .ok()
                .filter(|a| !a.ip().is_unspecified() && a.port() != 0)
                .ok_or_else(|| {
                    self.err(
                        value.span(),
                        S,
                        key,
                        "must be an address and port the other nodes can reach, e.g. \"10.0.0.1:7300\" or \"[fd00::1]:7300\"",
                    )
                })
        };
        let file = |value: &Spanned<String>, key: &str| {
            if value.get_ref().trim().is_empty() {
                return Err(self.err(value.span(), S, key, "must not be empty"));
            }
            Ok(self.relative_path(value.get_ref().trim()))
        };
        let interval = |value: &Option<Spanned<crate::config::raw::DurationValue>>,
                        key: &str,
                        default: Duration,
                        range: std::ops::RangeInclusive<Duration>| {
            self.duration_in(value, S, key, default, range)
        };
        let report_interval = interval(
            &c.report_interval,
            "report_interval",
            DEFAULT_REPORT_INTERVAL,
            Duration::from_millis(100)..=Duration::from_secs(60),
        )?;
        Ok(ClusterConfig {
            attachment_steers: Default::default(),
            name: c.name.get_ref().clone(),
            grpc: socket(&c.grpc, "grpc")?,
            geneve: socket(&c.geneve, "geneve")?,
            ca: file(&c.ca, "ca")?,
            cert: file(&c.cert, "cert")?,
            key: file(&c.key, "key")?,
            report_interval,
            directive_timeout: interval(
                &c.directive_timeout,
                "directive_timeout",
                DEFAULT_DIRECTIVE_TIMEOUT,
                Duration::from_millis(100)..=Duration::from_secs(30),
            )?,
            lease: match &c.lease {
                Some(d) if d.get_ref().0.subsec_nanos() != 0 => {
                    return Err(self.err(
                        d.span(),
                        S,
                        "lease",
                        "must be whole seconds (etcd grants leases in seconds)",
                    ))
                }
                other => interval(
                    other,
                    "lease",
                    crate::store::DEFAULT_LEASE_TTL,
                    Duration::from_secs(1)..=Duration::from_secs(60),
                )?,
            },
            node_capacity_mbit: match &c.node_capacity_mbit {
                None => DEFAULT_NODE_CAPACITY_MBIT,
                Some(v) => u32::try_from(*v.get_ref())
                    .ok()
                    .filter(|m| (1..=10_000_000).contains(m))
                    .ok_or_else(|| {
                        self.err(
                            v.span(),
                            S,
                            "node_capacity_mbit",
                            "must be between 1 and 10000000 (Mbit/s)",
                        )
                    })?,
            },
            autoscale: self.autoscale(c.autoscale.as_ref(), report_interval)?,
            dispatch: self.dispatch(c.dispatch.as_ref())?,
        })
    }

    /// `[cluster.dispatch]`: the mode, `K`, the announcements and the ring's parameters
    /// (checked together: `T_M` must be at least `T_L`).
    pub(super) fn dispatch(
        &self,
        raw: Option<&RawDispatch>,
    ) -> Result<ClusterDispatch, Box<ConfigError>> {
        const S: &str = "cluster.dispatch";
        let defaults = ClusterDispatch::default();
        let Some(raw) = raw else {
            return Ok(defaults);
        };
        let duration = |value, key, default, range| self.duration_in(value, S, key, default, range);
        let count = |value: &Option<Spanned<i64>>, key: &str, default: u32, max: u32| match value {
            None => Ok(default),
            Some(v) => u32::try_from(*v.get_ref())
                .ok()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| self.err(v.span(), S, key, format!("must be between 1 and {max}"))),
        };
        let mode = match &raw.mode {
            None => defaults.mode,
            Some(m) => match m.get_ref().as_str() {
                "steer" => DispatchMode::Steer,
                "self" => DispatchMode::SelfDispatch,
                _ => {
                    return Err(self.err(
                        m.span(),
                        S,
                        "mode",
                        "must be \"steer\" (hosts send to the steer nodes) or \"self\" (hosts send to the data nodes' VTEPs, each VM to the owner of its virtual MAC)",
                    ))
                }
            },
        };
        let d = defaults.ring;
        let ring =
            dispatch::Params {
                load_interval: duration(
                    &raw.load_interval,
                    "load_interval",
                    d.load_interval,
                    Duration::from_millis(100)..=Duration::from_secs(600),
                )?,
                move_interval: duration(
                    &raw.move_interval,
                    "move_interval",
                    d.move_interval,
                    Duration::from_millis(100)..=Duration::from_secs(3600),
                )?,
                threshold: match &raw.load_difference {
                    None => d.threshold,
                    Some(v) if *v.get_ref() > 0.0 && *v.get_ref() < 1.0 => *v.get_ref(),
                    Some(v) => return Err(self.err(
                        v.span(),
                        S,
                        "load_difference",
                        "must be a fraction of a node's capacity above 0 and below 1 (e.g. 0.1)",
                    )),
                },
                batch: count(&raw.move_vmacs, "move_vmacs", d.batch as u32, 4096)? as usize,
                linger: duration(
                    &raw.linger,
                    "linger",
                    d.linger,
                    Duration::from_millis(100)..=Duration::from_secs(60),
                )?,
                ack_timeout: d.ack_timeout,
            };
        if let Err(e) = ring.check() {
            let span = raw
                .move_interval
                .as_ref()
                .map(|v| v.span())
                .or(raw.load_interval.as_ref().map(|v| v.span()))
                .unwrap_or(0..0);
            return Err(self.err(span, S, "move_interval", e.to_string()));
        }
        Ok(ClusterDispatch {
            mode,
            vmacs: count(&raw.vmacs, "vmacs", defaults.vmacs, dispatch::MAX_VMACS)?,
            announce_interval: duration(
                &raw.announce_interval,
                "announce_interval",
                defaults.announce_interval,
                Duration::from_millis(100)..=Duration::from_secs(120),
            )?,
            ring,
        })
    }

    /// A duration key of `section`: `default` when absent, else within `range`.
    pub(super) fn duration_in(
        &self,
        value: &Option<Spanned<crate::config::raw::DurationValue>>,
        section: &str,
        key: &str,
        default: Duration,
        range: std::ops::RangeInclusive<Duration>,
    ) -> Result<Duration, Box<ConfigError>> {
        match value {
            None => Ok(default),
            Some(d) if range.contains(&d.get_ref().0) => Ok(d.get_ref().0),
            Some(d) => Err(self.err(
                d.span(),
                section,
                key,
                format!(
                    "must be between {} and {}",
                    crate::config::format_duration(*range.start()),
                    crate::config::format_duration(*range.end())
                ),
            )),
        }
    }

    /// `[cluster.autoscale]`: the model's parameters, the mode and the provider. τ defaults
    /// to the report interval `report`, at least 10 s.
    pub(super) fn autoscale(
        &self,
        raw: Option<&RawAutoscale>,
        report: Duration,
    ) -> Result<AutoscaleConfig, Box<ConfigError>> {
        const S: &str = "cluster.autoscale";
        let defaults = AutoscaleConfig::default();
        let defaults = AutoscaleConfig {
            interval: report.max(defaults.interval),
            ..AutoscaleConfig::default()
        };
        let Some(raw) = raw else {
            return Ok(defaults);
        };
        let duration = |value: &Option<Spanned<crate::config::raw::DurationValue>>,
                        key: &str,
                        default: Duration,
                        range: std::ops::RangeInclusive<Duration>| {
            self.duration_in(value, S, key, default, range)
        };
        let fraction = |value: &Option<Spanned<f64>>,
                        key: &str,
                        default: f64,
                        ok: fn(f64) -> bool,
                        what: &str| match value {
            None => Ok(default),
            Some(v) if ok(*v.get_ref()) => Ok(*v.get_ref()),
            Some(v) => Err(self.err(v.span(), S, key, format!("must be {what}"))),
        };
        let mode = match &raw.mode {
            None => AutoscaleMode::Advise,
            Some(m) => match m.get_ref().as_str() {
                "advise" => AutoscaleMode::Advise,
                "act" => AutoscaleMode::Act,
                _ => {
                    return Err(self.err(
                        m.span(),
                        S,
                        "mode",
                        "must be \"advise\" (show decisions) or \"act\" (carry them out)",
                    ))
                }
            },
        };
        let local = match &raw.local {
            None => None,
            Some(l) => Some(self.local_provider(l)?),
        };
        let config = AutoscaleConfig {
            mode,
            interval: duration(
                &raw.interval,
                "interval",
                defaults.interval,
                Duration::from_secs(1)..=Duration::from_secs(3600),
            )?,
            consolidation_interval: duration(
                &raw.consolidation_interval,
                "consolidation_interval",
                defaults.consolidation_interval,
                Duration::from_secs(1)..=Duration::from_secs(86_400),
            )?,
            hotspot_threshold: fraction(
                &raw.hotspot_threshold,
                "hotspot_threshold",
                defaults.hotspot_threshold,
                |v| v > 0.0 && v <= 1.0,
                "a fraction of a node above 0 and at most 1 (e.g. 0.9)",
            )?,
            epsilon: fraction(
                &raw.epsilon,
                "epsilon",
                defaults.epsilon,
                |v| (0.0..1.0).contains(&v),
                "a probability at least 0 and below 1 (e.g. 0.05)",
            )?,
            start_latency: duration(
                &raw.start_latency,
                "start_latency",
                defaults.start_latency,
                Duration::from_secs(1)..=Duration::from_secs(3600),
            )?,
            min_nodes: match &raw.min_nodes {
                None => defaults.min_nodes,
                Some(v) => u32::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .ok_or_else(|| {
                        self.err(v.span(), S, "min_nodes", "must be between 1 and 10000")
                    })?,
            },
            sizing: match &raw.sizing {
                None => defaults.sizing,
                Some(v) => match v.get_ref().parse() {
                    Ok(provision::Sizing::Envelope { steps }) if steps > 1000 => {
                        return Err(self.err(
                            v.span(),
                            S,
                            "sizing",
                            "envelope:N: N must be at most 1000 measurements",
                        ))
                    }
                    Ok(sizing) => sizing,
                    Err(e) => return Err(self.err(v.span(), S, "sizing", e)),
                },
            },
            drain: raw.drain.unwrap_or(defaults.drain),
            guarantee_target: fraction(
                &raw.guarantee_target,
                "guarantee_target",
                defaults.guarantee_target,
                |v| (MIN_GUARANTEE_TARGET..1.0).contains(&v),
                &format!(
                    "a guarantee at least {MIN_GUARANTEE_TARGET} and below 1 (e.g. 0.97): the \
                     calibrator aims at {} · (1 − G*) saturated steps, at most half of them, so \
                     every G* up to {MIN_GUARANTEE_TARGET} behaves the same",
                    provision::forecast::SATURATED_PER_VIOLATION
                ),
            )?,
            window: match &raw.window {
                None => defaults.window,
                Some(v) => usize::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| (10..=100_000).contains(n))
                    .ok_or_else(|| {
                        self.err(
                            v.span(),
                            S,
                            "window",
                            "must be between 10 and 100000 samples",
                        )
                    })?,
            },
            stop_slack: match &raw.stop_slack {
                None => defaults.stop_slack,
                Some(v) => u32::try_from(*v.get_ref())
                    .ok()
                    .filter(|n| *n <= 10_000)
                    .ok_or_else(|| {
                        self.err(v.span(), S, "stop_slack", "must be between 0 and 10000")
                    })?,
            },
            local,
        };
        // Adaptive sizing forecasts the aggregate over the start latency in steps of τ, and
        // keeps at most `MAX_HORIZON` of them.
        if let Some(v) = raw
            .sizing
            .as_ref()
            .filter(|_| config.sizing == provision::Sizing::Adaptive)
        {
            let steps = (config.start_latency.as_secs_f64() / config.interval.as_secs_f64()).ceil()
                as usize
                + 1;
            if steps > provision::forecast::MAX_HORIZON {
                return Err(self.err(
                    v.span(),
                    S,
                    "sizing",
                    format!(
                        "\"adaptive\" forecasts over start_latency / interval + 1 = {steps} \
                         steps, at most {}: raise interval or lower start_latency",
                        provision::forecast::MAX_HORIZON
                    ),
                ));
            }
        }
        // Adaptive sizing forgets per step: a step without new load reports would still
        // advance the forgetting, and see a node's old interval again.
        if let Some(v) = raw
            .interval
            .as_ref()
            .filter(|_| config.sizing == provision::Sizing::Adaptive && config.interval < report)
        {
            return Err(self.err(
                v.span(),
                S,
                "interval",
                format!(
                    "with sizing = \"adaptive\" must be at least [cluster] report_interval \
                     ({report:?}): each step needs new load reports from the data nodes"
                ),
            ));
        }
        Ok(config)
    }

    /// `[cluster.autoscale.local]`.
    pub(super) fn local_provider(
        &self,
        l: &RawLocalProvider,
    ) -> Result<LocalProviderConfig, Box<ConfigError>> {
        const S: &str = "cluster.autoscale.local";
        let path = |value: &Spanned<String>, section: &str, key: &str| {
            if value.get_ref().trim().is_empty() {
                return Err(self.err(value.span(), section, key, "must not be empty"));
            }
            Ok(self.relative_path(value.get_ref().trim()))
        };
        let mut nodes: Vec<LocalNodeConfig> = Vec::with_capacity(l.node.len());
        for n in &l.node {
            const N: &str = "[cluster.autoscale.local.node]";
            let config = path(&n.get_ref().config, N, "config")?;
            if nodes.iter().any(|o| o.config == config) {
                return Err(self.err(
                    n.get_ref().config.span(),
                    N,
                    "config",
                    "lists the same data node twice",
                ));
            }
            let netns = match &n.get_ref().netns {
                None => None,
                Some(ns) => {
                    let name = ns.get_ref().trim();
                    let ok = !name.is_empty()
                        && name.len() <= 64
                        && name != "."
                        && name != ".."
                        && name
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
                    if !ok {
                        return Err(self.err(
                            ns.span(),
                            N,
                            "netns",
                            "must be a network namespace name (letters, digits, '-', '_', '.'; at most 64)",
                        ));
                    }
                    Some(name.to_owned())
                }
            };
            nodes.push(LocalNodeConfig { config, netns });
        }
        Ok(LocalProviderConfig {
            command: l
                .command
                .as_ref()
                .map(|c| path(c, S, "command"))
                .transpose()?,
            run_dir: path(&l.run_dir, S, "run_dir")?,
            stop_timeout: match &l.stop_timeout {
                None => DEFAULT_STOP_TIMEOUT,
                Some(d)
                    if (Duration::from_millis(100)..=Duration::from_secs(300))
                        .contains(&d.get_ref().0) =>
                {
                    d.get_ref().0
                }
                Some(d) => {
                    return Err(self.err(
                        d.span(),
                        S,
                        "stop_timeout",
                        "must be between 100ms and 5m",
                    ))
                }
            },
            nodes,
        })
    }
}
