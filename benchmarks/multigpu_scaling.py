"""Scaling of `tunefw launch` over GPU workers, and a worker killed mid-sweep (issue 7).

For each worker count the same study (Llama-3-8B layers, fixed budget) is created fresh in its
own database and launched; the sweep figures come from the launch itself. On the GPU machine
(--backend cuda) a warm-up launch fills the compile cache first so every measured run does the
same work. With --backend sim every trial costs a fixed wall time on the SIMULATED device,
which measures the scheduler's own overhead. Then one worker process is SIGKILLed mid-sweep:
its trial must be retried and recorded once, and the sweep must finish its budget.

    python3 benchmarks/multigpu_scaling.py --backend sim --gpus 1,2,4,8 --out R.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def study_file(tmp: Path, trials: int, trial_seconds: float) -> Path:
    data = yaml.safe_load((REPO / "studies" / "llama3_8b.yaml").read_text())
    data.update(name="scaling", trials=trials, confirm_top=0, reuse=False,
                sim={"trial_seconds": trial_seconds})
    path = tmp / "scaling.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def tunefw(db: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, TUNEFW_DB=f"sqlite:///{db}")
    return subprocess.run([sys.executable, "-m", "tunefw", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, **kw)


def rows(db: Path, sql: str) -> list:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def one_run(tmp: Path, study: Path, gpus: int, backend: str) -> dict:
    db = tmp / f"scaling_{gpus}.db"
    assert tunefw(db, "study", "create", "scaling", "--from", str(study)).returncode == 0
    launched = tunefw(db, "launch", "scaling", "--gpus", str(gpus), "--backend", backend)
    if launched.returncode != 0:
        raise SystemExit(f"launch --gpus {gpus} failed: {launched.stderr[-2000:]}")
    stats = json.loads(rows(db, "SELECT stats FROM tunefw_study")[0][0])
    gpus_seen = sorted({g for (g,) in rows(db, "SELECT DISTINCT gpu FROM tunefw_trial "
                                              "WHERE status != 'INVALID'")})
    return {"gpus": gpus, "trials": stats["trials"], "wall_s": stats["wall_s"],
            "trials_per_s": stats["trials_per_s"], "gpu_busy": stats["gpu_busy"],
            "trials_per_s_per_gpu": stats["trials_per_s_per_gpu"], "distinct_gpus": gpus_seen,
            "restarts": stats["restarts"]}


def worker_pids() -> list[int]:
    """PIDs of live tunefw GPU worker processes (Ray names them ray::GpuWorker)."""
    out = subprocess.run(["pgrep", "-f", "ray::GpuWorker"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def kill_test(tmp: Path, study: Path, gpus: int, backend: str) -> dict:
    """SIGKILL one worker once trials are flowing; the sweep must still finish its budget."""
    db = tmp / "kill.db"
    assert tunefw(db, "study", "create", "scaling", "--from", str(study)).returncode == 0
    env = dict(os.environ, TUNEFW_DB=f"sqlite:///{db}")
    proc = subprocess.Popen([sys.executable, "-m", "tunefw", "launch", "scaling", "--gpus",
                             str(gpus), "--backend", backend], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed = None
    deadline = time.time() + 300
    while killed is None and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
        done = rows(db, "SELECT count(*) FROM tunefw_trial WHERE status='OK'")[0][0] \
            if db.exists() else 0
        pids = worker_pids()
        if done >= 10 and pids:
            killed = pids[0]
            os.kill(killed, signal.SIGKILL)
    out, err = proc.communicate(timeout=900)
    budget = yaml.safe_load(study.read_text())["trials"]
    per_problem = rows(db, "SELECT problem_id, count(*), count(DISTINCT config_key) FROM "
                          "tunefw_trial WHERE status != 'INVALID' GROUP BY problem_id")
    lost = rows(db, "SELECT id, status, attempts FROM tunefw_trial WHERE log LIKE "
                    "'%WORKER_LOST%'")
    return {"gpus": gpus, "killed_pid": killed, "launch_rc": proc.returncode,
            "every_problem_at_budget": all(n == budget for _, n, _ in per_problem),
            "no_duplicates": all(n == d for _, n, d in per_problem),
            "lost_trials": [{"trial_id": i, "status": s, "attempts": a} for i, s, a in lost],
            "restart_events": [line for line in out.splitlines() if "restarted" in line]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="sim")
    ap.add_argument("--gpus", default="1,2,4,8")
    ap.add_argument("--trials", type=int, default=6, help="per problem (16 problems)")
    ap.add_argument("--trial-seconds", type=float, default=0.5, help="sim only")
    ap.add_argument("--kind", default="cpu-sim", help="machine kind, for the record")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    counts = [int(g) for g in args.gpus.split(",")]
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        study = study_file(tmp, args.trials, args.trial_seconds)
        if args.backend == "cuda":  # same compile cache state for every measured run
            os.environ.setdefault("TUNEFW_CACHE_DIR", str(tmp / "cache"))
            warm = tmp / "warm"
            warm.mkdir()
            one_run(warm, study, max(counts), args.backend)
        runs = [one_run(tmp, study, n, args.backend) for n in counts]
        killed = kill_test(tmp, study, max(counts), args.backend)
    base = next(r for r in runs if r["gpus"] == 1)
    result = {"script": "benchmarks/multigpu_scaling.py",
              "date": datetime.date.today().isoformat(), "kind": args.kind,
              "backend": args.backend, "simulated": args.backend == "sim",
              "study": {"file": "studies/llama3_8b.yaml", "trials_per_problem": args.trials,
                        "sim_trial_seconds": args.trial_seconds if args.backend == "sim" else None},
              "runs": runs, "kill_test": killed}
    for r in runs:
        result[f"speedup_{r['gpus']}_vs_1"] = r["trials_per_s"] / base["trials_per_s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for r in runs:
        speedup = result[f"speedup_{r['gpus']}_vs_1"]
        print(f"{r['gpus']} GPU(s): {r['trials']} trials, {r['trials_per_s']:.2f}/s, "
              f"speedup {speedup:.2f}, distinct GPUs {len(r['distinct_gpus'])}")
    print(f"kill test: {json.dumps(killed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
