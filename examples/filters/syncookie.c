/* A TCP SYN-cookie proxy for a tenant's servers, as two XDP programs of one object that share
 * their maps: `syncookie_in` runs on traffic toward the VNet (`direction = "to_cloud"`),
 * `syncookie_out` on the servers' answers (`direction = "from_cloud"`).
 *
 * For the ports in `protected_ports` (destination port, network byte order -> any value):
 *
 *   client                 gateway (these programs)                 server (a VM)
 *     |--- SYN ------------->|  answered at once (XDP_TX), no state:     |
 *     |<-- SYN-ACK, cookie --|  the cookie encodes the flow, the        |
 *     |                      |  client's ISN, the time and the MSS      |
 *     |--- ACK ------------->|  cookie checked: the ACK becomes the     |
 *     |                      |  client's SYN to the server (XDP_PASS) -->|
 *     |                      |<-- SYN-ACK (server's ISN) ----------------|
 *     |                      |  answered for the client (XDP_TX): ACK -->|
 *     |=== data ============>|  sequence numbers translated by the      |
 *     |<=====================|  difference of the two ISNs, both ways ==|
 *
 * A SYN flood thus costs one SYN-ACK per SYN and no memory: a connection is remembered only
 * once its client proved it received the cookie. An ACK with a wrong cookie is answered with
 * a RST. Neither side offers window scaling, SACK or timestamps (the cookie has no room for
 * them), so the connection's window is at most 64 KiB; the MSS is kept (one of four values).
 * IPv4 only; other traffic passes untouched, and so do later fragments (they carry no ports).
 * TCP toward a protected port with IP options, or as a first fragment, is dropped.
 *
 * Maps a tenant tunes at run time (`protego ctl filter map update`):
 *   protected_ports  u16 port (network order) -> u8
 *   secret           [0] -> two u64 keys of the cookie hash; all zero means "make one up on
 *                    the first SYN" (two workers doing so at once may each answer one SYN with
 *                    its own key; such a client's ACK is refused with a RST and it retries).
 * Counters (`verdicts`, per CPU): see the enum below.
 * Built with -DSYNCOOKIE_PORT=N, port N is protected and `protected_ports` is not read.
 *
 * Compile: clang -O2 -g -target bpf -mcpu=v3 -I/usr/include/x86_64-linux-gnu -c syncookie.c */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* What `verdicts` counts, by index. */
enum {
    SYN_ANSWERED,     /* SYN answered with a cookie */
    COOKIE_VALID,     /* ACK with a valid cookie, forwarded to the server as its SYN */
    COOKIE_INVALID,   /* ACK with a wrong or stale cookie, answered with a RST */
    SERVER_ANSWERED,  /* the server's SYN-ACK, acknowledged for the client */
    TRANSLATED,       /* packets of a proxied connection, sequence numbers translated */
    MALFORMED,        /* protected port, but a packet the proxy cannot handle: dropped */
    COUNTERS,
};

/* A proxied connection, keyed by its client and server. */
struct flow {
    __u32 client;
    __u32 server;
    __u16 client_port;
    __u16 server_port;
};

enum { SYN_SENT = 1, ESTABLISHED = 2 };

struct conn {
    __u32 cookie;     /* the ISN the client saw */
    __u32 client_isn;
    __u32 delta;      /* server's ISN - cookie: added to the client's ACKs, taken off the server's SEQs */
    __u16 window;     /* the client's window, announced to the server for it */
    __u16 state;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 64);
    __type(key, __u16);
    __type(value, __u8);
} protected_ports SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64[2]);
} secret SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_LRU_HASH);
    __uint(max_entries, 65536);
    __type(key, struct flow);
    __type(value, struct conn);
} conns SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, COUNTERS);
    __type(key, __u32);
    __type(value, __u64);
} verdicts SEC(".maps");

/* The MSS values a cookie can carry (its two low bits); a client's MSS is rounded down. (A
 * function, not a table: the gateway offers no global data, only maps.) */
static __always_inline __u16 mss_of(__u32 idx)
{
    switch (idx & 3) {
    case 3: return 1460;
    case 2: return 1360;
    case 1: return 1220;
    default: return 536;
    }
}

/* Length of the headers this proxy writes: Ethernet, IPv4 without options, TCP with MSS. */
#define SYN_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr) + 4)
/* The same without TCP options (the ACK and RST it writes). */
#define ACK_LEN (sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr))

static __always_inline int count(__u32 which, int verdict)
{
    __u64 *n = bpf_map_lookup_elem(&verdicts, &which);
    if (n)
        *n += 1;
    return verdict;
}

static __always_inline __u64 mix(__u64 h, __u64 w)
{
    h ^= w;
    h *= 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 29);
}

