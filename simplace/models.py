"""Resolve what a user names as MODEL into a function or an op graph.

MODEL is one of:
  * a zoo name (``resnet50``, ``nmt_4layer``... see ``simplace models``);
  * ``path/to/file.py:factory`` or ``package.module:factory``, where ``factory()``
    returns ``(fn, example_args)`` (it may take ``batch`` and ``training`` keywords);
  * a saved graph, ``graph.json`` (from ``simplace graph --out``).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import traceback

from simplace.errors import ModelError


def is_graph_file(spec: str) -> bool:
    """Whether ``spec`` names a graph file (``.json``) rather than a zoo model."""
    return spec.endswith(".json")


def _load_factory(spec: str):
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ModelError(f"'{spec}' is not of the form file.py:factory or module:factory.")
    if target.endswith(".py"):
        if not os.path.isfile(target):
            raise ModelError(f"Model file {target} (from '{spec}') does not exist.")
        mod_name = "_simplace_user_" + os.path.splitext(os.path.basename(target))[0]
        module_spec = importlib.util.spec_from_file_location(mod_name, target)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        try:
            module_spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:
            sys.modules.pop(mod_name, None)
            raise ModelError(f"Importing {target} failed: {_failure(err, True)}") from err
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as err:
            raise ModelError(f"Cannot import module '{target}' (from '{spec}'): {err}") from err
        except (Exception, SystemExit) as err:
            raise ModelError(f"Importing module '{target}' (from '{spec}') failed: "
                             f"{_failure(err, True)}") from err
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        have = sorted(n for n in dir(module) if not n.startswith("_")
                      and callable(getattr(module, n)))
        raise ModelError(f"'{target}' has no callable '{attr}'. Callables there: "
                         f"{', '.join(have) or '(none)'}.")
    return factory


def _failure(err: BaseException, importing: bool = False) -> str:
    """One line on what went wrong in the user's code: the exception and where it was
    raised, or what a ``sys.exit`` there means."""
    if isinstance(err, SystemExit) and importing:
        return (f"it called sys.exit({err.code!r}) while being imported. A model file "
                "defines factories and must not run a program on import: put that code "
                "under `if __name__ == \"__main__\":`.")
    if isinstance(err, SystemExit):
        return (f"it called sys.exit({err.code!r}). A factory returns (fn, args_tuple) and "
                "fn computes the model's step; neither may end the process.")
    frames = traceback.extract_tb(err.__traceback__)
    where = (f" (at {frames[-1].filename}, line {frames[-1].lineno}, in {frames[-1].name})"
             if frames else "")
    return f"{type(err).__name__}: {err}{where}."


def load_function(spec: str, *, training: bool = True, batch: int | None = None,
                  small: bool = False, abstract: bool = True):
    """``(fn, example_args)`` for a zoo name or a ``file.py:factory`` / ``module:factory``."""
    from simplace import zoo
    from simplace._argtypes import MAX_BATCH, check_int

    if not isinstance(spec, str):
        raise ModelError(f"A model is named by a string (a zoo name, file.py:factory or "
                         f"module:factory), got {spec!r}.")
    if batch is not None:
        check_int(batch, "batch", 1, MAX_BATCH, "a batch size")
    if ":" in spec:
        factory = _load_factory(spec)
        params = inspect.signature(factory).parameters
        kwargs = {}
        if batch is not None:
            if "batch" not in params:
                raise ModelError(f"Factory '{spec}' takes no 'batch' argument, so --batch "
                                 "cannot be applied to it.")
            kwargs["batch"] = batch
        if "training" in params:
            kwargs["training"] = training
        try:
            out = factory(**kwargs)
        except (Exception, SystemExit) as err:
            # Where in the user's code, in one line: a bad input is never a traceback.
            raise ModelError(f"Model factory '{spec}' failed: {_failure(err)}") from err
        return check_factory_output(out, f"Model factory '{spec}'")
    if spec not in zoo.names() and (spec.endswith(".py") or os.path.exists(spec)):
        raise ModelError(
            f"'{spec}' is a file, not a model: name a factory in it as {spec}:FACTORY (a "
            "function returning (fn, args_tuple)), or give a saved graph ending in .json "
            "(from `simplace graph MODEL --out g.json`).")
    return check_factory_output(
        zoo.get(spec, training=training, batch=batch, small=small, abstract=abstract),
        f"Zoo model '{spec}'")


def check_factory_output(out, what: str):
    """``(fn, args_tuple)`` from what a factory returned, or ModelError saying what it
    returned instead. A single argument must be wrapped, ``(fn, (x,))``: guessing would
    trace ``(fn, 5)`` with 5 as the argument."""
    def describe(x) -> str:
        r = repr(x)
        return f"{type(x).__name__} {r[:40] + '...' if len(r) > 40 else r}"

    if not isinstance(out, tuple | list) or len(out) != 2:
        n = f" of {len(out)} items" if isinstance(out, tuple | list) else ""
        raise ModelError(f"{what} must return a pair (fn, args_tuple); it returned "
                         f"{type(out).__name__}{n}.")
    fn, args = out
    if not callable(fn):
        raise ModelError(f"{what} must return (fn, args_tuple) with a callable fn; its first "
                         f"item is {describe(fn)}.")
    if not isinstance(args, tuple | list):
        raise ModelError(f"{what} must return (fn, args_tuple), the arguments of fn as a "
                         f"tuple; its second item is {describe(args)}. Wrap a single "
                         "argument: return fn, (x,).")
    return fn, tuple(args)


def load_graph(spec: str, *, training: bool = True, batch: int | None = None,
               small: bool = False):
    """The OpGraph for MODEL: a saved ``.json`` graph, or the trace of a model function."""
    from simplace.graph import OpGraph
    from simplace.trace import trace

    if not isinstance(spec, str):
        raise ModelError(f"A model is named by a string (a zoo name, file.py:factory, "
                         f"module:factory or a saved graph .json), got {spec!r}.")
    if is_graph_file(spec):
        if batch is not None or small or not training:
            raise ModelError(f"'{spec}' is a saved graph: its sizes and mode are fixed, so "
                             "--batch, --small and --inference do not apply. Save a graph "
                             "with the sizes and mode you want (simplace graph MODEL "
                             "--inference --out g.json).")
        return OpGraph.load(spec)
    fn, args = load_function(spec, training=training, batch=batch, small=small)
    mode = "train" if training else "inference"
    name = spec.rpartition(":")[2] if ":" in spec else spec
    suffix = f"/b{batch}" if batch is not None else ""
    try:
        return trace(fn, *args, name=f"{name}/{mode}{'/small' if small else ''}{suffix}")
    except SystemExit as err:  # the model's own code exits while being traced
        raise ModelError(f"Tracing '{spec}' failed: {_failure(err)}") from err
