"""``parallelize``: the front end of PaSE and its baselines, and the ``Strategy`` it returns."""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Any

import numpy as np

from simplace.cost_model import CostModel
from simplace.graph import OpGraph
from simplace.parallel import baselines, sharding
from simplace.parallel.configs import enumerate_configs
from simplace.parallel.costs import Machine, edge_cost, layer_cost
from simplace.parallel.layers import LayerGraph, ParallelizeError, build_layer_graph
from simplace.parallel.search import solve, total_cost

__all__ = ["METHODS", "LayerPlan", "Strategy", "parallelize", "shard"]

METHODS = ("pase", "data_parallel", "expert")


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """One layer's part of a strategy: its iteration space, split factors and seconds."""

    name: str
    kind: str
    dims: dict[str, int]
    splits: dict[str, int]
    compute_s: float
    comm_s: float

    @property
    def devices_used(self) -> int:
        """Number of devices the layer runs on: the product of its split factors."""
        return int(np.prod(list(self.splits.values()))) if self.splits else 1


@dataclasses.dataclass(frozen=True, repr=False)
class Strategy:
    """A parallelization strategy of a graph on p devices.

    method: ``pase``, ``data_parallel`` or ``expert``; devices: p; step_time_s: predicted
    seconds per step under the PaSE cost model (layers + redistribution + unattributed
    ops); layers: one ``LayerPlan`` per layer, in a topological order;
    redistribution_s: the edges' part of the step time; search_time_s: wall seconds of
    the search (building the layer graph and cost tables included); baselines_s: the
    step times of data parallelism and the expert strategy on the same cost model;
    mesh_shape, mesh_axis_names: the device mesh; param_specs: parameter name ->
    ``PartitionSpec``; activation_specs: layer name -> (output shape, ``PartitionSpec``
    of the output) for every layer whose output another layer reads;
    unsupported: layers kept replicated because PaSE has no split rule for them;
    info: search statistics (largest dependent set, largest table, configurations).
    """

    method: str
    devices: int
    step_time_s: float
    layers: tuple[LayerPlan, ...]
    redistribution_s: float
    search_time_s: float
    baselines_s: dict[str, float]
    mesh_shape: tuple[int, ...]
    mesh_axis_names: tuple[str, ...]
    param_specs: dict[str, Any]
    activation_specs: dict[str, Any]
    unsupported: tuple[str, ...]
    info: dict[str, Any]
    layer_graph: LayerGraph = dataclasses.field(compare=False)
    configs: tuple = dataclasses.field(compare=False, default=())

    def speedup_over(self, method: str) -> float:
        """Predicted step time of ``method`` divided by this strategy's."""
        return self.baselines_s[method] / self.step_time_s if self.step_time_s > 0 else 1.0

    def mesh(self, devices=None):
        """A ``jax.sharding.Mesh`` of the first p of ``devices`` (default: jax.devices())."""
        import jax
        from jax.sharding import Mesh

        devs = list(jax.devices() if devices is None else devices)
        if len(devs) < self.devices:
            raise ParallelizeError(
                f"The strategy is for {self.devices} devices but only {len(devs)} were given "
                "(jax.devices() by default). On CPU, set XLA_FLAGS="
                f"--xla_force_host_platform_device_count={self.devices} before importing JAX.")
        return Mesh(np.array(devs[: self.devices]).reshape(self.mesh_shape),
                    self.mesh_axis_names)

    def table(self) -> str:
        """Per layer: kind, iteration space, split factors, compute and comm ms."""
        rows = []
        for lp in self.layers:
            dims = " ".join(f"{k}={v}" for k, v in lp.dims.items())
            split = " ".join(f"{k}={v}" for k, v in lp.splits.items() if v > 1) or "replicated"
            rows.append((lp.name, lp.kind, dims, split, f"{lp.compute_s * 1e3:.3f}",
                         f"{lp.comm_s * 1e3:.3f}"))
        head = ("layer", "kind", "iteration space", "splits", "compute ms", "comm ms")
        w = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines = ["  ".join(h.ljust(x) for h, x in zip(head, w, strict=True)),
                 "  ".join("-" * x for x in w)]
        for r in rows:
            lines.append("  ".join(
                (c.rjust(x) if i >= 4 else c.ljust(x)) for i, (c, x) in enumerate(
                    zip(r, w, strict=True))))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Strategy(method={self.method!r}, devices={self.devices}, "
                f"step_time_s={self.step_time_s:.6g}, layers={len(self.layers)}, "
                f"mesh={self.mesh_shape})")


def _unique_rows(arrs: list[np.ndarray]) -> np.ndarray:
    out, seen = [], set()
    for a in arrs:
        for row in np.atleast_2d(a):
            key = tuple(int(x) for x in row)
            if key not in seen:
                seen.add(key)
                out.append(key)
    return np.array(out, dtype=np.int64).reshape(len(out), arrs[0].shape[-1])


