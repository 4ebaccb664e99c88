/* examples/filters/udp_firewall.c with a second program, `block_7001_7003`, that puts UDP ports
 * 7001 and 7003 into `blocked_ports` on every packet it sees: loaded before the firewall
 * (`to_cloud`, lower weight), it stands in for a tenant's `protego ctl filter map update`. The
 * firewall programs of this object share its maps, whatever their direction. */
#include "../../../../examples/filters/udp_firewall.c"

SEC("xdp")
int block_7001_7003(struct xdp_md *ctx)
{
    __u8 yes = 1;
    __u16 port = bpf_htons(7001);
    bpf_map_update_elem(&blocked_ports, &port, &yes, BPF_ANY);
    port = bpf_htons(7003);
    bpf_map_update_elem(&blocked_ports, &port, &yes, BPF_ANY);
    return XDP_PASS;
}
