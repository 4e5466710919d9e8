"""The typed ``spans`` and ``logs`` columns (``aiops.semconv``) derived while decoding, so the
store need not parse every row's JSON again to derive them (``semconv.ingest_select``).

A value is derived here only where it is certainly what that SQL makes of the row's JSON:
string values of the text keys, and int or plain-digit string values of the HTTP status keys.
Anything else (a double, bool, array, map or bytes value of one of those keys, a key twice in
one map, a status string that is not plain digits in INTEGER range) and the whole request goes
without them: the store derives them in SQL, exactly. The compiled decoder (``_wire.pyx``)
applies the same rules; tests hold both to the SQL.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from aiops import semconv
from aiops.identity import APP, DEPLOYMENT
from aiops.schema import LOGS, SPANS, Table

__all__ = ["DERIVED_SCHEMA", "LOG_DERIVED_SCHEMA", "LOG_KEYS", "LOG_NAMES", "NAMES",
           "RESOURCE_KEYS", "SPAN_KEYS", "LogDerivation", "SpanDerivation", "with_derived"]

# Span attribute keys the columns read (in _wire.pyx's order), and resource keys.
SPAN_KEYS = (semconv.MODEL_ATTR, semconv.MODEL_VERSION_ATTR, semconv.HTTP_STATUS_ATTR,
             semconv.OLD_HTTP_STATUS_ATTR)
RESOURCE_KEYS = (semconv.SERVICE_VERSION_ATTR, semconv.REPLICA_ATTR, DEPLOYMENT, APP)
_INDEX = {k: i for i, k in enumerate(SPAN_KEYS)}
NAMES = tuple(d.name for d in SPANS.derived)
if NAMES != (semconv.MODEL, semconv.VERSION, semconv.REPLICA, semconv.HTTP_STATUS,
             semconv.FAILED, semconv.DEPLOYMENT, semconv.APP) or semconv.keys("spans") != (
        SPAN_KEYS, RESOURCE_KEYS):  # _row and _wire.pyx read and fill them in this order
    raise ImportError(f"spans' derived columns changed ({NAMES}): update the decoders")
# Log record attribute keys the logs columns read (the first two of SPAN_KEYS, which _wire.pyx
# picks alike); their resource keys are the spans'.
LOG_KEYS = SPAN_KEYS[:2]
LOG_NAMES = tuple(d.name for d in LOGS.derived)
if LOG_NAMES != semconv.IDENTITY or semconv.keys("logs") != (LOG_KEYS, RESOURCE_KEYS):
    raise ImportError(f"logs' derived columns changed ({LOG_NAMES}): update the decoders")


def _derived_schema(t: Table) -> pa.Schema:
    """A decoded batch with the derived columns: the wire columns, then those, marked."""
    return pa.schema([*t.wire.arrow_schema, *(pa.field(d.name, d.kind.arrow)
                                             for d in t.derived)],
                     metadata=dict([semconv.DECODED_MARK]))


DERIVED_SCHEMA = _derived_schema(SPANS)
LOG_DERIVED_SCHEMA = _derived_schema(LOGS)
_INT32_MAX = 2**31 - 1
_STATUS_NAMES = ("unset", "ok", "error")


# AnyValue's string_value_strindex points into a profiles dictionary, which no trace or log
# request carries: its value is null, as an absent one (decode.any_value, and _wire.pyx).
STRINDEX = "string_value_strindex"


class _Undecided(Exception):
    """The SQL's answer for this row is not certain here: the store derives the request."""


def _text(v: Any) -> str | None:
    """A text column's value from an attribute's AnyValue (None: absent), as ``->>``."""
    if v is None:
        return None
    which = v.WhichOneof("value")
    if which is None or which == STRINDEX:
        return None  # JSON null
    if which == "string_value":
        return str(v.string_value)
    raise _Undecided


def _status(v: Any) -> int | None:
    """``TRY_CAST(<the value as text> AS INTEGER)``."""
    if v is None:
        return None
    which = v.WhichOneof("value")
    if which is None or which == STRINDEX:
        return None
    if which == "int_value":
        i = int(v.int_value)
        return i if -_INT32_MAX - 1 <= i <= _INT32_MAX else None
    if which == "string_value":
        s = v.string_value
        # DuckDB's cast takes more (' 5', '+5', '5.5', '1e2', '0x10'): not decided here.
        if 0 < len(s) <= 10 and s.isascii() and s.isdigit() and int(s) <= _INT32_MAX:
            return int(s)
    raise _Undecided


def _resource_text(value: Any) -> str | None:
    # The resource's dict holds what its JSON text holds (bytes already as base64 text).
    if value is None or isinstance(value, str):
        return value
    raise _Undecided


class SpanDerivation:
    """The derived columns of one request's spans, built beside the decoded rows; ``None``
    from ``columns`` once any span's values are not certain."""

    names = NAMES

    def __init__(self) -> None:
        self._lists: list[list[Any]] | None = [[] for _ in self.names]

    def add(self, resource: dict[str, Any], kvs: Iterable[Any], code: int) -> None:
        """One (valid) span: its resource's attributes, its attributes, its status code."""
        if self._lists is None:
            return
        try:
            row = _row(resource, kvs, code)
        except _Undecided:
            self._lists = None
            return
        for values, value in zip(self._lists, row, strict=True):
            values.append(value)

    def columns(self) -> dict[str, list[Any]] | None:
        return None if self._lists is None else dict(zip(self.names, self._lists, strict=True))


class LogDerivation(SpanDerivation):
    """The same for one request's log records (no status: ``code`` is not read)."""

    names = LOG_NAMES

    def add(self, resource: dict[str, Any], kvs: Iterable[Any], code: int = 0) -> None:
        if self._lists is None:
            return
        try:
            model, version, replica, _, _, deployment, app = _row(resource, kvs, code, False)
        except _Undecided:
            self._lists = None
            return
        for values, value in zip(self._lists, (model, version, replica, deployment, app),
                                 strict=True):
            values.append(value)


def _row(resource: dict[str, Any], kvs: Iterable[Any], code: int, status_keys: bool = True
         ) -> tuple[Any, ...]:
    picked: list[Any] = [None] * len(SPAN_KEYS)
    for kv in kvs:
        i = _INDEX.get(kv.key)
        if i is not None:
            if picked[i] is not None and (status_keys or i < len(LOG_KEYS)):
                raise _Undecided  # the JSON text keeps both; which one SQL reads is its own
            picked[i] = kv.value
    model, version, new, old = picked
    service_version = _resource_text(resource.get(semconv.SERVICE_VERSION_ATTR))
    replica = _resource_text(resource.get(semconv.REPLICA_ATTR))
    deployment = _resource_text(resource.get(DEPLOYMENT))
    app = _resource_text(resource.get(APP))
    model = _text(model)
    version = _text(version)
    if version is None:
        version = service_version
    if not status_keys:
        return model, version, replica, None, None, deployment, app
    status = _status(new)
    if status is None:  # coalesce: the older key only where the new one gave NULL
        status = _status(old)
    failed = semconv.failed(_STATUS_NAMES[code] if 0 <= code < 3 else None, status)
    return model, version, replica, status, failed, deployment, app  # in NAMES' order


def with_derived(arrays: dict[str, Any], schema: pa.Schema = DERIVED_SCHEMA) -> pa.Table:
    """A marked table (spans by default) from column arrays or lists holding the derived
    columns too."""
    return pa.Table.from_pydict({n: arrays[n] for n in schema.names}, schema=schema)
