"""The agent's evaluation: incident fixtures as data (``cases/``), replayed and scored."""
