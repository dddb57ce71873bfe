"""Focused GPU check of the wgmma_sm90 family on an H200 (about 3-4 minutes).

    source benchmarks/device_setup.sh && python3 benchmarks/wgmma_sm90_gpu_check.py --commit SHA
    python3 benchmarks/wgmma_sm90_gpu_check.py --sanitize --commit SHA  # sanitizers only
    python3 benchmarks/wgmma_sm90_gpu_check.py --dry-run                # CPU: the plan
    options: --skip-perf, --skip-verify, --only-shape 4096x4096x4096

Everything runs on the product's own code (`tunefw verify`'s functions, tunefw/measure/verify.py):
every kernel compiled ahead on all cores by tunefw's compiler (its SASS checked: HGMMA present,
no local memory; a kernel that fails is reported and not run), each job in an isolated GPU
worker (a config that hangs, poisons its context or kills its process costs that one job, the
next runs in a fresh worker).

Correctness (every ping-pong variant, the split-K paths and a sample of cooperative configs) on
the edge shapes (1,8,8), (17,24,40), (129,136,264), (4095,4104,4104), (300,1000,520), verified as
every sweep trial is (tunefw/evaluate/strict.py): C NaN-poisoned between guard bands, A and B
between guard bands and unchanged, a throw-away launch, then two on the same workspace that must
agree bit for bit (split-K counters reset), judged against A.float() @ B.float().T with cuBLAS's
error as the second bound; persistent configs also on a small grid (8 SMs' worth), so every CTA
loops over several tiles and the two ping-pong consumers get uneven tile counts.

Speed: a focused candidate list per public-suite shape, each config run as a sweep trial
(verified, then screened interleaved with cuBLAS: A B A B ..., L2 flushed before every launch),
so clock and power drift between configs does not bias the ratio.

--sanitize: a few small configs (a cooperative 2x1 cluster with the overlapped epilogue, a
persistent ping-pong, a ping-pong cluster with split-K) verified under compute-sanitizer memcheck
and racecheck as `tunefw verify --sanitize` does (tunefw/measure/sanitize.py).

Prints a table last; writes $OUT/wgmma_sm90_gpu_check.json (or wgmma_sm90_sanitize.json), else
benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import math
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import gpu_result  # noqa: E402
from tunefw.device import H200, DeviceSpec  # noqa: E402
from tunefw.measure.verify import Job, run_verify  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.templates import config_key  # noqa: E402
from tunefw.templates.wgmma_sm90 import WgmmaSm90  # noqa: E402

SCRIPT = "benchmarks/wgmma_sm90_gpu_check.py"
T = WgmmaSm90()
DEFAULT = T.default_config()

EDGE_SHAPES = [(1, 8, 8), (17, 24, 40), (129, 136, 264), (4095, 4104, 4104), (300, 1000, 520)]
PERF_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 28672, 4096), (128, 6144, 4096),
               (16, 4096, 14336), (2048, 4096, 14336)]
JOB_TIMEOUT_S = 45.0
SANITIZE_TIMEOUT_S = 240.0  # per tool's whole run: both tools within 9 minutes


def cfg(**changes) -> dict:
    c = dict(DEFAULT)
    c.update(changes)
    assert T.space_reason(c) is None, (changes, T.space_reason(c))
    return c


# ---- what is checked -------------------------------------------------------------------------
C11 = dict(CLUSTER_M=1, CLUSTER_N=1)
C21 = dict(CLUSTER_M=2, CLUSTER_N=1)
C12 = dict(CLUSTER_M=1, CLUSTER_N=2)
C22 = dict(CLUSTER_M=2, CLUSTER_N=2)
PP = dict(SCHEDULE="pingpong")
OV = dict(EPILOGUE="tma_overlap")


def correctness_configs() -> list[tuple[str, dict, str]]:
    """(group, config, dtype): every ping-pong variant, then a sample of cooperative ones."""
    ping = [
        cfg(**PP, **C11, BN=128),
        cfg(**PP, **C11, BN=128, EPILOGUE="direct"),
        cfg(**PP, **C11, BN=128, PERSISTENT=0),
        cfg(**PP, **C11, BN=128, PERSISTENT=0, EPILOGUE="direct", SPLIT_K=2),
        cfg(**PP, **C11, BM=64, BN=256),
        cfg(**PP, **C11, BM=64, BN=128, STAGES=7, SPLIT_K=4),
        cfg(**PP, **C11, BM=64, BN=64, BK=32, SWIZZLE=64, STAGES=7, EPILOGUE="direct"),
        cfg(**PP, **C11, BN=192, STAGES=4),
        cfg(**PP, **C11, BN=96, SWIZZLE=32, RASTER="n", GROUP=1),
        cfg(**PP, **C11, BN=128, SPLIT_K=4),
        cfg(**PP, **C11, BM=64, BN=256, SPLIT_K=8, EPILOGUE="direct"),
        cfg(**PP, **C21, BN=128, STAGES=6),
        cfg(**PP, **C12, BN=128, STAGES=6),
        cfg(**PP, **C22, BM=64, BN=128, EPILOGUE="direct"),
        cfg(**PP, **C21, BN=128, SPLIT_K=2, PERSISTENT=0),
        cfg(**PP, **C21, BM=64, BN=96, STAGES=6),
        cfg(**PP, **C21, BM=64, BN=192, SPLIT_K=2),
    ]
    coop = [
        cfg(**C11),
        cfg(**C11, **OV),
        cfg(**OV),                                     # 2x1
        cfg(**C12, **OV),
        cfg(**C22, **OV, PERSISTENT=0),
        cfg(**C11, **OV, BM=256, BN=128),
        cfg(**C11, **OV, BN=96, SWIZZLE=32, STAGES=6),  # odd epilogue chunk count
        cfg(**C11, BN=160, SWIZZLE=64),                 # odd chunk count, 64B C swizzle
        cfg(**C11, EPILOGUE="direct"),
        cfg(**C11, SPLIT_K=2, BN=96),
        cfg(**C21, SPLIT_K=4, EPILOGUE="direct"),
        cfg(**C11, BN=128, SPLIT_K=8, STAGES=5),
        cfg(**C11, BN=192, SPLIT_K=4, STAGES=4, RASTER="n"),
    ]
    split = [  # the split-K reduction (into the accumulators) everywhere; BK=128 stages
        cfg(**C12, BN=96, SPLIT_K=2, STAGES=6),
        cfg(**C12, BN=192, SPLIT_K=4, STAGES=4, EPILOGUE="direct"),
        cfg(**C21, BN=128, SPLIT_K=8, STAGES=5, RASTER="n", GROUP=2),
        cfg(**C11, BN=256, SPLIT_K=2, STAGES=3),
        cfg(**PP, **C12, BN=96, SPLIT_K=4, STAGES=6),
        cfg(**C11, BK=128, STAGES=2),
        cfg(**C11, BK=128, SWIZZLE=64, BN=128, STAGES=3),
        cfg(**PP, **C11, BM=64, BN=128, BK=128, STAGES=4, SPLIT_K=4),
        cfg(**PP, **C11, BM=64, BN=64, BK=128, SWIZZLE=32, STAGES=5),
        cfg(**C12, BN=96, BK=128, STAGES=3, SPLIT_K=2, EPILOGUE="direct"),
    ]
    out = [("pingpong", c, "bf16") for c in ping]
    out += [("split", c, "bf16") for c in split]
    out += [("split", cfg(**PP, **C11, BM=64, BN=128, SPLIT_K=4), "fp16")]
    out += [("pingpong", cfg(**PP, **C11, BN=128), "fp16")]
    out += [("coop", c, "bf16") for c in coop]
    out += [("coop", cfg(**C21, **OV), "fp16")]
    return out


def perf_configs() -> dict[tuple, list[dict]]:
    """The focused candidates per public-suite shape: the round-3 sweep winners
    (results/wgmma_sm90_h200.json) and, for the small-M shapes, the structure of cuBLAS's
    kernels there (results/profile_h200.json: at M=128 64x96 tiles on 2x1 clusters without
    split-K, 10 stages; at M=16 split-K 4 on 1x2 clusters, 11 stages) beside split-K."""
    big = [
        cfg(**C21),
        cfg(**C11, **OV, GROUP=4),
        cfg(**C11, **OV, GROUP=16),
        cfg(**C21, **OV, RASTER="n", GROUP=16),             # round-3 4096^3 winner
        cfg(**PP, **C11, BN=192, GROUP=16),
    ]
    m128 = [  # M=128 N=6144 K=4096
        cfg(**C11, BN=96, SPLIT_K=2, STAGES=6, GROUP=16),   # round-3 winner
        cfg(**C11, BN=96, SPLIT_K=2, STAGES=7, GROUP=16),
        cfg(**PP, **C21, BM=64, BN=96, STAGES=10),          # cuBLAS's structure
        cfg(**PP, **C21, BM=64, BN=96, STAGES=8),
        cfg(**PP, **C21, BM=64, BN=96, STAGES=10, PERSISTENT=0),
        cfg(**PP, **C11, BM=64, BN=96, STAGES=10),
        cfg(**PP, **C21, BM=64, BN=192, STAGES=6, SPLIT_K=2),
        cfg(**PP, **C21, BM=64, BN=96, BK=128, STAGES=5),
    ]
    m16 = [  # M=16 N=4096 K=14336: memory-bound
        cfg(**PP, **C11, BM=64, BN=128, SPLIT_K=4, STAGES=6, GROUP=2),  # round-3 winner
        cfg(**PP, **C11, BM=64, BN=128, SPLIT_K=4, STAGES=8),
        cfg(**PP, **C12, BM=64, BN=128, SPLIT_K=4, STAGES=8),           # cuBLAS's structure
        cfg(**PP, **C12, BM=64, BN=128, SPLIT_K=4, STAGES=6),
        cfg(**PP, **C11, BM=64, BN=128, BK=128, STAGES=4, SPLIT_K=4),
        cfg(**PP, **C11, BM=64, BN=256, SPLIT_K=8, STAGES=4),
    ]
    out = {}
    for shape in PERF_SHAPES:
        out[shape] = m128 if shape[0] == 128 else m16 if shape[0] == 16 else big
    return out


def sanitize_configs() -> list[tuple[dict, tuple]]:
    return [
        (cfg(**C21, **OV), (300, 1000, 520)),
        (cfg(**PP, **C11, BN=128), (300, 1000, 520)),
        (cfg(**PP, **C21, BM=64, BN=128, SPLIT_K=2, STAGES=6), (129, 1000, 520)),
    ]


# ---- plans (no GPU) ---------------------------------------------------------------------------
def plan_verify(device: DeviceSpec) -> tuple[list[Job], list[dict]]:
    """The correctness jobs (each config on each edge shape check() allows; source names its
    group) and the (config, shape) pairs check() refuses, with why."""
    jobs, refused = [], []
    for group, config, dtype in correctness_configs():
        for shape in EDGE_SHAPES:
            problem = GemmProblem(*shape, dtype=dtype)
            reason = T.check(config, problem, device)
            if reason:
                refused.append({"group": group, "config": config, "shape": list(shape),
                                "dtype": dtype, "reason": reason})
            else:
                jobs.append(Job(T.family, config, problem, group))
    return jobs, refused


def plan_perf(device: DeviceSpec, only_shape: str | None = None) -> list[Job]:
    """The timed jobs: each shape's candidates that check() allows (``only_shape``: one shape)."""
    return [Job(T.family, c, GemmProblem(*s), "perf") for s, configs in perf_configs().items()
            if not only_shape or "x".join(map(str, s)) == only_shape
            for c in configs if T.check(c, GemmProblem(*s), device) is None]


