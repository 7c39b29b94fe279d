"""The PaSE cost model on a simplace CostModel: seconds per layer and per edge.

The machine is p identical devices joined by identical links. A simplace CostModel
describes a concrete machine of D devices; for any p (also p > D) PaSE takes its
*reference device*, the fastest accelerator (the device of kind gpu or tpu with the
highest peak FLOP/s, the fastest device when there is none), as every device's kind,
and the slowest link between two devices of that kind (lowest bandwidth, highest latency;
links to other kinds when it is the only one) as every link. Collectives are rings over
those links.

Cost of a strategy = sum over layers of (compute on its share + its own communication)
+ sum over edges of the redistribution between the two layers' layouts, as PaSE. All in
seconds, forward and (for training graphs) backward:

* compute: the layer's op time on the reference device (roofline or measured, from
  ``CostModel.op_times``), the per-op overheads kept whole and the rest scaled by the
  largest share of the iteration space one device gets (``prod ceil(n_d / s_d) / n_d``);
* layer communication: an all-reduce of partial sums whenever a dimension the result
  does not have is split: the output in the forward pass (a split reduction
  dimension), every input activation's and parameter's gradient in the backward pass
  (a split output dimension; a split batch for the weight gradients); LSTM layers add
  per time step the all-gather of the hidden state when hidden units are split; split
  convolutions and pools exchange halos of (window - 1) rows or columns; ring
  collectives cost ``2 (g - 1) / g x bytes / bandwidth + 2 (g - 1) x latency`` (all-reduce)
  and half that (all-gather), except that weight-gradient all-reduces carry no latency
  term (runtimes bucket them into a few large collectives);
* redistribution of a tensor from its producer's layout to its consumer's: the data a
  device needs minus the data it holds, per axis ``min(1, s_consumer / s_producer)`` of
  the needed block is already there (aligned blocks), forward and (gradients) backward.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from simplace.cost_model import CostModel
from simplace.parallel.layers import Layer, ParallelizeError

__all__ = ["Machine", "edge_cost", "layer_cost"]

# Devices to split over: PaSE enumerates the factorisations of P per layer; past a few
# thousand devices the tables grow without telling anything new.
MAX_DEVICES = 4096


@dataclasses.dataclass(frozen=True)
class Machine:
    """p identical devices (the reference device of a CostModel) and identical links."""

    devices: int
    device_index: int
    device_name: str
    latency_s: float
    bandwidth_bytes_per_s: float

    @classmethod
    def from_cost_model(cls, cost_model: CostModel, devices: int) -> Machine:
        """``devices`` copies of the cost model's reference device (its fastest accelerator) and of
        its slowest link between devices of that kind; ``ParallelizeError`` for a bad ``devices``
        or a model with no link to price."""
        if not isinstance(cost_model, CostModel):
            raise ParallelizeError(f"cost_model must be a simplace CostModel, got "
                                   f"{type(cost_model).__name__}; load one with "
                                   "CostModel.load(name).")
        if isinstance(devices, bool) or not isinstance(devices, (int, np.integer)) \
                or not 1 <= devices <= MAX_DEVICES:
            raise ParallelizeError(f"devices must be an integer >= 1 and at most "
                                   f"{MAX_DEVICES} (the number of devices to split each "
                                   f"layer over), got {devices!r}.")
        devs = cost_model.devices
        accel = [k for k, d in enumerate(devs) if d.kind in ("gpu", "tpu")]
        pool = accel or list(range(len(devs)))
        ref = max(pool, key=lambda k: (devs[k].peak_flops_per_s, -k))
        same = [k for k in range(len(devs)) if devs[k].kind == devs[ref].kind]
        pairs = [(i, j) for i in same for j in same if i != j]
        if not pairs:
            pairs = [(ref, j) for j in range(len(devs)) if j != ref] + [
                (j, ref) for j in range(len(devs)) if j != ref]
        if pairs:
            bw = min(float(cost_model.corrected_bandwidth_bytes_per_s[i, j]) for i, j in pairs)
            lat = max(float(cost_model.corrected_latency_s[i, j]) for i, j in pairs)
        elif devices == 1:
            bw, lat = math.inf, 0.0
        else:
            raise ParallelizeError(
                f"Cost model {cost_model.name!r} has one device and so no link figures to "
                f"price communication between {devices} devices. Use a cost model with at "
                "least two devices (e.g. haswell_k40x4).")
        return cls(int(devices), ref, devs[ref].name, lat, bw)

    def allreduce_s(self, nbytes, group, latency: bool = True):
        """Ring all-reduce of ``nbytes`` per device among ``group`` devices (without the
        per-step latency when ``latency`` is False: a bucketed, fused all-reduce)."""
        g = np.asarray(group, dtype=np.float64)
        t = 2 * (g - 1) / np.maximum(g, 1) * nbytes / self.bandwidth_bytes_per_s + \
            2 * (g - 1) * self.latency_s * latency
        return np.where(g > 1, t, 0.0)

    def allgather_s(self, full_bytes, group):
        """Ring all-gather ending with ``full_bytes`` on each of ``group`` devices."""
        g = np.asarray(group, dtype=np.float64)
        t = (g - 1) / np.maximum(g, 1) * full_bytes / self.bandwidth_bytes_per_s + \
            (g - 1) * self.latency_s
        return np.where(g > 1, t, 0.0)

    def send_s(self, nbytes):
        """One point-to-point transfer of ``nbytes`` (0 when there is nothing to send)."""
        b = np.asarray(nbytes, dtype=np.float64)
        return np.where(b > 0, self.latency_s + b / self.bandwidth_bytes_per_s, 0.0)


def _splits(configs: np.ndarray, axis_dims) -> np.ndarray:
    """int64[C, A]: the split factor of each tensor axis under each configuration."""
    out = np.ones((len(configs), len(axis_dims)), dtype=np.int64)
    for a, d in enumerate(axis_dims):
        if d >= 0:
            out[:, a] = configs[:, d]
    return out


def _outside(configs: np.ndarray, dims: frozenset[int]) -> np.ndarray:
    """Product of the split factors of the dims not in ``dims`` (the reduction group)."""
    keep = [d for d in range(configs.shape[1]) if d not in dims]
    return configs[:, keep].prod(axis=1) if keep else np.ones(len(configs), dtype=np.int64)


def layer_cost(layer: Layer, configs: np.ndarray, machine: Machine, training: bool,
               detail: bool = False):
    """float64[C]: seconds of ``layer`` under each configuration (compute + own
    communication); with ``detail``, ``(compute_s[C], comm_s[C])``."""
    configs = np.asarray(configs, dtype=np.int64)
    sizes = np.asarray(layer.dim_sizes, dtype=np.float64)
    # the largest share of the iteration space one device gets
    frac = (np.ceil(sizes / configs) / sizes).prod(axis=1) if len(sizes) else np.ones(
        len(configs))
    compute = layer.overhead_s + (layer.time_s - layer.overhead_s) * frac
    comm = np.zeros(len(configs))
    for t in layer.tensors:
        if not t.first or not t.shape and t.role != "param":
            continue
        dims = t.dims()
        local = t.nbytes / _splits(configs, t.axis_dims).prod(axis=1)
        group = _outside(configs, dims)
        if t.role == "out":
            comm += machine.allreduce_s(local, group)
        elif t.role == "param" and training:
            # weight gradients are bucketed into a few large all-reduces by every
            # data-parallel runtime (Horovod, PyTorch DDP, XLA's combiner): volume only
            comm += machine.allreduce_s(local, group, latency=False)
        elif training and t.is_float:
            comm += machine.allreduce_s(local, group)
    if layer.kind == "lstm":
        b, h, k = (layer.dim(x) for x in ("b", "h", "k"))
        hbytes = layer.dim_sizes[b] * layer.dim_sizes[h] * layer.itemsize / configs[:, b]
        # the recurrent matmul needs every hidden unit at every step
        per_step = machine.allgather_s(hbytes, configs[:, h])
        if training:  # and its input gradient sums over the split hidden units
            per_step = per_step + machine.allreduce_s(hbytes, configs[:, h])
        comm += layer.steps * per_step
    if layer.kind in ("conv", "pool") and len(layer.dim_sizes) >= 4:
        n = 0
        hd, wd = (2, 3) if layer.kind == "conv" else (1, 2)
        cd = 4 if layer.kind == "conv" else 3
        sz = layer.dim_sizes
        kh, kw = layer.window
        rows = (kh - 1) * np.ceil(sz[wd] / configs[:, wd])
        cols = (kw - 1) * np.ceil(sz[hd] / configs[:, hd])
        per = np.ceil(sz[n] / configs[:, n]) * np.ceil(sz[cd] / configs[:, cd]) * layer.itemsize
        halo = machine.send_s(np.where(configs[:, hd] > 1, rows * per, 0.0)) + \
            machine.send_s(np.where(configs[:, wd] > 1, cols * per, 0.0))
        comm += halo * (2 if training else 1)
    if detail:
        return compute, comm
    return compute + comm


def edge_cost(layers, edge, configs_src: np.ndarray, configs_dst: np.ndarray,
              machine: Machine, training: bool) -> np.ndarray | None:
    """float64[Cs, Cd]: seconds to redistribute the edge's tensor between every pair of
    configurations (forward, and its gradient backward); None when it costs nothing."""
    s, d, ts, td = edge
    t_src = layers[s].tensors[ts]
    t_dst = layers[d].tensors[td]
    if not t_dst.first or not t_src.shape or len(t_src.axis_dims) != len(t_dst.axis_dims):
        return None
    su = _splits(configs_src, t_src.axis_dims).astype(np.float64)  # [Cs, A]
    sv = _splits(configs_dst, t_dst.axis_dims).astype(np.float64)  # [Cd, A]
    if not su.shape[1]:
        return None
    nbytes = t_src.nbytes
    held = np.minimum(1.0, sv[None, :, :] / su[:, None, :]).prod(axis=2)  # [Cs, Cd]
    need = nbytes / sv.prod(axis=1)
    # aligned blocks: 1 - held is exactly 0 or a fraction >= 1/p; drop rounding noise
    cost = machine.send_s(np.where(held > 1 - 1e-9, 0.0, need[None, :] * (1.0 - held)))
    if training and t_src.is_float:
        held_b = np.minimum(1.0, su[:, None, :] / sv[None, :, :]).prod(axis=2)
        need_b = nbytes / su.prod(axis=1)
        cost = cost + machine.send_s(np.where(held_b > 1 - 1e-9, 0.0,
                                              need_b[:, None] * (1.0 - held_b)))
    return cost
