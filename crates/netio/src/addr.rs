//! Socket addresses between `std::net` and the kernel's `sockaddr_in` / `sockaddr_in6`.

use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// Converts a socket address for the kernel: the storage and the length of the address in it.
pub(crate) fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut st: libc::sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut st as *mut libc::sockaddr_storage).cast(), sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as libc::socklen_t)
}

/// Converts a socket address the kernel wrote; `None` for families other than IPv4 and IPv6.
pub(crate) fn from_sockaddr(st: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match libc::c_int::from(st.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in, which it is large
            // enough and aligned for.
            let sin: &libc::sockaddr_in = unsafe { &*(st as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6, which it is large
            // enough and aligned for.
            let sin6: &libc::sockaddr_in6 =
                unsafe { &*(st as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_survive_the_round_trip() {
        let scoped = SocketAddr::V6(SocketAddrV6::new(
            "fe80::1".parse().expect("ip"),
            4500,
            0x12345,
            3,
        ));
        for a in ["192.0.2.1:4500", "[2001:db8::1]:500", "0.0.0.0:0"] {
            let a: SocketAddr = a.parse().expect("addr");
            let (st, len) = to_sockaddr(&a);
            assert_eq!(from_sockaddr(&st), Some(a));
            let want = if a.is_ipv4() {
                size_of::<libc::sockaddr_in>()
            } else {
                size_of::<libc::sockaddr_in6>()
            };
            assert_eq!(len as usize, want);
        }
        assert_eq!(from_sockaddr(&to_sockaddr(&scoped).0), Some(scoped));
    }

    #[test]
    fn other_families_are_none() {
        // SAFETY: all-zero is a valid sockaddr_storage (family AF_UNSPEC).
        let mut st: libc::sockaddr_storage = unsafe { zeroed() };
        assert_eq!(from_sockaddr(&st), None);
        st.ss_family = libc::AF_UNIX as libc::sa_family_t;
        assert_eq!(from_sockaddr(&st), None);
    }
}
