"""The exception tree. Every error aiops raises on purpose derives from ``AIOpsError``.

    AIOpsError
    ├── ConfigError            bad configuration file or environment value
    ├── StoreError             DuckDB store problems
    │   ├── SchemaMismatch     an Arrow batch does not fit its declared table
    │   ├── QueryRejected      a read-only query asked to write, or is not one statement
    │   ├── QueryTimeout       a read-only query ran past its time limit (interrupted)
    │   ├── ResultTooLarge     a read-only query's result passed its byte limit
    │   └── QueryBusy          every read-only query slot is taken (retryable)
    ├── DecodeError            an OTLP body could not be decoded (maps to HTTP 400)
    │   └── UnsupportedMediaType  the content type is not OTLP protobuf or JSON (HTTP 415)
    ├── PayloadTooLarge        a body exceeds the configured limit (HTTP 413)
    ├── ModelError             a model backend failed to load or run
    └── StackError             starting, stopping or reaching the local stack failed

Vendor errors (duckdb, protobuf, llama.cpp, Ray) are translated into these at the module
boundary with ``raise X(...) from exc``, so callers never need to import vendor exceptions.
"""

from __future__ import annotations

__all__ = [
    "AIOpsError",
    "ConfigError",
    "DecodeError",
    "ModelError",
    "PayloadTooLarge",
    "QueryBusy",
    "QueryRejected",
    "QueryTimeout",
    "ResultTooLarge",
    "SchemaMismatch",
    "StackError",
    "StoreError",
    "UnsupportedMediaType",
]


class AIOpsError(Exception):
    """Root of every error aiops raises on purpose."""


class ConfigError(AIOpsError):
    """Configuration could not be read or validated."""


class StoreError(AIOpsError):
    """The telemetry store failed to read or write."""


class SchemaMismatch(StoreError):
    """A batch does not match the declared schema of its table."""


class QueryRejected(StoreError):
    """A query sent to the read-only query path is not a single read statement."""


class QueryTimeout(StoreError):
    """A read-only query ran past its time limit and was interrupted."""


class ResultTooLarge(StoreError):
    """A read-only query's result grew past the byte limit; it was stopped."""


class QueryBusy(StoreError):
    """Every read-only query slot is taken; retry shortly."""


class DecodeError(AIOpsError):
    """An OTLP request body is malformed."""


class UnsupportedMediaType(DecodeError):
    """The request's content type is not one the receiver accepts."""


class PayloadTooLarge(AIOpsError):
    """A request body exceeds the configured size limit."""


class ModelError(AIOpsError):
    """A model backend could not load or answer."""


class StackError(AIOpsError):
    """The local stack (server, Ray, Serve) could not be started, reached or stopped."""
