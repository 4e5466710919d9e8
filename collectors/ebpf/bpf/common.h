/* Prepended to every aiops probe by the collector (bcc rewrites map calls only in the main
 * source text). Each probe is its own BPF module, so these names do not clash.
 *
 * latency: per id (tgid, tid or device) a count, a sum and a log2 histogram of microseconds,
 * drained by the collector every cycle. drops: updates lost to a full map (reported, never
 * fatal). AIOPS_PERCPU selects a per-CPU map for hot paths (no atomics, no shared lines). */
#ifndef SLOTS
#define SLOTS 24
#endif

struct latency { u64 count; u64 sum_ns; u64 slots[SLOTS]; };

#ifdef AIOPS_PERCPU
BPF_PERCPU_HASH(latency, u32, struct latency, MAX_ENTRIES);
#else
BPF_HASH(latency, u32, struct latency, MAX_ENTRIES);
#endif
BPF_PERCPU_ARRAY(drops, u64, 1);

static __always_inline void count_drop(void) {
    int zero = 0;
    u64 *d = drops.lookup(&zero);
    if (d) *d += 1;
}

static __always_inline void record(u32 id, u64 delta_ns) {
    struct latency empty = {};
    struct latency *p = latency.lookup_or_try_init(&id, &empty);
    if (p == 0) {
        count_drop();
        return;
    }
    p->count += 1;
    p->sum_ns += delta_ns;
    u32 slot = bpf_log2l(delta_ns / 1000);
    if (slot >= SLOTS) slot = SLOTS - 1;
    p->slots[slot] += 1;
}
