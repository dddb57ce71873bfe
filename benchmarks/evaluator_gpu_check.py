"""GPU check of the CUDA evaluator: fault kernels, repeatability, confirmation, compile speed.

Repeatability is that of the search's figure: each screen times the config interleaved with
cuBLAS, and the five screens' ratios to that cuBLAS must agree within 2%; the raw medians' spread
(``raw_spread``) and NVML's reading after each screen show the clock drift the ratio cancels.

Run on a GPU host from the repo root: ``PYTHONPATH=. python benchmarks/evaluator_gpu_check.py``.
Trials run in child worker processes (like the sweep's GPU workers): a poisoned or hung worker is
replaced by a fresh one and the next trial runs there. Writes $OUT/evaluator_gpu_check.json
(else benchmarks/results/). Takes a few minutes.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

import gpu_result  # noqa: E402
from faults.fault_family import EXPECTED, FAULT_DIR, FAULTS, FaultFamily  # noqa: E402
from tunefw.cli.compile import sample_configs  # noqa: E402
from tunefw.cuda.compiler import CompilePool  # noqa: E402
from tunefw.device import H200  # noqa: E402
from tunefw.outcome import cublas_ratio  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.templates import get_family  # noqa: E402

FAULT_PROBLEM = {"M": 1024, "N": 1024, "K": 1024, "dtype": "bf16", "layout": "TN"}
MARK = "@@"  # prefix of the child's result lines (anything else on stdout is library noise)
STARTUP_S = 180.0  # child: import torch, create the context, first compiles
SLACK_S = 30.0  # beyond a trial's timeout before the parent's watchdog kills the child


# ---- child: one GPU worker ------------------------------------------------------------------
def child(jobs: list[dict], cache_dir: str) -> None:
    """Run jobs in order on cuda:0; one result line each; stop after a poisoned outcome."""
    from tunefw.cuda.compiler import compile_kernel
    from tunefw.evaluate.cuda import CudaEvaluator
    from tunefw.outcome import TrialSpec
    from tunefw.templates import FAMILIES

    evaluator = CudaEvaluator(0, families={**FAMILIES, "fault": FaultFamily()})
    arch = evaluator.device_spec().arch
    print(MARK + json.dumps({"fingerprint": evaluator.fingerprint(), "arch": arch}), flush=True)
    # Every kernel is compiled before the first trial, as a sweep's pool compiles ahead of the
    # GPU: a compile between two trials idles the GPU for about a second, and the screen after
    # it then runs on a boosted clock (8% fast on the H200).
    compiled_jobs = []
    for job in jobs:
        source = FAULT_DIR if job["family"] == "fault" else None
        compiled_jobs.append(compile_kernel(evaluator.families[job["family"]], job["config"],
                                            job["problem"]["dtype"], arch, cache_dir=cache_dir,
                                            source_dir=source))
    for job, compiled in zip(jobs, compiled_jobs):
        spec = TrialSpec(job["id"], job["family"], job["config"], job["problem"], job["timeout_s"])
        run = evaluator.confirm if job["kind"] == "confirm" else evaluator.evaluate
        outcome = run(spec, compiled).as_dict()
        outcome["regs"], outcome["spill_bytes"] = compiled.regs, compiled.spill_bytes
        print(MARK + json.dumps({"id": job["id"], "outcome": outcome}), flush=True)
        if outcome["poisoned"]:
            break
    sys.stdout.flush()
    os._exit(0)  # skip CUDA teardown: a poisoned or hung context must not block the exit


# ---- parent: the pool and its watchdog --------------------------------------------------------
class _Results:
    """The child's result lines, read from its stdout with a deadline (select on the raw pipe)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.fd = proc.stdout.fileno()
        self.buffer = b""

    def next(self, deadline: float) -> dict | None:
        """The next result, or None if the child exited or passed the deadline."""
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                if line.startswith(MARK.encode()):
                    return json.loads(line[len(MARK):])
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.fd], [], [], remaining)[0]:
                return None
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk


def run_jobs(jobs: list[dict], cache_dir: str) -> tuple[dict[int, dict], dict[int, bool], dict]:
    """Run all jobs in child workers; returns outcomes, fresh-worker flags and the worker's
    fingerprint and arch."""
    outcomes: dict[int, dict] = {}
    fresh: dict[int, bool] = {}
    worker: dict = {}
    pending = list(jobs)
    while pending:
        proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(pending),
                                 "--cache-dir", cache_dir], stdout=subprocess.PIPE,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                    filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))})
        results = _Results(proc)
        worker = results.next(time.monotonic() + STARTUP_S) or {}
        if "fingerprint" not in worker:
            proc.kill()
            raise RuntimeError("GPU worker did not start (see stderr above)")
        first = True
        while pending:
            job = pending[0]
            start = time.monotonic()
            line = results.next(start + job["timeout_s"] + SLACK_S)
            if line is None:  # hung or died: the watchdog's verdict, then a fresh worker
                alive = proc.poll() is None
                proc.kill()
                outcomes[job["id"]] = {"status": "TIMEOUT" if alive else "WORKER_LOST",
                                       "log": "killed by the watchdog" if alive else "worker exited",
                                       "poisoned": True, "seconds": time.monotonic() - start}
            else:
                outcomes[job["id"]] = {**line["outcome"], "seconds": time.monotonic() - start}
            fresh[job["id"]] = first
            first = False
            pending.pop(0)
            if outcomes[job["id"]]["poisoned"]:
                break
        proc.kill()
        proc.wait()
    return outcomes, fresh, worker


