"""stream_sm90: the decode GEMM (small M) of kernel_templates/stream_sm90.cuh that streams the
weight through a deep shared-memory ring filled by TMA.

A producer thread keeps STAGES chunks of BN rows x BK k in flight (2D TMA boxes of 64 k,
128-byte swizzle, mbarrier-completed, edges zero-filled), WARPS consumer warps multiply them
with swap-AB mma.sync (WN groups of them splitting the BN rows), a cluster of CK CTAs splits K
and the epilogue reduces in shared memory and DSMEM in a fixed order (deterministic, no
workspace). Bytes in flight cost shared memory, not registers, so a CTA can hold 64-200 KB of
loads at once. This file is the one declaration of its space, its rules and its launch.
"""
from __future__ import annotations

import ctypes
from typing import Any, Mapping

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.templates.base import (Config, CostHint, KernelTemplate, Launch, Param, Resources,
                                   ptxas_register_cap)
from tunefw.templates.skinny_sm90 import SWAPAB_HEADERS, swap_ab_tile_reason
from tunefw.templates.wgmma_sm90 import WgmmaSm90

MAX_CLUSTER = 16  # H100/H200 allow 16 CTAs with the non-portable cluster attribute
REG_OVERHEAD = 48  # indices, barrier addresses, the epilogue

# Starting points: the best of 596 random configs over 16 decode shapes on the H200
# (benchmarks/results/stream_probe2_h200.json): one CTA of 4 consumer warps per 32 rows with a
# 4-stage ring was best or near it almost everywhere; K split only where N/BN leaves SMs idle
# (CK = 8 or 16 ran 3-6x slower: clusters of a few chunks each). Each is offered at every
# MTILES; check() keeps the one that fits the problem's M.
SEED_SHAPES = (
    {"BN": 32, "BK": 256, "STAGES": 4, "WARPS": 4, "CK": 1},
    {"BN": 16, "BK": 256, "STAGES": 3, "WARPS": 2, "CK": 1},
    {"BN": 32, "BK": 256, "STAGES": 8, "WARPS": 8, "CK": 1},
    {"BN": 16, "BK": 256, "STAGES": 3, "WARPS": 4, "CK": 2},
    {"BN": 64, "BK": 128, "STAGES": 8, "WARPS": 2, "CK": 1},
    # N = 6144 in 128 CTAs, one per SM (BN = 32 makes 192: 1.45 waves); decode5_h200.json's
    # 32x6144x4096 winner (BN 48, 3 stages)
    {"BN": 48, "BK": 256, "STAGES": 3, "WARPS": 4, "CK": 1},
)


