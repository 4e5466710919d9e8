"""Line coverage of ``collectors/otlp/_wire.pyx`` by the fuzz corpus (``make fuzz-coverage``).

Builds the decoder once more with Cython's line tracing (``build/fuzz/trace/``, no sanitizers),
runs every corpus input through it as traces and as logs, and counts the ``.pyx`` lines that
ran among those that generate code (the lines Cython marks in the C it writes). Prints the
figure and the lines never run, grouped into ranges.

Run as ``python fuzz/coverage.py [corpus]`` after ``make fuzz`` has grown ``build/fuzz/corpus``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "fuzz" / "trace"
PYX = "collectors/otlp/_wire.pyx"
MARK = re.compile(r'^\s*/\* "(?:.*/)?collectors/otlp/_wire\.pyx":(\d+)$')


def _build_module() -> ModuleType:
    """fuzz/build.py (fuzz/ is scripts, not a package)."""
    spec = importlib.util.spec_from_file_location("fuzz_build", Path(__file__).parent / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def code_lines(c_file: Path, source: list[str]) -> set[int]:
    """The .pyx lines Cython generated code for, less ``elif`` conditions: Cython emits no
    trace event for those (their branch's first line tells whether they ran)."""
    marked = {int(m.group(1)) for line in c_file.read_text().splitlines()
              if (m := MARK.match(line))}
    return {n for n in marked if not source[n - 1].lstrip().startswith("elif ")}


def ranges(lines: list[int]) -> str:
    out: list[str] = []
    for n in lines:
        if out and out[-1].split("-")[-1] == str(n - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ", ".join(out)


def main(argv: list[str]) -> None:
    corpus = Path(argv[1]) if len(argv) > 1 else ROOT / "build" / "fuzz" / "corpus"
    so, c_file = _build_module().build(OUT, trace=True)
    spec = importlib.util.spec_from_file_location("collectors.otlp._wire", so)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["collectors.otlp._wire"] = module
    spec.loader.exec_module(module)
    from aiops.errors import DecodeError
    from collectors.otlp.decode import decode

    ran: set[int] = set()

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.endswith(PYX):
            ran.add(frame.f_lineno)
            return tracer
        return None

    files = sorted(p for p in corpus.iterdir() if p.is_file())
    for path in files:
        try:
            body = path.read_bytes()
        except FileNotFoundError:  # a running fuzzer replaced it with a smaller one
            continue
        for signal in ("traces", "logs"):
            # Set again for every call: CPython drops a trace function that raised (as a
            # deeply nested input's RecursionError does inside it), silently.
            sys.settrace(tracer)
            try:
                decode(signal, body, "protobuf", compiled=True)
            except DecodeError:
                pass
            finally:
                sys.settrace(None)
    source = (ROOT / PYX).read_text().splitlines()
    code = code_lines(c_file, source)
    # Lines Cython marks that run once, at import (module-level definitions), count as run.
    module_level = {n for n in code if not source[n - 1][:1].isspace()}
    covered = (ran | module_level) & code
    missed = sorted(code - covered)
    print(f"{PYX}: {len(covered)} of {len(code)} lines with code ran "
          f"({len(covered) / len(code):.1%}) over {len(files)} corpus inputs "
          f"({os.fsdecode(corpus)})")
    print(f"never ran: {ranges(missed)}")


if __name__ == "__main__":
    main(sys.argv)
