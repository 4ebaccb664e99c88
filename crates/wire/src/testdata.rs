//! Real frames captured for the unit tests (test-only).
//!
//! Captured with tcpdump on a veth pair between two Linux 6.x network namespaces (TX checksum
//! offload off, so every checksum on the wire is final; Wireshark reports all of them good).
//! Namespace A: veth 02:00:00:00:0a:01, 10.9.0.1, fd00:9::1; kernel vxlan device VNI 42,
//! dstport 4789, 02:00:00:77:00:01, 192.168.77.1, fd77::1. Namespace B mirrors it with
//! ...0b:02 / .2 / ::2 and 02:00:00:77:00:02. Each constant is a whole Ethernet frame in hex.

/// ARP request, who has 10.9.0.2? tell 10.9.0.1 (broadcast, untagged, 42 bytes, no padding).
pub(crate) const ARP_REQUEST: &str =
    "ffffffffffff020000000a0108060001080006040001020000000a010a0900010000000000000a090002";

/// ARP reply, 10.9.0.2 is at 02:00:00:00:0b:02.
pub(crate) const ARP_REPLY: &str =
    "020000000a01020000000b0208060001080006040002020000000b020a090002020000000a010a090001";

/// Linux VXLAN (VNI 42) carrying an ARP request for 192.168.77.2, outer IPv4/UDP 53155 -> 4789,
/// outer UDP checksum present (0xa0bb).
pub(crate) const VXLAN_ARP_REQUEST: &str = "020000000b02020000000a0108004500004e232d00004011435e0a0900010a090002cfa312b5003aa0bb0800000000002a00ffffffffffff02000077000108060001080006040001020000770001c0a84d01000000000000c0a84d02";

/// Linux VXLAN (VNI 42) carrying an ICMP echo request 192.168.77.1 -> 192.168.77.2.
pub(crate) const VXLAN_ICMP: &str = "020000000b02020000000a01080045000086232e0000401143250a0900010a090002e9a712b50072afa70800000000002a00020000770002020000770001080045000054a4c1400040017a93c0a84d01c0a84d020800d8912fcd00017190016b00000000b3d10a0000000000101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f3031323334353637";

/// Linux VXLAN (VNI 42) carrying an IPv6 neighbor solicitation fd77::1 -> ff02::1:ff00:2 for
/// fd77::2 with a source link-layer address option.
pub(crate) const VXLAN_NS: &str = "020000000b02020000000a0108004500007a232f0000401143300a0900010a090002839512b50066cc710800000000002a003333ff00000202000077000186dd6000000000203afffd770000000000000000000000000001ff0200000000000000000001ff00000287007c3200000000fd7700000000000000000000000000020101020000770001";

/// Neighbor solicitation fd00:9::1 -> ff02::1:ff00:2 for fd00:9::2 (untagged, no VXLAN).
pub(crate) const NS: &str = "3333ff000002020000000a0186dd6000000000203afffd000009000000000000000000000001ff0200000000000000000001ff0000028700738500000000fd0000090000000000000000000000020101020000000a01";

/// Neighbor advertisement fd00:9::2 -> fd00:9::1 (solicited, override), target link-layer
/// address 02:00:00:00:0b:02.
pub(crate) const NA: &str = "020000000a01020000000b0286dd6000000000203afffd000009000000000000000000000002fd0000090000000000000000000000018800117f60000000fd0000090000000000000000000000020201020000000b02";

/// UDP over IPv6, fd00:9::1 port 38477 -> fd00:9::2 port 4500, payload "protego udp6 test".
pub(crate) const UDP6: &str = "020000000b02020000000a0186dd6008217a00191140fd000009000000000000000000000001fd000009000000000000000000000002964d11940019c9d270726f7465676f20756470362074657374";

