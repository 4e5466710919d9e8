"""aiops' harness: benchmarks (``bench``), dataset evaluations (``evals``), the agent's
evaluation (``agent_evals``) and the demo (``demo``). Not part of the product: its own
distribution (harness/pyproject.toml), mounted into the ``aiops`` command by entry points."""
