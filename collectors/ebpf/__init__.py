"""Kernel signals from bcc tracepoint programs, attributed to Ray Serve replicas and shipped
to the aiops server as OTLP metrics. Root only; see ``preflight`` for what else it needs."""
