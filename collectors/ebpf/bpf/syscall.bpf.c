/* Syscall latency per process (tgid), sampled: every SAMPLE_EVERY-th syscall of each thread is
 * timed (the collector scales counts back up). The kernel's tracepoint path alone costs about
 * as much as a cheap syscall; sampling keeps the program's own share of it small. Per-thread
 * state lives in task-local storage: no hash lookup by tid, freed when the task exits. */
// common.h is prepended by the collector: bcc rewrites map calls only in the main source.

struct syscall_state { u64 start; u32 seen; };

BPF_TASK_STORAGE(threads, struct syscall_state);

RAW_TRACEPOINT_PROBE(sys_enter) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct syscall_state *s = threads.task_storage_get(task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (s == 0) return 0;
    s->seen += 1;
    s->start = (s->seen % SAMPLE_EVERY) ? 0 : bpf_ktime_get_ns();
    return 0;
}

RAW_TRACEPOINT_PROBE(sys_exit) {
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct syscall_state *s = threads.task_storage_get(task, 0, 0);
    if (s == 0 || s->start == 0) return 0;
    u64 delta = bpf_ktime_get_ns() - s->start;
    s->start = 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (tgid == SELF_TGID) return 0;
    record(tgid, delta);
    return 0;
}
