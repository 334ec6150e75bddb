"""tensorflow.compat (see tensorflow/__init__.py)."""