def sanitize_jobs() -> list[Job]:
    return [Job(T.family, c, GemmProblem(*s), "sanitize") for c, s in sanitize_configs()]


# ---- compiling ahead, with the SASS checked ---------------------------------------------------
def sass_failures(jobs: list[Job], arch: str, cache_dir: str) -> dict[str, str]:
    """Kernel (name expression) -> why it must not run: a failed compile, spills, or SASS
    without HGMMA or with local memory (tunefw compile --check-sass's rule)."""
    from tunefw.cuda.compiler import sass_check
    from tunefw.measure.verify import compile_all

    failures = {}
    for key, result in compile_all(jobs, arch, cache_dir).items():
        name = key.split(" ", 1)[1]
        if not result.ok:
            failures[name] = f"{result.status.value}: {result.log.strip()[-300:]}"
        elif result.spill_bytes:
            failures[name] = f"spills {result.spill_bytes} bytes"
        elif reason := sass_check(result.cubin, require_op=T.tensor_op):
            failures[name] = reason
    return failures


def runnable(jobs: list[Job], failures: dict[str, str]) -> list[Job]:
    return [j for j in jobs if T.name_expression(j.config, j.problem.dtype) not in failures]


# ---- the result (no GPU) ----------------------------------------------------------------------
def per_config(rows: list[dict]) -> list[dict]:
    """The correctness rows grouped by (config, dtype): OK only if every shape is OK."""
    grouped: dict[tuple, dict] = {}
    for r in rows:
        key = (config_key(T.family, r["config"]), r["dtype"])
        entry = grouped.setdefault(key, {"group": r["source"], "dtype": r["dtype"],
                                         "config": r["config"], "status": "OK", "detail": "",
                                         "shapes": []})
        entry["shapes"].append({"shape": [r["M"], r["N"], r["K"]], "status": r["status"],
                                "rel_err": r["rel_err"], "log": r["log"]})
        if r["status"] != "OK" and entry["status"] == "OK":
            entry["status"] = r["status"]
            entry["detail"] = f"{r['M']}x{r['N']}x{r['K']}: {r['log']}"
    return list(grouped.values())


