"""A model's own table on an H200, end to end and resumable: sweep the linear shapes of a
Hugging Face Llama (``tunefw study create --from-model``), export them never slower than cuBLAS,
calibrate the serving rules, check the dispatch acceptance and time the model itself.

Phases, each recorded when done in the state directory (a later run goes on where one stopped):

1. ``study``: ``tunefw study create NAME --from-model CONFIG --m-grid GRID --family ...``
2. ``sweep``: ``tunefw launch NAME --time-limit ...`` until every problem has its winner
3. ``export``: ``tunefw export --min-ratio 1.0``, and the table's cubins shipped (no recompiles
   in a later run on a fresh machine)
4. ``hf``: benchmarks/hf_llama_h200.py on the exported table (the grid makes every GEMM of its
   cases an exact entry: calibration changes none of their routes)
5. ``calibrate``: ``tunefw dispatch calibrate --shapes`` on dispatch_guard_h200.calibration_shapes
6. ``guard``: benchmarks/dispatch_guard_h200.py on the calibrated table

A phase starts only while the run's budget leaves it ``MIN_S`` seconds; the run then exits 3
("run again"). Everything a later run needs is packed into $OUT/STUDY_state.tar.gz; put it at
benchmarks/state/STUDY_state.tar.gz and carry that path into the next run.

    source benchmarks/device_setup.sh && python3 benchmarks/model_table_h200.py --commit SHA

Results ($OUT, else benchmarks/results/): model_table_STUDY_h200.json (the sweep's winners and
each phase's figures), dispatch_STUDY_h200.json (the calibrated table), dispatch_guard_h200.json,
hf_llama_h200.json. ``--study-file`` sweeps a study file instead of a model (e.g. issue 14's
studies/llama3_8b.yaml, with ``--phases study,sweep,export,calibrate,guard``). ``--plan``
prints what a run would do (no GPU).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from tunefw.study.spec import load_study_file  # noqa: E402

SCRIPT = "benchmarks/model_table_h200.py"
PHASES = ("study", "sweep", "export", "hf", "calibrate", "guard")
MIN_S = {"study": 30, "sweep": 240, "export": 60, "calibrate": 150, "guard": 180, "hf": 150}
PACK_S = 20  # kept at the end of a run to pack the state (a phase past it is stopped)
# The sweep's time limit leaves this much of the run: the launch's start (Ray and the worker
# took ~15-20 s on the H200, before the limit starts counting), the jobs in flight at the limit
# and the shutdown (the limit covers the confirmation, which resumes like the search)
FINISH_S = 45
FAMILIES = ("stream_sm90", "skinny_sm90", "rows_sm90", "wgmma_sm90")
DEFAULTS = {"model": "benchmarks/models/llama3_8b/config.json", "m_grid": "1,16,64,512,2048",
            "study": "hf_llama3_8b", "trials": 24, "timeout": 30, "confirm_top": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=DEFAULTS["model"], help="transformers config.json")
    ap.add_argument("--study-file", type=Path,
                    help="or a study file (e.g. studies/llama3_8b.yaml) instead of --model")
    ap.add_argument("--m-grid", default=DEFAULTS["m_grid"], help="tuned M (tokens per call)")
    ap.add_argument("--fuse", action="store_true", help="tune and serve sibling groups (q/k/v "
                    "by default) as one GEMM each: study create --fuse, hf_llama_h200.py --fuse")
    # With --study-file, the study's name, trials, timeout and confirm_top are the file's unless
    # given here (issue 14's table is a sweep of studies/llama3_8b.yaml as it stands)
    ap.add_argument("--study", help=f"study name (default {DEFAULTS['study']}, or the file's)")
    ap.add_argument("--trials", type=int,
                    help=f"evaluated configs per problem (default {DEFAULTS['trials']}, or the "
                    "file's)")
    ap.add_argument("--timeout", type=float,
                    help=f"per-trial timeout in s (default {DEFAULTS['timeout']}, or the file's)")
    ap.add_argument("--confirm-top", type=int, help="configs per problem re-timed to pick its "
                    f"winner (default {DEFAULTS['confirm_top']}, or the file's)")
    ap.add_argument("--gpus", type=int, default=1, help="GPU workers of the sweep")
    ap.add_argument("--backend", default="cuda", help="cuda; sim only to check this script on a CPU")
    ap.add_argument("--budget-s", type=float, default=510.0, help="this run's wall-time budget")
    ap.add_argument("--state-dir", type=Path, help="where this run works (default /tmp/STUDY)")
    ap.add_argument("--resume", type=Path, help="a state tarball from an earlier run, used when "
                    "it exists (default benchmarks/state/STUDY_state.tar.gz)")
    ap.add_argument("--phases", default=",".join(PHASES), help="the phases to run, in order")
    ap.add_argument("--redo", default="", help="done phases to run again (this run only: the "
                    "state it packs has them undone until they finish), e.g. hf,calibrate,guard")
    ap.add_argument("--new-round", action="store_true",
                    help="a kernel source or space changed since the sweep's trials: this run's "
                    "launch starts a new round of the study (changed families re-measured) and "
                    "the sweep and every later phase are redone (a later run resumes that round)")
    ap.add_argument("--out", type=Path, help="result folder (default: $OUT or benchmarks/results)")
    ap.add_argument("--commit", help="the commit measured (the device tree has no .git)")
    ap.add_argument("--plan", action="store_true", help="print the phases' commands and stop")
    args = ap.parse_args(argv)
    spec = load_study_file(args.study_file) if args.study_file else None
    fallback = ({"study": spec.name, "trials": spec.trials, "timeout": spec.timeout_s,
                 "confirm_top": spec.confirm_top} if spec else DEFAULTS)
    for key in ("study", "trials", "timeout", "confirm_top"):
        if getattr(args, key) is None:
            setattr(args, key, fallback[key])
    if args.trials < 1 or args.gpus < 1 or args.budget_s <= 0:
        ap.error("--trials, --gpus and --budget-s must be positive")
    for field, empty_ok in (("phases", False), ("redo", True)):
        names = [p.strip() for p in getattr(args, field).split(",") if p.strip()]
        unknown = sorted(set(names) - set(PHASES))
        if unknown or not (names or empty_ok):
            ap.error(f"--{field}: expected some of {','.join(PHASES)} (not {','.join(unknown) or 'none'})")
        setattr(args, field, [p for p in PHASES if p in names])
    if args.new_round:  # the new round's results replace the sweep's and all that follows it
        later = PHASES[PHASES.index("sweep"):]
        args.redo = [p for p in PHASES if p in args.redo or p in later]
    args.resume = args.resume or REPO / "benchmarks" / "state" / state_tar(args.study)
    args.state_dir = args.state_dir or Path("/tmp") / args.study
    return args


def state_tar(study: str) -> str:
    """The name the state tarball comes back under."""
    return f"{study}_state.tar.gz"


def table_result(study: str) -> str:
    """The name the calibrated table comes back under (benchmarks/results/)."""
    return f"dispatch_{study}_h200.json"


# ---- state --------------------------------------------------------------------------------------
class State:
    """The state directory: the database, the tables, the cubins and phases.json."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = f"sqlite:///{(root / 'state.db').resolve()}"
        self.table, self.calibrated = root / "dispatch.json", root / "dispatch_calibrated.json"
        self.cubins, self.shapes = root / "cubins", root / "calibration_shapes.txt"
        self.file = root / "phases.json"
        self.data = json.loads(self.file.read_text()) if self.file.exists() else {"done": {}, "runs": []}

    def done(self, phase: str) -> bool:
        return phase in self.data["done"]

    def undo(self, phases: list[str]) -> None:
        """Forget that these phases were done (--redo), at once."""
        for phase in phases:
            self.data["done"].pop(phase, None)
        self.save()

    def mark(self, phase: str, figures: dict) -> None:
        """Record a phase as done, with its figures (written at once)."""
        self.data["done"][phase] = figures
        self.save()

    def save(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps(self.data, indent=1, default=str) + "\n")


