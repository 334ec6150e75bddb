"""Build the optional C fast path for `prep create`.

Everything else is declared in pyproject.toml. The extension is optional: without a C compiler the
package installs and `prep create` falls back to its pure-Python implementation (same output, slower).
"""
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "bertperf.prep.samples._fastcreate",
            sources=["implementations/pytorch/bertperf/prep/samples/_fastcreate.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        )
    ]
)
