"""Evaluations of the analytics on public corpora (../shared/datasets), behind `aiops bench rca|logs|anomaly`."""