/* The cookie of a flow and its client's ISN at minute `t`, its two low bits left for the MSS. */
static __always_inline __u32 cookie_hash(const __u64 *key, const struct flow *f, __u32 isn, __u64 t)
{
    __u64 h = mix(key[0], ((__u64)f->client << 32) | f->server);
    h = mix(h, ((__u64)f->client_port << 48) | ((__u64)f->server_port << 32) | isn);
    h = mix(h, t ^ key[1]);
    return (__u32)(h ^ (h >> 32)) & ~3U;
}

/* The cookie key, made up on first use if the tenant set none. */
static __always_inline __u64 *cookie_key(void)
{
    __u32 zero = 0;
    __u64 *key = bpf_map_lookup_elem(&secret, &zero);
    if (key && key[0] == 0 && key[1] == 0) {
        key[0] = ((__u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32();
        key[1] = ((__u64)bpf_get_prandom_u32() << 32) | bpf_get_prandom_u32() | 1;
    }
    return key;
}

static __always_inline __u16 fold(__s64 sum)
{
    __u64 s = (__u64)sum;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    return (__u16)~s;
}

/* Rewrites the IPv4 header's length and checksum (no options: 20 bytes). */
static __always_inline void ip_finish(struct iphdr *ip, __u16 tot_len)
{
    ip->tot_len = bpf_htons(tot_len);
    ip->ttl = 64;
    ip->check = 0;
    ip->check = fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0));
}

/* The TCP checksum over the pseudo-header and `len` bytes of TCP header (a multiple of 4). */
static __always_inline void tcp_finish(struct iphdr *ip, struct tcphdr *tcp, __u32 len)
{
    __u32 pseudo[3] = {ip->saddr, ip->daddr, bpf_htonl((IPPROTO_TCP << 16) | len)};
    __s64 sum = bpf_csum_diff(0, 0, pseudo, sizeof(pseudo), 0);
    tcp->check = 0;
    tcp->check = fold(bpf_csum_diff(0, 0, (__be32 *)tcp, len, (__u32)sum));
}

/* Replaces the 4-byte word `old` by `new` in the TCP checksum. */
static __always_inline void tcp_adjust(struct tcphdr *tcp, __u32 old, __u32 new)
{
    __u32 from = old, to = new;
    __u32 seed = (__u16)~tcp->check;
    tcp->check = fold(bpf_csum_diff(&from, 4, &to, 4, seed));
}

static __always_inline void swap_ends(struct ethhdr *eth, struct iphdr *ip, struct tcphdr *tcp)
{
    __u8 mac[ETH_ALEN];
    __builtin_memcpy(mac, eth->h_source, ETH_ALEN);
    __builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
    __builtin_memcpy(eth->h_dest, mac, ETH_ALEN);
    __u32 a = ip->saddr;
    ip->saddr = ip->daddr;
    ip->daddr = a;
    __u16 p = tcp->source;
    tcp->source = tcp->dest;
    tcp->dest = p;
}

/* Sets the packet's length to `len` bytes from its start; the caller re-reads every pointer. */
static __always_inline int resize(struct xdp_md *ctx, __u32 len)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    long have = end - data;
    /* Keeps clang from folding this into `len + data - end` in 32-bit arithmetic, which a
     * verifier cannot follow (a 32-bit operation on a pointer). */
    asm volatile("" : "+r"(have));
    return bpf_xdp_adjust_tail(ctx, (int)((long)len - have));
}

/* The headers of an IPv4/TCP packet without IP options, or NULL pointers. */
struct view {
    struct ethhdr *eth;
    struct iphdr *ip;
    struct tcphdr *tcp;
};

/* 1: an IPv4/TCP packet this proxy handles (no IP options, not a fragment); -1: TCP it does
 * not handle, with `tcp` set when its ports can be read; 0: anything else. */
static __always_inline int parse(struct xdp_md *ctx, struct view *v)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    v->tcp = 0;
    v->eth = data;
    if ((void *)(v->eth + 1) > end || v->eth->h_proto != bpf_htons(ETH_P_IP))
        return 0;
    v->ip = (void *)(v->eth + 1);
    if ((void *)(v->ip + 1) > end || v->ip->protocol != IPPROTO_TCP)
        return 0;
    if (v->ip->frag_off & bpf_htons(0x1fff))
        return -1; /* a later fragment: no ports */
    struct tcphdr *tcp = (void *)v->ip + v->ip->ihl * 4;
    if (v->ip->ihl < 5 || (void *)(tcp + 1) > end)
        return -1;
    v->tcp = tcp;
    if (v->ip->ihl != 5 || (v->ip->frag_off & bpf_htons(0x2000)))
        return -1;
    return 1;
}

