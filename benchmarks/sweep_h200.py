"""Run real `tunefw launch` sweeps on the GPU (resumable in pieces) and write a result file.

Each study file is created once in the state database, then launched with a time limit, so a
long sweep is split over several device runs: carry the state database in, copy it back out,
run again. When every listed study is complete, the result JSON is built from the database
alone: each row is a confirmed winner with its trial id, beside cuBLAS timed in the same run.

    python3 benchmarks/sweep_h200.py --db STATE.db --time-limit 300 --result OUT.json \
        benchmarks/studies/mma_sm80_suite.yaml benchmarks/studies/mma_sm80_correctness.yaml
    python3 benchmarks/sweep_h200.py --db STATE.db --report-only --result OUT.json STUDY.yaml...
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import select

from tunefw.outcome import cublas_ratio
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.store.models import Trial, Winner
from tunefw.study.spec import load_study_file

SCRIPT = "benchmarks/sweep_h200.py"


def commit() -> str | None:
    """The checkout's commit (None where the tree has no git metadata: pass --commit)."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def tunefw(db: str, *args: str) -> int:
    """The CLI, as a user runs it."""
    return subprocess.call([sys.executable, "-m", "tunefw", "--db", db, *args])


def complete(db: str, name: str) -> bool:
    out = subprocess.run([sys.executable, "-m", "tunefw", "--db", db, "study", "show", name,
                          "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return False
    shown = json.loads(out.stdout)
    spec_trials = load_trials(db, name)
    return all(p["evaluated"] >= spec_trials for p in shown["problems"])


def load_trials(db: str, name: str) -> int:
    store = open_store(db)
    with store.session() as s:
        return q.get_study(s, name).spec["trials"]


def run_studies(db: str, files: list[Path], time_limit: float, gpus: int, backend: str) -> bool:
    """Launch each incomplete study until the time is spent; True when all are complete."""
    start = time.monotonic()
    for path in files:
        name = load_study_file(path).name
        if tunefw(db, "study", "show", name) != 0:
            tunefw(db, "study", "create", name, "--from", str(path))
        if complete(db, name) and winners_done(db, name):
            continue
        left = time_limit - (time.monotonic() - start)
        if left < 20:
            return False
        tunefw(db, "launch", name, "--gpus", str(gpus), "--backend", backend,
               "--time-limit", str(int(left)))
    return all(complete(db, load_study_file(p).name) and winners_done(db, load_study_file(p).name)
               for p in files)


def winners_done(db: str, name: str) -> bool:
    store = open_store(db)
    with store.session() as s:
        study = q.get_study(s, name)
        if study.spec.get("confirm_top", 3) == 0:
            return True
        return all(s.get(Winner, p.id) is not None for p in study.problems)


def _best_by(s, problem_id: int, round_: int, key: str) -> dict:
    """Best OK trial (by ratio to cuBLAS, as the search ranks) per value of one config knob
    (e.g. per schedule, per cluster shape)."""
    best: dict = {}
    for t in s.scalars(select(Trial).where(Trial.problem_id == problem_id, Trial.round == round_,
                                           Trial.status == "OK")):
        value = key_value(t.config, key)
        if value not in best or (t.ratio or 0.0) > (best[value]["ratio"] or 0.0):
            best[value] = {"tflops": t.tflops, "cublas_tflops": t.cublas_tflops,
                           "ratio": t.ratio, "trial_id": t.id, "config": t.config}
    return best


def key_value(config: dict, key: str) -> str:
    if key == "cluster":
        return f"{config.get('CLUSTER_M', 1)}x{config.get('CLUSTER_N', 1)}"
    return str(config.get(key))


def study_rows(db: str, name: str, by: list[str]) -> tuple[list[dict], dict, dict]:
    """Rows (one per problem) in the design.md format, the launch figures and the device."""
    store = open_store(db)
    rows, device = [], {}
    with store.session() as s:
        study = q.get_study(s, name)
        for p in study.problems:
            counts = q.outcome_counts(s, p, study.round)
            evaluated = sum(n for st, n in counts.items() if st != "INVALID")
            winner = s.get(Winner, p.id)
            row = {"family": None, "dtype": p.dtype, "M": p.M, "N": p.N, "K": p.K, "gate": p.gate,
                   "config": None, "tflops": None, "cublas_tflops": None, "ratio": None,
                   "trial_id": None, "confirmed": False, "configs_checked": evaluated,
                   "wrong": counts.get("WRONG_ANSWER", 0), "outcomes": dict(counts)}
            source = winner or q.best_trial(s, p, study.round)
            if source is not None:
                trial_id = winner.trial_id if winner else source.id
                row.update(family=source.family, config=source.config, tflops=source.tflops,
                           cublas_tflops=source.cublas_tflops,
                           ratio=cublas_ratio(source.tflops, source.cublas_tflops), trial_id=trial_id,
                           confirmed=bool(winner and winner.confirmed))
                device = device or s.get(Trial, trial_id).fingerprint
            for knob in by:
                row[f"best_by_{knob}"] = _best_by(s, p.id, study.round, knob)
            rows.append(row)
        stats = study.stats or {}
    return rows, stats, device


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def build_result(db: str, files: list[Path], by: list[str], extra: list[str]) -> dict:
    result: dict = {"script": SCRIPT, "date": datetime.date.today().isoformat(), "studies": {}}
    for path in files:
        name = load_study_file(path).name
        rows, stats, device = study_rows(db, name, by)
        result["device"] = result.get("device") or device
        result["studies"][name] = {"file": str(path), "launch_stats": stats, "rows": rows,
                                   "geomean_ratio": geomean([r["ratio"] for r in rows]),
                                   "configs_checked": sum(r["configs_checked"] for r in rows),
                                   "wrong": sum(r["wrong"] for r in rows)}
    first = result["studies"][load_study_file(files[0]).name]
    result["rows"] = first["rows"]  # the headline table: the first study's confirmed winners
    result["geomean_ratio"] = first["geomean_ratio"]
    result["configs_checked"] = sum(st["configs_checked"] for st in result["studies"].values())
    result["wrong"] = sum(st["wrong"] for st in result["studies"].values())
    for spec in extra:  # FILE:KEY,KEY - e.g. the mma.sync ceiling from another committed script
        path, _, keys = spec.partition(":")
        data = json.loads(Path(path).read_text())
        for key in keys.split(","):
            result[key] = data[key]
        result.setdefault("extra_sources", {}).update({k: path for k in keys.split(",")})
    return result


def print_table(result: dict) -> None:
    print(f"{'shape':>20} {'family':>11} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6} "
          f"{'trial':>6} {'checked':>7} {'wrong':>5}")
    for r in result["rows"]:
        shape = f"{r['M']}x{r['N']}x{r['K']}"
        fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
        print(f"{shape:>20} {str(r['family']):>11} {fmt(r['tflops'], '8.1f')} "
              f"{fmt(r['cublas_tflops'], '8.1f')} {fmt(r['ratio'], '6.3f')} "
              f"{str(r['trial_id']):>6} {r['configs_checked']:>7} {r['wrong']:>5}")
    print(f"geomean ratio {result['geomean_ratio']}; configs checked {result['configs_checked']}, "
          f"wrong {result['wrong']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="+", type=Path)
    ap.add_argument("--db", required=True, help="state database path (carried between runs)")
    ap.add_argument("--time-limit", type=float, default=300.0)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--backend", default="cuda", help="cuda; sim only to try this script on a CPU")
    ap.add_argument("--result", type=Path, help="result JSON to write once every study is done")
    ap.add_argument("--by", default="", help="knobs to report the best config of, e.g. "
                                             "SCHEDULE,cluster")
    ap.add_argument("--extra", action="append", default=[], metavar="FILE:KEY[,KEY]",
                    help="copy these keys of another result file into the result")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    db = f"sqlite:///{Path(args.db).resolve()}"
    done = args.report_only or run_studies(db, args.studies, args.time_limit, args.gpus,
                                                    args.backend)
    if not done:
        print("not finished: carry the state database into the next run and run again")
        return 3
    by = [k for k in args.by.split(",") if k]
    result = build_result(db, args.studies, by, args.extra)
    if args.result:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print_table(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
