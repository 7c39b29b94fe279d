"""The graphs and machines the universal policy is trained on, and those kept out.

Training problems (``training_problems``): zoo models (training steps and inference, at
their real sizes, their small presets and other batch sizes), random layered DAGs, and
graphs imported from other placement systems, each priced on the datasheet machines (or
the machine its file implies) and on random variants of them (``perturbed``: device
speeds, link bandwidths and memory caps scaled, devices added or removed).
``HELD_OUT_MODELS``, ``HELD_OUT_MACHINES`` and ``HELD_OUT_IMPORTED`` never appear in
training at any size: they are what the held-out evaluation (``bench/pretrained.py``)
places.
"""

from __future__ import annotations

import numpy as np

from simplace.rl.problem import MAX_DEVICES, OP_CLASSES

HELD_OUT_MODELS = ("inception_v3", "transformer")
# The measured machine is held out: the one machine whose costs come from measurements
# is where a policy trained on datasheets has the most to prove.
HELD_OUT_MACHINES = ("haswell_k40x8", "placeto_k80x2", "cpu_vm2core_x4")
HELD_OUT_IMPORTED = ("doppler/full_transformer_layer_261nodes.txt",
                     "doppler/8gpu_full_transformer.txt",
                     "msr/throughput-inputs/LayerGraphs/inceptionv3_training.json")
TRAIN_MACHINES = ("haswell_k40x2", "haswell_k40x4", "cpu_h100x4_nvlink", "cpu_h100_pcie",
                  "hsdag_cpu_gpu")
# (model, zoo.get keyword options): real sizes, small presets, other batches, inference.
TRAIN_GRAPHS = (
    ("rnnlm", {}), ("rnnlm", {"small": True}), ("nmt_2layer", {}), ("nmt_4layer", {}),
    ("nmt_2layer", {"small": True}), ("resnet50", {}), ("resnet50", {"batch": 8}),
    ("resnet50", {"small": True}), ("resnet50", {"training": False}), ("alexnet", {}),
    ("alexnet", {"batch": 32}), ("bert_base", {}), ("bert_base", {"small": True}),
    ("bert_base", {"training": False}), ("mlp", {}), ("tiny_cnn", {}),
)
TRAIN_IMPORTED = ("doppler/chain_mm_112nodes.txt", "doppler/ffnn_192nodes.txt",
                  "doppler/transformer_block_215nodes.txt",
                  "doppler/8gpu_transformer_block.txt",
                  "msr/throughput-inputs/LayerGraphs/bert24_training.json",
                  "msr/throughput-inputs/LayerGraphs/gnmt_training.json",
                  "msr/throughput-inputs/OperatorGraphs/bert_l-6_training.json")
_PRIMS = tuple(p for names in OP_CLASSES.values() for p in names[:3])


def graph_label(model: str, opts: dict) -> str:
    """A short name for a zoo graph at its options, e.g. ``resnet50[batch=8]``."""
    if not opts:
        return model
    return f"{model}[{','.join(f'{k}={v}' for k, v in sorted(opts.items()))}]"


def zoo_graph(model: str, opts: dict):
    """The traced graph of a zoo model with ``zoo.get`` options ``opts``."""
    from simplace import zoo
    from simplace.trace import trace

    fn, args = zoo.get(model, **opts)
    return trace(fn, *args)


def random_dag(num_ops: int, seed: int):
    """A random layered DAG of ``num_ops`` ops (widths 1-8, in-degree 1-3, op names from
    the policy's vocabulary, flops and bytes spread over four orders of magnitude)."""
    from simplace.graph import OpGraph

    rng = np.random.default_rng(seed)
    m = int(num_ops)
    src, dst = [], []
    layer_start, j = [0], 1
    while j < m:
        width = int(rng.integers(1, 9))
        layer_start.append(j)
        j += width
    layer_start.append(m)
    for li in range(1, len(layer_start) - 1):
        lo_prev, lo, hi = layer_start[li - 1], layer_start[li], min(layer_start[li + 1], m)
        for v in range(lo, hi):
            preds = {int(rng.integers(lo_prev, lo))}
            for _ in range(int(rng.integers(0, 3))):
                preds.add(int(rng.integers(max(0, lo - 32), lo)))
            for s in sorted(preds):
                src.append(s)
                dst.append(v)
    e = len(src)
    flops = 10 ** rng.uniform(5, 10, m)
    out = 10 ** rng.uniform(3, 7, m)
    params = rng.random(m) < 0.2
    n_par = int(params.sum())
    return OpGraph(op=list(rng.choice(_PRIMS, m)), name_path=[f"n{i}" for i in range(m)],
                   flops=flops, bytes_accessed=out * rng.uniform(1, 4, m), out_bytes=out,
                   signature=["s"] * m, src=src, dst=dst,
                   edge_bytes=np.asarray(out)[np.asarray(src, np.int64)] if e else [],
                   is_output=np.arange(m) == m - 1,
                   param_names=[f"p{k}" for k in range(n_par)],
                   param_sizes=10 ** rng.uniform(4, 8, n_par),
                   param_op=np.flatnonzero(params), param_index=np.arange(n_par),
                   name=f"dag{m}_{seed}")


