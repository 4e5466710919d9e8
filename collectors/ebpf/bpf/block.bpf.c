/* Block I/O latency per device, issue to completion. The issuing process is kept too (the
 * submitter's tgid at issue; 0 when the kernel issued it from a worker). */
// common.h is prepended by the collector: bcc rewrites map calls only in the main source.

struct rq_key { u32 dev; u32 pad; u64 sector; };
struct rq_start { u64 ts; u32 tgid; };

BPF_HASH(issued, struct rq_key, struct rq_start, MAX_ENTRIES);
BPF_HASH(issuers, u32, u32, MAX_ENTRIES);

TRACEPOINT_PROBE(block, block_rq_issue) {
    struct rq_key k = {.dev = args->dev, .sector = args->sector};
    struct rq_start s = {.ts = bpf_ktime_get_ns(), .tgid = bpf_get_current_pid_tgid() >> 32};
    if (issued.update(&k, &s)) count_drop();
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete) {
    struct rq_key k = {.dev = args->dev, .sector = args->sector};
    struct rq_start *s = issued.lookup(&k);
    if (s == 0) return 0;
    u64 delta = bpf_ktime_get_ns() - s->ts;
    u32 tgid = s->tgid;
    issued.delete(&k);
    u32 dev = args->dev;
    record(dev, delta);
    /* The last issuer per device: enough to name who was waiting on a slow disk. */
    issuers.update(&dev, &tgid);
    return 0;
}
