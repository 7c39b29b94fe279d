"""The method registry: every placement method, its kind and the options it takes.

A method is a function ``place(ctx: PlacerContext) -> PlacerOutput`` registered under a
name with ``@register("name", kind=..., options={...})``. Its kind says how the front end
(``simplace.placers.front``) runs it; nothing outside this module tests method names:

* ``"heuristic"`` (the default): a fast method run without a time budget (heuristics,
  list schedulers, partitioners); its placements are where searches start;
* ``"annealer"``: a local search within a time budget that starts from given
  placements (option ``starts``);
* ``"policy"``: a REINFORCE policy trained within a time budget, warm-started from given
  placements (option ``warm_start``);
* ``"exhaustive"``: enumerates placements (tiny graphs only); ``compare`` leaves it out.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable

from simplace.errors import OptionError, SimplaceError

KINDS = ("heuristic", "annealer", "policy", "exhaustive")


@dataclasses.dataclass(frozen=True)
class Method:
    """One registered method: ``fn(ctx) -> PlacerOutput``, its kind (one of ``KINDS``)
    and ``{option: one-line description}`` of the keyword options it reads."""

    name: str
    fn: Callable
    kind: str
    options: dict


_METHODS: dict[str, Method] = {}
# Modules that register methods; imported on first use so that ``import simplace``
# stays light.
_METHOD_MODULES = ("single", "expert", "list_schedulers", "partitioners", "pipeline", "local",
                   "pretrained", "ideals",
                   "exact", "rl")


def register(name: str, *, kind: str = "heuristic", options: dict[str, str] | None = None):
    """Decorator: make ``fn(ctx) -> PlacerOutput`` available as ``optimize(method=name)``.

    ``kind``: one of ``KINDS`` (see the module docstring). ``options``: ``{option name:
    one-line description}`` of every keyword option the method reads from
    ``ctx.options``; ``optimize`` refuses any other."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def deco(fn):
        _METHODS[name] = Method(name, fn, kind, dict(options or {}))
        return fn

    return deco


def method(name: str) -> Method:
    """The registered ``Method`` called ``name``; SimplaceError naming the others."""
    _load_methods()
    if not isinstance(name, str) or name not in _METHODS:
        raise SimplaceError(f"Unknown placement method {name!r}. Available: "
                            f"{', '.join(sorted(_METHODS))} (or 'all').")
    return _METHODS[name]


def method_kind(name: str) -> str:
    """The kind of method ``name`` (one of ``KINDS``)."""
    return method(name).kind


def methods_of_kind(*kinds: str) -> list[str]:
    """Names of the methods of the given kinds, sorted."""
    _load_methods()
    return sorted(n for n, m in _METHODS.items() if m.kind in kinds)


def is_search(name: str) -> bool:
    """True for the methods that search within a time budget (annealers and policies)."""
    return method_kind(name) in ("annealer", "policy")


def method_options(name: str) -> dict[str, str]:
    """``{option: description}`` of the keyword options ``name`` takes."""
    return dict(method(name).options)


def check_options(name: str, options: dict) -> None:
    """OptionError naming any option in ``options`` that method ``name`` does not take."""
    valid = method(name).options
    unknown = sorted(set(options) - set(valid))
    if unknown:
        which = ", ".join(repr(u) for u in unknown)
        takes = (f"Valid options: {', '.join(sorted(valid))}." if valid
                 else "It takes no options.")
        raise OptionError(f"Method {name!r} has no option{'s' * (len(unknown) > 1)} "
                          f"{which}. {takes}")


def _load_methods() -> None:
    for mod in _METHOD_MODULES:
        try:
            importlib.import_module(f"simplace.placers.{mod}")
        except ModuleNotFoundError as err:
            if err.name != f"simplace.placers.{mod}":
                raise


def methods() -> list[str]:
    """Names of the available methods (``all`` runs them all)."""
    _load_methods()
    return sorted(_METHODS)


def method_docs() -> dict[str, str]:
    """``{name: one-line summary}`` for every method: the first paragraph of its
    docstring (of its module's when it has none), whole, on one line."""
    _load_methods()
    docs = {}
    for name in sorted(_METHODS):
        fn = _METHODS[name].fn
        doc = (fn.__doc__ or sys.modules[fn.__module__].__doc__ or "").strip()
        first = " ".join(doc.split("\n\n")[0].split())
        docs[name] = first.removeprefix(f"``{name}``:").strip()
    return docs