def perturbed(inputs, seed: int, *, resize: bool = True, shared: bool = False):
    """A random variant of a priced machine (``SimInputs``): each device's speed scaled
    by 0.5-2x, link bandwidths by 0.25-4x (one factor, then 0.8-1.25x per link), memory
    caps by 0.25-2x, and (``resize``) its accelerators resampled to 1-8 of them (a copy
    of a device is another device of its kind, with its own links). ``shared``: the host
    is split into 2-4 virtual devices that share its hardware (one exclusive group, its
    memory divided among them: JAX's forced host devices) beside 0-6 accelerators."""
    from simplace.sim.inputs import make_sim_inputs

    rng = np.random.default_rng(seed)
    d = inputs.num_devices
    idx = np.arange(d)
    split = 1
    if shared:
        split = int(rng.integers(2, 5))
        k = int(rng.integers(0, min(6, MAX_DEVICES - split) + 1)) if d > 1 else 0
        idx = np.concatenate([np.zeros(split, np.int64),
                              rng.choice(np.arange(1, d), size=k, replace=True)
                              if k else np.zeros(0, np.int64)])
    elif resize and d > 1:
        # device 0 is the host CPU on the datasheet machines; the rest are resampled
        k = int(rng.integers(1, min(8, MAX_DEVICES - 1) + 1))
        idx = np.concatenate([[0], rng.choice(np.arange(1, d), size=k, replace=True)])
    n = len(idx)
    speed = np.exp(rng.uniform(np.log(0.5), np.log(2.0), n))
    bw_scale = np.exp(rng.uniform(np.log(0.25), np.log(4.0)))
    link = np.exp(rng.uniform(np.log(0.8), np.log(1.25), (n, n)))
    mem = np.exp(rng.uniform(np.log(0.25), np.log(2.0), n))
    if split > 1:  # the host's virtual devices: one chip's speed and memory, shared
        speed[:split] = speed[0]
        mem[:split] = mem[0] / split
    ix = np.ix_(idx, idx)
    groups = np.asarray(inputs.exclusive_group)[idx].copy()
    seen: set[int] = set()
    for pos, dev in enumerate(idx):  # a copy of a device is not its exclusive partner
        if int(dev) in seen and pos >= split:  # (but the host's virtual devices are)
            groups[pos] = groups.max() + 1 + pos
        seen.add(int(dev))
    lat = np.asarray(inputs.latency_s)[ix]
    same = idx[:, None] == idx[None, :]
    off = ~np.eye(n, dtype=bool)
    # Two copies of one device talk over the links the original has to its peers.
    peer = np.where(off, np.asarray(inputs.bandwidth_bytes_per_s)[ix], 1.0)
    ref_bw = float(np.median(np.asarray(inputs.bandwidth_bytes_per_s)[~np.eye(d, dtype=bool)])
                   ) if d > 1 else 1e10
    peer = np.where(same & off, ref_bw, peer)
    lat = np.where(same & off, float(np.median(lat)) if n > 1 else 0.0, lat)
    put = np.asarray(inputs.put_s)[ix]
    waits = None if inputs.put_waits is None else np.asarray(inputs.put_waits)[ix] & off
    return make_sim_inputs(
        np.asarray(inputs.op_time_s)[:, idx] / speed, lat, peer * bw_scale * link,
        np.asarray(inputs.memory_bytes)[idx] * mem, groups,
        np.asarray(inputs.launch_s)[idx], np.asarray(inputs.dispatch_s)[idx], put,
        np.asarray(inputs.op_pool_work)[:, idx], np.asarray(inputs.pool_min_work)[idx],
        np.asarray(inputs.pool_launch_s)[idx], np.asarray(inputs.op_unfused_s)[:, idx] / speed,
        waits)


