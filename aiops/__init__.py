"""aiops: observability and AIOps for AI model serving."""

import os as _os

__version__ = "0.1.0"

# DuckDB allocates through its own jemalloc, which by default keeps every address range it
# ever mapped. Under the server's data-memory cap (RLIMIT_DATA) one huge query would then
# spend the cap for good: later ingest and queries fail although nothing is in use. Without
# ``retain`` freed memory goes back to the kernel. Read once, when DuckDB first allocates, so
# it is set on importing aiops (before any store is opened); a value already set wins.
_os.environ.setdefault("DUCKDB_JE_MALLOC_CONF", "retain:false")
