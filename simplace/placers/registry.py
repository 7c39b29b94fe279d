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

Options are typed: each is an ``Option`` (its doc, its default, the parser that checks a
given value), made by ``int_option``, ``float_option``, ``bool_option``,
``choice_option`` or ``Option(doc)`` for a value only the method can check (arrays,
callables). ``check_options`` refuses an option the method does not take and a value of
the wrong type, naming the method, the option and what to pass; ``option_values`` gives
a method every option it declares, checked, with the defaults filled in. (A plain
string declares an untyped option: any value, checked by the method itself.)
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from simplace._argtypes import check_float, check_int
from simplace.errors import OptionError, SimplaceError

KINDS = ("heuristic", "annealer", "policy", "exhaustive")


@dataclasses.dataclass(frozen=True)
class Option:
    """One keyword option of a method.

    doc: what it does, one line (``method_options`` lists it).
    default: the value the method reads when the option is not given (None: the method
      decides, as ``doc`` says).
    parse: ``value -> the value the method reads``, raising ``OptionError``,
      ``TypeError`` or ``ValueError`` that says what the value must be (worded
      ``"value must be ..."``); None: any value is taken as given (the method checks
      it). A None given for an option whose default is None is passed on unparsed.
    """

    doc: str
    default: Any = None
    parse: Callable[[Any], Any] | None = None

    def check(self, method: str, name: str, value):
        """``value`` parsed, or OptionError naming ``method``, the option and its default."""
        if self.parse is None or (value is None and self.default is None):
            return value
        try:
            return self.parse(value)
        except (TypeError, ValueError) as err:  # OptionError is a ValueError
            why = str(err).removeprefix("value ").rstrip(".")
            raise OptionError(
                f"Method {method!r}: option {name!r} {why} ({name}: {self.doc}). Pass such "
                f"a value, or leave the option out for its default ({self.default!r})."
            ) from None


def int_option(doc: str, default: int | None, lo: int = 0, hi: int | None = None) -> Option:
    """An integer option in ``lo..hi`` (``hi`` None: no upper bound); booleans and
    non-integral numbers are refused."""
    return Option(doc, default, lambda v: check_int(v, "value", lo, hi))


def float_option(doc: str, default: float | None, lo: float, hi: float | None = None, *,
                 lo_open: bool = False) -> Option:
    """A finite real option in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    return Option(doc, default, lambda v: check_float(v, "value", lo, hi, lo_open=lo_open))


def _boolean(value) -> bool:
    # Only real booleans: bool("False") is True, the trap this refuses.
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise OptionError(f"value must be True or False, got {value!r}.")


def bool_option(doc: str, default: bool) -> Option:
    """A True/False option (strings and numbers are refused)."""
    return Option(doc, default, _boolean)


def choice_option(doc: str, default: str, choices: Sequence[str]) -> Option:
    """An option that takes one of the strings ``choices``."""
    allowed = tuple(choices)

    def parse(value):
        if not isinstance(value, str) or value not in allowed:
            raise OptionError(f"value must be one of {', '.join(map(repr, allowed))}, got "
                              f"{value!r}.")
        return value

    return Option(doc, default, parse)


@dataclasses.dataclass(frozen=True)
class Method:
    """One registered method: ``fn(ctx) -> PlacerOutput``, its kind (one of ``KINDS``),
    ``{option: Option}`` of the keyword options it reads, and ``untyped``: the options
    declared by a plain string (no type, no default: the method checks them)."""

    name: str
    fn: Callable
    kind: str
    options: dict
    untyped: frozenset = frozenset()


_METHODS: dict[str, Method] = {}
# Modules that register methods; imported on first use so that ``import simplace``
# stays light.
_METHOD_MODULES = ("single", "expert", "list_schedulers", "partitioners", "pipeline", "local",
                   "pretrained", "ideals",
                   "exact", "rl")


def register(name: str, *, kind: str = "heuristic",
             options: Mapping[str, Option | str] | None = None):
    """Decorator: make ``fn(ctx) -> PlacerOutput`` available as ``optimize(method=name)``.

    ``kind``: one of ``KINDS`` (see the module docstring). ``options``: ``{option name:
    Option}`` of every keyword option the method reads from ``ctx.options`` (a string:
    an untyped option with that doc); ``optimize`` refuses any other, and a value its
    ``Option`` does not parse."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    declared = {k: v if isinstance(v, Option) else Option(str(v))
                for k, v in (options or {}).items()}
    untyped = frozenset(k for k, v in (options or {}).items() if not isinstance(v, Option))

    def deco(fn):
        _METHODS[name] = Method(name, fn, kind, declared, untyped)
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
    return {k: opt.doc for k, opt in method(name).options.items()}


def check_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` as method ``name`` reads them (each value parsed by its ``Option``);
    OptionError naming any option the method does not take, or a value of the wrong
    type."""
    valid = method(name).options
    unknown = sorted(set(options) - set(valid))
    if unknown:
        which = ", ".join(repr(u) for u in unknown)
        takes = (f"Valid options: {', '.join(sorted(valid))}." if valid
                 else "It takes no options.")
        raise OptionError(f"Method {name!r} has no option{'s' * (len(unknown) > 1)} "
                          f"{which}. {takes}")
    return {k: valid[k].check(name, k, v) for k, v in options.items()}


def option_values(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Every option method ``name`` declares: the given ones checked
    (``check_options``), the others at their defaults."""
    given = check_options(name, options)
    return {k: given.get(k, opt.default) for k, opt in method(name).options.items()}


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
