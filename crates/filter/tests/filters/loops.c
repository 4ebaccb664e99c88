/* Accepted: programs for the runtime's instruction meter, the JIT's size limit and return
 * values. Select `xdp:walk_all`, `xdp:huge` or `xdp:redirect`. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

/* Sums every byte of the frame (a loop bounded by data_end): about 8 instructions per byte,
 * so a full-size packet needs more than the meter's default limit's tenth. */
SEC("xdp")
int walk_all(struct xdp_md *ctx)
{
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    unsigned int sum = 0;
    while (p + 1 <= end) {
        sum += *p;
        p++;
    }
    return sum & 1 ? XDP_DROP : XDP_PASS;
}

/* Straight-line code too long for rbpf's 4 KiB of machine code: 150 unrolled rounds of
 * mixing a packet byte. */
SEC("xdp")
int huge(struct xdp_md *ctx)
{
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    if (p + 1 > end)
        return XDP_PASS;
    unsigned int h = p[0];
#pragma unroll
    for (int i = 0; i < 150; i++)
        h = ((h * 31) ^ (h >> 7)) + i;
    return h & 1 ? XDP_DROP : XDP_PASS;
}

/* XDP_REDIRECT, which the gateway does not offer: ABORTED. */
SEC("xdp")
int redirect(struct xdp_md *ctx)
{
    return XDP_REDIRECT;
}

char LICENSE[] SEC("license") = "GPL";
