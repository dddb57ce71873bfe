"""GPU acceptance of strict verification, in one run: every fault kernel ends as expected (those
that write outside C, leave a split-K counter dirty or are right only on the first launch as
WRONG_ANSWER), every winner of the committed dispatch tables passes, the runtime serves every
shape a table sends to a kernel after its first-use verification (tunefw/runtime/firstuse.py),
and a real `tunefw launch` sweep at 4096^3 (strict checks in every trial) still runs at least 5
trials/s.

Run once on the GPU host from the repo root (about 5 minutes):

    source benchmarks/device_setup.sh && python3 benchmarks/verify_h200.py

The faults and the tables go through `tunefw verify`'s own functions (tunefw/measure/verify.py,
the faults named by their family file as `--families` names it); the sweep is the CLI itself.
Each part records its own failure and the next still runs. Writes $OUT/verify_h200.json (else
benchmarks/results/). ``--dry-run`` plans every part without a GPU and prints the plan.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "benchmarks")]

import gpu_result  # noqa: E402
from faults.fault_family import EXPECTED, FAULT_DIR, FAULTS  # noqa: E402
from sweep_h200 import commit  # noqa: E402
from tunefw.measure.verify import Job, parse_shapes, plan, run_verify  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.runtime.rules import decide  # noqa: E402
from tunefw.templates import get_family  # noqa: E402
from tunefw.templates.family_module import load_family_module  # noqa: E402

SCRIPT = "benchmarks/verify_h200.py"
FAULT_FILE = FAULT_DIR / "fault_family.py"
FAULT_PROBLEM = GemmProblem(1024, 1024, 1024)
# The acceptance's three: a write outside C, a split-K counter left dirty, right only once.
ACCEPTANCE_FAULTS = ("outside_c", "splitk_dirty", "first_launch_only")
MIN_TRIALS_PER_S = 5.0


# ---- plans (no GPU) ---------------------------------------------------------------------------
def fault_jobs() -> list[Job]:
    """Every fault kernel once on FAULT_PROBLEM, planned as `tunefw verify fault --families`."""
    return plan("fault", [FAULT_PROBLEM], len(FAULTS), 0, families=load_family_module(FAULT_FILE))


def table_jobs(paths: list[Path], shapes: list[GemmProblem], gpu_cc: int
               ) -> tuple[list[dict], list[Job], list[str]]:
    """Per table its entry (file, fingerprint, jobs or why skipped), all tables' jobs in order,
    and the file of each job."""
    from tunefw.runtime.dispatch import load

    tables, jobs, owners = [], [], []
    for path in paths:
        entry: dict = {"file": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)}
        try:
            table = load(path)
            entry["fingerprint"] = {k: table.fingerprint.get(k) for k in ("name", "cc", "uuid")}
            too_new = sorted({e.family for e in table.entries if not e.is_cublas
                              and get_family(e.family).min_cc > gpu_cc})
            if too_new:
                raise ValueError(f"families {', '.join(too_new)} need a newer GPU than cc {gpu_cc}")
            planned = plan(str(path), shapes, 1, 0, device=table.device())
        except Exception as exc:  # a table that cannot be verified here is listed, not fatal
            tables.append({**entry, "jobs": 0, "skipped": f"{type(exc).__name__}: {exc}"})
            continue
        tables.append({**entry, "jobs": len(planned), "skipped": None})
        jobs += planned
        owners += [entry["file"]] * len(planned)
    return tables, jobs, owners


def runtime_shapes(path: Path, shapes: list[GemmProblem]) -> list[GemmProblem]:
    """The shapes a table serves with a kernel on its own device: its kernel entries' and those
    of ``shapes`` its rules send to a kernel."""
    from tunefw.runtime.dispatch import load

    table = load(path)
    own = [e.problem for e in table.entries if not e.is_cublas]
    return own + [p for p in shapes if p not in own and decide(table, p).entry is not None]


# ---- judging (no GPU) -------------------------------------------------------------------------
def judge_faults(result: dict) -> dict:
    """Each fault's verdict beside its expected one."""
    rows = [{"fault": r["config"]["fault"], "status": r["status"],
             "expected": EXPECTED[r["config"]["fault"]], "log": r["log"]} for r in result["rows"]]
    for row in rows:
        row["as_expected"] = row["status"] == row["expected"]
    seen = {r["fault"]: r for r in rows}
    return {"device": result["device"], "problem": FAULT_PROBLEM.key(), "rows": rows,
            "missing": sorted(set(FAULTS) - set(seen)),
            "all_as_expected": set(seen) == set(FAULTS) and all(r["as_expected"] for r in rows),
            "acceptance_caught": {f: f in seen and seen[f]["status"] == "WRONG_ANSWER"
                                  for f in ACCEPTANCE_FAULTS}}


