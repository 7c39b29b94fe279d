"""Placers: one signature for every method, a registry of them, and the front ends.

A method is a function ``place(ctx: PlacerContext) -> PlacerOutput`` registered under a
name and a kind with ``@register("name", kind=..., options={...}, cost=..., rank=...)``
(``registry``: typed options, and for a fast method what it costs and where it comes
among the starts);
adding a method is adding one module that registers itself (and naming it in
``registry._METHOD_MODULES``). ``optimize`` and ``compare`` (``front``) run them and
re-simulate what they return; search methods share ``simplace.search.SearchSession``
(clock, stop reason, best placement, history, progress, the validation hook).
"""

from simplace.placers.context import OptimizeResult, PlacerContext, PlacerOutput
from simplace.placers.front import (
    COMPARE_DEFAULT_BUDGET_S,
    best_of,
    compare,
    optimize,
    run_method,
)
from simplace.placers.registry import (
    KINDS,
    Cost,
    Option,
    bool_option,
    choice_option,
    float_option,
    int_option,
    is_search,
    method_docs,
    method_kind,
    method_options,
    methods,
    methods_of_kind,
    path_option,
    register,
)
from simplace.search import OOM_PENALTY, penalised

__all__ = ["COMPARE_DEFAULT_BUDGET_S", "KINDS", "OOM_PENALTY", "Cost", "Option",
           "OptimizeResult", "bool_option", "choice_option", "float_option", "int_option",
           "PlacerContext", "PlacerOutput", "best_of", "compare", "is_search", "method_docs",
           "method_kind", "method_options", "methods", "methods_of_kind", "optimize", "path_option",
           "penalised", "register", "run_method"]
