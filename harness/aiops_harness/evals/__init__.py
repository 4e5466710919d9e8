"""Evaluations of the analytics on public corpora (../shared/datasets).

Behind `aiops bench rca|logs|anomaly`."""
