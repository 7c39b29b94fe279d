"""PaSE search time and predicted speedups: AlexNet, Inception-V3, RNNLM, Transformer.

    python bench/pase.py [--models alexnet,inception_v3,rnnlm,transformer]
                         [--devices 4,8,16,32,64] [--cost-models haswell_k40x4]
                         [--batch 128] [--out bench/results/pase_<date>_vm-2core.json]

For each (model, cost model, p): the PaSE search time (layer graph, cost tables and
dynamic programming; tracing excluded and reported apart) and the predicted step times
of PaSE, data parallelism and the expert strategy under the same cost model, with the
speedups. Predictions, not measurements: quote them with the cost model. Wall times
are for the machine it runs on: quote it with the figures.

Paper anchors (Elango, IPDPS 2021; recalled in /work/shared/background.md): up to 1.85x
(1080Ti) and 4x (2080Ti) over data parallelism; search 0.06 s (RNNLM) to minutes
(Transformer, 64 GPUs).
"""

import argparse
import json
import os
import platform
import time

import simplace
from simplace import zoo
from simplace.parallel import parallelize

DEFAULT_MODELS = "alexnet,inception_v3,rnnlm,transformer"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--devices", default="4,8,16,32,64")
    ap.add_argument("--cost-models", default="haswell_k40x4")
    # One global batch for every model so data parallelism can use all 64 devices
    # (the zoo defaults are 32-128 per model).
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    date = time.strftime("%Y-%m-%d")
    out = args.out or os.path.join(os.path.dirname(__file__), "results",
                                   f"pase_{date}_vm-2core.json")
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cpus, {date}; "
          f"batch {args.batch}")
    rows = []
    header = (f"{'model':<13} {'cost model':<18} {'p':>3} {'layers':>6} {'search s':>9} "
              f"{'pase ms':>9} {'dp ms':>9} {'expert ms':>9} {'vs dp':>6} {'vs expert':>9} "
              f"{'dep':>3}")
    print(header)
    print("-" * len(header))
    for model in args.models.split(","):
        fn, ex = zoo.get(model, training=True, batch=args.batch)
        t0 = time.perf_counter()
        graph = simplace.trace(fn, *ex, name=model)
        trace_s = time.perf_counter() - t0
        for cm_name in args.cost_models.split(","):
            cm = simplace.CostModel.load(cm_name)
            for p in (int(x) for x in args.devices.split(",")):
                st = parallelize(graph, cm, p)
                dp, expert = st.baselines_s["data_parallel"], st.baselines_s["expert"]
                row = {"model": model, "ops": graph.num_ops, "trace_s": trace_s,
                       "cost_model": cm_name, "devices": p, "batch": args.batch,
                       "layers": len(st.layers), "search_s": st.search_time_s,
                       "pase_step_s": st.step_time_s, "data_parallel_step_s": dp,
                       "expert_step_s": expert,
                       "speedup_vs_data_parallel": dp / st.step_time_s,
                       "speedup_vs_expert": expert / st.step_time_s,
                       "max_dependent_set": st.info["max_dependent_set"],
                       "max_table_entries": st.info["max_table_entries"]}
                rows.append(row)
                print(f"{model:<13} {cm_name:<18} {p:>3} {len(st.layers):>6} "
                      f"{st.search_time_s:>9.2f} {st.step_time_s * 1e3:>9.2f} "
                      f"{dp * 1e3:>9.2f} {expert * 1e3:>9.2f} "
                      f"{row['speedup_vs_data_parallel']:>5.2f}x "
                      f"{row['speedup_vs_expert']:>8.2f}x {st.info['max_dependent_set']:>3}",
                      flush=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"machine": f"{platform.node()} {platform.machine()} "
                              f"({os.cpu_count()} cpus, shared)", "date": date,
                   "jax_version": __import__("jax").__version__, "rows": rows}, f, indent=1)
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
