"""Focused GPU check of the wgmma_sm90 family on an H200 (fast: about 3-4 minutes).

    PYTHONPATH=. python benchmarks/wgmma_sm90_gpu_check.py                # correctness + speed
    PYTHONPATH=. python benchmarks/wgmma_sm90_gpu_check.py --sanitize --budget-s 480  # sanitizer only
    options: --budget-s 220, --skip-perf, --skip-verify, --only-shape 4096x4096x4096

Self-contained: compiles with NVRTC (sm_90a) through tunefw.cuda.compiler, loads the cubins with
cuda.bindings.driver (cuModuleLoadData, cuFuncSetAttribute, cuLaunchKernelEx with the cluster
dimension attribute, on torch's current stream) and builds the TMA tensor maps with the family's
own kernel_args().

A kernel that hangs or faults must not take the run with it: the parent process only compiles
and orchestrates; the GPU work runs in worker subprocesses that report one JSON line per job.
A job that exceeds its time limit or kills its worker is recorded (HANG / CRASH) and a fresh
worker continues with the jobs after it.

Correctness (every ping-pong variant and a sample of the rest): the edge shapes (1,8,8),
(17,24,40), (129,136,264), (4095,4104,4104), (300,1000,520), launched twice each (C poisoned with
NaN before each launch, the split-K workspace zeroed once), judged by tunefw.evaluate.method.verify
against A.float() @ B.float().T with cuBLAS's error as the second bound; the two launches must
agree bit for bit. Persistent configs are also run on a SMALL grid (a few clusters), so that every
CTA loops over several tiles and the two ping-pong consumers get uneven tile counts.

Speed: a focused candidate list per public-suite shape, each config timed INTERLEAVED with cuBLAS
(tunefw.evaluate.method.interleaved: A B A B ..., L2 flushed before every launch, medians), so
clock/power drift between configs does not bias the ratio. Every timed config is verified at the
timed shape first.

--sanitize: a few small configs (a cooperative 2x1 cluster with the overlapped epilogue, a
persistent ping-pong, a ping-pong cluster with split-K) run in a child process under
`compute-sanitizer --tool memcheck` and `--tool racecheck` (small persistent grid, so CTAs loop
over tiles); the "ERROR SUMMARY: N errors" line of each is recorded.

Prints a table last; writes $OUT/wgmma_sm90_gpu_check.json (or wgmma_sm90_sanitize.json).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.templates.wgmma_sm90 import WgmmaSm90  # noqa: E402

T = WgmmaSm90()
DEFAULT = T.default_config()

EDGE_SHAPES = [(1, 8, 8), (17, 24, 40), (129, 136, 264), (4095, 4104, 4104), (300, 1000, 520)]
PERF_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 28672, 4096), (128, 6144, 4096),
               (16, 4096, 14336), (2048, 4096, 14336)]
SMALL_GRID_CLUSTERS = 5  # persistent configs are verified on this many clusters too
FIRST_JOB_TIMEOUT_S = 120.0  # includes torch + CUDA start in a fresh worker
JOB_TIMEOUT_S = 45.0
SANITIZE_TIMEOUT_S = 150.0
FLUSH_BYTES = 512 * 2**20
TIME_MIN_LAUNCHES = 15
TIME_MIN_MS = 25.0


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


# ---- orchestration (parent) ----------------------------------------------------------------------
def _key(config: dict, dtype: str) -> str:
    return json.dumps(config, sort_keys=True) + "|" + dtype


def _compile_all(jobs: list[dict], cubin_dir: Path) -> dict:
    """NVRTC-compile every distinct (config, dtype) once; returns key -> compile record."""
    from tunefw.cuda.compiler import CompilePool, compiler_info, sass_check

    keys = {}
    for job in jobs:
        keys[_key(job["config"], job["dtype"])] = (job["config"], job["dtype"])
    records = {}
    with CompilePool(min(16, os.cpu_count() or 1), cache_dir=cubin_dir / "cache") as pool:
        futures = {k: pool.submit(T, c, d, "sm_90a") for k, (c, d) in keys.items()}
        for k, fut in futures.items():
            r = fut.result()
            warn = [ln.strip() for ln in r.log.splitlines() if "(C75" in ln]
            rec = {"ok": r.ok, "regs": r.regs, "spill_bytes": r.spill_bytes, "seconds": r.seconds,
                   "lowered": r.lowered_name, "log": "" if r.ok else r.log[-2000:],
                   "ptxas_warnings": warn}
            if r.ok:
                path = cubin_dir / f"{r.key}.cubin"
                path.write_bytes(r.cubin)
                rec["cubin"] = str(path)
                rec["sass"] = sass_check(r.cubin, require_hgmma=True)
            records[k] = rec
    print(f"compiled {len(records)} kernels with {compiler_info().label}", flush=True)
    return records


def _run_workers(jobs: list[dict], work: Path, deadline: float, tag: str,
                 prefix: list[str] | None = None) -> list[dict]:
    """Run jobs in worker subprocesses; a hung or crashed job is recorded and skipped."""
    results: list[dict] = []
    pending = list(jobs)
    rounds = 0
    barren = 0  # workers in a row that died before finishing any job
    while pending and time.monotonic() < deadline and rounds < 16 and barren < 2:
        job_file = work / f"{tag}_{rounds}.json"
        out_file = work / f"{tag}_{rounds}.jsonl"
        rounds += 1
        job_file.write_text(json.dumps(pending))
        out_file.write_text("")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
        proc = subprocess.Popen([sys.executable, __file__, "--worker", str(job_file), str(out_file)],
                                env=env, start_new_session=True)
        done_ids: set[int] = set()
        started: int | None = None
        job_deadline = time.monotonic() + FIRST_JOB_TIMEOUT_S
        reason = None
        seen = 0
        while True:
            code = proc.poll()  # before reading: every line written before the exit is seen
            for line in out_file.read_text().splitlines()[seen:]:
                try:
                    msg = json.loads(line)
                except ValueError:
                    break  # a partial line: read it next time
                seen += 1
                if msg["event"] == "start":
                    started = msg["id"]
                    job_deadline = time.monotonic() + msg.get("timeout", JOB_TIMEOUT_S)
                elif msg["event"] == "done":
                    done_ids.add(msg["id"])
                    results.append(msg["result"])
                    started = None
            if code is not None:
                if code != 0:
                    reason = f"CRASH (worker exit code {code})"
                break
            if time.monotonic() > job_deadline or time.monotonic() > deadline:
                reason = "HANG (over its time limit; worker killed)"
                try:
                    os.killpg(proc.pid, 9)
                except ProcessLookupError:
                    pass
                proc.wait()
                break
            time.sleep(0.2)
        pending = [j for j in pending if j["id"] not in done_ids]
        if reason is None:
            break
        if started is not None:  # the job that was running when the worker died or hung
            bad = next(j for j in pending if j["id"] == started)
            results.append({**_job_row(bad), "status": reason.split()[0], "detail": reason})
            print(f"  !! {reason}: {bad['kind']} {bad['dtype']} {_short(bad['config'])}", flush=True)
            pending = [j for j in pending if j["id"] != started]
        barren = 0 if (done_ids or started is not None) else barren + 1
        if barren:
            print(f"  !! worker died before its first job: {reason}", flush=True)
    for j in pending:
        results.append({**_job_row(j), "status": "SKIPPED",
                        "detail": "time budget, or workers kept dying before their first job"})
    return results


def _job_row(job: dict) -> dict:
    return {"kind": job["kind"], "group": job.get("group"), "dtype": job["dtype"],
            "config": job["config"], "shape": job.get("shape")}


def _device_info() -> dict:
    code = ("import json, torch; from cuda.bindings import driver as cu; cu.cuInit(0); "
            "p = torch.cuda.get_device_properties(0); "
            "d = {'name': p.name, 'uuid': str(getattr(p, 'uuid', '')), "
            "'cc': p.major * 10 + p.minor, 'sm_count': p.multi_processor_count, "
            "'driver': cu.cuDriverGetVersion()[1], 'cuda': torch.version.cuda, 'torch': torch.__version__}\n"
            "try:\n import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
            " d['driver'] = pynvml.nvmlSystemGetDriverVersion()\n"
            " d['sm_clock_mhz'] = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)\n"
            " d['max_sm_clock_mhz'] = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)\n"
            " d['power_limit_w'] = pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000\n"
            "except Exception as e:\n d['nvml'] = repr(e)\n"
            "print(json.dumps(d))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc)}


def _write(name: str, summary: dict) -> None:
    out_dir = os.environ.get("OUT")
    if out_dir:
        path = Path(out_dir) / name
        path.write_text(json.dumps(summary, indent=1, default=str))
        print(f"\nwrote {path}")


def _short(c: dict) -> str:
    return (f"{c['SCHEDULE'][:4]} {c['BM']}x{c['BN']}x{c['BK']} s{c['STAGES']} sw{c['SWIZZLE']} "
            f"cl{c['CLUSTER_M']}x{c['CLUSTER_N']} p{c['PERSISTENT']} r{c['RASTER']}{c['GROUP']} "
            f"k{c['SPLIT_K']} {c['EPILOGUE']}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-s", type=float, default=220.0, help="stop starting jobs after this")
    ap.add_argument("--skip-perf", action="store_true")
    ap.add_argument("--skip-verify", action="store_true")
    ap.add_argument("--only-shape", default=None, help="time one shape only, e.g. 4096x4096x4096")
    ap.add_argument("--sanitize", action="store_true",
                    help="run a few small configs under compute-sanitizer memcheck and racecheck")
    args = ap.parse_args()
    if args.sanitize:
        return sanitize_main(args)
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    from tunefw.cuda.compiler import compiler_info

    device = _device_info()
    print(f"device: {json.dumps(device)}", flush=True)

    jobs = []
    if not args.skip_verify:
        for group, config, dtype in correctness_configs():
            jobs.append({"id": len(jobs), "kind": "verify", "group": group, "config": config,
                         "dtype": dtype, "shapes": EDGE_SHAPES})
    perf_jobs = []
    if not args.skip_perf:
        for shape, configs in perf_configs().items():
            if args.only_shape and "x".join(map(str, shape)) != args.only_shape:
                continue
            for config in configs:
                perf_jobs.append({"id": 10000 + len(perf_jobs), "kind": "time", "group": "perf",
                                  "config": config, "dtype": "bf16", "shape": shape})

    work = Path(tempfile.mkdtemp(prefix="wgmma_gpu_check_"))
    records = _compile_all(jobs + perf_jobs, work)
    for job in jobs + perf_jobs:
        job["compile"] = records[_key(job["config"], job["dtype"])]
    compile_failures = {k: r for k, r in records.items()
                        if not r["ok"] or r.get("sass") or r.get("spill_bytes")}
    print(f"compile: {len(records) - len(compile_failures)} ok, {len(compile_failures)} failed "
          f"({time.monotonic() - t0:.0f} s)", flush=True)
    for k, r in compile_failures.items():
        print(f"  compile failure: {k[:160]}: {(r.get('sass') or r['log'])[-300:]}")

    verify_rows = []
    for group in ("pingpong", "coop", "split"):
        group_jobs = [j for j in jobs if j["group"] == group]
        if group_jobs:
            print(f"== correctness: {group} ({len(group_jobs)} configs)", flush=True)
            verify_rows += _run_workers(group_jobs, work, deadline, f"verify_{group}")

    perf_rows = []
    if perf_jobs:
        failed = {json.dumps(r["config"], sort_keys=True) for r in verify_rows
                  if r.get("status") != "OK" and r["dtype"] == "bf16"}
        todo = [j for j in perf_jobs if json.dumps(j["config"], sort_keys=True) not in failed]
        skipped = [j for j in perf_jobs if j not in todo]
        print(f"== speed: {len(todo)} timings, interleaved with cuBLAS ({len(skipped)} skipped: "
              "config failed its correctness check)", flush=True)
        perf_rows = _run_workers(todo, work, deadline, "time")
        for j in skipped:
            perf_rows.append({**_job_row(j), "status": "SKIPPED",
                              "detail": "config failed its correctness check"})

    # ---- report ----
    wrong = [r for r in verify_rows if r.get("status") != "OK"]
    checked = sum(len(r.get("shapes", [])) for r in verify_rows)
    print("\n== correctness")
    for r in verify_rows:
        mark = "ok " if r.get("status") == "OK" else "BAD"
        print(f"{mark} {r['group']:<8} {r['dtype']} {_short(r['config'])}  {r.get('detail', '')}")
    print(f"{len(verify_rows) - len(wrong)} configs ok, {len(wrong)} not ok; {checked} (config, shape, grid) runs")

    print("\n== speed (ratio = tflops / cublas_tflops, cuBLAS interleaved per row)")
    print(f"{'shape':<18} {'config':<62} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6}")
    best: dict[str, dict] = {}
    best_by: dict[str, dict] = {}  # shape -> {"schedule:..."/"cluster:...": row}
    for r in sorted(perf_rows, key=lambda r: (r["shape"], -(r.get("ratio") or 0))):
        shape = "x".join(map(str, r["shape"]))
        if r.get("status") != "OK":
            print(f"{shape:<18} {_short(r['config']):<62} {'-':>8} {'-':>8} {'-':>6}  "
                  f"{r.get('status')} {str(r.get('detail', ''))[:120]}")
            continue
        print(f"{shape:<18} {_short(r['config']):<62} {r['tflops']:8.1f} {r['cublas_tflops']:8.1f} "
              f"{r['ratio']:6.3f}")
        if shape not in best or r["ratio"] > best[shape]["ratio"]:
            best[shape] = r
        c = r["config"]
        for knob in (f"schedule:{c['SCHEDULE']}", f"cluster:{c['CLUSTER_M']}x{c['CLUSTER_N']}",
                     f"epilogue:{c['EPILOGUE']}"):
            cur = best_by.setdefault(shape, {}).get(knob)
            if cur is None or r["ratio"] > cur["ratio"]:
                best_by[shape][knob] = r
    print("\n== best per shape")
    ratios = []
    for shape, r in best.items():
        ratios.append(r["ratio"])
        print(f"{shape:<18} {r['tflops']:8.1f} TFLOP/s vs cuBLAS {r['cublas_tflops']:8.1f}  "
              f"ratio {r['ratio']:.3f}  {_short(r['config'])}")
    if ratios:
        geo = 1.0
        for x in ratios:
            geo *= x
        geo **= 1.0 / len(ratios)
        print(f"geomean ratio over {len(ratios)} shapes: {geo:.3f}")
    print("\n== every knob real: best of each schedule / cluster / epilogue per shape, as a "
          "fraction of that shape's best (>= 0.95 somewhere = real)")
    knob_real: dict[str, float] = {}
    for shape, by in best_by.items():
        top = best[shape]["ratio"]
        cells = []
        for knob, r in sorted(by.items()):
            frac = r["ratio"] / top
            knob_real[knob] = max(knob_real.get(knob, 0.0), frac)
            cells.append(f"{knob}={frac:.3f}")
        print(f"{shape:<18} " + "  ".join(cells))
    print("max over shapes: " + "  ".join(f"{k}={v:.3f}" for k, v in sorted(knob_real.items())))
    summary = {
        "script": "benchmarks/wgmma_sm90_gpu_check.py",
        "date": _dt.date.today().isoformat(),
        "device": {**device, "compiler": compiler_info().label},
        "configs_checked": len(verify_rows), "runs_checked": checked, "wrong": len(wrong),
        "compile_failures": [{"key": k, **{x: v for x, v in rec.items() if x != "cubin"}}
                             for k, rec in compile_failures.items()],
        "correctness": verify_rows,
        "rows": [dict(r, family="wgmma_sm90", M=r["shape"][0], N=r["shape"][1], K=r["shape"][2])
                 for r in perf_rows],
        "best": best,
        "best_by_knob": best_by,
        "knob_best_fraction": knob_real,
        "seconds": round(time.monotonic() - t0, 1),
    }
    _write("wgmma_sm90_gpu_check.json", summary)
    print(f"total {time.monotonic() - t0:.0f} s")
    return 0 if not wrong else 1


# ---- compute-sanitizer -----------------------------------------------------------------------------
def _sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    pats = ["/usr/local/cuda*/bin/compute-sanitizer", "/usr/local/cuda*/compute-sanitizer/compute-sanitizer",
            "/opt/nvidia/*/compute-sanitizer", str(Path(sys.prefix) / "lib/python3*/site-packages/nvidia/*/bin/compute-sanitizer")]
    for pat in pats:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


def sanitize_main(args) -> int:
    t0 = time.monotonic()
    from tunefw.cuda.compiler import compiler_info

    device = _device_info()
    tool_path = _sanitizer()
    print(f"device: {json.dumps(device)}\ncompute-sanitizer: {tool_path}", flush=True)
    work = Path(tempfile.mkdtemp(prefix="wgmma_sanitize_"))
    jobs = [{"id": i, "kind": "verify", "group": "sanitize", "config": c, "dtype": "bf16",
             "shapes": [shape], "small_grid_only": True}
            for i, (c, shape) in enumerate(sanitize_configs())]
    records = _compile_all(jobs, work)
    rows = []
    for job in jobs:
        job["compile"] = records[_key(job["config"], job["dtype"])]
        for tool in ("memcheck", "racecheck"):
            row = {"tool": tool, "config": job["config"], "shape": job["shapes"][0]}
            if time.monotonic() - t0 > args.budget_s:
                row.update(status="SKIPPED", errors=None, detail="--budget-s reached")
                rows.append(row)
                continue
            if tool_path is None:
                row.update(status="NO_SANITIZER", errors=None)
                rows.append(row)
                continue
            job_file = work / f"san_{job['id']}_{tool}.json"
            out_file = work / f"san_{job['id']}_{tool}.jsonl"
            job_file.write_text(json.dumps([job]))
            out_file.write_text("")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
            base = [tool_path, "--tool", tool, "--print-limit", "20"]
            tail = [sys.executable, __file__, "--worker", str(job_file), str(out_file)]
            t1 = time.monotonic()
            text, rc = "", None
            for filt in (["--kernel-name", "kns=gemm_wgmma_sm90"], []):  # filter, else everything
                try:
                    proc = subprocess.run(base + filt + tail, capture_output=True, text=True,
                                          env=env, timeout=SANITIZE_TIMEOUT_S)
                    text, rc = proc.stdout + proc.stderr, proc.returncode
                except subprocess.TimeoutExpired as exc:
                    text = f"TIMEOUT after {SANITIZE_TIMEOUT_S} s\n" + str(exc.stdout or "")[-2000:]
                    rc = None
                if "ERROR SUMMARY" in text or rc is None:
                    row["kernel_filter"] = bool(filt)
                    break
            m = re.search(r"ERROR SUMMARY:\s*(\d+)\s*error", text)
            result = None
            for line in out_file.read_text().splitlines():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("event") == "done":
                    result = msg["result"]
            row.update(errors=int(m.group(1)) if m else None, returncode=rc,
                       seconds=round(time.monotonic() - t1, 1),
                       verify=(result or {}).get("status"),
                       status="CLEAN" if m and int(m.group(1)) == 0 and (result or {}).get("status") == "OK"
                       else ("ERRORS" if m and int(m.group(1)) else "FAILED"),
                       log_tail=text[-3000:])
            rows.append(row)
            print(f"{tool:<10} {row['status']:<7} errors={row['errors']} verify={row.get('verify')} "
                  f"{row['seconds']:.0f}s  {_short(job['config'])} {job['shapes'][0]}", flush=True)
            if row["status"] != "CLEAN":
                print("   " + "\n   ".join(text[-1500:].splitlines()[-25:]))
    summary = {"script": "benchmarks/wgmma_sm90_gpu_check.py --sanitize",
               "date": _dt.date.today().isoformat(),
               "device": {**device, "compiler": compiler_info().label},
               "sanitizer": tool_path, "rows": rows,
               "clean": all(r["status"] == "CLEAN" for r in rows),
               "seconds": round(time.monotonic() - t0, 1)}
    _write("wgmma_sm90_sanitize.json", summary)
    print(f"sanitize: {'all clean' if summary['clean'] else 'NOT clean'} ({summary['seconds']:.0f} s)")
    return 0 if summary["clean"] else 1


# ---- worker (child): the GPU work ------------------------------------------------------------------
class Gpu:
    def __init__(self) -> None:
        import torch
        from cuda.bindings import driver as cu

        self.torch, self.cu = torch, cu
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        self.check(cu.cuInit(0))
        ctx = self.check(cu.cuCtxGetCurrent())
        if not int(ctx):
            dev = self.check(cu.cuDeviceGet(torch.cuda.current_device()))
            ctx = self.check(cu.cuDevicePrimaryCtxRetain(dev))
            self.check(cu.cuCtxSetCurrent(ctx))
        from tunefw.device import spec_for

        p = torch.cuda.get_device_properties(0)
        self.spec = spec_for(p.name, p.major * 10 + p.minor, p.multi_processor_count,
                             getattr(p, "shared_memory_per_block_optin", 232448),
                             getattr(p, "shared_memory_per_multiprocessor", 233472),
                             getattr(p, "L2_cache_size", 50 * 2**20))
        self.modules: dict[str, tuple] = {}
        self.flush_buf = None
        self.shape_cache: dict = {}  # (shape, dtype, seed) -> (a, b, ref) for the current shape

    def flush(self) -> None:
        if self.flush_buf is None:
            self.flush_buf = self.torch.empty(FLUSH_BYTES // 4, dtype=self.torch.float32, device="cuda")
        self.flush_buf.zero_()

    def check(self, res):
        cu = self.cu
        err = res[0] if isinstance(res, tuple) else res
        if err != cu.CUresult.CUDA_SUCCESS:
            name = cu.cuGetErrorName(err)[1]
            raise RuntimeError(f"CUDA driver error {name.decode() if isinstance(name, bytes) else name}")
        if isinstance(res, tuple):
            return res[1] if len(res) == 2 else res[1:]
        return None

    def function(self, rec: dict, smem: int):
        if rec["cubin"] not in self.modules:
            mod = self.check(self.cu.cuModuleLoadData(Path(rec["cubin"]).read_bytes()))
            fn = self.check(self.cu.cuModuleGetFunction(mod, rec["lowered"].encode()))
            self.check(self.cu.cuFuncSetAttribute(
                fn, self.cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
            self.modules[rec["cubin"]] = (mod, fn)
        return self.modules[rec["cubin"]][1]

    def launch_config(self, launch, stream: int):
        cu = self.cu
        lc = cu.CUlaunchConfig()
        lc.gridDimX, lc.gridDimY, lc.gridDimZ = launch.grid
        lc.blockDimX, lc.blockDimY, lc.blockDimZ = launch.block
        lc.sharedMemBytes = launch.smem_bytes
        lc.hStream = cu.CUstream(stream)
        if launch.cluster != (1, 1, 1):
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = launch.cluster
            lc.attrs = [attr]
            lc.numAttrs = 1
        else:
            lc.numAttrs = 0
        return lc

    def inputs(self, shape, dtype: str, seed: int, want_ref: bool):
        """A, B (and the fp32 reference) for a shape; only the latest shape is kept."""
        from tunefw.evaluate.method import make_inputs, reference

        key = (tuple(shape), dtype, seed)
        if key not in self.shape_cache:
            self.shape_cache.clear()
            M, N, K = shape
            a, b = make_inputs(M, N, K, dtype, seed, device="cuda")
            self.shape_cache[key] = {"a": a, "b": b}
        entry = self.shape_cache[key]
        if want_ref and "ref" not in entry:
            entry["ref"] = reference(entry["a"], entry["b"])
            entry["base"] = self.torch.matmul(entry["a"], entry["b"].T)
        return entry

    def prepare(self, job: dict, shape, seed: int, small_grid: int | None = None):
        """Output, workspace and a launch closure for one (config, shape); small_grid: run a
        persistent config on that many clusters instead of one per SM."""
        torch = self.torch
        from tunefw.evaluate.method import TORCH_DTYPE

        M, N, K = shape
        problem = GemmProblem(M, N, K, job["dtype"])
        config = job["config"]
        reason = T.check(config, problem, self.spec)
        if reason:
            return None, reason
        launch = T.launch(config, problem, self.spec)
        if small_grid:
            clusters = max(1, min(small_grid, launch.extra["clusters"]))
            launch = dataclasses.replace(
                launch, grid=(config["CLUSTER_M"] * clusters, config["CLUSTER_N"], 1))
        data = self.inputs(shape, job["dtype"], seed, want_ref=False)
        a, b = data["a"], data["b"]
        c = torch.empty(M, N, dtype=TORCH_DTYPE[job["dtype"]], device="cuda")
        ws = torch.zeros(max(1, launch.workspace_bytes // 4), dtype=torch.float32, device="cuda")
        fn = self.function(job["compile"], launch.smem_bytes)
        args = T.kernel_args(config, problem, {"a": a.data_ptr(), "b": b.data_ptr(),
                                               "c": c.data_ptr(), "workspace": ws.data_ptr()})
        params = (tuple(v for v, _ in args), tuple(t for _, t in args))
        stream = torch.cuda.current_stream().cuda_stream
        lc = self.launch_config(launch, stream)

        def run():
            self.check(self.cu.cuLaunchKernelEx(lc, fn, params, 0))

        return {"data": data, "c": c, "ws": ws, "run": run, "launch": launch, "fn": fn,
                "lc": lc, "args": args}, None


def worker(job_file: str, out_file: str) -> int:
    jobs = json.loads(Path(job_file).read_text())
    out = open(out_file, "a", buffering=1)

    def emit(**msg):
        out.write(json.dumps(msg, default=str) + "\n")
        out.flush()

    gpu = Gpu()
    torch = gpu.torch
    from tunefw.evaluate.method import verify

    for job in jobs:
        emit(event="start", id=job["id"], timeout=JOB_TIMEOUT_S)
        row = _job_row(job)
        rec = job["compile"]
        if not rec["ok"] or rec.get("sass") or rec.get("spill_bytes"):
            row.update(status="COMPILE_ERROR",
                       detail=(rec.get("sass") or rec["log"] or f"spills {rec.get('spill_bytes')} bytes")[-400:])
            emit(event="done", id=job["id"], result=row)
            continue
        try:
            if job["kind"] == "verify":
                row.update(_verify_job(gpu, job, verify))
            else:
                row.update(_time_job(gpu, job, verify))
        except Exception as exc:  # noqa: BLE001
            row.update(status="RUNTIME_CRASH", detail=f"{type(exc).__name__}: {exc}"[:500])
            emit(event="done", id=job["id"], result=row)
            return 3  # the context may be poisoned: let the parent start a fresh worker
        emit(event="done", id=job["id"], result=row)
    torch.cuda.synchronize()
    return 0


def _verify_job(gpu: Gpu, job: dict, verify) -> dict:
    torch = gpu.torch
    shapes_out = []
    status, detail = "OK", ""
    grids = [None]
    if job["config"]["PERSISTENT"]:
        grids = [SMALL_GRID_CLUSTERS] if job.get("small_grid_only") else [None, SMALL_GRID_CLUSTERS]
    for i, shape in enumerate(job["shapes"]):
        seed = 1000 + 17 * i + job["id"]
        for small in grids:
            prep, reason = gpu.prepare(job, shape, seed=seed, small_grid=small)
            if prep is None:
                shapes_out.append({"shape": shape, "status": "INVALID", "reason": reason})
                break
            data = gpu.inputs(shape, job["dtype"], seed, want_ref=True)
            outs, verdicts = [], []
            for _ in range(2):
                prep["c"].fill_(float("nan"))
                prep["run"]()
                torch.cuda.synchronize()
                outs.append(prep["c"].clone())
                verdicts.append(verify(prep["c"], data["ref"], job["dtype"], baseline=data["base"]))
            same = bool(torch.equal(outs[0], outs[1]))
            ok = all(v.ok for v in verdicts) and same
            entry = {"shape": shape, "status": "OK" if ok else "WRONG_ANSWER",
                     "rel_err": max(v.rel_err for v in verdicts), "grid": prep["launch"].grid,
                     "small_grid": bool(small)}
            if not ok:
                entry["reason"] = "; ".join(v.reason for v in verdicts if not v.ok) or \
                    "the two launches differ (nondeterministic or racy)"
                if status == "OK":
                    status, detail = "WRONG_ANSWER", f"{shape} grid {entry['grid']}: {entry['reason']}"
            shapes_out.append(entry)
    return {"status": status, "detail": detail, "shapes": shapes_out,
            "regs": job["compile"]["regs"], "spill_bytes": job["compile"]["spill_bytes"]}


def _time_job(gpu: Gpu, job: dict, verify) -> dict:
    """Verify at the timed shape, then time interleaved with cuBLAS (A B A B ..., each flushed)."""
    torch = gpu.torch
    from tunefw.evaluate.method import interleaved

    shape = tuple(job["shape"])
    prep, reason = gpu.prepare(job, shape, seed=7)
    if prep is None:
        return {"status": "INVALID", "detail": reason}
    M, N, K = shape
    flops = 2.0 * M * N * K
    data = gpu.inputs(shape, job["dtype"], 7, want_ref=True)
    prep["c"].fill_(float("nan"))
    prep["run"]()
    torch.cuda.synchronize()
    v = verify(prep["c"], data["ref"], job["dtype"], baseline=data["base"])
    if not v.ok:
        return {"status": "WRONG_ANSWER", "detail": v.reason}
    a, b = data["a"], data["b"]
    cout = torch.empty(M, N, dtype=a.dtype, device="cuda")
    bt = b.T

    def cublas():
        torch.mm(a, bt, out=cout)

    ours, theirs = interleaved(prep["run"], cublas, gpu.flush, torch.cuda.synchronize,
                               min_launches=TIME_MIN_LAUNCHES, min_ms=TIME_MIN_MS)
    ms, cub_ms = ours.median_ms, theirs.median_ms
    tflops = flops / ms / 1e9
    cub = flops / cub_ms / 1e9
    ratio = tflops / cub
    extra = {}
    launch = prep["launch"]
    if launch.cluster != (1, 1, 1):
        try:
            extra["max_active_clusters"] = int(gpu.check(gpu.cu.cuOccupancyMaxActiveClusters(prep["fn"], prep["lc"])))
        except Exception as exc:  # noqa: BLE001
            extra["max_active_clusters"] = repr(exc)
    return {"status": "OK", "tflops": round(tflops, 1), "cublas_tflops": round(cub, 1),
            "ratio": round(ratio, 4), "median_ms": round(ms, 5), "min_ms": round(ours.min_ms, 5),
            "iqr_ms": round(ours.iqr_ms, 5), "samples": ours.samples,
            "cublas_ms": round(cub_ms, 5), "cublas_min_ms": round(theirs.min_ms, 5),
            "grid": launch.grid, "work_items": launch.extra.get("work_items"),
            "rel_err": v.rel_err, **extra}


if __name__ == "__main__":
    if len(sys.argv) >= 4 and sys.argv[1] == "--worker":
        sys.exit(worker(sys.argv[2], sys.argv[3]))
    sys.exit(main())
