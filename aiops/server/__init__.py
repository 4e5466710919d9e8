"""The aiops server process: the single owner of the DuckDB file."""
