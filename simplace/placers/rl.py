"""``rl-seq2seq``, ``rl-hierarchical``, ``rl-gnn``: REINFORCE policies trained against the
batched simulator (``simplace.rl``).

Options (``optimize(..., **options)``):
  episodes: sampled placements in all (deterministic for a seed); without it the run
    stops at ``budget_s``; with neither, 2,048 episodes (deterministic).
  samples: placements per update (K, default 64); any ``RLConfig`` field (reward,
    baseline, lr, entropy, oom...).
  warm_start: a method name, comma-separated names, ``"pretrained"`` (``rl-pretrained``'s
    zero-shot placement), ``"best"`` (every fast heuristic),
    an int[M] placement or several (int[K, M]): the best of them seeds the best-so-far
    (so the result is never worse) and the policy first imitates it; once training
    stalls it restarts from the next of the ``portfolio`` (default 3) best distinct
    ones, then from the run's best (``patience``: updates without progress before a
    restart, default 100; 0: never). Before training, those portfolio starts are
    polished by op-level moves (``simplace.rl.refine.polish``) within ``polish_share``
    (default 0.2) of the time left, and the polished ones (``<name>+polish``,
    ``info["prepolished"]``) are what the policy trains from; at the end each stint's
    best is polished again (``polish_batches``: at most that many batches per polish, 0:
    no polish). Under a time budget, the named heuristics after the first are not begun
    once 30% of it is spent (``WARM_SHARE``) or when their cost estimate does not fit
    what is left of that, and each stops there. A named heuristic that fails or is
    skipped is left out and named in ``info["warm_starts_missed"]`` with why (a failure
    is said in the progress too; an error when none gives a placement). Default: none.
  units: ``"auto"`` (co-location groups cut to at most ``max_units`` ranges; default 256
    for seq2seq, 1024 for the others), ``"ops"`` or an int. hidden, groups, layers:
    policy sizes. explore (gnn, seq2seq): expected deviations per sample from a warm
    start.
  history: a JSON path for the per-update reward curve; plot: a PNG path for its plot
    (default: the history path with ``.png``).
  checkpoint, checkpoint_every, checkpoint_every_s: resume from / save to a ``.npz``
    file, every N updates (default 50) and every S seconds (default 30).
  validate, validate_every, top_k: the search session's validation hook
    ``(update, candidates, cost_model) -> CostModel | None`` (``simplace.search``), every
    N updates (0, the default: only at the end); a returned (drift-corrected) model is
    trained against from then on, and is the result's ``cost_model``.
  stop_after_updates: stop after that many updates (to be resumed from a checkpoint).
  progress_bar: draw a progress bar on stderr.
  fallback_single: when the fastest single device that holds the model beats the policy's
    best placement (a short run's samples are near random), return that device instead
    (``info["returned"] == "single"``, ``info["note_single"]``; the policy's own best is
    ``info["score"]``), as the list schedulers do. Default True.

The budget runs from the call of ``optimize``: warm starts, building the policy and
compilation count. On ``simplace.search.request_stop()`` (Ctrl-C in the CLI) training
stops after the current update; the checkpoint and history are written and the best
placement so far is returned (``info["stop"] == "interrupted"``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import time

import numpy as np

from simplace._argtypes import MAX_BATCH, check_int
from simplace.errors import OptionError, SimplaceError
from simplace.placers import (
    Option,
    PlacerContext,
    PlacerOutput,
    bool_option,
    float_option,
    int_option,
    path_option,
    register,
)
from simplace.placers.registry import option_values
from simplace.search import OOM_PENALTY, SESSION_OPTIONS, penalised_text

DEFAULT_MAX_UNITS = {"seq2seq": 256, "hierarchical": 1024, "gnn": 1024}
# Under a time budget, warm-start heuristics after the first are not begun once this
# share of it is spent: the policy needs the rest to compile and train (with every
# heuristic, nmt_2layer's first update came after the whole 30 s budget).
WARM_SHARE = 0.3
_POLICY_KW = {"seq2seq": ("hidden", "attention", "explore"),
              "hierarchical": ("hidden", "groups", "grouper_hidden", "attention"),
              "gnn": ("hidden", "groups", "layers", "explore")}
# The policies' sizes: None (the default) leaves the policy's own default.
_POLICY_OPTIONS = {
    "hidden": int_option("hidden width of the policy (default: the policy's)", None, 1,
                         MAX_BATCH),
    "attention": int_option("attention width (default: the policy's)", None, 1, MAX_BATCH),
    "groups": int_option("groups the grouper pools units into (default: the policy's)", None,
                         1, MAX_BATCH),
    "grouper_hidden": int_option("hidden width of the grouper (default: the policy's)", None,
                                 1, MAX_BATCH),
    "layers": int_option("GNN layers (default: the policy's)", None, 0, MAX_BATCH),
    "explore": float_option("deviations per sample after a warm start (default 2)", None,
                            0.0, lo_open=True),
}


def _config_option(field: dataclasses.Field) -> Option:
    """``RLConfig.<field>`` as an option: a value is checked by ``RLConfig`` itself (that
    field set, the others at their defaults), so the checks live in one place."""
    from simplace.rl.cli_args import MAX_SAMPLES
    from simplace.rl.config import RLConfig

    name = field.name

    def parse(value):
        if name == "samples":  # the command line's bound (an array dimension)
            check_int(value, "value", 1, MAX_SAMPLES)
        try:
            return getattr(RLConfig(**{name: value}), name)
        except SimplaceError as err:
            why = str(err)
            raise OptionError(f"value {why.removeprefix(name + ' ')}" if why.startswith(
                name + " ") else f"value must pass RLConfig's check: {why}") from None

    return Option(f"REINFORCE setting (RLConfig.{name}, default {field.default!r})",
                  field.default, parse)



def _units(value):
    if isinstance(value, str) and value in ("auto", "ops"):
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return check_int(value, "value", 1, MAX_BATCH, "a number of units")
    if isinstance(value, list | tuple | np.ndarray):
        return value  # an int[M] grouping: the method checks it against the graph
    raise OptionError(f"value must be 'auto', 'ops', a number of units >= 1 or an int[M] "
                      f"grouping, got {value!r}.")


def _options(policy: str) -> dict[str, Option]:
    """The options an ``rl-<policy>`` method declares."""
    from simplace.rl.config import RLConfig

    opts = {f.name: _config_option(f) for f in dataclasses.fields(RLConfig)}
    opts.update({
        "episodes": int_option("sampled placements in all (deterministic for a seed; "
                               "default: until the budget, or 2,048 without one)", None, 1,
                               MAX_BATCH),
        "warm_start": Option("method name(s), 'pretrained', 'best' or int[M] placement(s) "
                             "to start from (default: none)"),
        "units": Option("'auto' (default), 'ops', a number of units or an int[M] grouping",
                        "auto", _units),
        "max_units": int_option(f"units at most (default {DEFAULT_MAX_UNITS[policy]})",
                                DEFAULT_MAX_UNITS[policy], 1, MAX_BATCH),
        "history": path_option("JSON path of the reward curve"),
        "plot": path_option("PNG path of its plot (default: the history's with .png)"),
        "checkpoint": path_option(".npz path to resume from and save to"),
        "checkpoint_every": int_option("save every N updates (default 50)", 50, 1, MAX_BATCH),
        "checkpoint_every_s": float_option("save every S seconds (default 30)", 30.0, 0.0,
                                           lo_open=True),
        "stop_after_updates": int_option("stop after N updates (resume later)", None, 1,
                                         MAX_BATCH),
        "progress_bar": bool_option("draw a progress bar on stderr (default False)", False),
        "fallback_single": bool_option("return the fastest single device that fits when it "
                                       "beats the policy's best (default True)", True),
        **{k: _POLICY_OPTIONS[k] for k in _POLICY_KW[policy]},
        **{k: Option(*spec) for k, spec in SESSION_OPTIONS.items()}})
    return opts


def fast_heuristics() -> list[str]:
    """Registered methods usable as warm starts: all but search methods and oracles."""
    from simplace.placers import methods_of_kind

    return methods_of_kind("heuristic")


def _warm_starts(ctx: PlacerContext):
    """[(label, placement)], their penalised scores, and {name: why} for the named
    methods that gave none, from option ``warm_start``."""
    from simplace.placement import check_placement
    from simplace.placers.local import run_starts

    ws = ctx.options.get("warm_start")
    if ws is None or (isinstance(ws, str) and ws in ("", "none")):
        return [], [], {}
    m, d = ctx.graph.num_ops, ctx.inputs.num_devices
    missed = {}
    if isinstance(ws, str):
        from simplace.placers import methods_of_kind

        # "pretrained" names the learned heuristics (the pretrained policy)
        names = fast_heuristics() if ws == "best" else [
            n for w in ws.split(",") if w.strip()
            for n in (methods_of_kind("heuristic", learned=True) if w.strip() == "pretrained"
                      else [w.strip()])]
        known = fast_heuristics()
        for n in names:
            if n not in known:
                raise SimplaceError(
                    f"Unknown warm-start method {n!r}: use one of "
                    f"{', '.join(fast_heuristics())}, 'pretrained', 'best', 'none' or a "
                    f"placement.")
        # Raw placements (no reference simulation): they are scored below in one batch.
        # Under a budget, those after the first are begun only while their cost estimate
        # fits what is left of WARM_SHARE of it, and each stops there (list schedulers and
        # ideals): unbudgeted, ideals begun just inside the share took 10.9 s of a 20 s
        # budget on rnnlm on the CPU+GPU machine.
        share = None if ctx.budget_s is None else WARM_SHARE * float(ctx.budget_s)
        found, report = run_starts(
            ctx.with_options({"starts": names}),
            math.inf if share is None else ctx.t_begin + share, share, add_single=False,
            always_first=True)
        missed = {r["start"]: r["error"] for r in report if "error" in r}
        for name, why in missed.items():
            if not why.startswith("skipped"):  # a skip for time is the budget's rule
                ctx.progress(f"warm start {name} failed ({why}); going on without it.")
        if not found:
            raise SimplaceError(
                "No warm start could be made: " + "; ".join(
                    f"{n}: {why}" for n, why in missed.items())
                + ". Name other methods with warm_start, or 'none'.")
    else:
        arr = np.asarray(ws)
        if arr.ndim not in (1, 2) or arr.size == 0:
            raise SimplaceError(
                f"warm_start must be a method name, comma-separated names, 'best', 'none', "
                f"an int[M] placement or int[K, M] placements; got an array of shape "
                f"{arr.shape}.")
        rows = [arr] if arr.ndim == 1 else list(arr)  # one placement, or int[K, M]
        found = []
        for k, row in enumerate(rows):
            label = "placement" if arr.ndim == 1 else f"placement[{k}]"
            try:
                found.append((label, check_placement(row, m, d)))
            except SimplaceError as err:
                raise SimplaceError(f"warm_start {label} is invalid: {err}") from None
    scores = [float(s) for s in ctx.score(np.stack([p for _, p in found]))]
    return found, scores, missed


def _references(ctx: PlacerContext, warm, warm_scores) -> dict[str, float]:
    """Step times to judge a run against: ``single``, the best warm start (a
    heuristic) and the lower bound (seconds; the history's meta and plot show them)."""
    from simplace.placers import run_method

    refs = {"lower bound": float(ctx.lower_bound_s)}
    scores = dict(zip((n for n, _ in warm), (float(s) for s in warm_scores), strict=True))
    if "single" not in scores:
        try:
            out, _ = run_method(ctx.graph, ctx.cost_model, "single", seed=ctx.seed)
            # The reference simulator on one placement: no batched program to compile
            # for a batch of one after the budget is spent.
            res = ctx.simulate(out.placement)
            scores["single"] = OOM_PENALTY if res.oom else float(res.step_time_s)
        except Exception:  # noqa: BLE001 - a reference line is not worth failing a run
            pass
    if scores.get("single", OOM_PENALTY) < OOM_PENALTY:
        refs["single"] = scores["single"]
    fitting = {n: s for n, s in scores.items() if s < OOM_PENALTY and n != "single"}
    if fitting:
        name = min(fitting, key=fitting.get)
        refs[f"best heuristic ({name})"] = fitting[name]
    return refs


def _prepolish(ctx: PlacerContext, session, cfg, warm, warm_scores):
    """(warm starts, their scores, info): the portfolio's warm starts
    (``simplace.rl.reinforce.portfolio_starts``) each polished by op-level moves
    (``simplace.rl.refine.polish``, at most ``cfg.polish_batches`` batches) within an
    equal part of ``cfg.polish_share`` of the time left, added as ``<name>+polish``;
    the warm starts unchanged when there are none or the polish is off."""
    from simplace.rl.refine import polish
    from simplace.rl.reinforce import portfolio_starts

    if not warm or not cfg.polish_batches:
        return warm, warm_scores, {}
    t0 = time.perf_counter()
    starts = portfolio_starts(warm, warm_scores, cfg.stint_starts)
    score_of = {n: s for (n, _), s in zip(warm, warm_scores, strict=True)}
    end = t0 + cfg.polish_share * (session.deadline - t0) if \
        math.isfinite(session.deadline) else math.inf
    edges = (np.asarray(ctx.graph.src), np.asarray(ctx.graph.dst))
    out, scores, done = list(warm), list(warm_scores), {}
    for i, (name, p) in enumerate(starts):
        if score_of[name] >= OOM_PENALTY:
            continue
        now = time.perf_counter()
        share = (end - now) / (len(starts) - i) if math.isfinite(end) else math.inf
        b, s, _ = polish(ctx.score, p, score_of[name], ctx.inputs.num_devices,
                         cfg.samples, int(cfg.polish_batches), deadline=now + share,
                         edges=edges)
        if s < score_of[name]:
            out.append((f"{name}+polish", b))
            scores.append(s)
            done[f"{name}+polish"] = s
    return out, scores, {"prepolished": done, "prepolish_s": time.perf_counter() - t0}


def run_policy(ctx: PlacerContext, policy_name: str) -> PlacerOutput:
    """Train ``policy_name`` on ``ctx``'s problem; see the module docstring."""
    from simplace.placers.single import faster_single
    from simplace.rl import RLConfig, Trainer, build_units, make_policy, train, unit_grouping
    from simplace.rl.history import plot_history, save_history
    from simplace.rl.reinforce import portfolio_starts

    label = f"rl-{policy_name}"
    opts = option_values(label, ctx.options)
    cfg = RLConfig.from_options(opts)
    g, d = ctx.graph, ctx.inputs.num_devices
    episodes = opts["episodes"]
    if g.num_ops == 0 or d == 1:
        return PlacerOutput(np.zeros(g.num_ops, np.int32), info={"note": "nothing to place"})
    session = ctx.session(label, bar=opts["progress_bar"], unit="episodes")
    warm, warm_scores, missed = _warm_starts(ctx)
    # The policy trains from the portfolio's warm starts polished first (op-level moves,
    # RLConfig.polish_*): whatever training finds is then beyond the polish's reach.
    t_warm, t_scores, pre = _prepolish(ctx, session, cfg, warm, warm_scores)
    max_units = opts["max_units"]
    # Units are cut where the warm starts the run trains from (the best, and the
    # portfolio's others: simplace.rl.reinforce, "Restarts") change device, so that the
    # policy can represent each exactly (a majority vote over coarser units can be far
    # slower). One label per combination of their devices marks every such cut.
    starts = portfolio_starts(t_warm, t_scores, cfg.stint_starts)
    split = None
    if starts:
        split = np.unique(np.stack([p for _, p in starts], axis=1), axis=0,
                          return_inverse=True)[1].reshape(-1)
    units = build_units(g, ctx.op_times, unit_grouping(g, opts["units"],
                                                       max_units, split_by=split))
    policy_kw = {k: opts[k] for k in _POLICY_KW[policy_name] if opts[k] is not None}
    policy = make_policy(policy_name, units, d, **policy_kw)
    trainer = Trainer(g, ctx.inputs, units, policy, cfg, seed=ctx.seed)
    res = train(trainer, episodes=None if episodes is None else int(episodes),
                session=session, warm_starts=t_warm, warm_scores=t_scores,
                checkpoint=opts["checkpoint"], checkpoint_every=opts["checkpoint_every"],
                checkpoint_every_s=opts["checkpoint_every_s"],
                stop_after_updates=opts["stop_after_updates"], policy_kw=policy_kw,
                label=label)
    hist_path = opts["history"]
    plot_path = opts["plot"] or (os.path.splitext(hist_path)[0] + ".png"
                                     if hist_path else None)
    # Only a saved history or plot shows the reference lines: computed for them alone.
    references = _references(ctx, warm, warm_scores) if hist_path or plot_path else {}
    meta = {"method": label, "graph": g.name, "graph_hash": g.hash, "seed": ctx.seed,
            "samples": cfg.samples, "units": units.num_units, "references_s": references}
    if hist_path:
        save_history(hist_path, res.history, meta)
    if plot_path and res.history:
        plot_history(res.history, plot_path, title=f"{label} on {g.name or 'graph'}",
                     references=references)
    info = {**res.info, "score": res.best_score, "fits": bool(res.best_score < OOM_PENALTY),
            "policy": policy_name, "warm_starts": {n: s for (n, _), s in
                                                   zip(warm, warm_scores, strict=True)},
            **({"warm_starts_missed": missed} if missed else {}),
            **pre,
            **session.finish(res.info["stop"])}
    info["run_wall_s"] = res.info["wall_s"]  # earlier legs (a resumed checkpoint) included
    if hist_path:
        info["history_path"] = hist_path
    if opts["checkpoint"]:
        info["checkpoint_path"] = opts["checkpoint"]
    rows = [{**r, "step_time_s": r["best_step_time_s"]} for r in res.history]
    placement = res.best_placement.astype(np.int32)
    # (Not against a drift-corrected model: the policy's score is under that one.)
    faster = faster_single(ctx, res.best_score) if opts["fallback_single"] and \
        not session.validation["corrections"] else None
    if faster is not None:
        # Too short a run (or a poor one) can end slower than one device: a from-scratch
        # policy's first samples are near random (resnet50 on 4 H100s, 2 s: rl-gnn's
        # 79 ms against single's 33 ms). The policy's own best stays in info["score"].
        d, t1 = faster
        placement = np.full(g.num_ops, d, np.int32)
        info.update(returned="single", single_device=d, single_step_time_s=t1,
                    note_single=f"the policy's best placement ({penalised_text(res.best_score)}) "
                                f"is slower than the whole graph on device {d} "
                                f"({t1 * 1e3:.3f} ms): returned that")
    return PlacerOutput(placement, history=rows, info=info,
                        cost_model=session.cost_model if session.validation["corrections"]
                        else None)


@register("rl-seq2seq", kind="policy", options=_options("seq2seq"))
def place_seq2seq(ctx: PlacerContext) -> PlacerOutput:
    """``rl-seq2seq``: REINFORCE, LSTM encoder + attention decoder over groups (2017)."""
    return run_policy(ctx, "seq2seq")


@register("rl-hierarchical", kind="policy", options=_options("hierarchical"))
def place_hierarchical(ctx: PlacerContext) -> PlacerOutput:
    """``rl-hierarchical``: REINFORCE, feed-forward grouper + seq2seq placer (2018)."""
    return run_policy(ctx, "hierarchical")


@register("rl-gnn", kind="policy", options=_options("gnn"))
def place_gnn(ctx: PlacerContext) -> PlacerOutput:
    """``rl-gnn``: REINFORCE, GNN with learned pooling and an MLP placer (HSDAG)."""
    return run_policy(ctx, "gnn")