/// RFC 3948 NAT-keepalive (a single 0xff byte) 10.9.0.1:4500 -> 10.9.0.2:4500, checksum set.
pub(crate) const NAT_KEEPALIVE: &str =
    "020000000b02020000000a0108004500001d233240004011038a0a0900010a090002119411940009c99eff";

// Checksums computed by Linux 6.x: read with an AF_PACKET socket on the receiving end of a veth
// pair between two namespaces (A: 02:00:00:00:77:01, 10.77.0.1, fd77::1; B: ...77:02,
// 10.77.0.2, fd77::2), untagged. The `*_FINAL` frames were sent with TX checksum offload off
// (`ethtool -K csv0 tx off`: the stack computed the checksum); the `*_PARTIAL` ones with it on,
// so their TCP/UDP checksum field holds what the kernel left there for the NIC to finish: the
// pseudo-header sum (these are the frames a packet socket flags `TP_STATUS_CSUMNOTREADY`).
// The UDP datagrams carry the same ports and data in both forms, so finishing a `_PARTIAL` one
// must give its `_FINAL` checksum; the TCP SYNs differ in their sequence numbers.

/// UDP over IPv4, 10.77.0.1:40001 -> 10.77.0.2:9999, "protego csum udp4", checksum 0xe199.
pub(crate) const UDP4_FINAL: &str = "02000000770202000000770108004500002db870400040116db30a4d00010a4d00029c41270f0019e19970726f7465676f206373756d2075647034";
/// The same datagram sent with checksum offload (IP ID differs): checksum field 0x14c7.
pub(crate) const UDP4_PARTIAL: &str = "02000000770202000000770108004500002db95f400040116cc40a4d00010a4d00029c41270f001914c770726f7465676f206373756d2075647034";
/// UDP over IPv6, [fd77::1]:40002 -> [fd77::2]:9999, "protego csum udp6", checksum 0xf942.
pub(crate) const UDP6_FINAL: &str = "02000000770202000000770186dd6004d1ad00191140fd770000000000000000000000000001fd7700000000000000000000000000029c42270f0019f94270726f7465676f206373756d2075647036";
/// The same datagram sent with checksum offload: checksum field 0xfb1c.
pub(crate) const UDP6_PARTIAL: &str = "02000000770202000000770186dd6004d1ad00191140fd770000000000000000000000000001fd7700000000000000000000000000029c42270f0019fb1c70726f7465676f206373756d2075647036";
/// TCP SYN over IPv4, 10.77.0.1:40003 -> 10.77.0.2:9998 (MSS, SACK, window scale), checksum
/// 0xd1ba.
pub(crate) const TCP4_SYN_FINAL: &str = "020000007702020000007701080045000034ee0940004006381e0a4d00010a4d00029c43270e77725302000000008002faf0d1ba0000020405b4010104020103030a";
/// A TCP SYN of the same flow sent with checksum offload: checksum field 0x14c3.
pub(crate) const TCP4_SYN_PARTIAL: &str = "02000000770202000000770108004500003429ad40004006fc7a0a4d00010a4d00029c43270e78da171c000000008002faf014c30000020405b4010104020103030a";
/// TCP SYN over IPv6, [fd77::1]:40004 -> [fd77::2]:9998, checksum 0x9e3e.
pub(crate) const TCP6_SYN_FINAL: &str = "02000000770202000000770186dd60019c8a00200640fd770000000000000000000000000001fd7700000000000000000000000000029c44270ebe765707000000008002fd209e3e0000020405a0010104020103030a";
/// A TCP SYN of the same flow sent with checksum offload: checksum field 0xfb18.
pub(crate) const TCP6_SYN_PARTIAL: &str = "02000000770202000000770186dd600a3f1200200640fd770000000000000000000000000001fd7700000000000000000000000000029c44270ebfde1c9c000000008002fd20fb180000020405a0010104020103030a";

/// Decodes one of the constants above.
pub(crate) fn frame(hex_str: &str) -> Vec<u8> {
    hex::decode(hex_str).expect("test data is valid hex")
}
