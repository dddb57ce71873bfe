"""skinny_sm90: the bandwidth-bound decode GEMM (small M) of kernel_templates/skinny_sm90.cuh.

Streams the weight B into registers with 16-byte loads, computes C^T = B A^T with mma.sync
(swap-AB: M is the MMA's 8-wide side), splits K over the warps of a CTA and over a thread-block
cluster, and reduces in shared memory and DSMEM in a fixed order (deterministic, no workspace).
This file is the one declaration of its space, its rules and its launch.
"""
from __future__ import annotations

import ctypes
from typing import Any, Mapping

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.templates.base import Config, CostHint, KernelTemplate, Launch, Param, Resources

# Register estimate: accumulators + the PF steps of loads in flight + REG_OVERHEAD (indices,
# pointers, predicates). ptxas needs up to ~25% more than this (row pointers, the DSMEM
# epilogue), so a config must estimate under REG_MARGIN of the registers its OCC CTAs per SM
# allow, else it spills (tests/test_skinny_sm90.py compiles a sample to hold this).
REG_OVERHEAD = 40
REG_MARGIN = 0.8
MAX_CLUSTER = 16  # H100/H200 allow 16 CTAs with the non-portable cluster attribute


# Starting points: enough loads in flight per SM for HBM (Little's law: ~32-64 KB per SM)
# at 1-2 CTAs per SM, from few warps with deep rings to many with shallow ones. Each is
# offered at every MTILES; check() keeps the one that fits the problem's M.
SEED_SHAPES = (
    {"BN": 32, "KV": 2, "PF": 2, "WARPS": 4, "CK": 2},
    {"BN": 16, "KV": 4, "PF": 2, "WARPS": 8, "CK": 4},
    {"BN": 64, "KV": 1, "PF": 4, "WARPS": 4, "CK": 1},
    {"BN": 32, "KV": 2, "PF": 3, "WARPS": 8, "CK": 1, "L2PF": 2},
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def m_tiles_needed(m: int) -> int:
    """n8 tiles that hold M rows of A."""
    return _cdiv(m, 8)


def swap_ab_tile_reason(config: Config, problem: GemmProblem) -> str | None:
    """The tile rules of the swap-AB decode families (skinny_sm90, stream_sm90): MTILES n8 tiles
    must hold M, and not twice over; BN must not leave a whole 16-row tile past N."""
    mt, need = config["MTILES"], m_tiles_needed(problem.M)
    if mt < need:
        return f"MTILES={mt} holds M <= {8 * mt} rows, the problem has M={problem.M}"
    if mt > 2 * need:
        return (f"MTILES={mt} is more than twice the {need} tile(s) M={problem.M} needs "
                "(registers, shared memory and MMAs for rows that do not exist)")
    if config["BN"] - 16 >= problem.N:
        return f"BN={config['BN']} leaves a whole 16-row tile past N={problem.N}"
    return None


# The headers of the swap-AB decode families (skinny, stream, rows): their shared epilogue and
# what it includes.
SWAPAB_HEADERS = ("include/tunefw/sm80.cuh", "include/tunefw/sm90.cuh",
                  "include/tunefw/swapab_reduce.cuh", "include/tunefw/gate.cuh")


class SkinnySm90(KernelTemplate):
    family = "skinny_sm90"
    source = "skinny_sm90.cuh"
    headers = SWAPAB_HEADERS
    kernel = "gemm_skinny_sm90"
    min_cc = 90  # thread-block clusters and DSMEM
    tensor_op = "HMMA"
    programmatic_launch = True  # pdl_wait() before any global memory access

    params = (
        Param("BN", (32, 16, 64), "rows of B (columns of C) per CTA, in 16-row MMA tiles"),
        Param("MTILES", (2, 1, 3, 4, 6, 8),
              "8-row MMA tiles of A a CTA holds: serves M <= 8*MTILES (rows past M are skipped)"),
        Param("KV", (2, 1, 4), "16-byte loads per row and step: a step covers 32*KV of K"),
        Param("PF", (2, 1, 3, 4), "steps of loads each warp keeps in flight (register ring)"),
        Param("WARPS", (4, 1, 2, 8, 16), "warps per CTA; they take the CTA's k-steps in turn"),
        Param("CK", (1, 2, 4, 8, 16),
              "CTAs of a cluster splitting K, reduced through DSMEM in rank order"),
        Param("L2PF", (0, 1, 2), "L2 prefetch-size hint of the B loads: 0 none, 1 128 B, 2 256 B"),
        Param("OCC", (1, 2, 4), "CTAs per SM the registers must allow (__launch_bounds__ minimum)"),
    )

    seeds = tuple({**shape, "MTILES": mt} for mt in (1, 2, 4, 8) for shape in SEED_SHAPES)

    # ---- derived quantities ---------------------------------------------------------------------
    @staticmethod
    def smem_bytes(config: Config) -> int:
        """Dynamic shared memory: WARPS fp32 partial tiles (MTILES*8 x BN+4); as Smem<> in the .cuh."""
        return config["WARPS"] * config["MTILES"] * 8 * (config["BN"] + 4) * 4

    @staticmethod
    def regs_estimate(config: Config) -> int:
        rt, mt, kv = config["BN"] // 16, config["MTILES"], config["KV"]
        acc = rt * mt * 4
        ring = config["PF"] * (rt * 2 * kv + mt * kv) * 4
        row_pointers = 2 * (rt * 2 + mt)  # 64-bit, one per row a thread reads
        return acc + ring + row_pointers + REG_OVERHEAD

    def estimate(self, config: Config) -> Resources:
        return Resources(threads=config["WARPS"] * 32, regs_per_thread=self.regs_estimate(config),
                         smem_bytes=self.smem_bytes(config))

    @staticmethod
    def k_steps(config: Config, problem: GemmProblem) -> int:
        return _cdiv(problem.K, 32 * config["KV"])

    # ---- rules ----------------------------------------------------------------------------------
    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        reason = swap_ab_tile_reason(config, problem)
        if reason:
            return reason
        steps, ck, warps = self.k_steps(config, problem), config["CK"], config["WARPS"]
        per_rank = _cdiv(steps, ck)
        if per_rank * (ck - 1) >= steps:
            return (f"CK={ck} with ceil(K/(32*KV)) = {steps} k-steps leaves the last cluster rank "
                    "without work")
        if per_rank < warps:
            return (f"WARPS={warps} > the {per_rank} k-steps of a cluster rank "
                    f"(K={problem.K}, KV={config['KV']}, CK={ck}): warps without work")
        if ck > MAX_CLUSTER:
            return f"CK={ck} > {MAX_CLUSTER} CTAs per cluster"
        res = self.estimate(config)
        if res.smem_bytes > device.smem_per_block_optin:
            return (f"shared memory WARPS*MTILES*8*(BN+4)*4 = {res.smem_bytes} B > "
                    f"{device.smem_per_block_optin} B per block on {device.name}")
        occ = config["OCC"]
        cap = min(device.max_regs_per_thread, device.regs_per_sm // (res.threads * occ))
        if res.regs_per_thread > REG_MARGIN * cap:
            return (f"register estimate {res.regs_per_thread}/thread (BN/16*MTILES*4 accumulators + "
                    f"PF*(BN/8*KV + MTILES*KV)*4 in flight, row pointers) > {REG_MARGIN:g} x the {cap} that "
                    f"OCC={occ} CTAs of {res.threads} threads allow: it would spill")
        if res.smem_bytes * occ > device.smem_per_sm:
            return f"OCC={occ} CTAs x {res.smem_bytes} B of shared memory > {device.smem_per_sm} B per SM"
        return None

    # ---- compile and launch ---------------------------------------------------------------------
    def cost_hint(self, config: Config) -> CostHint:
        """The simulated device's view: a BN x 8*MTILES tile split over CK CTAs; mma.sync on
        an 8-wide side reaches little of the peak (decode shapes are memory-bound anyway)."""
        return CostHint(tile_m=8 * config["MTILES"], tile_n=config["BN"], tile_k=32 * config["KV"],
                        split_k=config["CK"], stages=config["PF"] + 1, efficiency=0.4)

    def launch(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> Launch:
        ck = config["CK"]
        return Launch(grid=(_cdiv(problem.N, config["BN"]) * ck, 1, 1),
                      block=(config["WARPS"] * 32, 1, 1), smem_bytes=self.smem_bytes(config),
                      cluster=(ck, 1, 1))

    def kernel_args(self, config: Config, problem: GemmProblem,
                    ptrs: Mapping[str, int]) -> list[tuple[Any, Any]]:
        return [
            (ptrs["a"], ctypes.c_void_p),
            (ptrs["b"], ctypes.c_void_p),
            (ptrs["c"], ctypes.c_void_p),
            (ptrs.get("bias", 0) or 0, ctypes.c_void_p),
            (problem.M, ctypes.c_int),
            (problem.N, ctypes.c_int),
            (problem.K, ctypes.c_int),
        ]