def unpack(tar: Path, root: Path) -> bool:
    """Extract an earlier run's state into ``root`` (unless root already holds one)."""
    if (root / "phases.json").exists() or not tar.is_file():
        return False
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar) as f:
        f.extractall(root, filter="data")
    return True


def pack(root: Path, out: Path, name: str) -> Path:
    """The state directory as one tarball ``out/name`` (what comes back from the device)."""
    path = out / name
    with tarfile.open(path, "w:gz") as f:
        for item in sorted(root.iterdir()):
            f.add(item, arcname=item.name)
    return path


# ---- phases ---------------------------------------------------------------------------------------
def commands(args: argparse.Namespace, state: State, time_limit: float) -> dict[str, list[str]]:
    """Each CLI phase's command line (tunefw's own commands, as a user runs them)."""
    cli = [sys.executable, "-m", "tunefw", "--db", state.db]
    families = [w for f in FAMILIES for w in ("--family", f)]
    source = (["--from", str(args.study_file)] if args.study_file
              else ["--from-model", args.model, "--m-grid", args.m_grid, *(["--fuse"] if args.fuse else [])])
    return {
        "study": cli + ["study", "create", args.study, *source, *families, "--trials",
                        str(args.trials), "--timeout", f"{args.timeout:g}",
                        "--confirm-top", str(args.confirm_top)],
        "sweep": cli + ["launch", args.study, "--gpus", str(args.gpus), "--backend", args.backend,
                        "--time-limit", str(int(time_limit)),
                        *(["--new-round"] if args.new_round else [])],
        "export": cli + ["export", str(state.table), "--study", args.study, "--min-ratio", "1.0"],
        "calibrate": cli + ["dispatch", "calibrate", str(state.table), "--shapes", str(state.shapes),
                            "--out", str(state.calibrated), "--cubin-dir", str(state.cubins)],
        "guard": [sys.executable, str(REPO / "benchmarks" / "dispatch_guard_h200.py"),
                  "--table", str(state.calibrated), "--cubins", str(state.cubins)],
        "hf": [sys.executable, str(REPO / "benchmarks" / "hf_llama_h200.py"),
               "--table", str(state.table), "--cubins", str(state.cubins),
               *(["--fuse"] if args.fuse else [])],
    }


