"""``python -m aiops_harness.agent_evals.generate [--out DIR] [--only NAME]``: write the
incident fixtures."""

from aiops_harness.agent_evals.generate.catalog import main

main()
