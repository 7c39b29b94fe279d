"""The hyperparameters of a REINFORCE run (``RLConfig``) and the schedules of its
learning rate and entropy weight."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from simplace.errors import SimplaceError

REWARDS = ("neg", "sqrt", "log")


BASELINES = ("mean", "ema")


OOM_MODES = ("auto", "bound", "exact")


SIMULATORS = ("auto", "numba", "jax")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Hyperparameters of a REINFORCE run (defaults after Mirhoseini et al., tuned for
    the simulator's cheap rewards: smaller learning rate, batch-mean baseline).

    samples: placements per update (K). reward: "neg" | "sqrt" | "log".
    baseline: "mean" (leave-one-out batch mean) or "ema" (moving average, decay
      ``baseline_decay``). normalize: divide advantages by the batch's reward std.
    lr, lr_end, warmup_updates: Adam's learning-rate schedule. clip_norm: gradient
      clipping by global norm. entropy, entropy_end: entropy weight schedule.
    oom_factor: an OOM placement counts as this many reference step times (at least).
    oom: memory check in the jit, "auto" | "bound" | "exact"
      (``simplace.rl.reinforce``, "Memory").
    imitation_steps, imitation_target: warm start by imitation, at most this many Adam
      steps, stopping once the mean per-unit likelihood of the warm start's placement
      reaches ``imitation_target`` (leaving room to explore). A policy with its own
      ``warm_start`` (gnn, seq2seq) is set on the warm start directly instead.
    self_imitation: weight of self-imitation (Oh et al. 2018): every update also raises
      the likelihood of the best placement the run has sampled (or its warm start),
      this weight times its log-likelihood summed over units; 0 turns it off.
    refine_every, refine_batches: every ``refine_every`` updates (0: never) that best
      placement is refined by greedy block moves (``simplace.rl.refine``), at most
      ``refine_batches`` batches of K placements scored; the refined placement becomes
      the target of self-imitation.
    portfolio, patience: restarts (``simplace.rl.reinforce``, "Restarts"): the ``portfolio``
      best distinct warm starts are each trained from in turn, the next once the
      current leg's best has not improved for ``patience`` updates; after them, each
      stalled leg restarts the policy on the run's best placement. ``patience`` 0: one
      leg, no restarts.
    polish_batches, polish_share: at the end of a run each stint's best placement is
      polished by op-level moves (``simplace.rl.reinforce``, "Polish"), at most
      ``polish_batches`` batches of K in all (0: no polish); under a time budget,
      training stops when ``polish_share`` of the time left after the first update
      remains, for the polish.
    simulator: "auto" (the native simulator where numba is installed, else JAX),
      "numba" or "jax" (``simplace.sim.batched_simulator``'s backends). The native one
      scores each batch between the jitted policy and learning steps with exact OOM
      flags (``oom`` then does not matter) and compiles nothing per problem; the JAX
      one compiles the simulator once per problem.
    """

    samples: int = 64
    reward: str = "sqrt"
    baseline: str = "mean"
    baseline_decay: float = 0.9
    normalize: bool = True
    lr: float = 3e-3
    lr_end: float = 3e-4
    warmup_updates: int = 10
    clip_norm: float = 1.0
    entropy: float = 0.3
    entropy_end: float = 1e-2
    oom_factor: float = 10.0
    oom: str = "auto"
    imitation_steps: int = 100
    imitation_target: float = 0.8
    self_imitation: float = 0.5
    refine_every: int = 10
    refine_batches: int = 4
    portfolio: int = 3
    patience: int = 100
    polish_batches: int = 1000
    polish_share: float = 0.2
    simulator: str = "auto"

    def __post_init__(self):
        from simplace._argtypes import check_float, check_int

        for f in dataclasses.fields(self):  # types first: no NaN, no True for a count
            v = getattr(self, f.name)
            if f.type == "int":
                check_int(v, f.name, 1 if f.name == "samples" else 0)
            elif f.type == "float":
                check_float(v, f.name, 0.0)
            elif f.type == "bool" and not isinstance(v, bool | np.bool_):
                raise SimplaceError(f"{f.name} must be True or False, got {v!r}.")
        if int(self.samples) < 1:
            raise SimplaceError(f"samples must be >= 1 (placements per update), got "
                                f"{self.samples}.")
        for name, val, allowed in (("reward", self.reward, REWARDS),
                                   ("baseline", self.baseline, BASELINES),
                                   ("oom", self.oom, OOM_MODES)):
            if val not in allowed:
                raise SimplaceError(f"{name} must be one of {', '.join(allowed)}, got "
                                    f"{val!r}.")
        if not (self.lr > 0 and self.lr_end > 0 and self.clip_norm > 0):
            raise SimplaceError("lr, lr_end and clip_norm must be > 0.")
        if self.entropy < 0 or self.entropy_end < 0 or self.oom_factor < 1:
            raise SimplaceError("entropy weights must be >= 0 and oom_factor >= 1.")
        if int(self.polish_batches) < 0 or not 0 <= float(self.polish_share) < 1:
            raise SimplaceError(f"polish_batches must be >= 0 (0: no polish) and "
                                f"polish_share in [0, 1), got {self.polish_batches} and "
                                f"{self.polish_share}.")
        if int(self.portfolio) < 1 or int(self.patience) < 0:
            raise SimplaceError(f"portfolio must be >= 1 and patience >= 0 (0: no "
                                f"restarts), got {self.portfolio} and {self.patience}.")
        if int(self.refine_every) < 0 or int(self.refine_batches) < 0:
            raise SimplaceError("refine_every and refine_batches must be >= 0 (0: no "
                                "refinement).")
        if self.simulator not in SIMULATORS:
            raise SimplaceError(f"simulator must be one of {', '.join(SIMULATORS)}, got "
                                f"{self.simulator!r}.")
        if not self.self_imitation >= 0:
            raise SimplaceError(f"self_imitation must be >= 0 (0: off), got "
                                f"{self.self_imitation}.")

    @property
    def stint_starts(self) -> int:
        """How many distinct warm starts a run trains from (``portfolio_starts``):
        ``portfolio``, or 1 without restarts (``patience`` 0)."""
        return int(self.portfolio) if self.patience else 1

    @classmethod
    def from_options(cls, options: dict) -> RLConfig:
        """The fields of ``options`` that name config fields (others are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in options.items() if k in names})
        except SimplaceError:
            raise
        except (TypeError, ValueError) as err:  # e.g. samples="abc"
            raise SimplaceError(f"Bad REINFORCE option ({err}): samples and the update "
                                "counts are integers, lr, entropy and the like numbers."
                                ) from None


def _schedule(cfg: RLConfig, update: int, frac: float) -> tuple[float, float]:
    warm = min(1.0, (update + 1) / max(1, cfg.warmup_updates))
    cos = 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    lr = warm * (cfg.lr_end + (cfg.lr - cfg.lr_end) * cos)
    beta = cfg.entropy * (cfg.entropy_end / cfg.entropy) ** min(1.0, frac) \
        if cfg.entropy > 0 and cfg.entropy_end > 0 else cfg.entropy * (1 - min(1.0, frac))
    return lr, beta
