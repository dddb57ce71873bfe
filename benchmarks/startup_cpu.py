"""CPU measurement of a launch's start-up on the SIMULATED device: the seconds from `python3 -m
tunefw launch` to its first printed line, to its workers' line (`launch STUDY on ...`: once every
worker was up before, once the first is up since trials start on it), to its first trial line and
to its exit; the seconds the command stores (first_trial_s; first_worker_s and workers_up_s where
the tree stores them); and the seconds a launch of a finished study takes to say so. Each --tree LABEL=PATH is a checkout measured with this script
(e.g. the commit before a change beside this one); their runs alternate, so a machine's load
falls on each alike. The median of --runs fresh runs per tree is written under its label into
benchmarks/results/startup_cpu.json.

    python3 benchmarks/startup_cpu.py --tree before=/tmp/before --tree after=.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "results" / "startup_cpu.json"
STUDY = """name: startup
trials: 4
problems:
  - shape: 4096x4096x4096
  - shape: 128x6144x4096
  - shape: 2048x4096x14336
sim:
  trial_seconds: 0.1
"""


def _env(tree: Path, db: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TUNEFW_DB"}
    env.update(PYTHONPATH=str(tree), TUNEFW_DB=db)
    return env


def _tunefw(env: dict, cwd: str, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "tunefw", *args], env=env, cwd=cwd,
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"tunefw {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _timed_launch(env: dict, cwd: str, gpus: int) -> dict:
    """Seconds from the command to its first line, to the workers' line, to its first trial
    line, and to its exit."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "tunefw", "launch", "startup", "--gpus",
                             str(gpus), "--backend", "sim"], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    marks: dict[str, float] = {}
    for line in proc.stdout:
        now = time.monotonic() - start
        marks.setdefault("first_line_s", now)
        if line.startswith("launch startup on "):
            marks.setdefault("workers_line_s", now)
        if line.startswith("trial "):
            marks.setdefault("first_trial_line_s", now)
    if proc.wait():
        raise SystemExit(f"the launch exited {proc.returncode}")
    marks["exit_s"] = time.monotonic() - start
    return marks


def run_once(tree: Path, gpus: int) -> dict:
    """One fresh database: create, launch (timed), then launch the finished study (timed). The
    commands run in the temporary folder: `python -m` imports from the current folder first."""
    with tempfile.TemporaryDirectory() as tmp:
        env = _env(tree, f"sqlite:///{Path(tmp) / 'tunefw.db'}")
        (Path(tmp) / "startup.yaml").write_text(STUDY)
        _tunefw(env, tmp, "study", "create", "startup", "--from", str(Path(tmp) / "startup.yaml"))
        marks = _timed_launch(env, tmp, gpus)
        shown = json.loads(_tunefw(env, tmp, "study", "show", "startup", "--json").stdout)
        for stored in ("first_worker_s", "workers_up_s", "first_trial_s"):
            if shown["stats"].get(stored) is not None:  # an older tree stores fewer
                marks[stored] = shown["stats"][stored]
        start = time.monotonic()
        again = _tunefw(env, tmp, "launch", "startup", "--gpus", str(gpus), "--backend", "sim")
        marks["finished_study_launch_s"] = time.monotonic() - start
        marks["finished_study_says"] = again.stdout.strip().splitlines()[-1]
    return marks


def _commit(tree: Path) -> str:
    """The tree's commit, marked +uncommitted where its files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True,
                              text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+uncommitted" if dirty else "")


def _tree(text: str) -> tuple[str, Path]:
    label, _, path = text.partition("=")
    if not label or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LABEL=PATH")
    return label, Path(path).resolve()


def summary(tree: Path, gpus: int, runs: list[dict]) -> dict:
    """One tree's runs: their medians (each figure's over the runs that have it) and each run's
    figures."""
    figures = list(dict.fromkeys(k for r in runs for k, v in r.items() if isinstance(v, float)))
    return {"commit": _commit(tree), "gpus": gpus, "runs": len(runs),
            "median": {k: round(statistics.median(r[k] for r in runs if k in r), 2)
                       for k in figures},
            "finished_study_says": runs[-1]["finished_study_says"],
            "each": [{k: round(v, 2) for k, v in r.items() if isinstance(v, float)}
                     for r in runs]}


def main() -> None:
    """Measure --runs launches of each --tree, alternating, and store their medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=_tree, action="append", required=True,
                        metavar="LABEL=PATH", help="a checkout to measure, e.g. after=.")
    parser.add_argument("--gpus", type=int, default=8, help="simulated workers (quickstart: 8)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {label: [] for label, _ in args.tree}
    for _ in range(args.runs):
        for label, tree in args.tree:
            runs[label].append(run_once(tree, args.gpus))
            print(label, runs[label][-1], flush=True)
    result = json.loads(args.out.read_text()) if args.out.exists() else {}
    result.update({
        "what": "CPU measurement, SIMULATED device: seconds from `python3 -m tunefw launch` "
                "(a 3-problem study, 4 trials each, 0.1 s per trial) to its first line, its "
                "workers' line (every worker up before ebb00a4, the first since), its first "
                "trial line, its exit, the stored first_trial_s (and first_worker_s, "
                "workers_up_s: the last worker up, null where one came up after the search), "
                "and a launch of the finished study; median of the runs (a stored figure: of "
                "the runs that have it), the trees' runs alternating",
        "script": "benchmarks/startup_cpu.py",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()}})
    result["machine"].pop("load_average_at_end", None)  # per tree since several runs share a file
    for label, tree in args.tree:  # the machine's load: what other processes took of its cores
        result[label] = {**summary(tree, args.gpus, runs[label]),
                         "load_average_at_end": os.getloadavg()}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({label: result[label]["median"] for label in runs}, indent=2))


if __name__ == "__main__":
    main()
