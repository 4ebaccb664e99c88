/* A tenant's own UDP firewall: datagrams to the destination ports in `blocked_ports` are
 * dropped (XDP_DROP, counted as `<tenant>/filter_drop` in `protego status`), everything else
 * passes untouched. It runs in either direction: `to_cloud` keeps the ports closed toward the
 * VMs, `from_cloud` keeps the VMs from sending to them.
 *
 * Maps a tenant tunes at run time (`protego ctl filter map update`):
 *   blocked_ports  u16 port (network order) -> u8 (any value: the port is blocked)
 * Counters (`verdicts`, per CPU): [0] passed, [1] dropped, [2] not UDP over IPv4 (passed).
 *
 * IPv4 only, as the other examples: IPv6 passes untouched. A later fragment carries no port
 * and passes; its first fragment, which carries the port, is dropped, so the datagram is never
 * reassembled. A datagram too short for its headers is dropped.
 *
 * Compile: clang -O2 -g -target bpf -mcpu=v3 -I/usr/include/x86_64-linux-gnu -c udp_firewall.c */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

enum { PASSED, DROPPED, OTHER, COUNTERS };

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 1024);
    __type(key, __u16);
    __type(value, __u8);
} blocked_ports SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, COUNTERS);
    __type(key, __u32);
    __type(value, __u64);
} verdicts SEC(".maps");

static __always_inline int count(__u32 which, int verdict)
{
    __u64 *n = bpf_map_lookup_elem(&verdicts, &which);
    if (n)
        *n += 1;
    return verdict;
}

SEC("xdp")
int udp_firewall(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
        return count(OTHER, XDP_PASS);
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end)
        return count(DROPPED, XDP_DROP);
    if (ip->protocol != IPPROTO_UDP)
        return count(OTHER, XDP_PASS);
    if (ip->frag_off & bpf_htons(0x1fff))
        return count(OTHER, XDP_PASS); /* a later fragment: no port to read */
    struct udphdr *udp = (void *)ip + ip->ihl * 4;
    if (ip->ihl < 5 || (void *)(udp + 1) > end)
        return count(DROPPED, XDP_DROP);
    __u16 port = udp->dest;
    if (bpf_map_lookup_elem(&blocked_ports, &port))
        return count(DROPPED, XDP_DROP);
    return count(PASSED, XDP_PASS);
}

char LICENSE[] SEC("license") = "GPL";
