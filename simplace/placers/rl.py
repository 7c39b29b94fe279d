"""``rl-seq2seq``, ``rl-hierarchical``, ``rl-gnn``: REINFORCE policies trained against the
batched simulator (``simplace.rl``).

Options (``optimize(..., **options)``):
  episodes: sampled placements in all (deterministic for a seed); without it the run
    stops at ``budget_s``; with neither, 2,048 episodes (deterministic).
  samples: placements per update (K, default 64); any ``RLConfig`` field (reward,
    baseline, lr, entropy, oom...).
  warm_start: a method name, comma-separated names, ``"best"`` (every fast heuristic),
    or an int[M] placement: the best of them seeds the best-so-far (so the result is
    never worse) and the policy first imitates it. Default: none.
  units: ``"auto"`` (co-location groups cut to at most ``max_units`` ranges; default 256
    for seq2seq, 1024 for the others), ``"ops"`` or an int. hidden, groups, layers:
    policy sizes.
  history: a JSON path for the per-update reward curve; plot: a PNG path for its plot
    (default: the history path with ``.png``).
  checkpoint, checkpoint_every: resume from / save to a ``.npz`` file.
  callback, callback_every: ``callback(simplace.rl.RLStatus) -> bool | CostModel |
    None`` every N updates (default 100) and at the end; True stops the run, a CostModel
    (drift-corrected, see ``simplace.validate.rl_status_callback``) is trained against
    from then on and lands in ``info["corrected_cost_model"]``.
  stop_after_updates: stop after that many updates (to be resumed from a checkpoint).
  progress_bar: draw a progress bar on stderr.
"""

from __future__ import annotations

import os

import numpy as np

from simplace.errors import SimplaceError
from simplace.placers import PlacerContext, PlacerOutput, register

DEFAULT_MAX_UNITS = {"seq2seq": 256, "hierarchical": 1024, "gnn": 1024}
_NOT_WARM = ("local", "exact", "all")
_POLICY_KW = {"seq2seq": ("hidden", "attention"),
              "hierarchical": ("hidden", "groups", "grouper_hidden", "attention"),
              "gnn": ("hidden", "groups", "layers")}


def fast_heuristics() -> list[str]:
    """Registered methods usable as warm starts: all but search methods and oracles."""
    from simplace.placers import methods

    return [m for m in methods() if m not in _NOT_WARM and not m.startswith("rl-")]


def _warm_starts(ctx: PlacerContext):
    """[(label, placement)] and their penalised scores from option ``warm_start``."""
    from simplace.placement import check_placement
    from simplace.placers import methods, optimize

    ws = ctx.options.get("warm_start")
    if ws is None or (isinstance(ws, str) and ws in ("", "none")):
        return [], []
    m, d = ctx.graph.num_ops, ctx.inputs.num_devices
    if isinstance(ws, str):
        names = fast_heuristics() if ws == "best" else [w.strip() for w in ws.split(",")]
        known = methods()
        for n in names:
            if n not in known or n in _NOT_WARM or n.startswith("rl-"):
                raise SimplaceError(
                    f"Unknown warm-start method {n!r}: use one of "
                    f"{', '.join(fast_heuristics())}, 'best', 'none' or a placement.")
        found = [(n, optimize(ctx.graph, ctx.cost_model, n, seed=ctx.seed).placement)
                 for n in names]
    else:
        try:
            found = [("placement", check_placement(np.asarray(ws), m, d))]
        except SimplaceError as err:
            raise SimplaceError(f"warm_start placement is invalid: {err}") from None
    scores = [float(s) for s in ctx.score(np.stack([p for _, p in found]))]
    return found, scores


def run_policy(ctx: PlacerContext, policy_name: str) -> PlacerOutput:
    """Train ``policy_name`` on ``ctx``'s problem; see the module docstring."""
    from simplace.rl import RLConfig, Trainer, build_units, make_policy, train, unit_grouping
    from simplace.rl.history import plot_history, save_history

    opts = ctx.options
    cfg = RLConfig.from_options(opts)
    g, d = ctx.graph, ctx.inputs.num_devices
    episodes = opts.get("episodes")
    if g.num_ops == 0 or d == 1:
        return PlacerOutput(np.zeros(g.num_ops, np.int32), info={"note": "nothing to place"})
    warm, warm_scores = _warm_starts(ctx)
    max_units = int(opts.get("max_units", DEFAULT_MAX_UNITS[policy_name]))
    units = build_units(g, ctx.op_times, unit_grouping(g, opts.get("units", "auto"), max_units))
    policy_kw = {k: opts[k] for k in _POLICY_KW[policy_name] if opts.get(k) is not None}
    policy = make_policy(policy_name, units, d, **policy_kw)
    trainer = Trainer(g, ctx.inputs, units, policy, cfg, seed=ctx.seed)
    label = f"rl-{policy_name}"
    res = train(trainer, episodes=None if episodes is None else int(episodes),
                budget_s=ctx.budget_s, warm_starts=warm, warm_scores=warm_scores,
                checkpoint=opts.get("checkpoint"),
                checkpoint_every=int(opts.get("checkpoint_every", 50)),
                callback=opts.get("callback"),
                callback_every=int(opts.get("callback_every", 100)),
                stop_after_updates=opts.get("stop_after_updates"), progress=ctx.progress,
                progress_bar=bool(opts.get("progress_bar", False)), policy_kw=policy_kw,
                label=label)
    hist_path = opts.get("history")
    meta = {"method": label, "graph": g.name, "graph_hash": g.hash, "seed": ctx.seed,
            "samples": cfg.samples, "units": units.num_units}
    if hist_path:
        save_history(hist_path, res.history, meta)
    plot_path = opts.get("plot") or (os.path.splitext(hist_path)[0] + ".png"
                                     if hist_path else None)
    if plot_path and res.history:
        plot_history(res.history, plot_path, title=f"{label} on {g.name or 'graph'}")
    info = {**res.info, "score": res.best_score, "fits": bool(res.best_score < 1e6),
            "policy": policy_name, "warm_starts": {n: s for (n, _), s in
                                                   zip(warm, warm_scores, strict=True)}}
    if trainer.corrected_cost_model is not None:
        info["corrected_cost_model"] = trainer.corrected_cost_model
    rows = [{**r, "step_time_s": r["best_step_time_s"]} for r in res.history]
    return PlacerOutput(res.best_placement.astype(np.int32), history=rows, info=info)


@register("rl-seq2seq")
def place_seq2seq(ctx: PlacerContext) -> PlacerOutput:
    """``rl-seq2seq``: REINFORCE, LSTM encoder + attention decoder over groups (2017)."""
    return run_policy(ctx, "seq2seq")


@register("rl-hierarchical")
def place_hierarchical(ctx: PlacerContext) -> PlacerOutput:
    """``rl-hierarchical``: REINFORCE, feed-forward grouper + seq2seq placer (2018)."""
    return run_policy(ctx, "hierarchical")


@register("rl-gnn")
def place_gnn(ctx: PlacerContext) -> PlacerOutput:
    """``rl-gnn``: REINFORCE, GNN with learned pooling and an MLP placer (HSDAG)."""
    return run_policy(ctx, "gnn")
