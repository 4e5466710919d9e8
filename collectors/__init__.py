"""Telemetry in: the OTLP/HTTP receiver (later: Prometheus scraper, eBPF programs)."""