/* After a resize: the headers again, checked against the new end (`len` bytes needed). */
static __always_inline int reparse(struct xdp_md *ctx, struct view *v, __u32 len)
{
    void *data = (void *)(long)ctx->data;
    void *end = (void *)(long)ctx->data_end;
    if (data + len > end)
        return 0;
    v->eth = data;
    v->ip = (void *)(v->eth + 1);
    v->tcp = (void *)(v->ip + 1);
    if ((void *)(v->tcp + 1) > end)
        return 0;
    return 1;
}

/* The MSS the client asked for, if it is the SYN's first option (where stacks put it). */
static __always_inline __u16 client_mss(struct xdp_md *ctx, struct tcphdr *tcp)
{
    void *end = (void *)(long)ctx->data_end;
    __u8 *opt = (void *)(tcp + 1);
    if (tcp->doff < 6 || (void *)(opt + 4) > end || opt[0] != 2 || opt[1] != 4)
        return 536;
    return ((__u16)opt[2] << 8) | opt[3];
}

/* A segment this proxy writes over the packet it got: headers only (any payload dropped). */
struct segment {
    __u32 seq;      /* host order */
    __u32 ack;      /* host order */
    __u16 mss;      /* 0: no options */
    __u16 window;   /* host order */
    __u8 syn, ack_flag, rst;
    __u8 swap;      /* back to the sender (XDP_TX) rather than on to the receiver */
};

/* Writes `seg` over the packet: length, addresses, TCP header and checksums. */
static __always_inline int write(struct xdp_md *ctx, struct view *v, struct segment *seg)
{
    __u32 len = seg->mss ? SYN_LEN : ACK_LEN;
    if (resize(ctx, len) < 0 || !reparse(ctx, v, len))
        return 0;
    struct tcphdr *tcp = v->tcp;
    if (seg->swap)
        swap_ends(v->eth, v->ip, tcp);
    tcp->seq = bpf_htonl(seg->seq);
    tcp->ack_seq = bpf_htonl(seg->ack);
    tcp->window = bpf_htons(seg->window);
    tcp->doff = seg->mss ? 6 : 5;
    tcp->fin = 0;
    tcp->syn = seg->syn;
    tcp->rst = seg->rst;
    tcp->psh = 0;
    tcp->ack = seg->ack_flag;
    tcp->urg = 0;
    tcp->ece = 0;
    tcp->cwr = 0;
    tcp->res1 = 0;
    tcp->urg_ptr = 0;
    __u32 tcp_len = sizeof(struct tcphdr);
    if (seg->mss) {
        void *end = (void *)(long)ctx->data_end;
        __u8 *opt = (void *)(tcp + 1);
        if ((void *)(opt + 4) > end)
            return 0;
        opt[0] = 2;
        opt[1] = 4;
        opt[2] = seg->mss >> 8;
        opt[3] = seg->mss & 0xff;
        tcp_len += 4;
    }
    ip_finish(v->ip, sizeof(struct iphdr) + tcp_len);
    tcp_finish(v->ip, tcp, tcp_len);
    return 1;
}

/* The two minutes a cookie is good for: this one and the one before. */
static __always_inline __u64 minute(void)
{
    return bpf_ktime_get_ns() / (60ULL * 1000000000ULL);
}

