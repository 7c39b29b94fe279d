"""An OpGraph's JSON form (schema ``simplace.opgraph``): writing it with its shapes and
parameters interned in tables, and reading it back with every field's type checked
before numpy converts anything."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from simplace._graph_fields import (
    _EDGE_FIELDS,
    _OP_FLOAT_FIELDS,
    _OP_STR_FIELDS,
    _PARAM_FIELDS,
    Aval,
    _freeze_attrs,
    _thaw,
)
from simplace.errors import GraphError

_INT_FIELDS = ("src", "dst", "edge_output", "param_op", "param_index")
_STR_FIELDS = _OP_STR_FIELDS + ("param_names",)

SCHEMA = "simplace.opgraph"
# 2: ops carry their input and output shapes and dtypes (``in_avals``, ``out_avals``), their
# primitive's parameters (``attrs``) and parameters their shapes (``param_avals``).
SCHEMA_VERSION = 2
# The content hash covers ops, edges and parameters as in version 1 and is salted with
# "/1" still: the shape fields added in version 2 are not hashed (for a traced graph they
# follow from the signatures, which hold the input shapes, dtypes and parameters), so
# placements and validation records made for a version 1 graph match the same graph
# traced again.
_HASH_SALT = f"{SCHEMA}/1"


def graph_to_dict(g) -> dict:
    """The JSON form of OpGraph ``g`` (see ``OpGraph.save``). Shapes are interned:
    ``avals`` is a table of the distinct ``(shape, dtype, itemsize)``, and
    ``ops.in_avals``/``ops.out_avals``/``params.param_avals`` hold indices into it;
    ``attrs`` is a table of the distinct parameter mappings and ``ops.attrs`` indices into
    it. A field not recorded is null."""
    table: dict[Aval, int] = {}

    def index(a: Aval) -> int:
        k = table.get(a)
        if k is None:
            k = table[a] = len(table)
        return k

    def rows(v):
        if v is None:
            return None
        done: dict[int, list[int]] = {}  # ops share row tuples: index each once
        out = []
        for row in v:
            r = done.get(id(row))
            if r is None:
                r = done[id(row)] = [index(a) for a in row]
            out.append(r)
        return out

    ops = {f: getattr(g, f).tolist() for f in
           _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",)}
    ops["in_avals"], ops["out_avals"] = rows(g.in_avals), rows(g.out_avals)
    attr_table: dict[str, int] = {}
    attr_values: list = []
    if g.attrs is None:
        ops["attrs"] = None
    else:
        ops["attrs"] = []
        by_id: dict[int, int] = {}  # ops share mappings: serialise each once
        for a in g.attrs:
            k = by_id.get(id(a))
            if k is None:
                plain = _thaw(a)
                key = json.dumps(plain, sort_keys=True)
                k = attr_table.get(key)
                if k is None:
                    k = attr_table[key] = len(attr_values)
                    attr_values.append(plain)
                by_id[id(a)] = k
            ops["attrs"].append(k)
    params = {f: getattr(g, f).tolist() for f in _PARAM_FIELDS}
    params["param_avals"] = (None if g.param_avals is None else
                             [index(a) for a in g.param_avals])
    return {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "hash": g.hash,
        "name": g.name,
        "meta": g.meta,
        "ops": ops,
        "edges": {f: getattr(g, f).tolist() for f in _EDGE_FIELDS},
        "params": params,
        "avals": {"shape": [list(a.shape) for a in table],
                  "dtype": [a.dtype for a in table],
                  "itemsize": [a.itemsize for a in table]},
        "attrs": attr_values,
    }


def graph_from_dict(cls, d: dict, *, source: str = "<dict>"):
    """The graph (of class ``cls``, an OpGraph) of a ``graph_to_dict`` form; ``source``
    names it in errors. Checks the schema version, every field's type and the content
    hash."""
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        raise GraphError(f"{source} is not a simplace op graph (its 'schema' field is not "
                         f"'{SCHEMA}'). Save graphs with OpGraph.save or `simplace graph "
                         "--out`.")
    version = d.get("schema_version")
    if version != SCHEMA_VERSION:
        args = _remake_args(d.get("name"))
        how = (" (MODEL: the zoo name or file.py:factory, with the --batch, --small or "
               "--inference options it was made with)" if args == "MODEL" else
               " (as its name records; a model of your own is path/file.py:factory)")
        remake = (f"Make it again from its model: `simplace graph {args} --out "
                  f"{source}`{how}, or trace the model and OpGraph.save it.")
        if type(version) is int and version < SCHEMA_VERSION:
            why = (" (ops without their shapes and dtypes)" if version == 1 else "")
            raise GraphError(f"{source} is an op graph of schema_version {version}"
                             f"{why}, an older format than this simplace reads (version "
                             f"{SCHEMA_VERSION}). {remake}")
        raise GraphError(f"{source} has op-graph schema_version {version!r}; this simplace "
                         f"reads version {SCHEMA_VERSION}. Use the simplace that wrote it, "
                         f"or: {remake}")
    fields = {}
    for section, names in (("ops", _OP_STR_FIELDS + _OP_FLOAT_FIELDS + ("is_output",)),
                           ("edges", _EDGE_FIELDS), ("params", _PARAM_FIELDS)):
        sec = d.get(section)
        if not isinstance(sec, dict):
            raise GraphError(f"{source}: section '{section}' is missing or not an object.")
        for f in names:
            if f not in sec:
                raise GraphError(f"{source}: field '{section}.{f}' is missing.")
            _check_json_list(sec[f], f, f"{section}.{f}", source)
            fields[f] = sec[f]
    fields.update(_shape_fields_from_json(d, source))
    if not isinstance(d.get("name", ""), str):
        raise GraphError(f"{source}: field 'name' must be a string, got "
                         f"{json.dumps(d['name'])[:40]}.")
    if not isinstance(d.get("meta") or {}, dict):
        raise GraphError(f"{source}: field 'meta' must be an object.")
    if not isinstance(d.get("hash", ""), str | None):
        raise GraphError(f"{source}: field 'hash' must be a string.")
    try:
        g = cls(name=d.get("name", ""), meta=d.get("meta") or {}, **fields)
    except (TypeError, ValueError, OverflowError) as err:
        if isinstance(err, GraphError):
            raise GraphError(f"{source}: {err}") from None
        raise GraphError(f"{source}: a field has values of the wrong type ({err}).") from None
    want = d.get("hash")
    if want is not None and want != g.hash:
        raise GraphError(
            f"{source}: the content hash does not match (file says {want[:12]}..., content "
            f"gives {g.hash[:12]}...): the graph was changed after it was saved. If the "
            "change is intended, delete the 'hash' field and load it again."
        )
    return g


def _remake_args(name) -> str:
    """The ``simplace graph`` arguments that made a graph named ``name`` by the CLI's
    convention (``model/train|inference[/small][/bN]``, see ``models.load_graph``);
    ``MODEL`` when the name does not follow it. Only a hint in an error message."""
    parts = name.split("/") if isinstance(name, str) else []
    if len(parts) < 2 or parts[1] not in ("train", "inference") or not parts[0]:
        return "MODEL"
    args = [parts[0]]
    if parts[1] == "inference":
        args.append("--inference")
    for p in parts[2:]:
        if p == "small":
            args.append("--small")
        elif p[:1] == "b" and p[1:].isdigit():
            args.append(f"--batch {p[1:]}")
    return " ".join(args)


def _shape_fields_from_json(d: dict, source: str) -> dict:
    """``in_avals``, ``out_avals``, ``attrs`` and ``param_avals`` of a graph file, from its
    ``avals`` and ``attrs`` tables and the index lists in ``ops`` and ``params``."""
    tab = d.get("avals")
    if not isinstance(tab, dict):
        raise GraphError(f"{source}: section 'avals' (the table of shapes and dtypes) is "
                         "missing or not an object.")
    cols = {}
    for f, ok, want in (("shape", lambda x: type(x) is list and all(
                            type(n) is int and n >= 0 for n in x), "a list of sizes >= 0"),
                        ("dtype", lambda x: type(x) is str and x != "", "a dtype name"),
                        ("itemsize", lambda x: type(x) is int and x >= 0,
                         "an integer >= 0 (bytes)")):
        v = tab.get(f)
        if type(v) is not list:
            raise GraphError(f"{source}: field 'avals.{f}' is missing or not a list.")
        for k, x in enumerate(v):
            if not ok(x):
                raise GraphError(f"{source}: field 'avals.{f}' entry {k} is "
                                 f"{json.dumps(x)[:40]}; it must be {want}.")
        cols[f] = v
    n = len(cols["shape"])
    if len(cols["dtype"]) != n or len(cols["itemsize"]) != n:
        raise GraphError(f"{source}: 'avals.shape', 'avals.dtype' and 'avals.itemsize' must "
                         f"have one entry per aval; they have {n}, {len(cols['dtype'])} and "
                         f"{len(cols['itemsize'])}.")
    avals = [Aval(tuple(sh), dt, sz) for sh, dt, sz in
             zip(cols["shape"], cols["dtype"], cols["itemsize"], strict=True)]

    def aval_at(k, where: str) -> Aval:
        if type(k) is not int or not 0 <= k < n:
            raise GraphError(f"{source}: field '{where}' holds {json.dumps(k)[:40]}; it must "
                             f"be an index into 'avals' (0..{n - 1}).")
        return avals[k]

    out: dict[str, Any] = {}
    for section, f in (("ops", "in_avals"), ("ops", "out_avals"), ("ops", "attrs"),
                       ("params", "param_avals")):
        if f not in d[section]:
            raise GraphError(f"{source}: field '{section}.{f}' is missing (null when not "
                             "recorded).")
        v = d[section][f]
        if v is not None and type(v) is not list:
            raise GraphError(f"{source}: field '{section}.{f}' must be a list or null.")
        out[f] = v
    if out["param_avals"] is not None:
        out["param_avals"] = [aval_at(k, f"params.param_avals[{j}]")
                              for j, k in enumerate(out["param_avals"])]
    if out["attrs"] is not None:
        table = d.get("attrs")
        if type(table) is not list or not all(type(a) is dict for a in table):
            raise GraphError(f"{source}: section 'attrs' (the table of op parameters) must "
                             "be a list of objects.")
        frozen: dict[int, Mapping] = {}
        try:
            table = [_freeze_attrs(a, k, frozen, "'attrs' table entry") for k, a in
                     enumerate(table)]
        except GraphError as err:
            raise GraphError(f"{source}: {err}") from None
        attrs = []
        for i, k in enumerate(out["attrs"]):
            if type(k) is not int or not 0 <= k < len(table):
                raise GraphError(f"{source}: field 'ops.attrs' entry {i} is "
                                 f"{json.dumps(k)[:40]}; it must be an index into 'attrs' "
                                 f"(0..{len(table) - 1}).")
            attrs.append(table[k])
        out["attrs"] = attrs
    return _lookup_rows(out, avals, source)


def _lookup_rows(out: dict, avals: list[Aval], source: str) -> dict:
    """``ops.in_avals``/``ops.out_avals`` index rows replaced by Aval tuples; equal rows
    share one tuple (so the graph checks each once)."""
    n = len(avals)
    for f in ("in_avals", "out_avals"):
        if out[f] is None:
            continue
        interned: dict[tuple, tuple[Aval, ...]] = {}
        rows = []
        for i, row in enumerate(out[f]):
            if type(row) is not list:
                raise GraphError(f"{source}: field 'ops.{f}' entry {i} must be a list of "
                                 "indices into 'avals'.")
            if not all(type(k) is int and 0 <= k < n for k in row):
                k = next(k for k in row if not (type(k) is int and 0 <= k < n))
                raise GraphError(f"{source}: field 'ops.{f}[{i}]' holds "
                                 f"{json.dumps(k)[:40]}; it must be an index into 'avals' "
                                 f"(0..{n - 1}).")
            key = tuple(row)
            r = interned.get(key)
            if r is None:
                r = interned[key] = tuple(avals[k] for k in row)
            rows.append(r)
        out[f] = rows
    return out


def _check_json_list(values, field: str, where: str, source: str) -> None:
    """Strict types of one field of a graph file, before numpy converts anything: indices
    are integers (numpy would truncate 2.7 to 2 and read ``true`` as 1), sizes are
    numbers (not booleans), ``is_output`` entries are booleans, names are strings."""
    if not isinstance(values, list):
        raise GraphError(f"{source}: field '{where}' must be a list, got "
                         f"{type(values).__name__}.")
    if field in _INT_FIELDS:
        ok, want = (lambda x: type(x) is int), "an integer (an index)"
    elif field == "is_output":
        ok, want = (lambda x: type(x) is bool), "true or false"
    elif field in _STR_FIELDS:
        ok, want = (lambda x: type(x) is str), "a string"
    else:
        ok, want = (lambda x: type(x) in (int, float)), "a number"
    for i, x in enumerate(values):
        if not ok(x):
            raise GraphError(f"{source}: field '{where}' entry {i} is {json.dumps(x)[:40]}; "
                             f"it must be {want}.")
