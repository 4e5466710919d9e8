/* TCP retransmits and socket state changes, counted per (local port, remote port, state).
 * Retransmits fire from timers and softirqs, so the pid there is not the owner: the collector
 * maps the local port to its process instead. State changes keep the current tgid as well,
 * which is the owner for connect() and close(). */
// common.h is prepended by the collector: bcc rewrites map calls only in the main source.

struct tcp_key { u16 sport; u16 dport; u16 oldstate; u16 newstate; u32 tgid; u32 event; };

BPF_HASH(tcp_events, struct tcp_key, u64, MAX_ENTRIES);

static __always_inline void count_event(struct tcp_key *k) {
    u64 zero = 0;
    u64 *c = tcp_events.lookup_or_try_init(k, &zero);
    if (c) __sync_fetch_and_add(c, 1);
    else count_drop();
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    struct tcp_key k = {.sport = args->sport, .dport = args->dport,
                        .oldstate = args->state, .newstate = args->state, .event = 1};
    count_event(&k);
    return 0;
}

TRACEPOINT_PROBE(sock, inet_sock_set_state) {
    if (args->protocol != 6) return 0;  /* IPPROTO_TCP */
    struct tcp_key k = {.sport = args->sport, .dport = args->dport, .oldstate = args->oldstate,
                        .newstate = args->newstate, .tgid = bpf_get_current_pid_tgid() >> 32,
                        .event = 2};
    count_event(&k);
    return 0;
}