def judge_tables(tables: list[dict], owners: list[str], result: dict) -> dict:
    """Per table how its winners ended (on their own shapes and on the edge shapes they serve)."""
    by_file: dict[str, list[dict]] = {}
    for owner, row in zip(owners, result["rows"]):
        row["table"] = owner
        row["own_shape"] = row["source"] == f"entry {row['M']}x{row['N']}x{row['K']}"
        by_file.setdefault(owner, []).append(row)
    for table in tables:
        rows = by_file.get(table["file"], [])
        table["checked"] = len(rows)
        table["own_shapes_ok"] = sum(r["own_shape"] and r["status"] == "OK" for r in rows)
        table["own_shapes"] = sum(r["own_shape"] for r in rows)
        table["statuses"] = {s: sum(r["status"] == s for r in rows)
                             for s in sorted({r["status"] for r in rows})}
        table["pass"] = None if table["skipped"] else bool(rows) and all(
            r["status"] == "OK" for r in rows) and len(rows) == table["jobs"]
    verified = [t for t in tables if not t["skipped"]]
    return {"device": result["device"], "tables": tables,
            "failures": [r for r in result["rows"] if r["status"] != "OK"],
            "all_pass": bool(verified) and all(t["pass"] for t in verified),
            "rows": result["rows"]}


def judge_runtime(rows: list[dict]) -> dict:
    """Every shape served after its first-use verification: none left to cuBLAS by a failed
    check, no table that could not be served."""
    failed = [r for r in rows if not r.get("verified")]
    return {"rows": rows, "checked": len(rows), "failures": failed,
            "all_pass": bool(rows) and not failed}


def summarize(parts: dict) -> dict:
    """Pass or fail per acceptance point, with the figures it rests on (None: part failed)."""
    faults, tables, runtime, sweep = (parts.get(k) or {}
                                      for k in ("faults", "tables", "runtime", "sweep"))
    caught = faults.get("acceptance_caught")
    rate = sweep.get("trials_per_s")
    points = {
        "faults_caught": {
            "pass": bool(caught) and all(caught.values()) and bool(faults.get("all_as_expected")),
            "evidence": {"acceptance_faults": caught, "all_as_expected": faults.get("all_as_expected"),
                         "error": faults.get("error")}},
        "winners_pass": {
            "pass": bool(tables.get("all_pass")),
            "evidence": {"tables": [{k: t.get(k) for k in ("file", "pass", "checked", "own_shapes",
                                                           "own_shapes_ok", "statuses", "skipped")}
                                    for t in tables.get("tables", [])], "error": tables.get("error")}},
        "runtime_first_use": {
            "pass": bool(runtime.get("all_pass")),
            "evidence": {"checked": runtime.get("checked"), "failures": runtime.get("failures"),
                         "error": runtime.get("error")}},
        "sweep_rate": {
            "pass": rate is not None and rate >= MIN_TRIALS_PER_S,
            "evidence": {"trials_per_s": rate, "min": MIN_TRIALS_PER_S,
                         "gpu_busy": sweep.get("gpu_busy"), "trials": sweep.get("trials"),
                         "wrong": sweep.get("wrong"), "error": sweep.get("error")}},
    }
    return {**points, "all_pass": all(p["pass"] for p in points.values())}


