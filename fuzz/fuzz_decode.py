"""Coverage-guided, differential fuzzing of the OTLP protobuf decoder (``make fuzz``).

libFuzzer (through atheris) mutates request bodies, guided by the coverage of the sanitizer
build of ``collectors/otlp/_wire.pyx`` (``fuzz/build.py``: ASan, UBSan, bounds checks) and of
the Python decoder. Every input goes to both decoders, as traces and as logs; they must give the
same rows, or both refuse it (the same class of error). A mismatch raises (libFuzzer saves the
input as ``crash-*``), as does any sanitizer report.

Run through ``make fuzz`` (which preloads atheris' ASan runtime); by hand::

    LD_PRELOAD=$(python -c 'import atheris; print(atheris.path())')/asan_with_fuzzer.so \\
    ASAN_OPTIONS=detect_leaks=0 python fuzz/fuzz_decode.py build/fuzz/corpus -max_total_time=60
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import atheris

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / "build" / "fuzz" / "lib" / "collectors" / "otlp"


def _load_sanitized() -> None:
    """The sanitizer build as ``collectors.otlp._wire``, before the decoder imports it."""
    [so] = BUILT.glob("_wire*.so")
    spec = importlib.util.spec_from_file_location("collectors.otlp._wire", so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["collectors.otlp._wire"] = module
    spec.loader.exec_module(module)


_load_sanitized()
with atheris.instrument_imports(include=["collectors.otlp.decode", "collectors.otlp.derive"]):
    from collectors.otlp import decode as decode_module
    from collectors.otlp.decode import decode

import pyarrow as pa  # noqa: E402

from aiops.errors import DecodeError  # noqa: E402

assert decode_module._wire is not None and str(BUILT) in str(decode_module._wire.__file__)

JSON_COLUMNS = {"attributes", "resource_attributes", "events", "links"}


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    for i, field in enumerate(table.schema):
        if pa.types.is_timestamp(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(pa.int64()))
    rows = table.to_pylist()
    for row in rows:
        for k, v in row.items():
            if k in JSON_COLUMNS and v is not None:
                row[k] = json.loads(v)
            elif k == "body" and isinstance(v, str) and v[:1] in "[{" and v[-1:] in "]}":
                with contextlib.suppress(ValueError):  # a string that only looks like JSON
                    row[k] = json.loads(v)
    return rows


def outcome(signal: str, body: bytes, compiled: bool) -> Any:
    """What a decoder makes of ``body``: its rows, or the class of its refusal."""
    try:
        result = decode(signal, body, "protobuf", compiled=compiled)
    except DecodeError as exc:
        return ("refused", str(exc).split(":")[0])
    return (result.rejected, result.message, {n: _rows(t) for n, t in result.items()})


class Mismatch(AssertionError):
    pass


def test_one_input(data: bytes) -> None:
    for signal in ("traces", "logs"):
        compiled, python = outcome(signal, data, True), outcome(signal, data, False)
        if compiled != python:
            raise Mismatch(f"{signal}: compiled {str(compiled)[:400]} != python "
                           f"{str(python)[:400]}")


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
