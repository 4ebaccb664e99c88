//! XDP frames (issue 18 §3): the memory a program sees as its packet and its context.
//!
//! clang loads `xdp_md`'s `data` and `data_end` as 32-bit fields and uses them as pointers,
//! so the packet must live below 4 GiB: a frame is one `mmap(MAP_32BIT)` mapping (x86-64
//! Linux; the kernel places it in the low 2 GiB). Its layout:
//!
//! ```text
//! 0      40                64         64+256       +14               data_end    +256
//! | ctx  | (unused)        | headroom | Ethernet   | IP packet  ...  | tailroom   |
//!   struct xdp_md (24 B) + the lowered program's stack-pointer and meter words
//! ```
//!
//! The Ethernet header is synthetic (dst 02:00:00:00:00:01, src 02:00:00:00:00:02, the
//! type of the IP version): tenants' filters are written for XDP and parse Ethernet first.
//! `bpf_xdp_adjust_head` may move `data` anywhere from the headroom's start to 14 bytes
//! before `data_end`; `bpf_xdp_adjust_tail` may move `data_end` from 14 bytes after `data`
//! to the tailroom's end.

/// Room before the Ethernet header for `bpf_xdp_adjust_head` (the kernel's
/// `XDP_PACKET_HEADROOM`).
pub const HEADROOM: usize = 256;
/// Room after the largest packet for `bpf_xdp_adjust_tail`.
pub const TAILROOM: usize = 256;
/// The synthetic Ethernet header's length.
pub const ETH_HLEN: usize = 14;
/// Where the packet area starts in the mapping (after the context).
pub(crate) const AREA: usize = 64;
/// Bytes of the context buffer: `struct xdp_md` (24), the stack-pointer word and the meter's
/// word (see [`crate::lower`]).
pub(crate) const CTX_LEN: usize = 40;

const ETH_DST: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const ETH_SRC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

/// Why a frame could not be made or filled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// `mmap(MAP_32BIT)` failed.
    #[error("cannot map a frame below 4 GiB: {0}")]
    Map(#[source] std::io::Error),
    /// The packet does not fit the frame.
    #[error("a {len}-byte packet does not fit a frame for {mtu}-byte packets")]
    TooLong {
        /// The packet's length.
        len: usize,
        /// The frame's packet room.
        mtu: usize,
    },
    /// The packet is neither IPv4 nor IPv6 (its first nibble).
    #[error("not an IP packet (version nibble {0})")]
    NotIp(u8),
    /// A frame for packets larger than [`MAX_MTU`] was asked for.
    #[error("a frame holds packets of at most {MAX_MTU} bytes, not {0}")]
    Mtu(usize),
}

/// The largest packet a frame holds: the verifier's proof assumes `data_end - data` never
/// exceeds 0xffff, and a program can move `data` back by the headroom and `data_end` on by
/// the tailroom.
pub const MAX_MTU: usize = 0xffff - (HEADROOM + ETH_HLEN + TAILROOM);

/// One XDP frame: the context and the packet memory a program runs on, below 4 GiB.
pub struct FrameBuf {
    base: *mut u8,
    map_len: usize,
    mtu: usize,
    /// Offsets of the packet in the mapping.
    data: usize,
    data_end: usize,
}

// SAFETY: the mapping is owned by this value alone; nothing else holds its address between
// runs.
unsafe impl Send for FrameBuf {}

impl std::fmt::Debug for FrameBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameBuf")
            .field("base", &self.base)
            .field("mtu", &self.mtu)
            .field("data", &self.data)
            .field("data_end", &self.data_end)
            .finish()
    }
}