# ---- GPU parts --------------------------------------------------------------------------------
def run_faults(cache_dir: str, timeout_s: float) -> dict:
    result = run_verify(fault_jobs(), cache_dir, timeout_s=timeout_s,
                        families=load_family_module(FAULT_FILE))
    return judge_faults(result)


def run_tables(paths: list[Path], shapes: list[GemmProblem], cache_dir: str) -> dict:
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    tables, jobs, owners = table_jobs(paths, shapes, major * 10 + minor)
    result = run_verify(jobs, cache_dir)
    return {**judge_tables(tables, owners, result), "precompile": result["compile"]}


def run_runtime(paths: list[Path], shapes: list[GemmProblem], cache_dir: str) -> dict:
    """Each table's kernel-served shapes through a Dispatcher (no guard) on random operands: the
    first call builds the plan and verifies it; a failure shows in the route as cuBLAS."""
    import time

    import torch

    from tunefw.runtime.dispatcher import Dispatcher
    from tunefw.runtime.plan import TORCH_DTYPES

    dtypes = {name: dtype for dtype, name in TORCH_DTYPES.items()}
    rows = []
    for path in paths:
        where = str(path.relative_to(REPO) if path.is_relative_to(REPO) else path)
        try:
            problems = runtime_shapes(path, shapes)
            dispatcher = Dispatcher(path, cache_dir=cache_dir, guard=False)
        except Exception as exc:  # a table that cannot be served here is a row, not fatal
            rows.append({"table": where, "verified": False, "error": f"{type(exc).__name__}: {exc}"})
            continue
        for p in problems:
            a = torch.randn(p.M, p.K, device="cuda").to(dtypes[p.dtype])
            b = torch.randn(p.N, p.K, device="cuda").to(dtypes[p.dtype])
            start = time.perf_counter()
            dispatcher.gemm(a, b)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            route = dispatcher.route_for(a, b)
            rows.append({"table": where, "shape": p.key(), "path": route.path,
                         "reason": route.reason, "first_call_s": round(first, 4),
                         "verified": "failed strict verification" not in route.reason})
    return judge_runtime(rows)


def run_sweep(study: Path, time_limit: float, backend: str) -> dict:
    """A fresh `tunefw launch` of the study (sweep_h200.py's helpers) and its launch figures."""
    import sweep_h200
    from tunefw.study.spec import load_study_file

    name = load_study_file(study).name
    with tempfile.TemporaryDirectory(prefix="tunefw-verify-sweep-") as tmp:
        db = f"sqlite:///{Path(tmp) / 'state.db'}"
        complete = sweep_h200.run_studies(db, [study], time_limit, 1, backend)
        rows, stats, device = sweep_h200.study_rows(db, name, [])
    row = rows[0] if rows else {}
    return {"study": str(study.relative_to(REPO) if study.is_relative_to(REPO) else study),
            "backend": backend, "complete": complete,
            "trials_per_s": stats.get("trials_per_s"), "gpu_busy": stats.get("gpu_busy"),
            "trials": stats.get("trials"), "wall_s": stats.get("wall_s"),
            "wrong": row.get("wrong"), "outcomes": row.get("outcomes"),
            "winner": {k: row.get(k) for k in ("family", "config", "tflops", "cublas_tflops",
                                               "ratio", "confirmed")},
            "launch_stats": stats, "device": device,
            "strict": "every trial (CudaEvaluator._measure runs tunefw/evaluate/strict.py)"}


# ---- the file ---------------------------------------------------------------------------------
def compose(parts: dict, given_commit: str | None, started: float) -> dict:
    """The result file: identity, the device (from the first part that reached the GPU), parts
    and the summary."""
    fp = next((p["device"] for p in parts.values() if p.get("device")), {})
    return {"script": SCRIPT, "date": datetime.date.today().isoformat(),
            "commit": gpu_result.commit(given_commit), "device": gpu_result.device(fp),
            "parts": parts, "summary": summarize(parts),
            "wall_s": round(time.monotonic() - started, 1)}


