"""A function replaced by a wrapper that records its calls and calls it."""

from __future__ import annotations


def spy(monkeypatch, module, name: str) -> list:
    """module.name replaced by a wrapper that records each call's (args, kwargs), then calls
    the real function."""
    calls, real = [], getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return calls
