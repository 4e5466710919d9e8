/* Process lifecycle: exec, exit of a whole process, and OOM-kill victims, sent as events
 * through a perf buffer (the collector counts events lost when it falls behind). */
// common.h is prepended by the collector: bcc rewrites map calls only in the main source.

#define EV_EXEC 1
#define EV_EXIT 2
#define EV_OOM 3

struct proc_event { u32 kind; u32 pid; char comm[16]; };

BPF_PERF_OUTPUT(proc_events);

TRACEPOINT_PROBE(sched, sched_process_exec) {
    struct proc_event e = {.kind = EV_EXEC, .pid = args->pid};
    bpf_get_current_comm(&e.comm, sizeof(e.comm));
    proc_events.perf_submit(args, &e, sizeof(e));
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    if ((u32)id != (u32)(id >> 32)) return 0;  /* a thread, not the process */
    struct proc_event e = {.kind = EV_EXIT, .pid = args->pid};
    bpf_probe_read_kernel(&e.comm, sizeof(e.comm), args->comm);
    proc_events.perf_submit(args, &e, sizeof(e));
    return 0;
}

TRACEPOINT_PROBE(oom, mark_victim) {
    struct proc_event e = {.kind = EV_OOM, .pid = args->pid};
    TP_DATA_LOC_READ_CONST(&e.comm, comm, sizeof(e.comm));
    proc_events.perf_submit(args, &e, sizeof(e));
    return 0;
}
