"""Packages whose exported names are imported on first use (PEP 562): the command line
builds its parser from their light modules without importing the heavy ones."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def exports(namespace: dict, table: Mapping[str, str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for the package whose globals are ``namespace``:
    ``table`` maps each exported name to the module that defines it."""
    def __getattr__(name: str):
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(table))

    return __getattr__, __dir__


class LazyModule:
    """A module imported on its first attribute access: ``jax = LazyModule("jax")`` at
    the top of a module whose functions use JAX, so that importing it does not import
    JAX (half a second of every command that never traces or runs a model)."""

    def __init__(self, name: str):
        self._lazy_name = name

    def __getattr__(self, attr: str):
        module = importlib.import_module(self._lazy_name)
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<lazily imported module {self._lazy_name!r}>"
