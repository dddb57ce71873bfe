"""Rooflines: what a GEMM must move and compute, which of the two limits it on a device, and how
close a measured time comes to that limit (the streaming-read bandwidth measured on the GPU)."""
from __future__ import annotations

from dataclasses import dataclass

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem


@dataclass(frozen=True)
class Roofline:
    """A problem on a device: bytes (A, B and C once), FLOPs, and the time each ceiling allows."""

    bytes: int
    flops: int
    memory_us: float  # bytes at the device's streaming-read bandwidth
    compute_us: float  # FLOPs at its dense bf16/fp16 tensor rate

    @property
    def bound(self) -> str:
        """'memory' or 'compute': which ceiling sets the shortest possible time."""
        return "memory" if self.memory_us >= self.compute_us else "compute"

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.bytes


def roofline(problem: GemmProblem, device: DeviceSpec) -> Roofline:
    """The problem's roofline on ``device`` (its measured read bandwidth where known)."""
    gbs = device.stream_read_gbs or device.mem_bandwidth_gbs
    return Roofline(problem.min_bytes, problem.flops, problem.min_bytes / (gbs * 1e3),
                    problem.flops / (device.peak_tflops_bf16 * 1e6))


def figures(problem: GemmProblem, tflops: float | None, read_tbs: float) -> dict:
    """Roofline fields of a measured result: bytes, effective TB/s and its share of ``read_tbs``."""
    out: dict = {"bytes": problem.min_bytes, "tbs": None, "frac_of_read": None}
    if tflops:
        seconds = problem.flops / (tflops * 1e12)
        out["tbs"] = problem.min_bytes / seconds / 1e12
        out["frac_of_read"] = out["tbs"] / read_tbs
    return out


def stream_read_tbs(gib: float = 4.0, repeats: int = 10) -> dict:
    """Best and median TB/s of reading ``gib`` GiB on cuda:0 (a float32 sum), and of a copy:
    the bandwidth a memory-bound GEMM is read against, measured in the run that reports it."""
    import torch

    x = torch.ones(int(gib * 2**30 // 4), dtype=torch.float32, device="cuda")
    y = torch.empty_like(x)
    reads, copies = [], []
    for _ in range(repeats):
        for fn, acc, nbytes in ((lambda: x.sum(), reads, x.numel() * 4),
                                (lambda: y.copy_(x), copies, 2 * x.numel() * 4)):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            acc.append(nbytes / (start.elapsed_time(end) * 1e-3) / 1e12)
    x = y = None  # free the 8 GiB before returning the cache to the driver
    torch.cuda.empty_cache()
    reads.sort()
    copies.sort()
    return {"bytes": int(gib * 2**30), "read_tbs_best": reads[-1],
            "read_tbs_median": reads[len(reads) // 2], "copy_tbs_best": copies[-1]}
