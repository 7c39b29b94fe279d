"""How much of the VM's real-size ranking an overlap rule could mend: the kept validation
records predicted again with the machine's exclusive group removed.

    python bench/overlap_bound.py [--records RUN.json]   (default: session 35's same-day run)

``cpu_vm2core_x4`` puts its 4 CPU devices in one exclusive group, so no two segments on
them overlap in the simulators; two independent steps on two of them measured 1.06-1.44x
faster dispatched together (``bench/cpu_overlap.py``). Every device in a group of its
own is the most any overlap rule could give (full overlap). For each model of a
``bench/fidelity_real.py`` run (its placements, measurements and profiles kept beside
it), the reference simulator predicts every placement both ways with the run's profile;
the raw MAPE, Kendall tau and the predictions are printed. Where both agree, the
simulated schedules of those placements hold no two segments that could run at once:
no overlap rule changes their ranking.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records",
                    default="bench/results/fidelity_real_2026-11-29_vm_session35.json")
    args = ap.parse_args()
    import simplace
    from simplace import zoo
    from simplace.cost_model import CostModel
    from simplace.models import load_function
    from simplace.profile import Profile
    from simplace.sim import simulate
    from simplace.validate.metrics import kendall_tau, mape

    path = Path(args.records)
    print(f"# {path}; {platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    raw = CostModel.load("cpu_vm2core_x4")
    for r in json.loads(path.read_text()):
        spec = r.get("spec") or (r["model"] if r["model"] in zoo.names()
                                 else f"bench/data/unseen_models.py:{r['model']}")
        fn, fargs = load_function(spec, training=True, batch=r["batch"], abstract=True)[:2]
        g = simplace.trace(fn, *fargs, name=f"{r['model']}/train")
        if g.hash != r["graph_hash"]:
            print(f"{r['model']}: traces to another graph here; skipped")
            continue
        inp = raw.with_profile(Profile.load(path.parent / r["profile_file"])).price(g)
        apart = inp._replace(exclusive_group=np.arange(inp.num_devices,
                                                       dtype=inp.exclusive_group.dtype))
        meas = np.array([p["measured_s"] for p in r["placements"]])
        print(f"{r['model']}:{r['batch']} measured ms: "
              + " ".join(f"{p['label']}={1e3 * m:.0f}" for p, m in zip(r["placements"], meas,
                                                                     strict=True)))
        for name, m in (("one exclusive group", inp), ("every device apart", apart)):
            pred = np.array([simulate(g, m, np.asarray(p["assignment"])).step_time_s
                             for p in r["placements"]])
            print(f"  {name:19s} MAPE {100 * mape(pred, meas):5.1f}%  tau "
                  f"{kendall_tau(pred, meas):5.2f}  predicted ms: "
                  + " ".join(f"{1e3 * v:.0f}" for v in pred))


if __name__ == "__main__":
    main()
