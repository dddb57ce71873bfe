"""Per shape, what a kernel engineer reads off a winner: its ratio to cuBLAS, where it sits on the
device's roofline (tunefw/measure/roofline.py), and what its launch asks of an SM."""
from __future__ import annotations

from dataclasses import dataclass

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.report.data import ProblemReport
from tunefw.measure.roofline import figures, roofline
from tunefw.runtime.dispatch import DEFAULT_MIN_RATIO
from tunefw.templates import FAMILIES


@dataclass(frozen=True)
class Ceiling:
    """One roofline ceiling: a bandwidth (GB/s) or a compute rate (TFLOP/s), and its source."""

    name: str
    value: float
    unit: str  # 'GB/s' or 'TFLOP/s'
    source: str  # 'measured' or 'declared'

    @property
    def label(self) -> str:
        return f"{self.name} {self.value:g} {self.unit} ({self.source})"


def ceilings(device: DeviceSpec) -> list[Ceiling]:
    """The device's ceilings: the measured streaming read where known, the datasheet HBM
    bandwidth, the dense tensor-core rate (bf16 and fp16 share it on the known devices)."""
    out = []
    if device.stream_read_gbs:
        out.append(Ceiling("streaming read", device.stream_read_gbs, "GB/s", "measured"))
    if device.mem_bandwidth_gbs:
        out.append(Ceiling("HBM", device.mem_bandwidth_gbs, "GB/s", "declared"))
    out.append(Ceiling("dense bf16/fp16", device.peak_tflops_bf16, "TFLOP/s", "declared"))
    return out


def roof_basis(device: DeviceSpec) -> str:
    """Which bandwidth the fraction of roofline is taken against (roofline.roofline's choice)."""
    return "measured streaming read" if device.stream_read_gbs else "declared HBM bandwidth"


@dataclass(frozen=True)
class ShapeRoof:
    """A problem on the device's roofline and its best config's place under it."""

    intensity: float  # FLOP per byte of the fewest bytes the GEMM moves (A, B, C once)
    bound: str  # 'memory' or 'compute'
    attainable_tflops: float  # the roofline at this intensity
    tbs: float | None  # the best config's effective TB/s over those bytes
    fraction: float | None  # best TFLOP/s over the attainable
    cublas_fraction: float | None


def shape_roof(problem: GemmProblem, device: DeviceSpec, tflops: float | None,
               cublas_tflops: float | None) -> ShapeRoof:
    """Roofline figures of one problem's best and of cuBLAS beside it."""
    roof = roofline(problem, device)
    attainable = problem.flops / (max(roof.memory_us, roof.compute_us) * 1e6)
    read_tbs = (device.stream_read_gbs or device.mem_bandwidth_gbs) / 1e3
    tbs = figures(problem, tflops, read_tbs)["tbs"]
    return ShapeRoof(roof.intensity, roof.bound, attainable, tbs,
                     tflops / attainable if tflops else None,
                     cublas_tflops / attainable if cublas_tflops else None)


@dataclass(frozen=True)
class LaunchFacts:
    """What one block of a config asks for: the launch plan's CTAs, threads and dynamic shared
    memory, and the family's register estimate (ptxas's figures are the trial's: stored with
    its row)."""

    ctas: int
    threads: int
    regs_estimate: int
    dynamic_smem: int


def launch_facts(family: str, config: dict, problem: GemmProblem,
                 device: DeviceSpec) -> LaunchFacts | None:
    """The launch facts of a stored config, or None where its family or space changed since."""
    tpl = FAMILIES.get(family)
    if tpl is None or tpl.space_reason(config) is not None:
        return None
    plan = tpl.launch(config, problem, device)
    res = tpl.estimate(config)
    gx, gy, gz = plan.grid
    bx, by, bz = plan.block
    return LaunchFacts(gx * gy * gz, bx * by * bz, res.regs_per_thread, plan.smem_bytes)


def ratio_of(p: ProblemReport) -> float | None:
    """The problem's best ratio to cuBLAS (None: nothing OK yet, or no cuBLAS figure)."""
    return (p.best or {}).get("ratio")


def is_loss(ratio: float | None) -> bool:
    """Slower than cuBLAS: below the ratio under which `tunefw export` routes a shape to cuBLAS
    by default."""
    return ratio is not None and ratio < DEFAULT_MIN_RATIO


def verdict(ratio: float | None) -> str | None:
    """'LOSS' (slower than cuBLAS), 'parity' (exactly as fast) or 'win'; None without a ratio."""
    if ratio is None:
        return None
    return "LOSS" if is_loss(ratio) else ("parity" if ratio == DEFAULT_MIN_RATIO else "win")
