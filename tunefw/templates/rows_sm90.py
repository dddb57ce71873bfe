"""rows_sm90: the decode GEMM (small M) of kernel_templates/rows_sm90.cuh that streams whole
rows of the weight with 1D bulk copies over a persistent grid.

Each CTA owns an equal, contiguous share of B's rows (one contiguous block of memory);
a producer thread copies RS whole rows per ring stage in COPY-byte pieces, WARPS consumer warps
split K with mma.sync (the tokens on the MMA's 16-row side) and sum their tiles in a fixed order
per stage: deterministic, no workspace. A stage holds RS * K * 2 bytes, so the ring's size
depends on K: check() takes the problem's K into every shared-memory rule. This file is the one
declaration of its space, its rules and its launch.
"""
from __future__ import annotations

import ctypes
from typing import Any, Mapping

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.templates.base import (Config, CostHint, KernelTemplate, Launch, Param, Resources,
                                   ptxas_register_cap)
from tunefw.templates.skinny_sm90 import SWAPAB_HEADERS

# Register estimate, fitted to ptxas on sm_90a (tests/test_rows_sm90.py compiles a sample to hold
# it: no accepted config spills): ptxas keeps about 16 registers per 64-k pair a warp holds
# (A of two blocks plus the shared loads it hoists), 4 more per pair for A's rows 8..15.
REG_OVERHEAD = 24
REFERENCE_K = 4096  # the K estimate() sizes the ring for (the ring scales with K)
SM_RESERVED_SMEM = 1024  # per CTA, kept by the driver (the per-SM sum includes it)