def sweep_done(state: State, study: str) -> bool:
    from sweep_h200 import complete, winners_done

    return complete(state.db, study) and winners_done(state.db, study)


def export_phase(cmd: list[str], state: State, timeout: float) -> dict:
    """Export (losses as cuBLAS routes) and ship the cubins."""
    from tunefw.runtime.dispatch import load
    from tunefw.runtime.shipped import ship_cubins

    run_checked("export", cmd, timeout)
    table = load(state.table)
    manifest = ship_cubins(table, state.cubins, table.device().arch)
    return {"entries": len(table.entries), "cublas_routes": sum(e.is_cublas for e in table.entries),
            "kernels_shipped": len(manifest["kernels"])}


def write_calibration_shapes(state: State) -> int:
    """The exported table's calibration shapes (dispatch_guard_h200.calibration_shapes), written
    when calibration starts, so a --redo of it measures today's list; how many."""
    from dispatch_guard_plan import calibration_shapes
    from tunefw.runtime.dispatch import load

    shapes = calibration_shapes(load(state.table))
    state.shapes.write_text("".join(f"{s['M']}x{s['N']}x{s['K']} {s['dtype']}\n" for s in shapes))
    return len(shapes)


def calibration_figures(state: State) -> dict:
    from tunefw.runtime.dispatch import load

    table = load(state.calibrated)
    losses = [f"{v.M}x{v.N}x{v.K} {v.ratio:.3f}" for v in table.evidence if v.ratio < table.evidence_min_ratio]
    return {"measured": len(table.evidence), "losses": losses,
            "evidence_min_ratio": table.evidence_min_ratio}


def call(cmd: list[str], timeout: float) -> int | None:
    """Run a command from the repository root; None when it outran ``timeout`` (it is killed)."""
    print("+", " ".join(cmd), flush=True)
    try:
        return subprocess.call(cmd, cwd=REPO, timeout=max(10.0, timeout))
    except subprocess.TimeoutExpired:
        return None


def run_checked(phase: str, cmd: list[str], timeout: float) -> None:
    """Run a phase's command; a failure or a timeout ends this run (its state is still packed)."""
    rc = call(cmd, timeout)
    if rc != 0:
        raise SystemExit(f"model_table_h200: phase {phase}: "
                         + ("stopped at this run's budget" if rc is None else f"exited {rc}"))


def sweep_figures(state: State, study: str) -> dict:
    """The sweep's rows (one per problem: winner, cuBLAS, trials) and launch figures."""
    from sweep_h200 import geomean, study_rows

    rows, stats, device = study_rows(state.db, study, [])
    return {"rows": rows, "launch_stats": stats, "device": device,
            "geomean_ratio": geomean([r["ratio"] for r in rows]),
            "trials": sum(r["configs_checked"] for r in rows), "wrong": sum(r["wrong"] for r in rows)}


