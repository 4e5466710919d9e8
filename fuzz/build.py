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


def build() -> Path:
    if shutil.which("clang") is None:
        sys.exit("clang is not installed: `make fuzz-build` installs it as root "
                 "(Debian package clang)")
    work = OUT / "src"
    for old in ("src", "lib", "tmp"):  # the corpus and findings stay
        shutil.rmtree(OUT / old, ignore_errors=True)
    (work / "collectors" / "otlp").mkdir(parents=True)
    pyx = work / "collectors" / "otlp" / "_wire.pyx"
    shutil.copy(ROOT / "collectors" / "otlp" / "_wire.pyx", pyx)
    os.environ["CC"] = "clang"
    os.environ["LDSHARED"] = f"clang -shared -fsanitize={SANITIZERS}"
    ext = cythonize([Extension("collectors.otlp._wire", [str(pyx)], extra_compile_args=CFLAGS,
                               extra_link_args=[f"-fsanitize={SANITIZERS}"])],
                    compiler_directives={"language_level": "3", "boundscheck": True,
                                         "wraparound": True},
                    build_dir=str(work), quiet=True)
    dist = Distribution({"ext_modules": ext})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = str(OUT / "lib")
    cmd.build_temp = str(OUT / "tmp")
    cmd.ensure_finalized()
    cmd.run()
    [built] = (OUT / "lib" / "collectors" / "otlp").glob("_wire*.so")
    return built


if __name__ == "__main__":
    print(build())