# Starting points, KP aside (the H200 streaming microbenchmark: 32 KB copies, 64-192 KB in flight per SM).
SEED_SHAPES = (
    {"RS": 8, "STAGES": 3, "WARPS": 8, "MROWS": 8, "OCC": 1, "COPY": 32768},
    {"RS": 8, "STAGES": 2, "WARPS": 8, "MROWS": 8, "OCC": 1, "COPY": 32768},
    {"RS": 8, "STAGES": 3, "WARPS": 16, "MROWS": 16, "OCC": 1, "COPY": 32768},
    {"RS": 8, "STAGES": 2, "WARPS": 8, "MROWS": 16, "OCC": 1, "COPY": 16384},
    {"RS": 16, "STAGES": 2, "WARPS": 8, "MROWS": 8, "OCC": 1, "COPY": 65536},
    {"RS": 8, "STAGES": 2, "WARPS": 4, "MROWS": 8, "OCC": 2, "COPY": 16384},
    {"RS": 4, "STAGES": 6, "WARPS": 16, "MROWS": 8, "OCC": 1, "COPY": 32768},
    {"RS": 4, "STAGES": 4, "WARPS": 16, "MROWS": 8, "OCC": 1, "COPY": 16384},
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class RowsSm90(KernelTemplate):
    family = "rows_sm90"
    source = "rows_sm90.cuh"
    headers = SWAPAB_HEADERS
    kernel = "gemm_rows_sm90"
    min_cc = 90  # cp.async.bulk with mbarrier transaction counts
    tensor_op = "HMMA"
    programmatic_launch = True  # pdl_wait() before any global memory access

    params = (
        Param("RS", (8, 4, 16, 32), "whole rows of B per ring stage (RS*K*2 bytes); an 8-row "
              "group of the MMA spans 8/RS stages when RS = 4"),
        Param("STAGES", (3, 2, 4, 6), "ring stages in flight"),
        Param("WARPS", (8, 4, 16), "consumer warps (plus one producer warp); they take the "
              "stage's 64-k pairs of blocks in turn"),
        Param("KP", (4, 2, 3, 5, 6, 8), "64-k pairs per consumer warp (ceil(K/64/WARPS) exactly); "
              "their A stays in registers across the stages"),
        Param("MROWS", (8, 16), "rows of A the MMA's 16-row side carries: serves M <= MROWS"),
        Param("OCC", (1, 2), "CTAs per SM of the persistent grid (grid = OCC * SMs, or fewer)"),
        Param("COPY", (32768, 16384, 65536), "bytes per bulk copy (a stage is copied in pieces)"),
    )

    # each seed at every KP: check() keeps the one K and WARPS call for
    seeds = tuple({**shape, "KP": kp} for kp in (2, 3, 4, 5, 6, 8) for shape in SEED_SHAPES)

    # ---- derived quantities ---------------------------------------------------------------------
    @staticmethod
    def smem_bytes(config: Config, k: int = REFERENCE_K) -> int:
        """Dynamic shared memory at this K: the ring (STAGES * RS rows of K*2 bytes), the warps'
        partial tiles (two buffers) and the mbarriers (as the .cuh lays them out)."""
        ring = config["STAGES"] * config["RS"] * k * 2
        groups = max(1, config["RS"] // 8)  # 8-row groups per consumer step
        partials = 2 * config["WARPS"] * groups * 32 * 2 * (config["MROWS"] // 8) * 4
        return ring + partials + 16 * config["STAGES"]

    @staticmethod
    def regs_estimate(config: Config) -> int:
        groups, mt, kp = max(1, config["RS"] // 8), config["MROWS"] // 8, config["KP"]
        return groups * 4 + 16 * kp + 4 * kp * (mt - 1) + REG_OVERHEAD

    def estimate(self, config: Config) -> Resources:
        """Threads, registers and shared memory of one block, the ring sized for K=4096."""
        return Resources(threads=(config["WARPS"] + 1) * 32,
                         regs_per_thread=self.regs_estimate(config),
                         smem_bytes=self.smem_bytes(config))

    # ---- rules ----------------------------------------------------------------------------------
    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        m, n, k = problem.M, problem.N, problem.K
        mrows = config["MROWS"]
        if m > mrows:
            return f"MROWS={mrows} holds M <= {mrows} rows, the problem has M={m}"
        if mrows == 16 and m <= 8:
            return f"MROWS=16 for M={m} <= 8: loads of A rows that do not exist (MROWS=8 serves it)"
        if k % 8:
            return f"K={k} is not a multiple of 8 (rows of B are copied in 16-byte units)"
        if config["RS"] - 8 >= n:
            return f"RS={config['RS']} leaves a whole 8-row group past N={n}"
        if config["COPY"] > config["RS"] * k * 2:
            return (f"COPY={config['COPY']} > a stage's RS*K*2 = {config['RS'] * k * 2} bytes "
                    "(a smaller COPY copies it the same way)")
        pairs, warps = _cdiv(k, 64), config["WARPS"]
        if pairs < warps:
            return f"WARPS={warps} > the {pairs} 64-k pairs of K={k}: warps without work"
        if config["KP"] != _cdiv(pairs, warps):
            return (f"KP={config['KP']}: the {pairs} 64-k pairs of K={k} over WARPS={warps} are "
                    f"{_cdiv(pairs, warps)} per warp")
        if config["RS"] < 8 and config["KP"] > 4:
            return (f"RS={config['RS']} with KP={config['KP']} > 4: the two stages of a group "
                    "beside the A it holds spill on sm_90a (seen with KP=8)")
        smem = self.smem_bytes(config, k)
        if smem > device.smem_per_block_optin:
            return (f"shared memory STAGES*RS*K*2 + partials = {smem} B at K={k} > "
                    f"{device.smem_per_block_optin} B per block on {device.name}")
        occ = config["OCC"]
        threads, regs = (config["WARPS"] + 1) * 32, self.regs_estimate(config)
        cap = ptxas_register_cap(device, threads, occ)
        if regs > cap:
            return (f"register estimate {regs}/thread (RS/8*4 accumulators, ~16 per 64-k pair "
                    f"of KP={config['KP']}) > the {cap} that OCC={occ} CTAs of {threads} threads "
                    "allow: it would spill")
        if occ * (smem + SM_RESERVED_SMEM) > device.smem_per_sm:
            return (f"OCC={occ} CTAs x {smem} B of shared memory (K={k}) > {device.smem_per_sm} B "
                    "per SM")
        return None

    # ---- compile and launch ---------------------------------------------------------------------
    def cost_hint(self, config: Config) -> CostHint:
        """The simulated device's view: M rows against RS-row stages of the whole K."""
        return CostHint(tile_m=config["MROWS"], tile_n=config["RS"], tile_k=64,
                        stages=config["STAGES"], efficiency=0.4)

    def launch(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> Launch:
        grid = min(_cdiv(problem.N, 8), config["OCC"] * device.sm_count)
        return Launch(grid=(grid, 1, 1), block=((config["WARPS"] + 1) * 32, 1, 1),
                      smem_bytes=self.smem_bytes(config, problem.K))

    def kernel_args(self, config: Config, problem: GemmProblem,
                    ptrs: Mapping[str, int]) -> list[tuple[Any, Any]]:
        return [(int(ptrs["a"]), ctypes.c_void_p), (int(ptrs["b"]), ctypes.c_void_p),
                (int(ptrs["c"]), ctypes.c_void_p), (int(ptrs.get("bias", 0) or 0), ctypes.c_void_p),
                (problem.M, ctypes.c_int), (problem.N, ctypes.c_int), (problem.K, ctypes.c_int)]
