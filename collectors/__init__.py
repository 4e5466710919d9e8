"""Telemetry in: the OTLP/HTTP receiver, the Prometheus scraper, vLLM's metrics, eBPF programs."""
