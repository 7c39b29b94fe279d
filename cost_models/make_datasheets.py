"""Build the datasheet cost models shipped in the package from cited specifications.

Every figure below is a published spec (its source is named next to it and copied into
the model's ``provenance.notes``) or a stated assumption; peak rates are derived from
core counts and clocks in code so that they can be audited. Run

    python cost_models/make_datasheets.py          # rewrite simplace/machines/*.json
    python cost_models/make_datasheets.py --check  # exit 1 if a committed file is stale

The files go to ``simplace/machines/``, package data that ships inside the wheel, so
that an installed simplace has machines to optimize for. This folder (``cost_models/``)
keeps what the project itself measured (``source: measured``).

Datasheet models are starting points for machines one does not have; a machine one does
have is better described by ``simplace calibrate`` (``source: measured``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simplace.cost_model import CostModel, Device, Provenance

# The package's data folder (simplace.paths.package_cost_model_dir) of the checkout
# this script sits in, not of whichever simplace happens to be installed.
MACHINES = Path(__file__).resolve().parents[1] / "simplace" / "machines"
DATE = "2026-11-21"  # when these figures were compiled

GIB = 2.0 ** 30  # memory capacities: GPUs and DIMMs come in binary gigabytes
GB = 1e9  # bandwidths: datasheets quote decimal GB/s
US = 1e-6  # for printing seconds as microseconds
FMA_FLOPS = 2  # a fused multiply-add counts as two floating-point operations

# --------------------------------------------------------------------------- assumptions
# Fraction of the roofline reached per op class (see README.md for the reasoning).
# GPU: cuBLAS SGEMM reaches ~70-80% of FP32 peak on large matrices; cuDNN convolutions
# ~50-70%; streaming elementwise kernels ~60-75% of peak memory bandwidth; reductions,
# transposes and gathers access memory less regularly; control ops (scan/while/cond bodies)
# are dominated by many small launches.
GPU_EFFICIENCY = {"matmul": 0.7, "conv": 0.6, "elementwise": 0.6, "reduction": 0.5,
                  "data_movement": 0.5, "control": 0.3}
# CPU: XLA:CPU GEMMs (Eigen / oneDNN) reach ~60% of AVX peak; its convolutions and
# elementwise loops are less tuned and often use fewer threads than cores.
CPU_EFFICIENCY = {"matmul": 0.6, "conv": 0.4, "elementwise": 0.4, "reduction": 0.3,
                  "data_movement": 0.3, "control": 0.2}

# Per-op costs inside a segment: each op that is not fused runs as its own kernel (GPU)
# or loop (CPU) within the one XLA computation (assumptions, to be replaced by calibration).
CPU_OVERHEAD_S = 2e-6  # framework dispatch of one op, no device launch
GPU_OVERHEAD_S = 5e-6  # CUDA kernel launch + executor bookkeeping (Kepler/Maxwell era)
H100_OVERHEAD_S = 3e-6  # Hopper kernel launch latency is lower than Kepler's
IGPU_OVERHEAD_S = 10e-6  # OpenCL / Level Zero enqueue on an Intel integrated GPU

# What JAX adds around the ops when it runs a placement (assumptions, to be replaced by
# calibration): each segment (one jitted computation) costs a launch on its device and a
# host dispatch; each jax.device_put call costs host time. Measured on an H100 host with
# JAX 0.11 (shared/measurements/h100_2026-11-23, runtime_probe): a tiny jit call takes
# ~38 us of host time to dispatch to the GPU and ~75 us to complete, ~9 us / ~11 us on
# the CPU. Older stacks are assumed no faster.
CPU_LAUNCH_S = 2e-6
CPU_DISPATCH_S = 9e-6
GPU_LAUNCH_S = 35e-6
GPU_DISPATCH_S = 38e-6
PUT_HOST_S = 20e-6  # host time of one jax.device_put call (the copy itself is the link's)
# Inside a segment XLA fuses elementwise ops into their neighbours' loops: only a quarter
# of their bytes_accessed is charged (a chain of four touches memory about once), and
# they cost no kernel of their own.
FUSED_BYTES_FRACTION = 0.25
FUSED_CLASS_OVERHEAD_S = {"elementwise": 0.0}

# Links: achieved copy bandwidth is ~80% of the raw per-direction rate (protocol
# overhead, DMA setup); PCIe 3.0 x16 -> ~12.6 GB/s, PCIe 5.0 x16 -> ~50 GB/s,
# NVLink 4 (450 GB/s per direction per GPU) -> 360 GB/s.
LINK_EFFICIENCY = 0.8
PCIE_LATENCY_S = 10e-6  # cudaMemcpy of a small tensor across PCIe, incl. API cost
NVLINK_LATENCY_S = 3e-6  # peer copy over NVLink: copy-engine start, sub-us wire latency

# Placeto's simulator constants for its K80 machine (per op; per transfer).
PLACETO_OP_OVERHEAD_S = 5.7e-6
PLACETO_LATENCY_S = 25e-6
PLACETO_BANDWIDTH_BYTES_PER_S = 7.6 * GB

# HSDAG-style desktop: system RAM (assumed) and the share an integrated GPU may allocate.
SYSTEM_RAM_BYTES = 32 * GIB
IGPU_SHARE_OF_RAM = 0.5  # Intel graphics driver default (assumed)
IGPU_COPY_LATENCY_S = 20e-6  # CPU <-> iGPU copy between OpenVINO plugins (assumed)


def pcie_bytes_per_s(transfers_per_s: float, lanes: int) -> float:
    """Raw per-direction PCIe 3.0+ bandwidth: 128b/130b encoding, one bit per transfer."""
    return transfers_per_s * lanes * (128 / 130) / 8


PCIE3_X16_BYTES_PER_S = pcie_bytes_per_s(8e9, 16)  # PCI-SIG PCIe 3.0: 8 GT/s per lane
PCIE5_X16_BYTES_PER_S = pcie_bytes_per_s(32e9, 16)  # PCI-SIG PCIe 5.0: 32 GT/s per lane
NVLINK4_BYTES_PER_S = 18 * 25 * GB  # H100 SXM: 18 NVLink 4 links x 25 GB/s per direction


def dram_bytes_per_s(channels: int, transfers_per_s: float) -> float:
    """Peak DRAM bandwidth: 64-bit (8-byte) channels."""
    return channels * 8 * transfers_per_s


# --------------------------------------------------------------------------- devices
def cpu(name: str, *, cores_flops_per_cycle_hz: list[tuple[int, int, float]],
        dram_channels: int, dram_transfers_per_s: float, memory_bytes: float) -> Device:
    """A CPU socket; peak FP32 = sum over core types of cores x FLOP/cycle x clock."""
    peak = sum(n * f * hz for n, f, hz in cores_flops_per_cycle_hz)
    return Device(name=name, kind="cpu", memory_bytes=memory_bytes, peak_flops_per_s=peak,
                  memory_bandwidth_bytes_per_s=dram_bytes_per_s(dram_channels,
                                                                dram_transfers_per_s),
                  overhead_s=CPU_OVERHEAD_S, efficiency=CPU_EFFICIENCY,
                  launch_s=CPU_LAUNCH_S, dispatch_s=CPU_DISPATCH_S,
                  fused_bytes_fraction=FUSED_BYTES_FRACTION,
                  class_overhead_s=FUSED_CLASS_OVERHEAD_S)


def gpu(name: str, *, fp32_lanes: int, clock_hz: float, memory_bandwidth_bytes_per_s: float,
        memory_bytes: float, overhead_s: float = GPU_OVERHEAD_S) -> Device:
    """A GPU; peak FP32 = FP32 lanes x 2 (FMA) x clock."""
    return Device(name=name, kind="gpu", memory_bytes=memory_bytes,
                  peak_flops_per_s=fp32_lanes * FMA_FLOPS * clock_hz,
                  memory_bandwidth_bytes_per_s=memory_bandwidth_bytes_per_s,
                  overhead_s=overhead_s, efficiency=GPU_EFFICIENCY,
                  launch_s=GPU_LAUNCH_S, dispatch_s=GPU_DISPATCH_S,
                  fused_bytes_fraction=FUSED_BYTES_FRACTION,
                  class_overhead_s=FUSED_CLASS_OVERHEAD_S)


# AVX2 with two 256-bit FMA units: 2 units x 8 FP32 lanes x 2 = 32 FLOP/cycle/core.
AVX2_FMA_FLOPS_PER_CYCLE = 2 * 8 * FMA_FLOPS
# AVX-512 with two 512-bit FMA units: 64 FP32 FLOP/cycle/core.
AVX512_FMA_FLOPS_PER_CYCLE = 2 * 16 * FMA_FLOPS
# Gracemont efficiency cores: two 128-bit FMA-capable pipes: 16 FP32 FLOP/cycle/core.
GRACEMONT_FLOPS_PER_CYCLE = 2 * 4 * FMA_FLOPS


def haswell_cpu() -> Device:
    # Intel Xeon E5-2699 v3 (Haswell-EP; 18 cores, 2.3 GHz base, 4 x DDR4-2133).
    return cpu("cpu:0", cores_flops_per_cycle_hz=[(18, AVX2_FMA_FLOPS_PER_CYCLE, 2.3e9)],
               dram_channels=4, dram_transfers_per_s=2133e6, memory_bytes=128 * GIB)


HASWELL_NOTES = [
    "Seed papers' machine: 'machines with 1 Intel Haswell 2300 CPU and up to 8 Nvidia Tesla "
    "K40 GPUs' (Mirhoseini et al., ICLR 2018, hardware section; ColocRL, ICML 2017, used "
    "1 CPU + 2/4 K40). 'Haswell 2300' with 18 cores is read as the Xeon E5-2699 v3.",
    "cpu:0 Intel Xeon E5-2699 v3 (Intel ARK): 18 cores, 2.3 GHz base, AVX2 with 2 FMA "
    "units -> 18 x 32 FLOP/cycle x 2.3 GHz = 1.3248 TFLOP/s FP32 peak (Intel's base-clock "
    "convention; sustained AVX clocks are lower, ~1.9 GHz, which the efficiency absorbs); "
    "4 channels DDR4-2133 -> 68.3 GB/s; 128 GiB of DRAM assumed (not stated in the papers).",
    "gpu:k NVIDIA Tesla K40 (NVIDIA Tesla K40 board specification / datasheet): 2880 CUDA "
    "cores at 745 MHz base -> 4.29 TFLOP/s FP32 peak (5.04 at the 875 MHz boost clock, not "
    "used); 288 GB/s GDDR5; 12 GiB (about 11.25 GiB usable with ECC on).",
    "Links: PCIe 3.0 x16 (PCI-SIG: 8 GT/s x 16 lanes, 128b/130b -> 15.75 GB/s per direction) "
    f"at {LINK_EFFICIENCY:.0%} -> 12.6 GB/s effective, {PCIE_LATENCY_S / US:.0f} us per "
    "transfer. GPU-GPU copies are modelled as peer-to-peer DMA over PCIe (GPUs behind PCIe "
    "switches of the one-socket host) at the same rate; a copy staged through host memory "
    "would take about twice as long.",
]


def k40(k: int) -> Device:
    return gpu(f"gpu:{k}", fp32_lanes=2880, clock_hz=745e6,
               memory_bandwidth_bytes_per_s=288 * GB, memory_bytes=12 * GIB)


def haswell_k40(num_gpus: int) -> CostModel:
    devices = [haswell_cpu()] + [k40(k) for k in range(num_gpus)]
    return CostModel.from_devices(
        f"haswell_k40x{num_gpus}", devices, PCIE_LATENCY_S,
        PCIE3_X16_BYTES_PER_S * LINK_EFFICIENCY,
        put_s=PUT_HOST_S, provenance=_provenance(HASWELL_NOTES))


def placeto_k80x2() -> CostModel:
    # Each Tesla K80 board carries two GK210 GPUs, which CUDA and TensorFlow see as two
    # devices; this model has two of those devices (one board) plus the host CPU.
    devices = [haswell_cpu()] + [
        gpu(f"gpu:{k}", fp32_lanes=2496, clock_hz=560e6, memory_bandwidth_bytes_per_s=240 * GB,
            memory_bytes=12 * GIB, overhead_s=PLACETO_OP_OVERHEAD_S) for k in range(2)]
    return CostModel.from_devices(
        "placeto_k80x2", devices, PLACETO_LATENCY_S, PLACETO_BANDWIDTH_BYTES_PER_S,
        put_s=PUT_HOST_S, provenance=_provenance([
            "Placeto (Addanki et al., NeurIPS 2019) trained against a simulator hand-tuned "
            "for one K80 machine: 5.7 us per op, 7.6 GB/s + 25 us per transfer (figures as "
            "recorded in simplace's background.md). Those constants are used here for the "
            "per-op overhead of the GPUs and for every link.",
            "gpu:0, gpu:1: the two GK210 GPUs of one NVIDIA Tesla K80 board (NVIDIA Tesla "
            "K80 datasheet: per GPU 2496 CUDA cores, 560 MHz base -> 2.80 TFLOP/s FP32 peak, "
            "4.37 at the 875 MHz boost, not used; 240 GB/s GDDR5; 12 GiB). 'k80x2' counts "
            "GPUs as the framework sees them; two whole boards would be 4 such devices.",
            "cpu:0: the host CPU is not stated; assumed the seed papers' Haswell Xeon "
            "E5-2699 v3 (18 cores, 2.3 GHz, AVX2 -> 1.3248 TFLOP/s FP32; 4 x DDR4-2133 -> "
            "68.3 GB/s; 128 GiB assumed).",
        ]))


def hsdag_cpu_gpu() -> CostModel:
    # Intel Core i9-12900K: 8 Golden Cove P-cores (AVX2, 2 FMA units; 3.2 GHz base) and
    # 8 Gracemont E-cores (2.4 GHz base); dual-channel DDR5-4800.
    host = cpu("cpu:0", cores_flops_per_cycle_hz=[(8, AVX2_FMA_FLOPS_PER_CYCLE, 3.2e9),
                                                  (8, GRACEMONT_FLOPS_PER_CYCLE, 2.4e9)],
               dram_channels=2, dram_transfers_per_s=4800e6, memory_bytes=SYSTEM_RAM_BYTES)
    # Intel UHD Graphics 770 (Xe-LP, 32 EUs x 8 FP32 lanes, 1.55 GHz max); it has no memory
    # of its own and reads the same DDR5 as the CPU.
    igpu = gpu("gpu:0", fp32_lanes=32 * 8, clock_hz=1.55e9,
               memory_bandwidth_bytes_per_s=host.memory_bandwidth_bytes_per_s,
               memory_bytes=SYSTEM_RAM_BYTES * IGPU_SHARE_OF_RAM, overhead_s=IGPU_OVERHEAD_S)
    # A CPU <-> iGPU copy reads and writes the same DRAM: at most half its bandwidth.
    copy_bw = host.memory_bandwidth_bytes_per_s / 2 * LINK_EFFICIENCY
    return CostModel.from_devices(
        "hsdag_cpu_gpu", [host, igpu], IGPU_COPY_LATENCY_S, copy_bw,
        put_s=PUT_HOST_S, provenance=_provenance([
            "HSDAG (Duan et al., NeurIPS 2024) placed OpenVINO inference graphs on an Intel "
            "CPU + GPU pair. The exact parts were not checked; this models a typical such "
            "machine: an Intel Core i9-12900K with its integrated Intel UHD Graphics 770.",
            "cpu:0 Intel Core i9-12900K (Intel ARK): 8 P-cores at 3.2 GHz base with AVX2 "
            "(32 FLOP/cycle) + 8 E-cores at 2.4 GHz base (16 FLOP/cycle) -> 1.1264 TFLOP/s "
            "FP32 peak; dual-channel DDR5-4800 -> 76.8 GB/s; 32 GiB of DRAM assumed.",
            "gpu:0 Intel UHD Graphics 770 (Intel ARK / Xe-LP architecture): 32 EUs x 8 FP32 "
            "lanes x 2 (FMA) x 1.55 GHz max -> 0.7936 TFLOP/s FP32; no local memory: it "
            "shares the 76.8 GB/s DDR5 with the CPU (contention is not modelled) and may "
            f"allocate up to {IGPU_SHARE_OF_RAM:.0%} of system RAM (driver default, assumed). "
            "FP32 rate used; OpenVINO's GPU plugin infers in FP16 by default, at twice it.",
            "Link cpu:0 <-> gpu:0: a copy inside the shared DRAM reads and writes each byte: "
            f"76.8 / 2 GB/s at {LINK_EFFICIENCY:.0%} -> 30.7 GB/s; "
            f"{IGPU_COPY_LATENCY_S / US:.0f} us per copy (enqueue + synchronisation between "
            "OpenVINO's CPU and GPU plugins; assumed).",
        ]))


def sapphire_rapids_cpu() -> Device:
    # Intel Xeon Platinum 8480+ (Sapphire Rapids; 56 cores, 2.0 GHz base, AVX-512 with two
    # FMA units, 8 x DDR5-4800), a typical host of H100 servers.
    return cpu("cpu:0", cores_flops_per_cycle_hz=[(56, AVX512_FMA_FLOPS_PER_CYCLE, 2.0e9)],
               dram_channels=8, dram_transfers_per_s=4800e6, memory_bytes=512 * GIB)


SAPPHIRE_RAPIDS_NOTE = (
    "cpu:0 Intel Xeon Platinum 8480+ (Intel ARK): 56 cores at 2.0 GHz base, AVX-512 with 2 "
    "FMA units (64 FP32 FLOP/cycle) -> 7.168 TFLOP/s FP32 peak (AMX not used for FP32); "
    "8 channels DDR5-4800 -> 307.2 GB/s; 512 GiB of DRAM assumed. One socket is modelled.")
H100_PEAK_NOTE = (
    "Peak used for H100s is the FP32 non-tensor-core rate. JAX's default matmul precision "
    "may use TF32 tensor cores on Hopper (378 TFLOP/s dense on PCIe, 495 on SXM), which "
    "would make matmuls several times faster than modelled; a measured model settles it.")


def cpu_h100_pcie() -> CostModel:
    devices = [sapphire_rapids_cpu(),
               # H100 PCIe: 114 SMs x 128 FP32 lanes = 14592, 1.755 GHz boost.
               gpu("gpu:0", fp32_lanes=14592, clock_hz=1.755e9,
                   memory_bandwidth_bytes_per_s=2.0e12, memory_bytes=80 * GIB,
                   overhead_s=H100_OVERHEAD_S)]
    return CostModel.from_devices(
        "cpu_h100_pcie", devices, PCIE_LATENCY_S, PCIE5_X16_BYTES_PER_S * LINK_EFFICIENCY,
        put_s=PUT_HOST_S, provenance=_provenance([
            SAPPHIRE_RAPIDS_NOTE,
            "gpu:0 NVIDIA H100 PCIe (NVIDIA H100 datasheet / Hopper whitepaper): 114 SMs x "
            "128 FP32 lanes x 2 x 1.755 GHz boost -> 51.2 TFLOP/s FP32; 2.0 TB/s HBM2e; "
            "80 GB (modelled as 80 GiB).",
            H100_PEAK_NOTE,
            "Link: PCIe 5.0 x16 (PCI-SIG: 32 GT/s x 16 lanes, 128b/130b -> 63.0 GB/s per "
            f"direction) at {LINK_EFFICIENCY:.0%} -> 50.4 GB/s effective, "
            f"{PCIE_LATENCY_S / US:.0f} us per transfer.",
        ]))


def cpu_h100x4_nvlink() -> CostModel:
    host = sapphire_rapids_cpu()
    # H100 SXM5: 132 SMs x 128 FP32 lanes = 16896, 1.98 GHz boost.
    gpus = [gpu(f"gpu:{k}", fp32_lanes=16896, clock_hz=1.98e9,
                memory_bandwidth_bytes_per_s=3.35e12, memory_bytes=80 * GIB,
                overhead_s=H100_OVERHEAD_S) for k in range(4)]
    d = 1 + len(gpus)
    lat = [[PCIE_LATENCY_S] * d for _ in range(d)]
    bw = [[PCIE5_X16_BYTES_PER_S * LINK_EFFICIENCY] * d for _ in range(d)]
    for i in range(1, d):
        for j in range(1, d):
            lat[i][j] = NVLINK_LATENCY_S
            bw[i][j] = NVLINK4_BYTES_PER_S * LINK_EFFICIENCY
    return CostModel.from_devices(
        "cpu_h100x4_nvlink", [host] + gpus, lat, bw,
        put_s=PUT_HOST_S, provenance=_provenance([
            SAPPHIRE_RAPIDS_NOTE,
            "gpu:0-3 NVIDIA H100 SXM5 80GB (NVIDIA H100 datasheet / Hopper whitepaper): 132 "
            "SMs x 128 FP32 lanes x 2 x 1.98 GHz boost -> 66.9 TFLOP/s FP32; 3.35 TB/s HBM3; "
            "80 GB (modelled as 80 GiB).",
            H100_PEAK_NOTE,
            "GPU-GPU links: NVLink 4, 18 links x 25 GB/s = 450 GB/s per direction per GPU "
            "(NVIDIA H100 datasheet: 900 GB/s bidirectional). Assumed: the four GPUs sit on "
            "an NVSwitch board (4 of an HGX H100 8-GPU), so any pair may use the full rate, "
            f"at {LINK_EFFICIENCY:.0%} -> 360 GB/s per ordered pair, "
            f"{NVLINK_LATENCY_S / US:.0f} us per transfer. Concurrent sends from one GPU to "
            "several peers really share the 450 GB/s; the simulator treats each ordered pair "
            "as its own link. (A 4-GPU HGX board without NVSwitch wires 6 links per pair: "
            "150 GB/s.)",
            "CPU-GPU links: PCIe 5.0 x16 (PCI-SIG: 63.0 GB/s per direction) at "
            f"{LINK_EFFICIENCY:.0%} -> 50.4 GB/s, {PCIE_LATENCY_S / US:.0f} us per transfer.",
        ]))


COMMON_NOTES = [
    "Datasheet model written by cost_models/make_datasheets.py: figures from the cited "
    "public specifications (recalled, not re-read in the session that wrote them; the "
    "arithmetic is in the script) and the stated assumptions; not measured.",
    "Efficiency (fraction of the roofline per op class) assumed, not fitted: GPU "
    + ", ".join(f"{k} {v}" for k, v in GPU_EFFICIENCY.items()) + "; CPU "
    + ", ".join(f"{k} {v}" for k, v in CPU_EFFICIENCY.items())
    + ". Free ops (reshape, broadcast...) cost 0. See cost_models/README.md.",
    f"Per-op overhead assumed: CPU {CPU_OVERHEAD_S / US:g} us (dispatch), Kepler GPUs "
    f"{GPU_OVERHEAD_S / US:g} us (kernel launch), H100 {H100_OVERHEAD_S / US:g} us, Intel "
    f"iGPU {IGPU_OVERHEAD_S / US:g} us, unless a note above says otherwise.",
    f"Link bandwidth = raw per-direction rate x {LINK_EFFICIENCY} (protocol and DMA "
    "overhead), unless a note above says otherwise.",
]


def _provenance(notes: list[str]) -> Provenance:
    return Provenance(source="datasheet", host="", date=DATE, notes=tuple(notes + COMMON_NOTES))


def build_all() -> dict[str, CostModel]:
    """Every datasheet model, by name."""
    models = [haswell_k40(2), haswell_k40(4), haswell_k40(8), placeto_k80x2(),
              hsdag_cpu_gpu(), cpu_h100_pcie(), cpu_h100x4_nvlink()]
    return {m.name: m for m in models}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the committed files instead of writing them")
    parser.add_argument("--out", type=Path, default=MACHINES,
                        help="directory to write into (default: simplace/machines/)")
    args = parser.parse_args(argv)
    stale = []
    for name, model in build_all().items():
        path = args.out / f"{name}.json"
        if args.check:
            if not path.is_file() or CostModel.load(path) != model:
                stale.append(name)
        else:
            model.save(path)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python {Path(__file__).name}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
