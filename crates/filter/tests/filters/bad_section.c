/* An older loader's section naming (`xdp/NAME`), which libbpf 1.0 and aya-obj refuse. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp/filter")
int filter(struct xdp_md *ctx)
{
    return XDP_PASS;
}

char LICENSE[] SEC("license") = "GPL";