def print_table(result: dict) -> None:
    summary = result["summary"]
    print(f"{'acceptance point':<17} {'result':<6} evidence")
    for point in ("faults_caught", "winners_pass", "runtime_first_use", "sweep_rate"):
        entry = summary[point]
        ev = entry["evidence"]
        if point == "faults_caught":
            text = ", ".join(f"{f} {'caught' if ok else 'MISSED'}"
                             for f, ok in (ev["acceptance_faults"] or {}).items())
            text += f"; all {len(FAULTS)} as expected: {ev['all_as_expected']}"
        elif point == "winners_pass":
            text = "; ".join(f"{Path(t['file']).stem} {t['skipped'] or t['statuses']}"
                             for t in ev["tables"])
        elif point == "runtime_first_use":
            text = (f"{ev['checked']} shapes served after first-use verification, "
                    f"{len(ev['failures'] or [])} not")
        else:
            text = f"{ev['trials_per_s']} trials/s (min {ev['min']}), gpu_busy {ev['gpu_busy']}"
        if ev.get("error"):
            text += f" ERROR {ev['error']}"
        print(f"{point:<17} {'PASS' if entry['pass'] else 'FAIL':<6} {text}")
    print(f"all pass: {summary['all_pass']}  ({result['device'].get('name')}, "
          f"{result['wall_s']} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", nargs="*", type=Path,
                    default=sorted((REPO / "benchmarks" / "results").glob("dispatch_*.json")))
    ap.add_argument("--table-shapes", default="edge",
                    help="shapes added to each table's own: 'edge', a file of MxNxK, or ''")
    ap.add_argument("--study", type=Path, default=REPO / "benchmarks/studies/throughput_4096.yaml")
    ap.add_argument("--sweep-time-limit", type=float, default=150.0)
    ap.add_argument("--sweep-backend", default="cuda", help="cuda; sim only to try it on a CPU")
    ap.add_argument("--fault-timeout", type=float, default=10.0, help="seconds per fault job")
    ap.add_argument("--commit", help="the commit, where the tree has no git metadata")
    ap.add_argument("--out", type=Path, help="default $OUT/verify_h200.json, else benchmarks/results/")
    ap.add_argument("--dry-run", action="store_true", help="plan every part (no GPU) and print it")
    args = ap.parse_args(argv)
    shapes = parse_shapes(args.table_shapes or None)
    if args.dry_run:
        tables, jobs, _ = table_jobs(args.tables, shapes, 90)
        from tunefw.study.spec import load_study_file
        study = load_study_file(args.study)
        runtime = sum(len(runtime_shapes(t, shapes)) for t in args.tables)
        print(json.dumps({"faults": [j.config["fault"] for j in fault_jobs()], "tables": tables,
                          "table_jobs": len(jobs), "runtime_shapes": runtime,
                          "study": {"name": study.name, "trials": study.trials}}, indent=1))
        return 0
    started = time.monotonic()
    cache_dir = os.environ.get("TUNEFW_CACHE_DIR") or tempfile.mkdtemp(prefix="tunefw-verify-")
    parts: dict = {}
    parts["faults"] = gpu_result.guarded(lambda: run_faults(cache_dir, args.fault_timeout))
    parts["tables"] = gpu_result.guarded(lambda: run_tables(args.tables, shapes, cache_dir))
    parts["runtime"] = gpu_result.guarded(lambda: run_runtime(args.tables, shapes, cache_dir))
    parts["sweep"] = gpu_result.guarded(lambda: run_sweep(args.study, args.sweep_time_limit,
                                                          args.sweep_backend))
    result = compose(parts, args.commit, started)
    gpu_result.write(result, gpu_result.out_path("verify_h200.json", args.out))
    print_table(result)
    return 0 if result["summary"]["all_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
