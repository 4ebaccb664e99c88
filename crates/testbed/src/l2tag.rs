//! A userspace IEEE 802.1ad / 802.1Q tagger standing in for a customer edge router's Linux
//! VLAN sub-interfaces (`ip link add … type vlan proto 802.1ad id S`, then `… type vlan id C`
//! on top) where the kernel has no VLAN support (`CONFIG_VLAN_8021Q` unset, as on the
//! project's test machines). It joins untagged *ports* (veth ends whose peers sit in the
//! customers' namespaces) to one *trunk*: a frame from a port leaves on the trunk with the
//! port's S-tag (TPID 0x88a8) and C-tag (0x8100), or with its C-tag alone when the S-tag is 0;
//! a frame on the trunk with a port's tags reaches that port without them, any other is
//! dropped. Frames are read with AF_PACKET sockets; the kernel hands the outer tag of a
//! received frame over as metadata (`PACKET_AUXDATA`), which is written back before the tags
//! are read, as Protego's own ring reader does.
//!
//! Run it as `protego-l2tag --trunk IF --port IF:S:C [--port …]` inside the namespace that
//! holds those interfaces ([`crate::Netns::spawn`]); it runs until killed.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// TPID of an 802.1ad service tag.
pub const TPID_S: u16 = 0x88a8;
/// TPID of an 802.1Q customer tag.
pub const TPID_C: u16 = 0x8100;

/// One untagged port and its tags (`s_tag` 0: a single C-tag).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Interface name.
    pub iface: String,
    /// Outer (802.1ad) VLAN id, or 0 for a single 802.1Q tag.
    pub s_tag: u16,
    /// Inner (802.1Q) VLAN id.
    pub c_tag: u16,
}

impl std::str::FromStr for Port {
    type Err = String;

    /// `IF:S:C`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut it = s.split(':');
        let (Some(iface), Some(st), Some(ct), None) = (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(format!("{s:?}: expected IF:S_TAG:C_TAG"));
        };
        let tag = |t: &str| {
            t.parse::<u16>()
                .ok()
                .filter(|v| *v <= 4094)
                .ok_or_else(|| format!("{s:?}: {t:?} is not a VLAN id"))
        };
        Ok(Port {
            iface: iface.to_owned(),
            s_tag: tag(st)?,
            c_tag: tag(ct)?,
        })
    }
}

/// Writes `frame` (untagged) into `out` with the port's tags; returns the length, or None if
/// the frame is tagged already or too short.
pub fn tag(frame: &[u8], port: &Port, out: &mut Vec<u8>) -> Option<usize> {
    if frame.len() < 14 {
        return None;
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    if ethertype == TPID_S || ethertype == TPID_C {
        return None;
    }
    out.clear();
    out.extend_from_slice(&frame[..12]);
    if port.s_tag != 0 {
        out.extend_from_slice(&TPID_S.to_be_bytes());
        out.extend_from_slice(&port.s_tag.to_be_bytes());
    }
    out.extend_from_slice(&TPID_C.to_be_bytes());
    out.extend_from_slice(&port.c_tag.to_be_bytes());
    out.extend_from_slice(&frame[12..]);
    Some(out.len())
}

/// The (S-tag or 0, C-tag) of a tagged trunk frame and the frame without them.
pub fn untag(frame: &[u8], out: &mut Vec<u8>) -> Option<(u16, u16)> {
    let at = |i: usize| {
        frame
            .get(i..i + 2)
            .map(|b| u16::from_be_bytes([b[0], b[1]]))
    };
    let vid = |i: usize| at(i).map(|t| t & 0x0fff);
    let (tags, rest) = match at(12)? {
        TPID_S if at(16)? == TPID_C => ((vid(14)?, vid(18)?), 20),
        TPID_C => ((0, vid(14)?), 16),
        _ => return None,
    };
    let next = at(rest)?;
    if next == TPID_S || next == TPID_C {
        return None;
    }
    out.clear();
    out.extend_from_slice(&frame[..12]);
    out.extend_from_slice(&frame[rest..]);
    Some(tags)
}

/// An AF_PACKET socket bound to one interface, with the outer tag handed over as aux data.
struct Sock {
    fd: OwnedFd,
}

impl Sock {
    fn open(iface: &str) -> io::Result<Sock> {
        let index = netio::packet::interface_index(iface)?;
        // One frame per system call is this tagger's pace: a deep receive queue keeps TCP
        // bursts from overflowing it (SO_RCVBUFFORCE: root, beyond rmem_max).
        let fd = netio::packet::open_raw(
            index,
            libc::ETH_P_ALL as u16,
            false,
            &[
                (libc::SOL_PACKET, libc::PACKET_AUXDATA, 1),
                (libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1),
                (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 32 << 20),
            ],
        )?;
        Ok(Sock { fd })
    }

    /// Receives one frame into `buf` with its outer tag written back; returns its length, or
    /// None for a frame this socket sent.
    fn recv(&self, buf: &mut Vec<u8>) -> io::Result<Option<usize>> {
        buf.resize(65536, 0);
        // Room after the first 12 bytes for a tag written back.
        let mut iov = libc::iovec {
            iov_base: buf[4..].as_mut_ptr().cast(),
            iov_len: buf.len() - 4,
        };
        let mut cmsg = [0u64; 16];
        // SAFETY: sockaddr_ll and msghdr are plain data.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut from as *mut libc::sockaddr_ll).cast();
        msg.msg_namelen = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cmsg.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cmsg);
        // SAFETY: every pointer in `msg` refers to live buffers of the given sizes.
        let r = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, 0) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = r as usize;
        if from.sll_pkttype == libc::PACKET_OUTGOING {
            return Ok(None);
        }
        let mut vlan = None;
        // SAFETY: walking the control messages the kernel wrote into `cmsg`.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_PACKET && (*c).cmsg_type == libc::PACKET_AUXDATA {
                    let aux: libc::tpacket_auxdata =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    if aux.tp_status & libc::TP_STATUS_VLAN_VALID != 0 {
                        let tpid = if aux.tp_status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                            aux.tp_vlan_tpid
                        } else {
                            TPID_C
                        };
                        vlan = Some((tpid, aux.tp_vlan_tci));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        match vlan {
            Some((tpid, tci)) if n >= 12 => {
                buf.copy_within(4..16, 0);
                buf[12..14].copy_from_slice(&tpid.to_be_bytes());
                buf[14..16].copy_from_slice(&tci.to_be_bytes());
                Ok(Some(n + 4))
            }
            _ => {
                buf.copy_within(4..4 + n, 0);
                Ok(Some(n))
            }
        }
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: sends the caller's bytes on the bound socket.
        let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if r < 0 {
            eprintln!("send: {}", io::Error::last_os_error());
        }
    }

    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Joins `ports` to `trunk` until the process is killed.
