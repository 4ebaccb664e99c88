/* Programs the loader must refuse, one reason each, and two accepted counterparts
 * (`fresh_pointer`, `packet_walk`); select one with `xdp:FUNCTION`. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} cfg SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 4096);
} events SEC(".maps");

/* Reads byte 20 after checking only 14. */
SEC("xdp")
int out_of_bounds(struct xdp_md *ctx)
{
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    if (p + 14 > end)
        return XDP_DROP;
    return p[20] == 0x45 ? XDP_PASS : XDP_DROP;
}

/* Uses a map value without checking the lookup found one. */
SEC("xdp")
int no_null_check(struct xdp_md *ctx)
{
    __u32 key = 0;
    __u64 *v = bpf_map_lookup_elem(&cfg, &key);
    return *v & 3;
}

/* Waits for a packet byte that never changes. */
SEC("xdp")
int unbounded_loop(struct xdp_md *ctx)
{
    volatile unsigned int spins = 0;
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    if (p + 1 > end)
        return XDP_DROP;
    while (p[0] != 7)
        spins++;
    return XDP_PASS;
}

/* A bounded loop: sums up to the first 64 bytes, each read checked against data_end. */
SEC("xdp")
int packet_walk(struct xdp_md *ctx)
{
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    unsigned int sum = 0;
    for (int i = 0; i < 64; i++) {
        if (p + i + 1 > end)
            break;
        sum += p[i];
    }
    return sum & 1 ? XDP_DROP : XDP_PASS;
}

/* Writes through a packet pointer taken before bpf_xdp_adjust_tail changed the packet. */
SEC("xdp")
int stale_pointer(struct xdp_md *ctx)
{
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    if (p + 40 > end)
        return XDP_DROP;
    if (bpf_xdp_adjust_tail(ctx, -10))
        return XDP_ABORTED;
    p[30] = 1;
    return XDP_TX;
}

/* The same, done right: pointers reloaded after the change. */
SEC("xdp")
int fresh_pointer(struct xdp_md *ctx)
{
    if (bpf_xdp_adjust_tail(ctx, -10))
        return XDP_ABORTED;
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    if (p + 40 > end)
        return XDP_DROP;
    p[30] = 1;
    return XDP_TX;
}

/* Uses 504 bytes of stack: more than the 496 a tenant program gets. */
SEC("xdp")
int big_stack(struct xdp_md *ctx)
{
    __u32 words[126];
    __builtin_memset(words, 0, sizeof(words));
    words[0] = ctx->rx_queue_index;
    return bpf_csum_diff(0, 0, words, sizeof(words), 0) & 1 ? XDP_PASS : XDP_DROP;
}

/* A helper the gateway does not offer (id 8). */
SEC("xdp")
int unknown_helper(struct xdp_md *ctx)
{
    return bpf_get_smp_processor_id() ? XDP_PASS : XDP_DROP;
}

/* A map type the gateway does not offer. */
SEC("xdp")
int ring_buffer(struct xdp_md *ctx)
{
    __u64 *slot = bpf_ringbuf_reserve(&events, sizeof(__u64), 0);
    if (!slot)
        return XDP_PASS;
    *slot = 1;
    bpf_ringbuf_submit(slot, 0);
    return XDP_PASS;
}

static __attribute__((noinline)) int classify(struct xdp_md *ctx)
{
    return ctx->rx_queue_index & 1 ? XDP_PASS : XDP_DROP;
}

/* A bpf-to-bpf call. */
SEC("xdp")
int local_call(struct xdp_md *ctx)
{
    return classify(ctx);
}

/* Not plain XDP: a multi-buffer XDP program and a traffic-control classifier. */
SEC("xdp.frags")
int multi_buffer(struct xdp_md *ctx)
{
    return XDP_PASS;
}

SEC("classifier")
int traffic_control(struct __sk_buff *skb)
{
    return 0;
}

char LICENSE[] SEC("license") = "GPL";