# ---- the checks -------------------------------------------------------------------------------
def fault_jobs(timeout_s: float) -> list[dict]:
    """Each fault followed by a normal trial (the 'next trial' on that GPU)."""
    jobs = []
    for fault in FAULTS:
        for config in ({"fault": fault}, {"fault": "none"}):
            jobs.append({"id": len(jobs), "kind": "evaluate", "family": "fault", "config": config,
                         "problem": FAULT_PROBLEM, "timeout_s": timeout_s, "fault": fault})
    return jobs


def real_config(family_name: str, problem: GemmProblem) -> dict:
    """The family's default config when it is valid for the problem, else a sampled valid one."""
    family = get_family(family_name)
    config = family.default_config()
    if family.check(config, problem, H200) is None:
        return config
    return sample_configs(family, problem, H200, 1, seed=0)[0]


def repeat_jobs(family: str, config: dict, problem: GemmProblem, first_id: int, repeats: int,
                timeout_s: float, lead_in: list[dict]) -> list[dict]:
    """Screens of ``lead_in`` configs (other configs of the same shape, as a sweep runs them),
    then the config screened ``repeats`` times in a row (each anchored with cuBLAS), then its
    confirmation.

    What precedes the five screens sets the GPU's clock for the first of them: after the light
    fault trials it ran 4.5% faster than the next four, right after the (hotter) confirmation
    3.5% slower. In a sweep a screen follows other screens, so the check does that too."""
    base = {"family": family, "problem": problem.as_dict(), "timeout_s": timeout_s}
    jobs = [{**base, "config": c, "id": first_id + i, "kind": "evaluate", "lead_in": True}
            for i, c in enumerate(lead_in)]
    jobs += [{**base, "config": config, "id": first_id + len(jobs) + i, "kind": "evaluate"}
             for i in range(repeats)]
    return jobs + [{**base, "config": config, "id": first_id + len(jobs), "kind": "confirm"}]


def spreads(values: list[float], screens: int) -> tuple[float | None, float | None]:
    """(max - min) and the largest distance from the median, each over the median; None when
    a screen was not OK."""
    if not values or len(values) < screens:
        return None, None
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid, max(abs(x - mid) for x in values) / mid


