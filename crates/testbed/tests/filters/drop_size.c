/* A tenant filter for cluster_filters.rs: drops ICMP echo requests whose IPv4 total length is
 * the one in the array map `size` (key 0; 0 there means 1028, a `ping -s 1000`), counting them
 * in the per-CPU array `dropped`. Everything else passes. */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define DEFAULT_LEN 1028
/* Not from <linux/icmp.h>, which pulls in the C library's headers. */
#define PROTO_ICMP 1
#define ICMP_ECHO_REQUEST 8

struct icmp_head {
    __u8 type;
    __u8 code;
    __u16 checksum;
};

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u32); /* IPv4 total length, host order; 0: DEFAULT_LEN */
} size SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} dropped SEC(".maps");

SEC("xdp")
int drop_size(struct xdp_md *ctx)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    struct ethhdr *eth = data;
    if ((void *)(eth + 1) > end)
        return XDP_ABORTED;
    if (eth->h_proto != bpf_htons(ETH_P_IP))
        return XDP_PASS;
    struct iphdr *ip = (void *)(eth + 1);
    if ((void *)(ip + 1) > end || ip->ihl != 5 || ip->protocol != PROTO_ICMP)
        return XDP_PASS;
    struct icmp_head *icmp = (void *)(ip + 1);
    if ((void *)(icmp + 1) > end || icmp->type != ICMP_ECHO_REQUEST)
        return XDP_PASS;
    __u32 zero = 0;
    __u32 want = DEFAULT_LEN;
    __u32 *set = bpf_map_lookup_elem(&size, &zero);
    if (set && *set)
        want = *set;
    if (bpf_ntohs(ip->tot_len) != want)
        return XDP_PASS;
    __u64 *n = bpf_map_lookup_elem(&dropped, &zero);
    if (n)
        *n += 1;
    return XDP_DROP;
}

char LICENSE[] SEC("license") = "GPL";
