"""Values derived from a graph, computed once per graph: graphs are immutable, and on a
graph of 20k ops a grouping rule costs a few tenths of a second, which every phase of a
search (the zero-shot policy, the guided search, each ``local`` run) used to pay again."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

_VALUES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def per_graph(graph, key, make: Callable[[], Any]):
    """``make()``, computed on the first call for this ``graph`` (by identity) and ``key``
    (hashable) and kept while the graph lives; callers must not modify what it returns."""
    values = _VALUES.setdefault(graph, {})
    if key not in values:
        values[key] = make()
    return values[key]
