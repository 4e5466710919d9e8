/* Process lifecycle: exec, exit of a whole process (and how it ended), and OOM-kill victims,
 * sent as events
 * through a perf buffer (the collector counts events lost when it falls behind). */
// common.h is prepended by the collector: bcc rewrites map calls only in the main source.

#define EV_EXEC 1
#define EV_EXIT 2
#define EV_OOM 3

/* code: how a process ended, as in wait(2): status << 8 after exit_group(status), else the
 * signal last sent to it; -1 when neither was seen. Read from tracepoints, not from
 * task_struct, whose layout depends on headers matching the running kernel exactly. */
struct proc_event { u32 kind; u32 pid; s32 code; char comm[16]; };

BPF_PERF_OUTPUT(proc_events);
BPF_TABLE("lru_hash", u32, s32, exit_codes, MAX_ENTRIES);

TRACEPOINT_PROBE(syscalls, sys_enter_exit_group) {
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    s32 code = (s32)((args->error_code & 0xff) << 8);
    exit_codes.update(&tgid, &code);
    return 0;
}

TRACEPOINT_PROBE(signal, signal_generate) {
    /* Only a signal that was delivered (result 0) can have ended the process; an
     * exit_group after it (a handler that exits) overwrites it. */
    if (args->result != 0 || args->sig == 17 /* SIGCHLD */) return 0;
    u32 pid = args->pid;
    s32 code = args->sig & 0x7f;
    exit_codes.update(&pid, &code);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec) {
    struct proc_event e = {.kind = EV_EXEC, .pid = args->pid};
    bpf_get_current_comm(&e.comm, sizeof(e.comm));
    proc_events.perf_submit(args, &e, sizeof(e));
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    if ((u32)id != (u32)(id >> 32)) return 0;  /* a thread, not the process */
    u32 pid = args->pid;
    struct proc_event e = {.kind = EV_EXIT, .pid = pid, .code = -1};
    s32 *code = exit_codes.lookup(&pid);
    if (code) {
        e.code = *code;
        exit_codes.delete(&pid);
    }
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