def run_phases(args: argparse.Namespace, state: State, out: Path, started: float) -> bool:
    """Every asked phase not done yet, while the budget lasts; True when all are done."""
    left = lambda: args.budget_s - (time.monotonic() - started)  # noqa: E731
    for phase in args.phases:
        if state.done(phase):
            continue
        if left() < MIN_S[phase]:
            print(f"model_table_h200: {phase} needs {MIN_S[phase]} s, {left():.0f} s left: run again")
            return False
        t0 = time.monotonic()
        cmd = commands(args, state, left() - PACK_S - FINISH_S)[phase]
        commit = ["--commit", args.commit] if args.commit else []
        timeout = left() - PACK_S
        if phase == "sweep":
            run_checked(phase, cmd, timeout)
            if not sweep_done(state, args.study):
                print("model_table_h200: the sweep is not finished: run again")
                return False
            figures = sweep_figures(state, args.study)
        elif phase == "export":
            figures = export_phase(cmd, state, timeout)
        elif phase == "calibrate":
            count = write_calibration_shapes(state)
            run_checked(phase, cmd, timeout)
            figures = {**calibration_figures(state), "calibration_shapes": count}
        elif phase in ("guard", "hf"):
            name = "dispatch_guard_h200.json" if phase == "guard" else "hf_llama_h200.json"
            budget = min(240.0 if phase == "guard" else 300.0, left() - 60)
            rc = call(cmd + commit + ["--budget-s", f"{budget:.0f}", "--out", str(out / name)],
                      min(budget + 120, timeout))  # a failed acceptance still writes its file
            if not (out / name).exists():  # it crashed: not done, a later run tries again
                raise SystemExit(f"model_table_h200: phase {phase}: exited {rc} without {name}")
            figures = {"result": name, "rc": rc}
        else:
            run_checked(phase, cmd, timeout)
            figures = {}
        state.mark(phase, {**figures, "wall_s": round(time.monotonic() - t0, 1)})
    return True


def result(args: argparse.Namespace, state: State, started: float, finished: bool) -> dict:
    """model_table_h200.json: this run and the earlier ones, each phase's figures."""
    run = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": args.commit, "wall_s": round(time.monotonic() - started, 1),
           "finished": finished}
    state.data["runs"].append(run)
    state.save()
    source = {"study_file": str(args.study_file)} if args.study_file else {
        "model": args.model, "m_grid": args.m_grid, "fuse": args.fuse}
    return {"script": SCRIPT, **source, "study": args.study,
            "families": list(FAMILIES), "trials": args.trials, "phases": state.data["done"],
            "runs": state.data["runs"], "finished": finished}


def print_table(report: dict) -> None:
    sweep = report["phases"].get("sweep")
    if sweep:
        print(f"{'problem':>18} {'family':>12} {'TFLOP/s':>8} {'cuBLAS':>8} {'ratio':>6} {'trials':>6}")
        for r in sweep["rows"]:
            fmt = lambda v, f: format(v, f) if v is not None else "-"  # noqa: E731
            print(f"{r['M']:>6}x{r['N']}x{r['K']:<6} {str(r['family']):>12} {fmt(r['tflops'], '8.1f')} "
                  f"{fmt(r['cublas_tflops'], '8.1f')} {fmt(r['ratio'], '6.3f')} {r['configs_checked']:>6}")
    for phase in PHASES:
        figures = report["phases"].get(phase)
        brief = {k: v for k, v in (figures or {}).items() if k not in ("rows", "launch_stats", "device")}
        print(f"{phase:10s} {'done' if figures else 'not yet'} {json.dumps(brief, default=str)[:200]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    out = args.out or Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    if args.plan:
        state = State(args.state_dir)
        for phase, cmd in commands(args, state, args.budget_s).items():
            done = state.done(phase) and phase not in args.redo
            print(f"{phase}: {'done' if done else ' '.join(cmd)}")
        return 0
    out.mkdir(parents=True, exist_ok=True)
    if unpack(args.resume, args.state_dir):
        print(f"resumed from {args.resume}")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    state = State(args.state_dir)
    state.undo(args.redo)
    finished = False
    try:
        finished = run_phases(args, state, out, started)
    finally:
        report = result(args, state, started, finished)
        (out / f"model_table_{args.study}_h200.json").write_text(
            json.dumps(report, indent=1, default=str) + "\n")
        # Every run brings its calibrated table back; one that a redone calibration has yet to
        # replace is the last round's, and stays behind.
        if state.done("calibrate") and state.calibrated.exists():
            shutil.copyfile(state.calibrated, out / table_result(args.study))
        print(f"wrote {pack(state.root, out, state_tar(args.study))}")
        print_table(report)
    return 0 if finished else 3


if __name__ == "__main__":
    sys.exit(main())