def imported_model(path: str):
    """(graph, cost model) of an imported instance under ``bench/data/external``
    (``doppler/...`` or ``msr/...``): the machine its file implies, judged by simplace's
    own step-time simulation (objective latency)."""
    from simplace.errors import SimplaceError
    from simplace.external import load_instance
    from simplace.paths import checkout_dir

    root = checkout_dir()
    if root is None:
        raise SimplaceError(f"The imported instance {path} lives in a source checkout "
                            "(bench/data/external); this install has none.")
    fmt = path.split("/", 1)[0]
    inst = load_instance(root / "bench" / "data" / "external" / path, fmt)
    return inst.graph, inst.cost_model.with_objective("latency")


def imported(path: str):
    """(graph, ``SimInputs``) of ``imported_model(path)``."""
    g, model = imported_model(path)
    return g, model.price(g)


def _target(graph, inputs, budget_s: float, seed: int):
    """``local``'s placement within ``budget_s`` from the fast heuristics (the first
    imitation target)."""
    from simplace.placers import methods_of_kind, optimize

    starts = methods_of_kind("heuristic", learned=False)
    return optimize(graph, inputs, "local", seed=seed, budget_s=budget_s,
                    starts=",".join(starts)).placement


def training_specs(seed: int = 0, *, quick: bool = False, variants: int = 1,
                   shared: int = 0, dags: int = 24) -> list[tuple[str, object]]:
    """``[(name, build)]``: the training problems' names and functions that build their
    ``(graph, SimInputs)``: each zoo graph on each training machine, ``variants`` random
    variants of it (``perturbed``) and ``shared`` more whose host is split into virtual
    devices, ``dags`` random DAGs, and the imported graphs with a variant each;
    ``quick``: a handful of small ones (tests, smoke runs)."""
    from simplace.cost_model import CostModel

    graphs = TRAIN_GRAPHS if not quick else (("mlp", {}), ("tiny_cnn", {}))
    machines = TRAIN_MACHINES if not quick else ("haswell_k40x2", "cpu_h100_pcie")
    cache: dict = {}

    def graph_of(model, opts):
        key = graph_label(model, opts)
        if key not in cache:
            cache[key] = zoo_graph(model, opts)
        return cache[key]

    specs = []
    for k, (model, opts) in enumerate(graphs):
        for j, mach in enumerate(machines):
            name = f"{graph_label(model, opts)}@{mach}"

            def base(model=model, opts=opts, mach=mach):
                g = graph_of(model, opts)
                return g, CostModel.load(mach).price(g)
            specs.append((name, base))
            # The first variant keeps the name (and seed) it always had: targets found
            # for it before are still its own.
            for v in range(variants + shared):
                s = seed * 100003 + k * 101 + j + 7777 * v
                label = f"{name}~{seed}" + (f".{v}" if v else "") + ("s" if v >= variants
                                                                        else "")

                def varied(base=base, s=s, sh=v >= variants):
                    g, inp = base()
                    return g, perturbed(inp, s, shared=sh)
                specs.append((label, varied))
    rng = np.random.default_rng(seed)
    for k in range(3 if quick else dags):
        m = int(rng.integers(50, 300 if quick else 3000))
        mach = machines[k % len(machines)]

        def dag(m=m, k=k, mach=mach):
            g = random_dag(m, seed * 1000 + k)
            return g, perturbed(CostModel.load(mach).price(g), seed * 1000 + k)
        specs.append((f"dag{m}_{seed * 1000 + k}@{mach}~", dag))
    if not quick:
        for k, path in enumerate(TRAIN_IMPORTED):
            def own(path=path):
                return imported(path)

            def imp_varied(own=own, s=seed * 7919 + k):
                g, inp = own()
                return g, perturbed(inp, s, resize=False)
            specs += [(path, own), (f"{path}~{seed}", imp_varied)]
    return specs


def training_problems(seed: int = 0, *, quick: bool = False, target_budget_s: float = 1.5,
                      targets: dict | None = None, progress=None, variants: int = 1,
                      shared: int = 0, dags: int = 24):
    """The training problems of ``training_specs``, each with ``local``'s placement in
    ``target_budget_s`` as its first imitation target (0: none). ``targets``: a dict
    ``{name: placement list}`` of targets already found, read and extended (a resumed
    run does not search again)."""
    from simplace.rl.pretrain import make_training_problem

    targets = {} if targets is None else targets
    out = []
    specs = training_specs(seed, quick=quick, variants=variants, shared=shared,
                           dags=dags)
    for n, (name, build) in enumerate(specs):
        g, inp = build()
        if target_budget_s > 0 and name not in targets:
            targets[name] = _target(g, inp, target_budget_s, seed).tolist()
        out.append(make_training_problem(name, g, inp, targets.get(name)))
        if progress is not None:
            progress(f"problem {n + 1}/{len(specs)} {name}: {g.num_ops} ops, "
                     f"{inp.num_devices} devices")
    return out