def compile_speed(arch: str, per_family: int, cache_dir: str) -> dict:
    """Seconds per compile on one core (sequential, empty cache) and pool throughput on all cores."""
    problem = GemmProblem(4096, 4096, 4096)
    result: dict = {}
    for name in ("mma_sm80", "wgmma_sm90"):
        family = get_family(name)
        configs = sample_configs(family, problem, H200, per_family, seed=1)
        with CompilePool(1, cache_dir=Path(cache_dir) / f"one-{name}") as pool:
            seconds = [pool.submit(family, c, "bf16", arch).result().seconds for c in configs]
        start = time.perf_counter()
        with CompilePool(cache_dir=Path(cache_dir) / f"all-{name}") as pool:
            done = [f.result() for f in [pool.submit(family, c, "bf16", arch) for c in configs]]
        wall = time.perf_counter() - start
        result[name] = {"configs": len(configs), "median_s": statistics.median(seconds),
                        "max_s": max(seconds), "ok": sum(r.ok for r in done),
                        "pool_kernels_per_s": len(configs) / wall, "pool_workers": os.cpu_count()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--child")
    parser.add_argument("--cache-dir")
    parser.add_argument("--family", default="wgmma_sm90")
    parser.add_argument("--shape", default="4096x4096x4096")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--compiles", type=int, default=8)
    parser.add_argument("--faults-only", action="store_true",
                        help="only the fault kernels (no repeat screens, no compile timing)")
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child), args.cache_dir)
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="tunefw-gpu-check-")
    started = time.time()

    faults = fault_jobs(args.timeout)
    m, n, k = (int(x) for x in args.shape.lower().split("x"))
    problem = GemmProblem(m, n, k)
    config = real_config(args.family, problem)
    others = [c for c in sample_configs(get_family(args.family), problem, H200, 6, seed=2)
              if c != config][:4]
    repeats = [] if args.faults_only else repeat_jobs(args.family, config, problem, len(faults), 5,
                                                       60.0, others)
    outcomes, fresh, worker = run_jobs(faults + repeats, cache_dir)

    fault_rows = []
    for job in faults[::2]:
        out, nxt = outcomes[job["id"]], outcomes[job["id"] + 1]
        fault_rows.append({"fault": job["fault"], "outcome": out["status"],
                           "expected": EXPECTED[job["fault"]], "next_outcome": nxt["status"],
                           "next_in_fresh_worker": fresh[job["id"] + 1],
                           "seconds": round(out["seconds"], 2), "log": out["log"][:300],
                           "regs": out.get("regs"), "spill_bytes": out.get("spill_bytes")})
    if args.faults_only:
        report = {"script": "benchmarks/evaluator_gpu_check.py --faults-only",
                  "date": datetime.date.today().isoformat(), "commit": gpu_result.commit(), "device": worker["fingerprint"],
                  "faults": fault_rows,
                  "faults_as_expected": all(r["outcome"] == r["expected"] and r["next_outcome"] == "OK"
                                            for r in fault_rows),
                  "wall_s": round(time.time() - started, 1)}
        out_dir = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "evaluator_faults_h200.json").write_text(json.dumps(report, indent=2, default=str))
        for r in fault_rows:
            print(f"{r['fault']:>18} {r['outcome']:>16} expected {r['expected']:>16} next {r['next_outcome']}  {r['log'][:90]}")
        print("faults as expected:", report["faults_as_expected"])
        return
    confirm = outcomes[repeats[-1]["id"]]
    screens = [outcomes[j["id"]] for j in repeats[:-1] if not j.get("lead_in")]
    ok = [s for s in screens if s["status"] == "OK"]
    ratios = [cublas_ratio(s["tflops"], s["cublas_tflops"]) for s in ok]
    spread, max_from_median = spreads(ratios, len(screens))
    row = {"family": args.family, "dtype": "bf16", "M": m, "N": n, "K": k, "config": config,
           "tflops": confirm.get("tflops"), "cublas_tflops": confirm.get("cublas_tflops"),
           "ratio": cublas_ratio(confirm.get("tflops"), confirm.get("cublas_tflops")),
           "configs_checked": 1, "wrong": int(confirm["status"] == "WRONG_ANSWER"),
           "status": confirm["status"], "log": confirm["log"][:300]}
    compile_s = compile_speed(worker["arch"], args.compiles, cache_dir)

    report = {
        "script": "benchmarks/evaluator_gpu_check.py",
        "date": datetime.date.today().isoformat(), "commit": gpu_result.commit(),
        "device": worker["fingerprint"],
        "rows": [row],
        "faults": fault_rows,
        "faults_as_expected": all(r["outcome"] == r["expected"] and r["next_outcome"] == "OK"
                                  for r in fault_rows),
        "screen_repeat": {"family": args.family, "config": config,
                          "after": f"screens of {len(others)} other configs of the shape",
                          # per OK screen: the kernel's and the same screen's cuBLAS medians
                          "median_ms": [s["median_ms"] for s in ok],
                          "cublas_median_ms": [s["cublas_median_ms"] for s in ok],
                          "ratio": ratios,
                          "tflops": [s["tflops"] for s in ok],
                          # NVML right after each screen: a screen on a dipped clock shows it.
                          "after_each": [{k: (s.get("fingerprint") or {}).get(k) for k in
                                          ("sm_clock_mhz", "power_w", "temperature_c")}
                                         for s in ok],
                          # of the ratios (the search's figure); raw_spread: of the raw medians
                          "spread": spread, "max_from_median": max_from_median,
                          "within_2pct": spread is not None and spread <= 0.02,
                          "raw_spread": spreads([s["median_ms"] for s in ok], len(screens))[0]},
        "confirm": {k: confirm.get(k) for k in ("status", "median_ms", "min_ms", "iqr_ms", "tflops",
                                               "cublas_median_ms", "cublas_tflops", "busy_s", "log")},
        "compile_s_per_kernel": compile_s,
        "wall_s": round(time.time() - started, 1),
    }
    _print(report)
    out_dir = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "evaluator_gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    print(f"wrote {out_dir / 'evaluator_gpu_check.json'}")


def _print(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"fault kernels on {report['device'].get('name')}")
    for column in ("fault", "outcome", "expected", "next", "fresh worker", "s", "log"):
        table.add_column(column)
    for r in report["faults"]:
        good = r["outcome"] == r["expected"] and r["next_outcome"] == "OK"
        table.add_row(r["fault"], f"[{'green' if good else 'red'}]{r['outcome']}[/]", r["expected"],
                      r["next_outcome"], str(r["next_in_fresh_worker"]), f"{r['seconds']:.1f}",
                      r["log"][:60])
    console = Console(width=160)
    console.print(table)
    console.print("screen x5:", report["screen_repeat"])
    console.print("confirm:", report["confirm"])
    console.print("compile:", report["compile_s_per_kernel"])


if __name__ == "__main__":
    main()
