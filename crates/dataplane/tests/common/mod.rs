//! Configuration shared by the loopback integration tests: the VNet whose VM 10.0.0.5 lives
//! behind the host VTEP 127.0.0.2, and the tunnel bound to it.

use protego_dataplane::{Inside, Route, TunnelBinding, VnetConfig};
use std::net::IpAddr;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip address")
}

/// Tenant `acme`'s VNet `prod`, VNI 100, gateway 10.0.0.1, local VTEP 127.0.0.1, and
/// 10.0.0.0/24 behind the host VTEP 127.0.0.2.
pub(crate) fn loopback_vnet() -> VnetConfig {
    VnetConfig {
        tenant: ids::TenantId::new("acme").expect("tenant"),
        name: "prod".into(),
        vni: 100,
        gateway_ips: vec![ip("10.0.0.1")],
        vtep: ip("127.0.0.1"),
        routes: vec![Route {
            prefix: ip("10.0.0.0"),
            len: 24,
            host: ip("127.0.0.2"),
        }],
    }
}

/// Tunnel 1 (`site`) of tenant `acme`, its traffic to `inside`.
pub(crate) fn site_tunnel(inside: Inside) -> TunnelBinding {
    TunnelBinding {
        tunnel: ike::TunnelId(1),
        name: "site".into(),
        tenant: ids::TenantId::new("acme").expect("tenant"),
        inside,
    }
}
