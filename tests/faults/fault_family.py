"""Kernel families built to fail: runtime faults (FaultFamily), a compile error, an endless compile.

Their sources live beside this file: compile them with ``source_dir=FAULT_DIR``, or name this
file to `tunefw verify --families` (its FAMILIES, at the end).
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, Mapping

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.templates.base import Config, KernelTemplate, Launch, Param, Resources

FAULT_DIR = Path(__file__).resolve().parent
FAULTS = ("none", "oob_write", "endless_loop", "wrong_result", "unwritten", "too_much_smem", "spill",
          "outside_c", "writes_input", "first_launch_only", "nondeterministic", "splitk_dirty",
          "reads_past_b")
# What the evaluator and strict verification (tunefw/evaluate/strict.py) make of each fault.
EXPECTED = {"none": "OK", "oob_write": "RUNTIME_CRASH", "endless_loop": "TIMEOUT",
            "wrong_result": "WRONG_ANSWER", "unwritten": "WRONG_ANSWER",
            "too_much_smem": "OUT_OF_RESOURCES", "spill": "OK",
            "outside_c": "WRONG_ANSWER", "writes_input": "WRONG_ANSWER",
            "first_launch_only": "WRONG_ANSWER", "nondeterministic": "WRONG_ANSWER",
            "splitk_dirty": "WRONG_ANSWER", "reads_past_b": "WRONG_ANSWER"}
COUNTER_BYTES = 256  # first_launch_only's launch counter (never reset); splitk_dirty's counters
SPLITS = 4  # splitk_dirty: CTAs per tile of C, each over a quarter of K
DTYPE_CODE = {"bf16": 0, "fp16": 1}
TILE = 16
TOO_MUCH_SMEM_BYTES = 300 * 1024  # over every GPU's per-block opt-in limit (H200: 227 KB)


class FaultFamily(KernelTemplate):
    """A naive GEMM (fault='none' is correct) and its deliberately broken variants."""

    family = "fault"
    source = "fault_gemm.cuh"
    headers = ("include/faults/convert.cuh",)
    kernel = "fault_gemm"
    min_cc = 80
    params = (Param("fault", FAULTS, "which failure the kernel commits"),)

    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        if config["fault"] == "spill" and problem.K % 64:
            return f"fault=spill needs K % 64 == 0 (K={problem.K})"
        return None

    def estimate(self, config: Config) -> Resources:
        smem = TOO_MUCH_SMEM_BYTES if config["fault"] == "too_much_smem" else 0
        return Resources(threads=TILE * TILE, regs_per_thread=32, smem_bytes=smem)

    def template_args(self, config: Config, dtype: str, gate: str = "none") -> list[str]:
        return [str(FAULTS.index(config["fault"])), str(DTYPE_CODE[dtype])]

    def launch(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> Launch:
        tiles_n, tiles_m = (problem.N + TILE - 1) // TILE, (problem.M + TILE - 1) // TILE
        splitk = config["fault"] == "splitk_dirty"
        return Launch(grid=(tiles_n, tiles_m, SPLITS if splitk else 1), block=(TILE, TILE, 1),
                      smem_bytes=self.estimate(config).smem_bytes,
                      workspace_bytes=self.workspace_bytes(config, problem))

    @staticmethod
    def workspace_bytes(config: Config, problem: GemmProblem) -> int:
        """first_launch_only: one counter; splitk_dirty: a counter per tile of C (padded to
        COUNTER_BYTES) and SPLITS float32 partial sums per element of C."""
        if config["fault"] == "first_launch_only":
            return COUNTER_BYTES
        if config["fault"] != "splitk_dirty":
            return 0
        tiles = ((problem.N + TILE - 1) // TILE) * ((problem.M + TILE - 1) // TILE)
        counters = -(-tiles * 4 // COUNTER_BYTES) * COUNTER_BYTES
        return counters + SPLITS * problem.M * problem.N * 4

    def kernel_args(self, config: Config, problem: GemmProblem,
                    ptrs: Mapping[str, int]) -> list[tuple[Any, Any]]:
        return [(ptrs["a"], ctypes.c_void_p), (ptrs["b"], ctypes.c_void_p),
                (ptrs["c"], ctypes.c_void_p), (ptrs.get("workspace") or 0, ctypes.c_void_p),
                (problem.M, ctypes.c_int),
                (problem.N, ctypes.c_int), (problem.K, ctypes.c_int)]


class _CompileOnly(KernelTemplate):
    """A one-parameter template that is only ever compiled, never launched."""

    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        return None

    def template_args(self, config: Config, dtype: str, gate: str = "none") -> list[str]:
        return [str(config["x"])]


class BrokenTemplate(_CompileOnly):
    """Does not compile: an undeclared identifier."""

    family = "broken"
    source = "broken.cuh"
    kernel = "broken_kernel"
    params = (Param("x", (1, 2), "anything"),)


class HangingCompileTemplate(_CompileOnly):
    """Compiles for minutes to hours: 2^x template instantiations (x=30 never ends in practice)."""

    family = "compile_hang"
    source = "compile_hang.cuh"
    kernel = "compile_hang"
    params = (Param("x", (4, 30), "depth of the instantiation tree"),)


# What `tunefw verify --families tests/faults/fault_family.py` can verify by name.
FAMILIES = (FaultFamily(), BrokenTemplate(), HangingCompileTemplate())
