"""Benchmarks behind `aiops bench` / `make bench`. Figures are recorded in docs/benchmarks.md."""
