"""mma_sm80: Ampere-style tensor-core GEMM (cp.async -> swizzled shared -> ldmatrix -> mma.sync).

Runs on every GPU from sm_80 on. The CUDA template is kernel_templates/mma_sm80.cuh; this file
is the one declaration of its parameter space, the rules a config must satisfy, and its launch.
"""
from __future__ import annotations

import ctypes
from typing import Any, Mapping

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.templates.base import Config, CostHint, KernelTemplate, Launch, Param, Resources

MAX_WARPS = 16
# Largest split-K workspace (counters + fp32 partials) a config may ask for.
MAX_WORKSPACE_BYTES = 2 * 2**30
# Register estimate: accumulators + fragments (x2 with DBUF) + REG_OVERHEAD (indices, loop
# state, predicates) + REG_PER_COPY per unrolled 16-byte cp.async of a k-tile (its addresses).
# Calibrated against ptxas (CUDA 13, sm_80/sm_90) so that accepted configs do not spill; see
# tests/test_mma_sm80.py::test_estimates_match_compiler for the tolerance.
REG_OVERHEAD = 30
REG_PER_COPY = 2
# The cp.async loader unrolls ceil(BM*BK/8 / threads) copies per operand and tile; past this
# many the code (and its address registers) grows without any benefit.
MAX_COPIES_PER_THREAD = 12


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def counter_bytes(tiles: int) -> int:
    """Bytes of the per-tile counter area at the start of the split-K workspace (as the kernel)."""
    return _ceil_div(tiles * 4, 256) * 256


