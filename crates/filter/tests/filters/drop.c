/* Accepted: drops IPv4 packets whose destination is one of the addresses in the array map
 * `blocked` (0.0.0.0 marks an unused slot), and counts them per CPU. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define SLOTS 16

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, SLOTS);
    __type(key, __u32);
    __type(value, __u32); /* IPv4 address, network order */
} blocked SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} dropped SEC(".maps");

SEC("xdp")
int drop_blocked(struct xdp_md *ctx)
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
    /* Unrolled: clang turns the exit test into `i == SLOTS`, which PREVAIL's loop analysis
     * cannot bound once it widens `i` (a loop whose exit compares against data_end can). */
#pragma unroll
    for (__u32 i = 0; i < SLOTS; i++) {
        __u32 key = i;
        __u32 *addr = bpf_map_lookup_elem(&blocked, &key);
        if (!addr || *addr == 0)
            break;
        if (*addr == ip->daddr) {
            __u32 zero = 0;
            __u64 *n = bpf_map_lookup_elem(&dropped, &zero);
            if (n)
                *n += 1;
            return XDP_DROP;
        }
    }
    return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