def best_and_knobs(perf: list[dict]) -> tuple[dict, dict, dict]:
    """Per shape the best row by ratio, the best row of each schedule / cluster / epilogue, and
    per knob value its best fraction of a shape's best over all shapes (>= 0.95 somewhere: the
    knob value earns its place)."""
    best: dict[str, dict] = {}
    best_by: dict[str, dict] = {}
    for r in (r for r in perf if r["status"] == "OK"):
        shape, c = f"{r['M']}x{r['N']}x{r['K']}", r["config"]
        if shape not in best or r["ratio"] > best[shape]["ratio"]:
            best[shape] = r
        for knob in (f"schedule:{c['SCHEDULE']}", f"cluster:{c['CLUSTER_M']}x{c['CLUSTER_N']}",
                     f"epilogue:{c['EPILOGUE']}"):
            cur = best_by.setdefault(shape, {}).get(knob)
            if cur is None or r["ratio"] > cur["ratio"]:
                best_by[shape][knob] = r
    fraction: dict[str, float] = {}
    for shape, by in best_by.items():
        for knob, r in by.items():
            fraction[knob] = max(fraction.get(knob, 0.0), r["ratio"] / best[shape]["ratio"])
    return best, best_by, fraction


def compose(parts: dict, refused: list[dict], failures: dict[str, str],
            given_commit: str | None, started: float) -> dict:
    verify, perf = parts.get("verify") or {}, parts.get("perf") or {}
    configs = per_config(verify.get("rows", []))
    best, best_by, fraction = best_and_knobs(perf.get("rows", []))
    wrong = [c for c in configs if c["status"] != "OK"]
    fingerprint = verify.get("device") or perf.get("device") or {}
    ratios = [r["ratio"] for r in best.values()]
    return {
        "script": SCRIPT, "date": datetime.date.today().isoformat(),
        "commit": gpu_result.commit(given_commit), "device": gpu_result.device(fingerprint),
        "configs_checked": len(configs), "runs_checked": len(verify.get("rows", [])),
        "wrong": len(wrong), "refused_by_check": refused,
        "compile_failures": [{"kernel": k, "reason": v} for k, v in failures.items()],
        "correctness": configs, "rows": perf.get("rows", []), "best": best,
        "best_by_knob": best_by, "knob_best_fraction": fraction,
        "geomean_ratio": math.prod(ratios) ** (1 / len(ratios)) if ratios else None,
        "parts": {name: {k: v for k, v in part.items() if k != "rows"}
                  for name, part in parts.items()},
        "all_ok": not wrong and not failures and all("error" not in p for p in parts.values()),
        "seconds": round(time.monotonic() - started, 1),
    }