def parallelize(graph: OpGraph, cost_model: CostModel, devices: int, method: str = "pase", *,
                exact: bool = True, min_part_elements: int = 1,
                max_table_entries: int = 1 << 24) -> Strategy:
    """A parallelization strategy of ``graph`` on ``devices`` identical devices.

    Args:
      graph: a traced OpGraph (training step or inference).
      cost_model: the machine; its fastest accelerator and slowest link between two
        such devices stand for every device and link (see ``simplace.parallel.costs``).
      devices: p >= 1.
      method: ``"pase"`` (dynamic programming, exact under the cost model),
        ``"data_parallel"`` or ``"expert"``.
      exact: configurations use exactly p devices where a layer's sizes allow (PaSE's
        default here); False allows every product up to p (larger tables).
      min_part_elements: cut-off: no split leaves fewer elements than this per part.
      max_table_entries: the largest dynamic-programming table allowed; a bigger need
        raises SearchTooLargeError instead of approximating.

    Returns a ``Strategy``. Layers of unsupported kinds are replicated and named in a
    warning. Raises ParallelizeError for an unknown method, p < 1 or a graph with no
    layers.
    """
    t0 = time.perf_counter()
    if method not in METHODS:
        raise ParallelizeError(f"Unknown parallelization method {method!r}; use one of "
                               f"{', '.join(METHODS)}.")
    if isinstance(min_part_elements, bool) or not isinstance(min_part_elements, int) \
            or min_part_elements < 1:
        raise ParallelizeError(f"min_part_elements must be an integer >= 1, got "
                               f"{min_part_elements!r}.")
    machine = Machine.from_cost_model(cost_model, devices)
    p = machine.devices
    lg = build_layer_graph(graph, cost_model, machine.device_index)
    if lg.unsupported:
        shown = ", ".join(lg.unsupported[:8]) + (" ..." if len(lg.unsupported) > 8 else "")
        warnings.warn(f"simplace.parallelize: {len(lg.unsupported)} layer(s) have ops PaSE "
                      f"cannot split (loops, sorts, ...) and stay replicated: {shown}.",
                      stacklevel=2)
    dp = baselines.data_parallel_configs(lg, p)
    ex = baselines.expert_configs(lg, p)
    configs = []
    for k, lay in enumerate(lg.layers):
        if method == "pase":
            base = enumerate_configs(lay.dim_sizes, lay.splittable, p, exact=exact,
                                     min_part_elements=min_part_elements)
            # the baselines are always candidates: the search never loses to them
            configs.append(_unique_rows([base, dp[k][None], ex[k][None]]))
        else:
            configs.append((dp if method == "data_parallel" else ex)[k][None])
    unary, pair = _cost_tables(lg, configs, machine)
    if method == "pase":
        choice, _, pl = solve(unary, pair, max_table_entries=max_table_entries)
        info = {"max_dependent_set": pl.max_dependent,
                "max_table_entries": pl.max_table_entries,
                "configurations": int(sum(len(c) for c in configs)),
                "layers": len(lg.layers)}
    else:
        choice = np.zeros(len(lg.layers), dtype=np.int64)
        info = {"layers": len(lg.layers)}
    chosen = [configs[k][choice[k]] for k in range(len(lg.layers))]
    search_s = time.perf_counter() - t0
    # every method's figure on the same tables, for comparison
    base_s = {}
    for name, cfgs in (("data_parallel", dp), ("expert", ex)):
        cs = [c[None] for c in cfgs]
        u, pr = _cost_tables(lg, cs, machine)
        base_s[name] = total_cost(np.zeros(len(cs), dtype=np.int64), u, pr) + \
            lg.unattributed_time_s
    return _build_strategy(graph, lg, machine, method, chosen, configs, base_s, search_s,
                           info)


def _cost_tables(lg: LayerGraph, configs, machine: Machine):
    unary = [layer_cost(lay, configs[k], machine, lg.training)
             for k, lay in enumerate(lg.layers)]
    pair: dict[tuple[int, int], np.ndarray] = {}
    for e in lg.edges:
        s, d = e[0], e[1]
        m = edge_cost(lg.layers, e, configs[s], configs[d], machine, lg.training)
        if m is None:
            continue
        if (s, d) in pair:
            pair[(s, d)] = pair[(s, d)] + m
        else:
            pair[(s, d)] = m
    return unary, pair


