"""tensorflow.compat.v1: the same stand-in as tensorflow itself (see tensorflow/__init__.py)."""

from tensorflow import app, flags, gfile, logging, python_io, train  # noqa: F401