def short(c: dict) -> str:
    return (f"{c['SCHEDULE'][:4]} {c['BM']}x{c['BN']}x{c['BK']} s{c['STAGES']} sw{c['SWIZZLE']} "
            f"cl{c['CLUSTER_M']}x{c['CLUSTER_N']} p{c['PERSISTENT']} r{c['RASTER']}{c['GROUP']} "
            f"k{c['SPLIT_K']} {c['EPILOGUE']}")


def print_table(result: dict) -> None:
    print("== correctness")
    for c in result["correctness"]:
        mark = "ok " if c["status"] == "OK" else "BAD"
        print(f"{mark} {c['group']:<8} {c['dtype']} {short(c['config'])}  {c['detail'][:160]}")
    for f in result["compile_failures"]:
        print(f"BAD compile {f['kernel'][:100]}: {f['reason'][:160]}")
    for name, part in result["parts"].items():
        if "error" in part:
            print(f"part {name} failed: {part['error']}")
    print(f"{result['configs_checked'] - result['wrong']} configs ok, {result['wrong']} not ok; "
          f"{result['runs_checked']} (config, shape) jobs")
    print("\n== speed (ratio = tflops / cublas_tflops, cuBLAS interleaved per row)")
    print(f"{'shape':<18} {'config':<62} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6}")
    for r in sorted(result["rows"], key=lambda r: ((r["M"], r["N"], r["K"]), -(r["ratio"] or 0))):
        shape = f"{r['M']}x{r['N']}x{r['K']}"
        if r["status"] != "OK":
            print(f"{shape:<18} {short(r['config']):<62} {r['status']} {r['log'][:100]}")
            continue
        print(f"{shape:<18} {short(r['config']):<62} {r['tflops']:8.1f} {r['cublas_tflops']:8.1f} "
              f"{r['ratio']:6.3f}")
    fractions = "  ".join(f"{k}={v:.3f}" for k, v in sorted(result["knob_best_fraction"].items()))
    print(f"knob values' best fraction of a shape's best: {fractions}")
    geomean = result["geomean_ratio"]
    print(f"geomean of the best ratios: {geomean:.3f}" if geomean else "no timing")
    print(f"all ok: {result['all_ok']} ({result['device'].get('name')}, {result['seconds']} s)")


