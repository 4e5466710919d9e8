"""``python -m agents.evals.generate [--out DIR] [--only NAME]``: write the incident fixtures."""

from agents.evals.generate.catalog import main

main()