/* Toward the servers: SYNs answered, cookies checked, ACK numbers of proxied flows translated. */
SEC("xdp")
int syncookie_in(struct xdp_md *ctx)
{
    struct view v;
    int parsed = parse(ctx, &v);
    if (!v.tcp)
        return XDP_PASS;
    __u16 port = v.tcp->dest;
#ifdef SYNCOOKIE_PORT
    /* A build with -DSYNCOOKIE_PORT=N protects port N instead of the map's ports (for a
     * gateway on which no one can update maps yet, e.g. `protego bench fairness`). */
    if (port != bpf_htons(SYNCOOKIE_PORT))
        return XDP_PASS;
#else
    if (!bpf_map_lookup_elem(&protected_ports, &port))
        return XDP_PASS;
#endif
    /* IP options or a first fragment toward a protected port: not proxied, not let by. */
    if (parsed < 0)
        return count(MALFORMED, XDP_DROP);
    struct flow f = {
        .client = v.ip->saddr,
        .server = v.ip->daddr,
        .client_port = v.tcp->source,
        .server_port = v.tcp->dest,
    };
    struct segment seg = {};
    __u32 counter;
    int verdict;
    if (v.tcp->syn) {
        if (v.tcp->ack || v.tcp->rst)
            return count(MALFORMED, XDP_DROP);
        /* A new attempt replaces whatever the flow was. Answered with a SYN-ACK whose
         * sequence number is the cookie. */
        bpf_map_delete_elem(&conns, &f);
        __u64 *key = cookie_key();
        if (!key)
            return count(MALFORMED, XDP_DROP);
        __u32 isn = bpf_ntohl(v.tcp->seq);
        __u16 mss = client_mss(ctx, v.tcp);
        __u32 idx = 0;
        if (mss >= mss_of(3))
            idx = 3;
        else if (mss >= mss_of(2))
            idx = 2;
        else if (mss >= mss_of(1))
            idx = 1;
        __u32 cookie = cookie_hash(key, &f, isn, minute()) | idx;
        seg = (struct segment){.seq = cookie, .ack = isn + 1, .mss = mss_of(idx),
                               .window = 65535, .syn = 1, .ack_flag = 1, .swap = 1};
        counter = SYN_ANSWERED;
        verdict = XDP_TX;
    } else {
        struct conn *c = bpf_map_lookup_elem(&conns, &f);
        if (c) {
            if (c->state != ESTABLISHED)
                /* The server has not answered yet: the client sends again later. */
                return XDP_DROP;
            if (v.tcp->rst)
                bpf_map_delete_elem(&conns, &f);
            if (v.tcp->ack) {
                __u32 old = v.tcp->ack_seq;
                __u32 new = bpf_htonl(bpf_ntohl(old) + c->delta);
                v.tcp->ack_seq = new;
                tcp_adjust(v.tcp, old, new);
            }
            return count(TRANSLATED, XDP_PASS);
        }
        if (v.tcp->rst)
            return XDP_DROP;
        if (!v.tcp->ack)
            return count(MALFORMED, XDP_DROP);
        /* A client's ACK for a flow not proxied yet: its cookie checked, it becomes the SYN
         * to the server that the client once sent (same ISN, the MSS from the cookie). */
        __u32 zero = 0;
        __u64 *key = bpf_map_lookup_elem(&secret, &zero);
        if (!key)
            return count(MALFORMED, XDP_DROP);
        __u32 acked = bpf_ntohl(v.tcp->ack_seq);
        __u32 cookie = acked - 1;
        __u32 isn = bpf_ntohl(v.tcp->seq) - 1;
        __u32 expect = cookie & ~3U;
        __u64 now = minute();
        if (cookie_hash(key, &f, isn, now) != expect && cookie_hash(key, &f, isn, now - 1) != expect) {
            /* A RST from the server's side, at the sequence number the ACK acknowledged. */
            seg = (struct segment){.seq = acked, .rst = 1, .swap = 1};
            counter = COOKIE_INVALID;
            verdict = XDP_TX;
        } else {
            struct conn fresh = {
                .cookie = cookie,
                .client_isn = isn,
                .window = bpf_ntohs(v.tcp->window),
                .state = SYN_SENT,
            };
            if (bpf_map_update_elem(&conns, &f, &fresh, BPF_ANY) < 0)
                return count(MALFORMED, XDP_DROP);
            seg = (struct segment){.seq = isn, .mss = mss_of(cookie), .window = fresh.window,
                                   .syn = 1};
            counter = COOKIE_VALID;
            verdict = XDP_PASS;
        }
    }
    if (!write(ctx, &v, &seg))
        return count(MALFORMED, XDP_DROP);
    return count(counter, verdict);
}

/* From the servers: the SYN-ACK acknowledged for the client, SEQ numbers of proxied flows
 * translated. */
SEC("xdp")
int syncookie_out(struct xdp_md *ctx)
{
    struct view v;
    if (parse(ctx, &v) <= 0)
        return XDP_PASS;
    struct flow f = {
        .client = v.ip->daddr,
        .server = v.ip->saddr,
        .client_port = v.tcp->dest,
        .server_port = v.tcp->source,
    };
    struct conn *c = bpf_map_lookup_elem(&conns, &f);
    if (!c)
        return XDP_PASS;
    if (c->state == SYN_SENT) {
        if (!v.tcp->syn || !v.tcp->ack) {
            if (v.tcp->rst)
                /* The server refused: the client learns it from its next packet's RST. */
                bpf_map_delete_elem(&conns, &f);
            return XDP_DROP;
        }
        __u32 server_isn = bpf_ntohl(v.tcp->seq);
        c->delta = server_isn - c->cookie;
        c->state = ESTABLISHED;
        struct segment seg = {.seq = c->client_isn + 1, .ack = server_isn + 1,
                              .window = c->window, .ack_flag = 1, .swap = 1};
        if (!write(ctx, &v, &seg))
            return count(MALFORMED, XDP_DROP);
        return count(SERVER_ANSWERED, XDP_TX);
    }
    if (v.tcp->rst)
        bpf_map_delete_elem(&conns, &f);
    __u32 old = v.tcp->seq;
    __u32 new = bpf_htonl(bpf_ntohl(old) - c->delta);
    v.tcp->seq = new;
    tcp_adjust(v.tcp, old, new);
    return count(TRANSLATED, XDP_PASS);
}

char LICENSE[] SEC("license") = "GPL";
