/* Accepted: moves the packet's head or tail by the delta in `delta[0]` (an array map) and
 * records the helper's return value in `result[0]`; PASS when the helper agreed, DROP when
 * it refused. Select `xdp:head` or `xdp:tail`. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __s32);
} delta SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __s64);
} result SEC(".maps");

static __always_inline int record(long r)
{
    __u32 zero = 0;
    __s64 *out = bpf_map_lookup_elem(&result, &zero);
    if (out)
        *out = r;
    return r == 0 ? XDP_PASS : XDP_DROP;
}

static __always_inline int get_delta(void)
{
    __u32 zero = 0;
    __s32 *d = bpf_map_lookup_elem(&delta, &zero);
    return d ? *d : 0;
}

SEC("xdp")
int head(struct xdp_md *ctx)
{
    long r = bpf_xdp_adjust_head(ctx, get_delta());
    if (r == 0) {
        /* Write a marker at the new head, if the frame allows. */
        unsigned char *p = (void *)(long)ctx->data;
        unsigned char *end = (void *)(long)ctx->data_end;
        if (p + 1 <= end)
            p[0] = 0xab;
    }
    return record(r);
}

SEC("xdp")
int tail(struct xdp_md *ctx)
{
    return record(bpf_xdp_adjust_tail(ctx, get_delta()));
}

char LICENSE[] SEC("license") = "GPL";