class MmaSm80(KernelTemplate):
    family = "mma_sm80"
    source = "mma_sm80.cuh"
    headers = ("include/tunefw/sm80.cuh",)
    kernel = "gemm_mma_sm80"
    min_cc = 80
    tensor_op = "HMMA"

    # The first value of each parameter is the default (sound for large problems).
    params = (
        Param("BM", (128, 32, 64, 256), "block tile rows (M)"),
        Param("BN", (128, 32, 64, 256), "block tile columns (N)"),
        Param("BK", (32, 16, 64), "block tile depth (K) per pipeline stage"),
        Param("WM", (64, 16, 32, 128), "warp tile rows; warps = BM/WM * BN/WN"),
        Param("WN", (64, 16, 32, 128), "warp tile columns"),
        Param("STAGES", (4, 2, 3, 5, 6), "shared-memory pipeline stages (cp.async ring)"),
        Param("SWIZZLE", (1, 0), "shared-memory layout: 1 XOR 16-byte-chunk swizzle, 0 plain rows"),
        Param("DBUF", (1, 0), "1: double-buffer ldmatrix fragments across k16 steps"),
        Param("RASTER", (0, 1), "tile order: 0 groups of GROUP block-rows, 1 of block-columns"),
        Param("GROUP", (8, 1, 4, 16), "raster group size (1: plain row/column order)"),
        Param("SPLIT_K", (1, 2, 4, 8, 16), "K slices; deterministic in-kernel reduction"),
        Param("EPILOGUE", (0, 1), "0: direct 4-byte stores, 1: staged in shared memory, 16-byte stores"),
    )

    # Measured on the H200 (benchmarks/results/mma_sm80_gpu_check_h200.json): the 64x64-warp
    # 128x256 and 256x128 tiles lead on large shapes; split-K tiles feed the SMs at small M.
    seeds = (
        {"BN": 256, "STAGES": 4, "EPILOGUE": 1},
        {"BN": 256, "STAGES": 3},
        {"BM": 256, "STAGES": 4},
        {"BN": 256, "BK": 64, "STAGES": 3},
        {"BK": 64, "STAGES": 3},
        {"BM": 64, "BN": 128, "BK": 64, "WM": 32, "WN": 64, "STAGES": 4, "SPLIT_K": 4},
        {"BM": 32, "BN": 128, "BK": 64, "WM": 32, "WN": 32, "STAGES": 4, "SPLIT_K": 8},
        {"BM": 32, "BN": 64, "BK": 64, "WM": 16, "WN": 32, "STAGES": 4, "SPLIT_K": 4},
    )

    # ---- derived quantities ---------------------------------------------------------------------
    @staticmethod
    def warps(config: Config) -> int:
        return (config["BM"] // config["WM"]) * (config["BN"] // config["WN"])

    @staticmethod
    def smem_bytes(config: Config) -> int:
        """Dynamic shared memory of one block; equals MmaSm80Smem<...>::bytes in the .cuh."""
        bm, bn, bk = config["BM"], config["BN"], config["BK"]
        pipeline = config["STAGES"] * (bm + bn) * bk * 2
        staging = bm * (bn * 2 + 16) if config["EPILOGUE"] else 0
        return max(pipeline, staging)

    @classmethod
    def copies_per_thread(cls, config: Config) -> tuple[int, int]:
        """16-byte cp.async copies per thread and k-tile, for A and for B."""
        threads = cls.warps(config) * 32
        chunks = config["BK"] // 8
        return (_ceil_div(config["BM"] * chunks, threads), _ceil_div(config["BN"] * chunks, threads))

    @classmethod
    def regs_estimate(cls, config: Config) -> int:
        wm, wn = config["WM"], config["WN"]
        acc = wm * wn // 32
        frags = (wm // 16) * 4 + (wn // 16) * 4
        copies = sum(cls.copies_per_thread(config))
        return acc + frags * (2 if config["DBUF"] else 1) + REG_OVERHEAD + REG_PER_COPY * copies

    def estimate(self, config: Config) -> Resources:
        return Resources(
            threads=self.warps(config) * 32,
            regs_per_thread=self.regs_estimate(config),
            smem_bytes=self.smem_bytes(config),
        )

    @staticmethod
    def grid_tiles(config: Config, problem: GemmProblem) -> tuple[int, int]:
        return _ceil_div(problem.M, config["BM"]), _ceil_div(problem.N, config["BN"])

    def workspace_bytes(self, config: Config, problem: GemmProblem) -> int:
        if config["SPLIT_K"] == 1:
            return 0
        tm, tn = self.grid_tiles(config, problem)
        tiles = tm * tn
        return counter_bytes(tiles) + tiles * config["SPLIT_K"] * config["BM"] * config["BN"] * 4

    # ---- rules ----------------------------------------------------------------------------------
    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        bm, bn, bk = config["BM"], config["BN"], config["BK"]
        wm, wn = config["WM"], config["WN"]
        if wm > bm or bm % wm:
            return f"WM={wm} does not divide BM={bm}"
        if wn > bn or bn % wn:
            return f"WN={wn} does not divide BN={bn}"
        if wm % 16 or wn % 16:
            return f"warp tile WM={wm} x WN={wn} is not a multiple of the 16x16 ldmatrix/mma granule"
        warps = self.warps(config)
        if warps > MAX_WARPS:
            return f"BM/WM * BN/WN = {warps} warps > {MAX_WARPS} (WM={wm}, WN={wn} too small)"
        threads = warps * 32
        if threads > device.max_threads_per_block:
            return (f"threads {threads} (BM/WM * BN/WN warps) > {device.max_threads_per_block} "
                    f"per block on {device.name}")
        res = self.estimate(config)
        if res.smem_bytes > device.smem_per_block_optin:
            what = ("STAGES*(BM+BN)*BK*2" if res.smem_bytes == config["STAGES"] * (bm + bn) * bk * 2
                    else "EPILOGUE=1 staging BM*(2*BN+16)")
            return (f"shared memory {what} = {res.smem_bytes} B > {device.smem_per_block_optin} B "
                    f"per block on {device.name}")
        for operand, rows, copies in zip(("BM", "BN"), (bm, bn), self.copies_per_thread(config)):
            if copies > MAX_COPIES_PER_THREAD:
                return (f"cp.async load of {operand}={rows} x BK={bk}: {copies} 16-byte copies per "
                        f"thread > {MAX_COPIES_PER_THREAD} (too few threads for the tile)")
        if res.regs_per_thread > device.max_regs_per_thread:
            return (f"register estimate {res.regs_per_thread}/thread (WM*WN/32 accumulators + "
                    f"fragments, DBUF={config['DBUF']}, cp.async addresses) > {device.max_regs_per_thread}")
        if res.regs_per_thread * threads > device.regs_per_sm:
            return (f"register estimate {res.regs_per_thread}/thread x {threads} threads (WM, WN, "
                    f"DBUF) = {res.regs_per_thread * threads} > {device.regs_per_sm} per SM")
        split = config["SPLIT_K"]
        if split > 1:
            ktiles = _ceil_div(problem.K, bk)
            if split > ktiles:
                return f"SPLIT_K={split} > ceil(K/BK) = ceil({problem.K}/{bk}) = {ktiles} k-tiles"
            per = _ceil_div(ktiles, split)
            if per * (split - 1) >= ktiles:
                return (f"SPLIT_K={split} with ceil(K/BK)={ktiles} k-tiles leaves the last split "
                        f"empty ({per} tiles per split)")
            ws = self.workspace_bytes(config, problem)
            if ws > MAX_WORKSPACE_BYTES:
                return (f"SPLIT_K={split} workspace {ws / 2**20:.0f} MiB (tiles x SPLIT_K x BM*BN "
                        f"fp32) > {MAX_WORKSPACE_BYTES // 2**20} MiB")
        tm, tn = self.grid_tiles(config, problem)
        if tm * tn > 2**31 - 1:
            return f"grid of {tm * tn} tiles (BM={bm}, BN={bn}) exceeds gridDim.x"
        return None

    # ---- compile and launch ---------------------------------------------------------------------
    def cost_hint(self, config: Config) -> CostHint:
        """The simulated device's view: the block tile; mma.sync reaches 0.47 of the peak."""
        return CostHint(tile_m=config["BM"], tile_n=config["BN"], tile_k=config["BK"],
                        split_k=config["SPLIT_K"], stages=config["STAGES"],
                        swizzled=config["SWIZZLE"] == 1, efficiency=0.47)

    def launch(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> Launch:
        tm, tn = self.grid_tiles(config, problem)
        return Launch(
            grid=(tm * tn, 1, config["SPLIT_K"]),
            block=(self.warps(config) * 32, 1, 1),
            smem_bytes=self.smem_bytes(config),
            workspace_bytes=self.workspace_bytes(config, problem),
        )

    def kernel_args(self, config: Config, problem: GemmProblem,
                    ptrs: Mapping[str, int]) -> list[tuple[Any, Any]]:
        return [
            (ptrs["a"], ctypes.c_void_p),
            (ptrs["b"], ctypes.c_void_p),
            (ptrs["c"], ctypes.c_void_p),
            (ptrs.get("workspace", 0) or 0, ctypes.c_void_p),
            (problem.M, ctypes.c_int),
            (problem.N, ctypes.c_int),
            (problem.K, ctypes.c_int),
        ]
