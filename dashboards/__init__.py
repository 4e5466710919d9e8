"""Grafana dashboards as code (issue P9). Nothing here yet."""