impl FrameBuf {
    /// Maps a frame for IP packets of up to `mtu` bytes.
    pub fn new(mtu: usize) -> Result<Self, FrameError> {
        if mtu > MAX_MTU {
            return Err(FrameError::Mtu(mtu));
        }
        let len = AREA + HEADROOM + ETH_HLEN + mtu + TAILROOM;
        let page = 4096;
        let map_len = len.div_ceil(page) * page;
        // SAFETY: an anonymous private mapping; the result is checked.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_32BIT,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(FrameError::Map(std::io::Error::last_os_error()));
        }
        let frame = Self {
            base: base.cast(),
            map_len,
            mtu,
            data: AREA + HEADROOM,
            data_end: AREA + HEADROOM + ETH_HLEN,
        };
        if (base as u64)
            .checked_add(map_len as u64)
            .is_none_or(|end| end > u64::from(u32::MAX))
        {
            return Err(FrameError::Map(std::io::Error::other(
                "the kernel placed the mapping above 4 GiB",
            )));
        }
        Ok(frame)
    }

    /// The largest IP packet the frame takes.
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Puts `ip` in the frame behind a synthetic Ethernet header, at the headroom's end.
    pub fn load_ip(&mut self, ip: &[u8]) -> Result<(), FrameError> {
        if ip.len() > self.mtu {
            return Err(FrameError::TooLong {
                len: ip.len(),
                mtu: self.mtu,
            });
        }
        let ethertype: [u8; 2] = match ip.first().map(|b| b >> 4) {
            Some(4) => [0x08, 0x00],
            Some(6) => [0x86, 0xdd],
            other => return Err(FrameError::NotIp(other.unwrap_or(0))),
        };
        self.data = AREA + HEADROOM;
        self.data_end = self.data + ETH_HLEN + ip.len();
        let area = self.area_mut();
        let at = HEADROOM;
        area[at..at + 6].copy_from_slice(&ETH_DST);
        area[at + 6..at + 12].copy_from_slice(&ETH_SRC);
        area[at + 12..at + 14].copy_from_slice(&ethertype);
        area[at + ETH_HLEN..at + ETH_HLEN + ip.len()].copy_from_slice(ip);
        Ok(())
    }

    /// The frame as the program left it: `[data, data_end)`, Ethernet header first.
    pub fn frame(&self) -> &[u8] {
        // SAFETY: data <= data_end <= the area's end, inside the mapping (helpers keep it so).
        unsafe { std::slice::from_raw_parts(self.base.add(self.data), self.data_end - self.data) }
    }

    /// The IP packet after the Ethernet header, when the frame still starts with an Ethernet
    /// header of type IPv4 or IPv6 (what the gateway forwards after a program ran).
    pub fn ip_packet(&self) -> Option<&[u8]> {
        let f = self.frame();
        match f.get(12..14)? {
            [0x08, 0x00] | [0x86, 0xdd] => f.get(ETH_HLEN..),
            _ => None,
        }
    }

    /// The packet's bounds as offsets from the headroom's start: `data` is [`HEADROOM`] until
    /// a program moves it.
    pub fn bounds(&self) -> std::ops::Range<usize> {
        self.data - AREA..self.data_end - AREA
    }

    /// The mapping's address (the context) as the program sees it.
    pub(crate) fn ctx_addr(&self) -> u64 {
        self.base as u64
    }

    /// The address of the packet area's first byte (the headroom's start).
    pub(crate) fn area_start(&self) -> u64 {
        self.base as u64 + AREA as u64
    }

    /// The address one past the tailroom's end.
    pub(crate) fn area_end(&self) -> u64 {
        self.area_start() + (HEADROOM + ETH_HLEN + self.mtu + TAILROOM) as u64
    }

    /// The packet's addresses.
    pub(crate) fn data_addrs(&self) -> (u64, u64) {
        let b = self.base as u64;
        (b + self.data as u64, b + self.data_end as u64)
    }

    /// Sets the packet's addresses (after a run; inside the area, as the helpers keep them).
    pub(crate) fn set_data_addrs(&mut self, data: u64, data_end: u64) {
        let b = self.base as u64;
        debug_assert!(self.area_start() <= data && data <= data_end && data_end <= self.area_end());
        self.data = (data - b) as usize;
        self.data_end = (data_end - b) as usize;
    }

    fn area_mut(&mut self) -> &mut [u8] {
        let len = HEADROOM + ETH_HLEN + self.mtu + TAILROOM;
        // SAFETY: the area lies inside the mapping, which this value owns exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(AREA), len) }
    }

    /// Writes the context for a run: `struct xdp_md` {data, data_end, data_meta (= data),
    /// ingress_ifindex, rx_queue_index, egress_ifindex (0)}, each a u32.
    pub(crate) fn write_ctx(&mut self, ingress_ifindex: u32, rx_queue_index: u32, meter: u32) {
        let (data, end) = self.data_addrs();
        let words = [
            data as u32,
            end as u32,
            data as u32,
            ingress_ifindex,
            rx_queue_index,
            0,
        ];
        // SAFETY: the context's bytes are the mapping's first, owned by this value.
        let ctx = unsafe { std::slice::from_raw_parts_mut(self.base, CTX_LEN) };
        for (chunk, w) in ctx.chunks_exact_mut(4).zip(words) {
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
        ctx[24..32].fill(0);
        ctx[32..36].copy_from_slice(&meter.to_ne_bytes());
        ctx[36..40].fill(0);
    }

    /// The meter's word as the program's last exit left it (see [`crate::lower`]).
    pub(crate) fn meter_left(&self) -> i32 {
        // SAFETY: as in `write_ctx`.
        let ctx = unsafe { std::slice::from_raw_parts(self.base, CTX_LEN) };
        i32::from_ne_bytes([ctx[32], ctx[33], ctx[34], ctx[35]])
    }

    /// The context buffer (for rbpf, which takes it as the "mbuff").
    pub(crate) fn ctx_ptr(&self) -> *mut u8 {
        self.base
    }

    /// The packet area, headroom to tailroom (for the interpreter's memory checks).
    pub(crate) fn area_ptr(&self) -> (*mut u8, usize) {
        // SAFETY: inside the mapping.
        (
            unsafe { self.base.add(AREA) },
            HEADROOM + ETH_HLEN + self.mtu + TAILROOM,
        )
    }
}

impl Drop for FrameBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.map_len) };
    }
}