def sanitize_main(given_commit: str | None, out: Path | None) -> int:
    """Each sanitizer over the sanitize jobs, as `tunefw verify --sanitize` runs them."""
    from tunefw.measure import sanitize

    started, cache = time.monotonic(), tempfile.mkdtemp(prefix="wgmma-sanitize-")
    jobs = sanitize_jobs()
    runs = [sanitize.run_tool(tool, jobs, cache, timeout_s=SANITIZE_TIMEOUT_S)
            for tool in sanitize.TOOLS]
    result = {"script": f"{SCRIPT} --sanitize", "date": datetime.date.today().isoformat(),
              "commit": gpu_result.commit(given_commit), "jobs": [j.as_dict() for j in jobs],
              "tools": runs, "clean": all(r["clean"] and r["all_ok"] for r in runs),
              "seconds": round(time.monotonic() - started, 1)}
    gpu_result.write(result, gpu_result.out_path("wgmma_sm90_sanitize.json", out))
    for r in runs:
        print(f"{r['tool']:<10} {sanitize.verdict(r):<40} errors={r['errors']} {r['statuses']}")
    print(f"sanitize: {'all clean' if result['clean'] else 'NOT clean'} ({result['seconds']} s)")
    return 0 if result["clean"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-perf", action="store_true")
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("--only-shape", default=None, help="time one shape only, e.g. 4096x4096x4096")
    ap.add_argument("--sanitize", action="store_true",
                    help="verify a few small configs under compute-sanitizer memcheck and racecheck")
    ap.add_argument("--commit", help="the commit, where the tree has no git metadata")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="print the plan (no GPU)")
    args = ap.parse_args(argv)
    if args.sanitize:
        return sanitize_main(args.commit, args.out)
    device = H200
    if not args.dry_run:
        from tunefw.cuda.driver import local_spec
        device = local_spec(0)
    verify_jobs, refused = plan_verify(device) if not args.skip_verify else ([], [])
    perf_jobs = plan_perf(device, args.only_shape) if not args.skip_perf else []
    print(f"{len(verify_jobs)} correctness jobs ({len(refused)} pairs refused by check()), "
          f"{len(perf_jobs)} timed jobs on {device.name}", flush=True)
    if args.dry_run:
        return 0
    started, cache = time.monotonic(), tempfile.mkdtemp(prefix="wgmma-check-")
    failures = sass_failures(verify_jobs + perf_jobs, device.arch, cache)
    parts = {}
    if verify_jobs:
        parts["verify"] = gpu_result.guarded(lambda: run_verify(
            runnable(verify_jobs, failures), cache, timeout_s=JOB_TIMEOUT_S))
    wrong = {(config_key(T.family, c["config"]), c["dtype"])
             for c in per_config(parts.get("verify", {}).get("rows", [])) if c["status"] != "OK"}
    perf_jobs = [j for j in runnable(perf_jobs, failures)  # a config wrong somewhere is not timed
                 if (config_key(T.family, j.config), j.problem.dtype) not in wrong]
    if perf_jobs:
        parts["perf"] = gpu_result.guarded(lambda: run_verify(
            perf_jobs, cache, timeout_s=JOB_TIMEOUT_S, timed=True))
    result = compose(parts, refused, failures, args.commit, started)
    gpu_result.write(result, gpu_result.out_path("wgmma_sm90_gpu_check.json", args.out))
    print_table(result)
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
