"""Grafana dashboards as code: built with grafana-foundation-sdk (``serving``, ``incidents``,
``ebpf``, ``pipeline``, ``slo``), rendered with their provisioning by ``generate`` into
``generated/`` and ``provisioning/``, uploaded by ``push``; see docs/dashboards.md."""
