"""``python -m collectors.ebpf``: run the collector with the aiops settings (AIOPS_*)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path

from aiops.auth import stack_credential
from aiops.config import load_settings
from aiops.datadir import ATTACHED_REPLICAS_FILE, NODES_FILE, REPLICAS_FILE
from aiops.logs import configure_json_logging
from aiops.tls import client_verify
from collectors.ebpf.collector import EbpfCollector, preflight, ready_file

log = logging.getLogger("collectors.ebpf")


def main() -> int:
    settings = load_settings()
    configure_json_logging(settings.log_level)
    problems = preflight(settings.ebpf_kernel_source)
    if problems:
        for p in problems:
            print(f"aiops ebpf: cannot run: {p}", file=sys.stderr)
        return 2
    collector = EbpfCollector(settings.server_url, settings.ebpf_interval_s,
                              settings.ebpf_max_entries,
                              [Path(settings.data_dir) / REPLICAS_FILE,
                               Path(settings.data_dir) / ATTACHED_REPLICAS_FILE],
                              settings.ebpf_kernel_source, verify=client_verify(settings),
                              token=stack_credential(Path(settings.data_dir), "ebpf"),
                              node=settings.ebpf_node,
                              nodes_file=Path(settings.data_dir) / NODES_FILE)
    if not collector.probes:
        print("aiops ebpf: cannot run: no probe attached: "
              + "; ".join(f"{k}: {v}" for k, v in collector.stats.attach_failures.items()),
              file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info("eBPF collector of %s exporting to %s every %.1f s",
             f"Ray node {settings.ebpf_node}" if settings.ebpf_node else "this machine",
             settings.server_url, settings.ebpf_interval_s)
    try:
        collector.run(stop, Path(settings.data_dir) / ready_file(settings.ebpf_node))
    finally:
        collector.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
