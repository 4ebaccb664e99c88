/* A test filter for the data path (tests/filters.rs): UDP over IPv4 to port 9 is dropped, to
 * port 7 is sent back (addresses and ports swapped, XDP_TX), to port 6 is lengthened by 8 bytes
 * of 0xee (bpf_xdp_adjust_tail, lengths and the IPv4 checksum fixed, UDP checksum 0), to port
 * 13 ends the program ABORTED; everything else passes. `seen` counts the packets it ran on. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} seen SEC(".maps");

static __always_inline __u16 fold(__s64 sum)
{
    __u64 s = (__u64)sum;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)~s;
}

SEC("xdp")
int echo(struct xdp_md *ctx)
{
    __u32 zero = 0;
    __u64 *n = bpf_map_lookup_elem(&seen, &zero);
    if (n)
        *n += 1;
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
        return XDP_PASS;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP || ip->ihl != 5)
        return XDP_PASS;
    struct udphdr *udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end)
        return XDP_PASS;
    __u16 port = bpf_ntohs(udp->dest);
    if (port == 9)
        return XDP_DROP;
    if (port == 13)
        return XDP_ABORTED;
    if (port == 7) {
        __u32 a = ip->saddr;
        ip->saddr = ip->daddr;
        ip->daddr = a;
        __u16 p = udp->source;
        udp->source = udp->dest;
        udp->dest = p;
        return XDP_TX;
    }
    if (port != 6)
        return XDP_PASS;
    __u16 tot = bpf_ntohs(ip->tot_len);
    if (bpf_xdp_adjust_tail(ctx, 8) < 0)
        return XDP_ABORTED;
    data = (void *)(long)ctx->data;
    end = (void *)(long)ctx->data_end;
    eth = data;
    ip = (void *)(eth + 1);
    udp = (void *)(ip + 1);
    if ((void *)(udp + 1) > end)
        return XDP_ABORTED;
    /* The packet is the IP packet the frame holds: its new bytes are the last 8. */
    __u8 *tail = end - 8;
    if ((void *)tail < (void *)(udp + 1) || (void *)(tail + 8) > end)
        return XDP_ABORTED;
    __builtin_memset(tail, 0xee, 8);
    ip->tot_len = bpf_htons(tot + 8);
    udp->len = bpf_htons(bpf_ntohs(udp->len) + 8);
    udp->check = 0;
    ip->check = 0;
    ip->check = fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));
    return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
