"""Builds the optional compiled OTLP decoder; everything else is in pyproject.toml.

Without a C compiler or Cython the package still works: decode.py falls back to the pure
Python path (slower; see docs/benchmarks.md).
"""

from setuptools import Extension, setup

try:
    from Cython.Build import cythonize
except ImportError:  # pragma: no cover - Cython is a build requirement
    ext_modules = []
else:
    ext_modules = cythonize(
        [Extension("collectors.otlp._wire", ["collectors/otlp/_wire.pyx"],
                   extra_compile_args=["-O2"])],
        compiler_directives={"language_level": "3"}, quiet=True)

setup(ext_modules=ext_modules)
