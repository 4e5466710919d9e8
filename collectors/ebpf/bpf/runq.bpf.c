/* Run-queue latency per thread: from wakeup, or from a switch-out while still runnable
 * (preempted or yielded; the tracepoint does not tell them apart), to running again.
 * Only tracepoint fields are read: struct offsets from the header tree may not match the
 * running kernel. prev_state & 0xff == 0: still runnable (0x100 marks some preemptions). */
// common.h is prepended by the collector: bcc rewrites map calls only in the main source.

BPF_HASH(enqueued, u32, u64, MAX_ENTRIES);


static __always_inline void enqueue(u32 tid) {
    if (tid == 0) return;
    u64 ts = bpf_ktime_get_ns();
    if (enqueued.update(&tid, &ts)) count_drop();
}

TRACEPOINT_PROBE(sched, sched_wakeup) { enqueue(args->pid); return 0; }
TRACEPOINT_PROBE(sched, sched_wakeup_new) { enqueue(args->pid); return 0; }

TRACEPOINT_PROBE(sched, sched_switch) {
    if ((args->prev_state & 0xff) == 0) enqueue(args->prev_pid);
    u32 tid = args->next_pid;
    u64 *start = enqueued.lookup(&tid);
    if (start == 0) return 0;
    u64 delta = bpf_ktime_get_ns() - *start;
    enqueued.delete(&tid);
    record(tid, delta);
    return 0;
}
