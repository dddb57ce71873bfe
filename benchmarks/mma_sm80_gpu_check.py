#!/usr/bin/env python3
"""GPU check of the mma_sm80 family: correctness sweep, timing vs cuBLAS, mma.sync ceiling.

    source benchmarks/device_setup.sh && python3 benchmarks/mma_sm80_gpu_check.py --commit SHA
    python3 benchmarks/mma_sm80_gpu_check.py --dry-run                     # CPU: the plan
    python3 benchmarks/mma_sm80_gpu_check.py --compile-only --arch sm_90a  # CPU: compiles only

Everything runs on the product's own code. Correctness and timing are `tunefw verify`'s functions
(tunefw/measure/verify.py): every kernel compiled ahead on all cores, each job in an isolated GPU
worker (a config that poisons its CUDA context, hangs or kills its process costs that one job,
the next runs in a fresh worker), verified as every sweep trial is (tunefw/evaluate/strict.py:
C NaN-poisoned between guard bands, A and B between guard bands and unchanged, a throw-away
launch, then two on the same workspace that must be right and bit-identical, so a split-K
counter left dirty fails). Correctness: every SPLIT_K/EPILOGUE/DBUF/BK path forced once, then
random valid configs, over edge shapes. Timing: promising configs at 4096^3 and 8192^3 as sweep
trials (verified, then screened interleaved with cuBLAS). Peak: mma.sync m16n8k16 register-only
throughput (benchmarks/micro/mma_peak.cuh, compiled by tunefw's compiler, launched through
tunefw/cuda/driver.py). About 3 minutes. Writes $OUT/mma_sm80_gpu_check.json (else
benchmarks/results/) and prints a table last.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import itertools
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import gpu_result  # noqa: E402
from tunefw.device import H200, DeviceSpec  # noqa: E402
from tunefw.measure.verify import Job, compile_all, run_verify  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.templates.base import Config, KernelTemplate, Launch, Param  # noqa: E402
from tunefw.templates.mma_sm80 import MmaSm80  # noqa: E402
from tunefw.tune.space import random_valid  # noqa: E402

SCRIPT = "benchmarks/mma_sm80_gpu_check.py"
T = MmaSm80()
CORRECTNESS_SHAPES = [(1, 8, 8), (17, 24, 40), (129, 136, 264), (4095, 4104, 4104), (256, 512, 1024)]
TIMING_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]
BASE = T.default_config()
# Every path of the kernel, forced once on each shape it is valid for (fp16 every third).
FORCED = [
    dict(BASE), dict(BASE, SPLIT_K=2), dict(BASE, SPLIT_K=4, EPILOGUE=1),
    dict(BASE, BK=16, DBUF=1), dict(BASE, BK=16, DBUF=0, SPLIT_K=8),
    dict(BASE, BK=64, STAGES=3, SWIZZLE=0), dict(BASE, DBUF=0, EPILOGUE=1, RASTER=1, GROUP=4),
    dict(BASE, BM=32, BN=32, WM=16, WN=16, STAGES=2, SPLIT_K=16, BK=16),
    dict(BASE, BM=256, BN=64, WM=64, WN=32, STAGES=3, EPILOGUE=1, GROUP=1),
    dict(BASE, BN=256, STAGES=3, RASTER=1, GROUP=16),
]
# Promising large-problem configs (bf16); each is verified on its timed shape before timing.
TIMING_CONFIGS = [
    dict(BASE), dict(BASE, STAGES=5), dict(BASE, BN=256, STAGES=3), dict(BASE, BN=256, STAGES=4),
    dict(BASE, BM=256, STAGES=4), dict(BASE, BM=256, STAGES=3, RASTER=1),
    dict(BASE, BK=64, STAGES=3), dict(BASE, BN=256, BK=64, STAGES=3),
    dict(BASE, BN=256, STAGES=4, EPILOGUE=1), dict(BASE, BN=256, STAGES=4, GROUP=16),
]
PEAK_BLOCKS_PER_SM, PEAK_THREADS, PEAK_MMAS_PER_WARP = 4, 256, 8192  # per chain: / CHAINS
PEAK_WARMUP, PEAK_TIMED = 2, 5


# ---- plans (no GPU) ---------------------------------------------------------------------------
def correctness_jobs(device: DeviceSpec, n_random: int, seed: int = 2024) -> list[Job]:
    """The forced paths on every shape they are valid for, then about ``n_random`` random valid
    configs spread evenly over the shapes (bf16 twice as often as fp16)."""
    rng = random.Random(seed)
    jobs: list[Job] = []

    def add(config: dict, shape: tuple, dtype: str, source: str) -> None:
        problem = GemmProblem(*shape, dtype=dtype)
        if T.check(config, problem, device) is None:
            jobs.append(Job(T.family, dict(config), problem, source))

    for i, config in enumerate(FORCED):
        for shape in CORRECTNESS_SHAPES:
            add(config, shape, "fp16" if i % 3 == 2 else "bf16", f"forced {i}")
    per_shape = n_random // len(CORRECTNESS_SHAPES) + 1
    for shape in CORRECTNESS_SHAPES:
        valid = random_valid(T, rng, GemmProblem(*shape), device)
        for config in itertools.islice(valid, per_shape):
            add(config, shape, rng.choice(["bf16", "bf16", "fp16"]), "random")
    return jobs


def timing_jobs(device: DeviceSpec) -> list[Job]:
    return [Job(T.family, dict(c), GemmProblem(*s), "timing") for s in TIMING_SHAPES
            for c in TIMING_CONFIGS if T.check(c, GemmProblem(*s), device) is None]


# ---- the mma.sync ceiling ---------------------------------------------------------------------
class MmaPeak(KernelTemplate):
    """benchmarks/micro/mma_peak.cuh, compiled from the repository root (compile only: the
    script launches it itself, through tunefw/cuda/driver.py)."""

    family = "mma_peak"
    source = "benchmarks/micro/mma_peak.cuh"
    headers = ("kernel_templates/include/tunefw/sm80.cuh",)
    kernel = "mma_peak"
    params = (Param("CHAINS", (4, 8, 16), "independent accumulator chains per warp"),)

    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        return None


PEAK = MmaPeak()


def peak_launch(sm_count: int) -> Launch:
    return Launch(grid=(sm_count * PEAK_BLOCKS_PER_SM, 1, 1), block=(PEAK_THREADS, 1, 1),
                  smem_bytes=0)


def peak_tflops(launch: Launch, chains: int, ms: float) -> float:
    """TFLOP/s of one peak launch: every warp issues PEAK_MMAS_PER_WARP m16n8k16 MMAs."""
    warps = launch.grid[0] * launch.block[0] // 32
    return warps * PEAK_MMAS_PER_WARP * 2.0 * 16 * 8 * 16 / (ms * 1e-3) / 1e12


def measure_peak(sm_count: int, arch: str, cache_dir: str) -> list[dict]:
    """Each (dtype, CHAINS): the median of PEAK_TIMED launches after PEAK_WARMUP (GPU)."""
    import torch

    from tunefw.cuda import driver
    from tunefw.cuda.compiler import compile_kernel
    from tunefw.evaluate import method

    torch.empty(1, device="cuda")  # torch's primary context, current on this thread
    driver.set_current(driver.primary_context(driver.device(0)))
    stream = torch.cuda.current_stream().cuda_stream
    launch, rows = peak_launch(sm_count), []
    out = torch.empty(launch.grid[0] * PEAK_THREADS, dtype=torch.float32, device="cuda")
    for dtype in PEAK.dtype_codes:
        for chains in PEAK.params[0].values:
            row = {"dtype": dtype, "chains": chains}
            compiled = compile_kernel(PEAK, {"CHAINS": chains}, dtype, arch, cache_dir=cache_dir,
                                      source_dir=REPO)
            if not compiled.ok:
                rows.append({**row, "status": compiled.status.value, "log": compiled.log[-600:]})
                continue
            module, function = driver.load(compiled.cubin, compiled.lowered_name)
            driver.configure(function, launch)
            params = ((out.data_ptr(), PEAK_MMAS_PER_WARP // chains), (ctypes.c_void_p, ctypes.c_int))
            run = lambda: driver.launch_checked(function, launch, params, stream)  # noqa: E731
            ms = statistics.median(method.time_each([run] * (PEAK_WARMUP + PEAK_TIMED), None,
                                                    torch.cuda.synchronize)[PEAK_WARMUP:])
            driver.unload(module)
            rows.append({**row, "status": "OK", "ms": ms, "tflops": peak_tflops(launch, chains, ms)})
    return rows


# ---- the result (no GPU) ----------------------------------------------------------------------
def timing_rows(result: dict) -> list[dict]:
    """The timed configs that passed, per shape by ratio to cuBLAS (best first)."""
    ok = [r for r in result["rows"] if r["status"] == "OK"]
    keys = ("family", "dtype", "M", "N", "K", "config", "tflops", "cublas_tflops", "ratio",
            "median_ms", "min_ms")
    return [{k: r[k] for k in keys} for r in sorted(ok, key=lambda r: ((r["M"], r["N"], r["K"]),
                                                                        -r["ratio"]))]


def compose(parts: dict, given_commit: str | None, started: float) -> dict:
    """The result file: identity, device, peak, timing rows and the correctness sweep."""
    corr, timing = parts.get("correctness") or {}, parts.get("timing") or {}
    peak = {}
    for r in parts.get("peak", {}).get("rows", []):
        if r["status"] == "OK":
            peak[r["dtype"]] = max(peak.get(r["dtype"], 0.0), r["tflops"])
    rows = corr.get("rows", []) + timing.get("rows", [])
    bad = [r for r in rows if r["status"] != "OK"]
    fingerprint = corr.get("device") or timing.get("device") or {}
    return {
        "script": SCRIPT, "date": datetime.date.today().isoformat(),
        "commit": gpu_result.commit(given_commit), "device": gpu_result.device(fingerprint),
        "mma_sync_peak_tflops": round(peak.get("bf16", 0.0), 1),
        "mma_sync_peak_tflops_fp16": round(peak.get("fp16", 0.0), 1),
        "rows": timing_rows(timing) if timing.get("rows") else [],
        "correctness": {"configs_checked": len(corr.get("rows", [])),
                        "statuses": corr.get("statuses"), "wrong": corr.get("wrong"),
                        "failures": [{k: r.get(k) for k in ("family", "config", "M", "N", "K",
                                                            "dtype", "status", "log")}
                                     for r in bad][:40],
                        "items": [{k: r.get(k) for k in ("source", "config", "M", "N", "K",
                                                         "dtype", "status", "rel_err")}
                                  for r in corr.get("rows", [])]},
        "parts": {name: {k: v for k, v in part.items() if k != "rows"}
                  for name, part in parts.items()},
        "peak_rows": parts.get("peak", {}).get("rows", []),
        "all_ok": not bad and all("error" not in p for p in parts.values()) and bool(rows),
        "wall_s": round(time.monotonic() - started, 1),
    }


def short(config: dict) -> str:
    c = config
    return (f"{c['BM']}x{c['BN']}x{c['BK']} w{c['WM']}x{c['WN']} s{c['STAGES']} sw{c['SWIZZLE']} "
            f"db{c['DBUF']} r{c['RASTER']}g{c['GROUP']} sk{c['SPLIT_K']} ep{c['EPILOGUE']}")


def print_table(result: dict) -> None:
    corr = result["correctness"]
    print(f"correctness: {corr['configs_checked']} config/shape jobs, statuses {corr['statuses']}")
    for r in corr["failures"][:10]:
        print(f"  {r['status']}: {r['M']}x{r['N']}x{r['K']} {r['dtype']} {short(r['config'])}: "
              f"{str(r['log'])[:200]}")
    for name, part in result["parts"].items():
        if "error" in part:
            print(f"  part {name} failed: {part['error']}")
    print(f"mma.sync m16n8k16 register-only peak: bf16 {result['mma_sync_peak_tflops']} TFLOP/s, "
          f"fp16 {result['mma_sync_peak_tflops_fp16']} TFLOP/s")
    print(f"{'shape':>16} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6}  config")
    for r in result["rows"]:
        print(f"{r['M']}x{r['N']}x{r['K']:>6} {r['tflops']:8.1f} {r['cublas_tflops']:8.1f} "
              f"{r['ratio']:6.3f}  {short(r['config'])}")
    print(f"all ok: {result['all_ok']} ({result['device'].get('name')}, {result['wall_s']} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-random", type=int, default=40, help="random valid configs in the sweep")
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--commit", help="the commit, where the tree has no git metadata")
    ap.add_argument("--out", type=Path, help="default $OUT/mma_sm80_gpu_check.json")
    ap.add_argument("--dry-run", action="store_true", help="print the plan (no GPU)")
    ap.add_argument("--compile-only", action="store_true", help="compile every kernel (no GPU)")
    ap.add_argument("--arch", default="sm_90a", help="the arch of --compile-only")
    args = ap.parse_args(argv)
    if args.dry_run or args.compile_only:
        corr, timing = correctness_jobs(H200, args.n_random, args.seed), timing_jobs(H200)
        print(f"{len(corr)} correctness jobs, {len(timing)} timing jobs on {H200.name}")
        if args.compile_only:
            compiled = compile_all(corr + timing, args.arch, tempfile.mkdtemp(prefix="mma-check-"))
            bad = {k: r.log[-300:] for k, r in compiled.items() if not r.ok}
            print(f"compiled {len(compiled)} kernels for {args.arch}: {len(bad)} failed {bad}")
            return 1 if bad else 0
        return 0
    from tunefw.cuda.driver import local_spec

    started, cache = time.monotonic(), tempfile.mkdtemp(prefix="mma-check-")
    device = local_spec(0)
    parts = {
        "correctness": gpu_result.guarded(lambda: run_verify(
            correctness_jobs(device, args.n_random, args.seed), cache)),
        "timing": gpu_result.guarded(lambda: run_verify(timing_jobs(device), cache, timed=True)),
        "peak": gpu_result.guarded(lambda: {"rows": measure_peak(device.sm_count, device.arch,
                                                                 cache)}),
    }
    result = compose(parts, args.commit, started)
    gpu_result.write(result, gpu_result.out_path("mma_sm80_gpu_check.json", args.out))
    print_table(result)
    return 0 if result["all_ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