pub fn run(trunk: &str, ports: &[Port]) -> io::Result<()> {
    let trunk_sock = Sock::open(trunk)?;
    let port_socks = ports
        .iter()
        .map(|p| Sock::open(&p.iface))
        .collect::<io::Result<Vec<_>>>()?;
    let mut fds: Vec<libc::pollfd> = std::iter::once(trunk_sock.raw())
        .chain(port_socks.iter().map(Sock::raw))
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    eprintln!("l2tag: trunk {trunk}, ports {ports:?}");
    loop {
        // SAFETY: `fds` is a live array of pollfd.
        netio::cvt(unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 1000) })?;
        if fds[0].revents & libc::POLLIN != 0 {
            if let Some(n) = trunk_sock.recv(&mut buf)? {
                let tags = untag(&buf[..n], &mut out);
                match tags.and_then(|t| ports.iter().position(|p| (p.s_tag, p.c_tag) == t)) {
                    Some(i) => port_socks[i].send(&out),
                    None => eprintln!("l2tag: trunk frame with tags {tags:?} dropped"),
                }
            }
        }
        for (i, sock) in port_socks.iter().enumerate() {
            if fds[i + 1].revents & libc::POLLIN == 0 {
                continue;
            }
            if let Some(n) = sock.recv(&mut buf)? {
                if tag(&buf[..n], &ports[i], &mut out).is_some() {
                    trunk_sock.send(&out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_go_on_and_come_off() {
        let port: Port = "p1:100:10".parse().expect("port");
        let mut frame = vec![1u8; 12];
        frame.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        let mut tagged = Vec::new();
        assert_eq!(tag(&frame, &port, &mut tagged), Some(frame.len() + 8));
        assert_eq!(
            &tagged[12..22],
            &[0x88, 0xa8, 0, 100, 0x81, 0, 0, 10, 0x08, 0]
        );
        let mut back = Vec::new();
        assert_eq!(untag(&tagged, &mut back), Some((100, 10)));
        assert_eq!(back, frame);
        // A single C-tag.
        let single: Port = "p2:0:7".parse().expect("port");
        tag(&frame, &single, &mut tagged).expect("tagged");
        assert_eq!(&tagged[12..16], &[0x81, 0, 0, 7]);
        assert_eq!(untag(&tagged, &mut back), Some((0, 7)));
        // Untagged trunk frames and tagged port frames are refused.
        assert_eq!(untag(&frame, &mut back), None);
        assert_eq!(tag(&tagged, &port, &mut back), None);
        assert!("p:1".parse::<Port>().is_err());
        assert!("p:1:4095".parse::<Port>().is_err());
    }
}
