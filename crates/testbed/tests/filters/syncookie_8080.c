/* examples/filters/syncookie.c with a third program, `protect_8080`, that puts TCP port 8080
 * into `protected_ports` on every packet it sees: loaded before `syncookie_in` (`to_cloud`,
 * lower weight), it stands in for a tenant's `protego ctl filter map update`. */
#include "../../../../examples/filters/syncookie.c"

SEC("xdp")
int protect_8080(struct xdp_md *ctx)
{
    __u8 yes = 1;
    __u16 port = bpf_htons(8080);
    bpf_map_update_elem(&protected_ports, &port, &yes, BPF_ANY);
    return XDP_PASS;
}
