"""Builds the sanitizer build of the native OTLP decoder for fuzzing (``make fuzz-build``):
``collectors/otlp/_wire.pyx`` with Cython's bounds and wraparound checks on, compiled by clang
with AddressSanitizer, UndefinedBehaviorSanitizer and libFuzzer's coverage instrumentation, and
warnings as errors, into ``build/fuzz/`` (the normal build is untouched).

Run as ``python fuzz/build.py``; needs clang (Debian's ``clang``: ``make fuzz-build`` installs
it as root) and Cython.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "fuzz"
SANITIZERS = "address,undefined,fuzzer-no-link"
CFLAGS = [f"-fsanitize={SANITIZERS}", "-fno-omit-frame-pointer", "-fno-sanitize-recover=all",
          "-g", "-O1", "-Wall", "-Werror",
          # Cython's generated C trips these on code it writes, not on the .pyx.
          "-Wno-unused-function", "-Wno-unreachable-code", "-Wno-unused-but-set-variable",
          "-Wno-unused-variable"]
# The JSON buffers start this small here (1024 bytes in the shipped build), so that every input
# with attributes grows them: the realloc path and writes past the old end under ASan.
SMALL_BUFFER = "4"


def build(out: Path = OUT, *, trace: bool = False) -> tuple[Path, Path]:
    """Cythonize and compile ``_wire.pyx`` into ``out``: the sanitizer build, or with
    ``trace`` the line-tracing one that fuzz/coverage.py measures with (no sanitizers).
    Returns the shared object and the C file Cython wrote."""
    if not trace and shutil.which("clang") is None:
        sys.exit("clang is not installed: `make fuzz-build` installs it as root "
                 "(Debian package clang)")
    work = out / "src"
    for old in ("src", "lib", "tmp"):  # the corpus and findings stay
        shutil.rmtree(out / old, ignore_errors=True)
    (work / "collectors" / "otlp").mkdir(parents=True)
    pyx = work / "collectors" / "otlp" / "_wire.pyx"
    shutil.copy(ROOT / "collectors" / "otlp" / "_wire.pyx", pyx)
    macros = [("AIOPS_JSON_CAP", SMALL_BUFFER)]
    directives: dict[str, object] = {"language_level": "3"}
    if trace:
        macros += [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]
        directives["linetrace"] = True
        ext = Extension("collectors.otlp._wire", [str(pyx)], define_macros=macros)
    else:
        os.environ["CC"] = "clang"
        os.environ["LDSHARED"] = f"clang -shared -fsanitize={SANITIZERS}"
        directives.update(boundscheck=True, wraparound=True)
        ext = Extension("collectors.otlp._wire", [str(pyx)], extra_compile_args=CFLAGS,
                        extra_link_args=[f"-fsanitize={SANITIZERS}"], define_macros=macros)
    exts = cythonize([ext], compiler_directives=directives, build_dir=str(work), quiet=True)
    cmd = Distribution({"ext_modules": exts}).get_command_obj("build_ext")
    cmd.build_lib = str(out / "lib")
    cmd.build_temp = str(out / "tmp")
    cmd.ensure_finalized()
    cmd.run()
    [built] = (out / "lib" / "collectors" / "otlp").glob("_wire*.so")
    [c_file] = work.rglob("_wire.c")
    return built, c_file


if __name__ == "__main__":
    print(build()[0])
