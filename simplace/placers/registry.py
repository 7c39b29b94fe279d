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
``choice_option``, ``path_option`` or ``Option(doc)`` for a value only the method can check (arrays,
callables). ``check_options`` refuses an option the method does not take and a value of
the wrong type, naming the method, the option and what to pass; ``option_values`` gives
a method every option it declares, checked, with the defaults filled in. (A plain
string declares an untyped option: any value, checked by the method itself.)
"""

from __future__ import annotations

import dataclasses
import importlib
import os
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
                 lo_open: bool = False, hi_open: bool = False) -> Option:
    """A finite real option in ``[lo, hi]`` (an end left out with ``lo_open`` or
    ``hi_open``)."""
    return Option(doc, default, lambda v: check_float(v, "value", lo, hi, lo_open=lo_open,
                                                      hi_open=hi_open))


def _path(value):
    if not isinstance(value, str | os.PathLike):
        raise OptionError(f"value must be a file path, got {value!r}.")
    return value


def path_option(doc: str) -> Option:
    """A file path option (a string or ``os.PathLike``; default None)."""
    return Option(doc, None, _path)


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
class Cost:
    """What a fast method takes at the least on a graph of M ops and a machine of D
    devices, in seconds on the machine the costs were measured on (``DEFAULT_COST``'s
    comment): ``fixed_s + per_op_device_s * M * D + per_op2_s * M^2``, plus
    ``first_call_s`` on its first run in a process (compilation, caches loaded). The
    whole method for one that takes no budget; its first answer for one that stops at
    its budget. ``compare`` and ``local``'s starts skip a method whose estimate does not
    fit the time left. ``paces``: the method's wall time is its whole cost whatever the
    budget (no anytime runs, no compilation), so what it took against its estimate tells
    ``compare`` how fast the machine runs now. ``kernels``: the compiled loops it runs
    (``simplace.kernels``), whose compilation ``fast_cost_s`` adds while this install has
    not compiled them (a fresh install's first run)."""

    fixed_s: float = 0.0
    per_op_device_s: float = 2e-5
    per_op2_s: float = 0.0
    first_call_s: float = 0.0
    paces: bool = False
    kernels: tuple[str, ...] = ()

    def seconds(self, num_ops: int, num_devices: int, *, first_call: bool = False) -> float:
        """The estimate on ``num_ops`` ops and ``num_devices`` devices."""
        m, d = float(num_ops), float(num_devices)
        return (self.fixed_s + self.per_op_device_s * m * d + self.per_op2_s * m * m
                + (self.first_call_s if first_call else 0.0))


# A method registered without a cost (a new one, or a user's). The registered costs were
# measured on the 2-core VM at load 2-3 with budgets of 0.01 s (mlp, resnet50, rnnlm on
# haswell_k40x4 and haswell_k40x8) and rounded up; ``compare`` rescales them by what the
# methods that take no budget took in the same run (``front._Pace``).
DEFAULT_COST = Cost()
# Methods registered without a rank run after the ranked ones, by name.
DEFAULT_RANK = 1000


@dataclasses.dataclass(frozen=True)
class Method:
    """One registered method: ``fn(ctx) -> PlacerOutput``, its kind (one of ``KINDS``),
    ``{option: Option}`` of the keyword options it reads, and ``untyped``: the options
    declared by a plain string (no type, no default: the method checks them);
    ``start_options``: the options it is given as another search's start (``start_options``
    of ``register``)."""

    name: str
    fn: Callable
    kind: str
    options: dict
    untyped: frozenset = frozenset()
    cost: Cost = DEFAULT_COST
    rank: int = DEFAULT_RANK
    learned: bool = False
    start_options: Mapping = dataclasses.field(default_factory=dict)


_METHODS: dict[str, Method] = {}
# Modules that register methods; imported on first use so that ``import simplace``
# stays light.
_METHOD_MODULES = ("single", "expert", "list_schedulers", "partitioners", "pipeline", "local",
                   "pretrained", "ideals",
                   "exact", "rl")


def register(name: str, *, kind: str = "heuristic",
             options: Mapping[str, Option | str] | None = None,
             cost: Cost | None = None, rank: int = DEFAULT_RANK, learned: bool = False,
             start_options: Mapping | None = None):
    """Decorator: make ``fn(ctx) -> PlacerOutput`` available as ``optimize(method=name)``.

    ``kind``: one of ``KINDS`` (see the module docstring). ``options``: ``{option name:
    Option}`` of every keyword option the method reads from ``ctx.options`` (a string:
    an untyped option with that doc); ``optimize`` refuses any other, and a value its
    ``Option`` does not parse. For a fast method: ``cost``, what it takes (``Cost``;
    default ``DEFAULT_COST``), and ``rank``, where it comes among the fast methods that
    ``compare`` and ``local``'s starts run (lowest first: the best starts for the time
    they take go early, so that a short budget keeps them). ``learned``: it places with
    weights trained beforehand on other graphs (what those weights are trained from and
    judged against leaves it out). ``start_options``: options it is run with when it is
    the start of another search (``local``'s starts, the ``rl-*`` warm starts), e.g. to
    leave out a refinement that search does better."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    declared = {k: v if isinstance(v, Option) else Option(str(v))
                for k, v in (options or {}).items()}
    untyped = frozenset(k for k, v in (options or {}).items() if not isinstance(v, Option))

    def deco(fn):
        _METHODS[name] = Method(name, fn, kind, declared, untyped,
                                DEFAULT_COST if cost is None else cost, int(rank),
                                bool(learned), dict(start_options or {}))
        return fn

    return deco


def method(name: str) -> Method:
    """The registered ``Method`` called ``name``; SimplaceError naming the others."""
    _load_methods()
    if not isinstance(name, str) or name not in _METHODS:
        raise SimplaceError(f"Unknown placement method {name!r}. Available: "
                            f"{', '.join(sorted(_METHODS))} (or 'all').")
    return _METHODS[name]


# The methods run in this process: a method's ``Cost.first_call_s`` is paid once.
_CALLED: set[str] = set()


def note_called(name: str) -> None:
    """Record that ``name`` ran in this process (the front end calls it)."""
    _CALLED.add(name)


def fast_cost_s(name: str, num_ops: int, num_devices: int) -> float:
    """The least wall time (seconds) fast method ``name`` is expected to take on a graph
    of ``num_ops`` ops and a machine of ``num_devices`` devices (its ``Cost``, with its
    first-call cost until it has run in this process, and the compilation of its kernels
    that this install has not compiled yet)."""
    entry = _METHODS.get(name) if isinstance(name, str) else None
    cost = DEFAULT_COST if entry is None else entry.cost
    first = name not in _CALLED
    extra = 0.0
    if first and cost.kernels:
        from simplace.kernels import compile_s

        extra = compile_s(cost.kernels)
    return cost.seconds(num_ops, num_devices, first_call=first) + extra


def paces(name: str) -> bool:
    """Whether ``name``'s wall time measures the machine's pace (``Cost.paces``)."""
    entry = _METHODS.get(name)
    return entry is not None and entry.cost.paces


def fast_rank(name: str) -> tuple[int, str]:
    """Sort key of the fast methods: their registered ``rank``, then their name."""
    entry = _METHODS.get(name)
    return (DEFAULT_RANK if entry is None else entry.rank, name)


def method_kind(name: str) -> str:
    """The kind of method ``name`` (one of ``KINDS``)."""
    return method(name).kind


def methods_of_kind(*kinds: str, learned: bool | None = None) -> list[str]:
    """Names of the methods of the given kinds, sorted; ``learned`` False (True): only
    those that place without (with) weights trained beforehand (``register``'s
    ``learned``), e.g. the baselines a pretrained policy is judged against."""
    _load_methods()
    return sorted(n for n, m in _METHODS.items()
                  if m.kind in kinds and (learned is None or m.learned == learned))


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