def _build_strategy(graph, lg, machine, method, chosen, configs, base_s, search_s, info):
    p = machine.devices
    plans = []
    layer_s = 0.0
    for lay, cfg in zip(lg.layers, chosen, strict=True):
        comp, comm = layer_cost(lay, cfg[None], machine, lg.training, detail=True)
        layer_s += float(comp[0] + comm[0])
        plans.append(LayerPlan(lay.name, lay.kind, dict(zip(lay.dim_names, lay.dim_sizes,
                                                            strict=True)),
                               {n: int(f) for n, f in zip(lay.dim_names, cfg, strict=True)},
                               float(comp[0]), float(comm[0])))
    single = [c[None] for c in chosen]
    _, pair = _cost_tables(lg, single, machine)
    redis_s = float(sum(m[0, 0] for m in pair.values()))
    mshape, mnames = sharding.mesh_axes(p)
    param_specs: dict[str, Any] = {}
    act_specs: dict[str, Any] = {}
    for lay, cfg in zip(lg.layers, chosen, strict=True):
        axes = sharding.config_axes(cfg, lay.batch_dim, p)
        for t in lay.tensors:
            if t.role == "param":
                name = str(graph.param_names[t.param])
                if name not in param_specs:
                    param_specs[name] = sharding.tensor_spec(t.shape, t.axis_dims, axes, p)
            elif t.role == "out" and lay.name not in act_specs and t.shape:
                act_specs[lay.name] = (tuple(t.shape),
                                       sharding.tensor_spec(t.shape, t.axis_dims, axes, p))
    batch_axes = ()
    for lay, cfg in zip(lg.layers, chosen, strict=True):
        if lay.batch_dim >= 0:
            batch_axes = sharding.config_axes(cfg, lay.batch_dim, p)[lay.batch_dim]
            break
    info = dict(info, batch_axes=batch_axes, machine=dataclasses.asdict(machine))
    return Strategy(
        method=method, devices=p,
        step_time_s=layer_s + redis_s + lg.unattributed_time_s, layers=tuple(plans),
        redistribution_s=redis_s, search_time_s=search_s, baselines_s=base_s,
        mesh_shape=mshape, mesh_axis_names=mnames, param_specs=param_specs,
        activation_specs=act_specs, unsupported=tuple(lg.unsupported), info=info,
        layer_graph=lg, configs=tuple(chosen))


def _leaf_module(layer) -> bool:
    """Whether the layer is all of one leaf module (Dense, Conv, Embed, a norm), whose
    output is the layer's output; a parent module's output is some other layer's."""
    if "#" in layer.name:
        return False
    if layer.kind in ("matmul", "conv", "embedding"):
        return True
    return layer.kind == "elementwise" and any(t.role == "param" for t in layer.tensors)


def shard(fn, example_args, strategy: Strategy, devices=None):
    """``(jitted_fn, sharded_args)``: ``fn`` jitted on the strategy's mesh with parameters
    (in ``example_args[0]``, named as the trace names them) and inputs placed by the
    strategy's specs, and module outputs constrained to their layer's spec (flax models).
    Call ``jitted_fn(*sharded_args)``; it returns what ``fn(*example_args)`` does.
    """
    import flax.linen as nn
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = strategy.mesh(devices)
    size = dict(zip(strategy.mesh_axis_names, strategy.mesh_shape, strict=True))

    def fits(shape, spec) -> bool:
        for n, entry in zip(shape, tuple(spec), strict=False):
            axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
            if n % int(np.prod([size[a] for a in axes] or [1])):
                return False
        return len(tuple(spec)) <= len(shape)

    def param_sharding(path, leaf):
        name = jax.tree_util.keystr(tuple(path), simple=True, separator="/")
        spec = strategy.param_specs.get(name, P())
        if not fits(getattr(leaf, "shape", ()), spec):
            spec = P()
        return NamedSharding(mesh, spec)

    batch_axes = strategy.info.get("batch_axes") or ()

    def input_sharding(leaf):
        shape = getattr(leaf, "shape", ())
        spec = P(batch_axes[0] if len(batch_axes) == 1 else tuple(batch_axes)) \
            if batch_axes and shape else P()
        return NamedSharding(mesh, spec if fits(shape, spec) else P())

    variables, *inputs = example_args
    in_sh = (jax.tree_util.tree_map_with_path(param_sharding, variables),
             *(jax.tree_util.tree_map(input_sharding, x) for x in inputs))
    # module path without the root class name -> (layer output shape, spec)
    constraints = {}
    leaf = {lay.name for lay in strategy.layer_graph.layers if _leaf_module(lay)}
    for name, (shape, spec) in strategy.activation_specs.items():
        if name not in leaf:
            continue
        key = tuple(name.split("/")[1:])
        if key:
            constraints[key] = (shape, spec)

    def interceptor(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if context.method_name != "__call__":
            return out
        hit = constraints.get(tuple(context.module.path))
        if hit is not None and getattr(out, "shape", None) == hit[0] and fits(hit[0], hit[1]):
            out = jax.lax.with_sharding_constraint(out, NamedSharding(mesh, hit[1]))
        return out

    def run(*args):
        with nn.intercept_methods(interceptor):
            return fn(*args)

    jitted = jax.jit(run, in_shardings=in_sh)
    sharded_args = tuple(jax.device_put(a, s) for a, s in zip(example_args, in_sh,
                                                              strict=True))
    return jitted, sharded_args