# M = 33-64 (MTILES 6, 8): A's 48-64 rows a stage take as much shared memory as the weight's, so
# the shapes above mostly do not fit; these halve the stage depth. Not measured yet: sized so
# that N = 4096 and 6144 make 128 CTAs with >= 48 KB of weight in flight each. No WN > 1 seed:
# the wide tiles it allows (BN 96-128, CK 2-4 to fill the SMs) ran 0.52-0.86x cuBLAS at M = 64
# where these ran 0.91-1.04x (stream_wn_probe_h100.json); the search may still find a use.
WIDE_M_SHAPES = (
    {"BN": 64, "BK": 128, "STAGES": 4, "WARPS": 4, "CK": 2},
    {"BN": 32, "BK": 128, "STAGES": 6, "WARPS": 4, "CK": 1},
    {"BN": 48, "BK": 128, "STAGES": 4, "WARPS": 4, "CK": 1},
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


SWIZZLE = 128  # bytes per swizzled box row: 64 k of bf16/fp16
ALIGN_SLACK = 1024  # the kernel aligns its ring to 1024 bytes (the 128-byte swizzle's period)


class StreamSm90(KernelTemplate):
    family = "stream_sm90"
    source = "stream_sm90.cuh"
    headers = SWAPAB_HEADERS
    gates = ("none", "silu")  # silu: a CTA's BN weight rows are BN/2 of Bg over the same of Bu
    kernel = "gemm_stream_sm90"
    min_cc = 90  # TMA, mbarrier transaction counts, clusters and DSMEM
    tensor_op = "HMMA"
    programmatic_launch = True  # pdl_wait() before any global memory access

    params = (
        Param("BN", (32, 16, 48, 64, 80, 96, 112, 128),
              "rows of B (columns of C) per CTA, in 16-row MMA tiles (48: N = 6144 in 128 CTAs, "
              "one wave of 132 SMs; 96-128 with WN > 1 for M = 33-64)"),
        Param("MTILES", (1, 2, 4, 6, 8),
              "8-row MMA tiles of A a CTA holds: serves M <= 8*MTILES (rows past M are skipped); "
              "6 and 8 carry M = 33-64, where the activations a CTA reads match its weight rows"),
        Param("BK", (256, 128, 512), "k per ring stage: each row of B is copied in 2*BK-byte runs"),
        Param("STAGES", (4, 2, 3, 6, 8), "ring stages in flight (bulk copies ahead of the MMAs)"),
        Param("WARPS", (4, 1, 2, 8), "consumer warps (plus one producer warp); they take a "
              "stage's k16 steps in turn"),
        Param("CK", (1, 2, 4, 8, 16, 3),
              "CTAs of a cluster splitting K, reduced through DSMEM in rank order"),
        Param("WN", (1, 2, 4), "groups of consumer warps splitting the CTA's BN rows (each warp "
              "holds BN/WN rows' accumulators; WARPS/WN warps per slice split K): wide tiles "
              "that read A once per BN weight rows without the registers of BN/16 MMA tiles "
              "(measured no faster at M = 64 than WN 1: stream_wn_probe_h100.json)",
              absent=1, after_gate=True),
    )

    seeds = (tuple({**shape, "MTILES": mt} for mt in (1, 2, 4, 6, 8) for shape in SEED_SHAPES)
             + tuple({**shape, "MTILES": mt} for mt in (6, 8) for shape in WIDE_M_SHAPES))

    # ---- derived quantities ---------------------------------------------------------------------
    @staticmethod
    def smem_bytes(config: Config) -> int:
        """Dynamic shared memory: the ring, the epilogue's partial tiles, the mbarriers and the
        alignment slack (as stream::Layout in the .cuh)."""
        bn, mt = config["BN"], config["MTILES"]
        ring = config["STAGES"] * (bn + 8 * mt) * config["BK"] * 2
        partials = config["WARPS"] // config["WN"] * mt * 8 * (bn + 4) * 4  # a tile per K slot
        return ring + partials + 16 * config["STAGES"] + ALIGN_SLACK

    @staticmethod
    def regs_estimate(config: Config) -> int:
        rt, mt = config["BN"] // config["WN"] // 16, config["MTILES"]
        return rt * mt * 4 + 2 * (rt * 4 + mt * 2) + REG_OVERHEAD  # acc + two steps of fragments

    def estimate(self, config: Config) -> Resources:
        return Resources(threads=(config["WARPS"] + 1) * 32,
                         regs_per_thread=self.regs_estimate(config),
                         smem_bytes=self.smem_bytes(config))

    # ---- rules ----------------------------------------------------------------------------------
    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        reason = swap_ab_tile_reason(config, problem)
        if reason:
            return reason
        wn = config["WN"]
        if config["WARPS"] % wn:
            return f"WN={wn} does not divide the WARPS={config['WARPS']} consumer warps"
        if config["BN"] % (16 * wn):
            return f"BN={config['BN']} does not split into WN={wn} slices of whole 16-row MMA tiles"
        chunks, ck = _cdiv(problem.K, config["BK"]), config["CK"]
        if _cdiv(chunks, ck) * (ck - 1) >= chunks:
            return (f"CK={ck} with ceil(K/BK) = {chunks} stages of K={problem.K} leaves the last "
                    "cluster rank without work")
        if ck > MAX_CLUSTER:
            return f"CK={ck} > {MAX_CLUSTER} CTAs per cluster"
        smem = self.smem_bytes(config)
        if smem > device.smem_per_block_optin:
            return (f"shared memory STAGES*(BN+8*MTILES)*2*BK + WARPS/WN partial tiles = "
                    f"{smem} B > {device.smem_per_block_optin} B per block on {device.name}")
        threads, regs = (config["WARPS"] + 1) * 32, self.regs_estimate(config)
        cap = ptxas_register_cap(device, threads)
        if regs > cap:
            return (f"register estimate {regs}/thread (BN/WN/16*MTILES*4 accumulators and two "
                    f"steps of fragments) > the {cap} a CTA of {threads} threads allows: it would "
                    "spill")
        return None

    # ---- compile and launch ---------------------------------------------------------------------
    def cost_hint(self, config: Config) -> CostHint:
        """The simulated device's view: a BN x 8*MTILES tile split over CK CTAs; mma.sync on
        an 8-wide side reaches little of the peak (decode shapes are memory-bound anyway)."""
        return CostHint(tile_m=8 * config["MTILES"], tile_n=config["BN"], tile_k=config["BK"],
                        split_k=config["CK"], stages=config["STAGES"], efficiency=0.4)

    def launch(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> Launch:
        ck = config["CK"]
        return Launch(grid=(_cdiv(problem.N, problem.tile_out_cols(config["BN"])) * ck, 1, 1),
                      block=((config["WARPS"] + 1) * 32, 1, 1), smem_bytes=self.smem_bytes(config),
                      cluster=(ck, 1, 1))

    def tensor_map_specs(self, config: Config, problem: GemmProblem) -> dict[str, dict]:
        """What cuTensorMapEncodeTiled gets for A and B (innermost dimension first): 64-k boxes
        of 8*MTILES rows of A and BN rows of B (gated: BN/2 rows, loaded from Bg and Bu)."""
        k = problem.K
        return {"a": {"dims": (k, problem.M), "strides": (k * 2,),
                      "box": (SWIZZLE // 2, 8 * config["MTILES"]), "swizzle": SWIZZLE},
                "b": {"dims": (k, problem.weight_rows), "strides": (k * 2,),
                      "box": (SWIZZLE // 2, problem.tile_out_cols(config["BN"])), "swizzle": SWIZZLE}}

    def kernel_args(self, config: Config, problem: GemmProblem,
                    ptrs: Mapping[str, int]) -> list[tuple[Any, Any]]:
        specs = self.tensor_map_specs(config, problem)
        maps = [WgmmaSm90.encode_tensor_map(specs[x], problem.dtype, int(ptrs[x])) for x in "ab"]
        return [(maps[0], None), (maps[1], None), (int(ptrs["c"]), ctypes.c_void_p),
                (int(ptrs.get("bias", 0) or 0), ctypes.c_void_p), (problem.M, ctypes.c_int),
                (problem.N, ctypes.c_int), (problem.K, ctypes.c_int)]
