/* `protego bench fairness`, case "spin": a tenant program that runs to the gateway's
 * instruction limit on every packet. Its loop is bounded (the verifier proves that it ends
 * within its 20 255 iterations at most) but takes about nine instructions an iteration,
 * some 180 000 in all, so the runtime's meter (100 000 instructions a packet) stops it every time and the packet is
 * XDP_ABORTED (counted as `<tenant>/filter_aborted`).
 *
 * Compile: clang -O2 -g -target bpf -mcpu=v3 -I/usr/include/x86_64-linux-gnu -c spin.c */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int spin(struct xdp_md *ctx)
{
    unsigned char *p = (void *)(long)ctx->data;
    unsigned char *end = (void *)(long)ctx->data_end;
    if (p + 1 > end)
        return XDP_PASS;
    __u32 h = p[0];
    /* A bound the compiler cannot turn into an equality test, which PREVAIL could not bound. */
    __u32 n = 20000 + (h & 0xff);
    for (__u32 i = 0; i < n; i++)
        h = (h ^ (h >> 3)) * 2654435761u + i;
    return h == 0x12345678 ? XDP_DROP : XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
