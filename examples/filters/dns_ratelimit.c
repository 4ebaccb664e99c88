/* A DNS rate limiter for a tenant's resolvers, as in the offloading paper: queries to UDP port
 * 53 (IPv4) are let through at most `rate` per second per source address, with bursts of up to
 * `burst` queries; the rest are dropped before they reach the VMs. Run it toward the VNet
 * (`direction = "to_cloud"`).
 *
 * Maps a tenant tunes at run time (`protego ctl filter map update`):
 *   config    [0] -> { u64 rate (queries per second; 0 = no limit), u64 burst (queries,
 *             1 to 1 000 000; 0 counts as 1) }
 *           Built with -DDNS_RATE=R -DDNS_BURST=B: R and B while `config` is unset.
 * State and counters:
 *   buckets   LRU hash, source address -> { u64 tokens (in 1e-9 query units), u64 last (ns) }
 *   verdicts  per CPU: [0] passed, [1] dropped, [2] not a query (passed untouched)
 *
 * A source's bucket is shared by the gateway's workers and updated without atomics, so two
 * workers handling one source at the same instant may both spend the same token: the rate
 * holds to within that race (a source's packets are normally handled by one worker).
 *
 * Compile: clang -O2 -g -target bpf -mcpu=v3 -I/usr/include/x86_64-linux-gnu -c dns_ratelimit.c */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define NANO 1000000000ULL

struct limits {
    __u64 rate;
    __u64 burst;
};

struct bucket {
    __u64 tokens;
    __u64 last;
};

enum { PASSED, DROPPED, OTHER, COUNTERS };

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, struct limits);
} config SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, struct bucket);
} buckets SEC(".maps");

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
int dns_ratelimit(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
        return count(OTHER, XDP_PASS);
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP)
        return count(OTHER, XDP_PASS);
    if (ip->frag_off & bpf_htons(0x1fff))
        return count(OTHER, XDP_PASS); /* a later fragment: no port to read */
    struct udphdr *udp = (void *)ip + ip->ihl * 4;
    if (ip->ihl < 5 || (void *)(udp + 1) > end)
        return count(DROPPED, XDP_DROP);
    if (udp->dest != bpf_htons(53))
        return count(OTHER, XDP_PASS);

    __u32 zero = 0;
    struct limits *lim = bpf_map_lookup_elem(&config, &zero);
#ifdef DNS_RATE
    /* A build with -DDNS_RATE=R -DDNS_BURST=B limits to R queries per second, bursts of B,
     * while `config` is unset (for a gateway on which no one can update maps yet, e.g.
     * `protego bench fairness`). */
    __u64 rate = DNS_RATE;
    __u64 burst = DNS_BURST;
    if (lim && lim->rate != 0) {
        rate = lim->rate;
        burst = lim->burst;
    }
#else
    if (!lim || lim->rate == 0)
        return count(PASSED, XDP_PASS);
    __u64 rate = lim->rate;
    __u64 burst = lim->burst;
#endif
    /* A burst of at least one query and at most a million (so nothing below overflows). */
    if (burst == 0)
        burst = 1;
    if (burst > 1000000)
        burst = 1000000;
    __u64 full = burst * NANO;
    __u64 now = bpf_ktime_get_ns();
    __u32 src = ip->saddr;
    struct bucket *b = bpf_map_lookup_elem(&buckets, &src);
    if (!b) {
        /* A new source starts with a full bucket, less this query. */
        struct bucket fresh = {.tokens = full - NANO, .last = now};
        bpf_map_update_elem(&buckets, &src, &fresh, BPF_ANY);
        return count(PASSED, XDP_PASS);
    }
    __u64 elapsed = now - b->last;
    /* Past the time that fills an empty bucket, more time adds nothing (and cannot overflow). */
    __u64 fill_time = full / rate + 1;
    if (elapsed > fill_time)
        elapsed = fill_time;
    __u64 tokens = b->tokens + elapsed * rate;
    if (tokens > full)
        tokens = full;
    b->last = now;
    if (tokens < NANO) {
        b->tokens = tokens;
        return count(DROPPED, XDP_DROP);
    }
    b->tokens = tokens - NANO;
    return count(PASSED, XDP_PASS);
}

char LICENSE[] SEC("license") = "GPL";
