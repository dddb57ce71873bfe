"""Issue 17's recorded sweeps on the H200, resumable over several device calls: five wgmma_sm90
shapes (benchmarks/studies/records_h200.yaml), each as a uniform sample of its valid space and
three seeded TPE runs, measured by real `tunefw launch` sweeps (anchored screens, top 20
confirmed), exported as recorded sweeps with a summary.

    source benchmarks/device_setup.sh && python3 benchmarks/record_sweeps_h200.py --gpus 8 \
        --commit SHA

Four studies in one state database: records_tpe_s0..2 (sampler tpe, seeds 0-2, 160 trials per
problem) first, then records_uniform (sampler uniform: the first 2000 configs of a seeded
uniformly random order of each problem's valid space). Each call decompresses the carried
state (benchmarks/state/records/records_h200.db.xz: committed, so it travels with the tree
to a device call), launches what is left within --budget-s, and writes the state back ($OUT,
else the state folder) after each launch; a second call
resumes where the first stopped (a launch resumes a study's rows, nothing is measured twice).
When every study is complete it exports the sweeps (one directory per study under
sweeps/wgmma_sm90_h200/) and the summary (record_sweeps_h200.json: GPU, driver, clocks, date,
commit, counts and outcomes per shape, best confirmed ratios), into $OUT as a tar and a JSON,
else into benchmarks/sweeps/ and benchmarks/results/. --export-only re-exports from the state.
--backend sim runs the same on the CPU (simulated device) to try it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import lzma
import os
import shutil
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from record_sweeps_summary import print_table, summarize  # noqa: E402
from sweep_h200 import commit  # noqa: E402
from tunefw.export.sweeps import export_sweeps  # noqa: E402
from tunefw.store import open_store  # noqa: E402
from tunefw.store import queries as q  # noqa: E402
from tunefw.study.spec import StudySpec, load_study_file  # noqa: E402

SCRIPT = "benchmarks/record_sweeps_h200.py"
STUDY_FILE = REPO / "benchmarks" / "studies" / "records_h200.yaml"
STATE = REPO / "benchmarks" / "state" / "records"
DB = "records_h200.db"
PACKED = f"{DB}.xz"  # the state as carried in and copied back out
CALLS = "records_h200.calls.json"
LOG = "record_sweeps_h200.log"
RESULT = "record_sweeps_h200.json"
SWEEPS = "wgmma_sm90_h200"  # the sweeps' directory under benchmarks/sweeps/
UNIFORM_SEED = 0
LAUNCH_OVERHEAD_S = 45.0  # a launch's Ray start, first compile and drain beyond its time limit
MIN_LAUNCH_S = 60.0  # no launch starts with less of the budget left than this
# A wgmma_sm90 trial with strict checks and an anchored screen over the five shapes in turn:
# 2.7-3.3 trials/s on one H200 (the first calls' launches, 2026-12-02, confirmation included),
# used until a call of this recording has measured its own rate
EST_TRIALS_PER_S_PER_GPU = 3.0
SMI_FIELDS = ("index", "name", "uuid", "driver_version", "clocks.sm", "clocks.mem",
              "clocks.max.sm", "clocks.max.mem", "power.draw", "power.limit", "temperature.gpu")


@dataclass(frozen=True)
class Part:
    """One study of the recording: its name, its sweeps' directory, sampler, seed and budget."""

    study: str
    subdir: str
    sampler: str
    seed: int
    trials: int


def plan(uniform: int, tpe_trials: int, tpe_seeds: list[int]) -> list[Part]:
    """The studies in launch order: the TPE runs (short, each complete soon), then the sample."""
    parts = [Part(f"records_tpe_s{s}", f"tpe_s{s}", "tpe", s, tpe_trials) for s in tpe_seeds]
    return parts + [Part("records_uniform", "uniform", "uniform", UNIFORM_SEED, uniform)]


def tunefw(db: str, args: list[str], log: Path) -> int:
    """The CLI as a user runs it, its output appended to the call's log."""
    with open(log, "a") as out:
        out.write(f"\n$ tunefw {' '.join(args)}\n")
        out.flush()
        return subprocess.call([sys.executable, "-m", "tunefw", "--db", db, *args],
                               stdout=out, stderr=subprocess.STDOUT)


def ensure_study(db: str, part: Part, study_file: Path, confirm_top: int | None,
                 log: Path) -> None:
    """Create the part's study from the study file, or check that the stored one is it."""
    store = open_store(db)
    try:
        with store.session() as s:
            row = next((r for r in q.list_studies(s) if r.name == part.study), None)
            spec = StudySpec.from_dict(row.spec) if row is not None else None
    finally:
        store.close()
    if spec is None:
        extra = [] if confirm_top is None else ["--confirm-top", str(confirm_top)]
        if tunefw(db, ["study", "create", part.study, "--from", str(study_file), "--sampler",
                       part.sampler, "--seed", str(part.seed), "--trials", str(part.trials),
                       *extra], log) != 0:
            raise SystemExit(f"could not create study {part.study} (see {log})")
        return
    if (spec.sampler, spec.seed, spec.trials) != (part.sampler, part.seed, part.trials):
        raise SystemExit(f"study {part.study} in the state is sampler {spec.sampler}, seed "
                         f"{spec.seed}, {spec.trials} trials, not {part.sampler}, {part.seed}, "
                         f"{part.trials}: run with the options that created it")


def progress(db: str, part: Part) -> tuple[bool, int]:
    """(whether a launch of the part has work left, its evaluated trials over all problems)."""
    store = open_store(db)
    try:
        with store.session() as s:
            study = q.get_study(s, part.study)
            evaluated = sum(q.evaluated_count(q.outcome_counts(s, p, study.round))
                            for p in study.problems)
            confirm_top = StudySpec.from_dict(study.spec).confirm_top
            return q.has_work(s, study, part.trials, confirm_top), evaluated
    finally:
        store.close()


def gpu_clocks() -> list[dict] | dict:
    """Each visible GPU's name, driver, clocks, power and temperature (nvidia-smi), or why not."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}",
                              "--format=csv,noheader,nounits"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if out.returncode != 0:
        return {"error": out.stderr.strip()[:200]}
    return [dict(zip(SMI_FIELDS, (v.strip() for v in line.split(","))))
            for line in out.stdout.splitlines() if line.strip()]


def unpack(state: Path, work: Path) -> Path:
    """The working database: the carried state's, decompressed, or a new one."""
    db = work / DB
    packed = state / PACKED
    if packed.exists():
        with lzma.open(packed, "rb") as src, open(db, "wb") as dst:
            shutil.copyfileobj(src, dst)
    return db


def pack(db: Path, out: Path) -> Path:
    """The database, checkpointed and xz-compressed into ``out`` (written whole, then renamed).
    xz: half gzip's size (a state of 12,000 trials is a few MB beside the carried wheels)."""
    con = sqlite3.connect(db)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()
    target = out / PACKED
    tmp = target.with_suffix(".tmp")
    with open(db, "rb") as src, lzma.open(tmp, "wb", preset=1) as dst:
        shutil.copyfileobj(src, dst)
    tmp.replace(target)
    return target


def estimate_s(left: int, gpus: int, calls: list[dict]) -> float:
    """Seconds of search the trials left need: at the last measured launch's trials/s, else
    at EST_TRIALS_PER_S_PER_GPU a GPU."""
    rates = [launch["trials_per_s"] for c in calls for launch in c.get("launches", [])
             if launch.get("trials_per_s") and c.get("backend") == "cuda"]
    return left / (rates[-1] if rates else EST_TRIALS_PER_S_PER_GPU * gpus)


def run_call(db: str, parts: list[Part], args: argparse.Namespace, log: Path, started: float,
             call: dict, save: Callable[[], None]) -> None:
    """Launch each part with work left while the budget lasts, each launch's figures added to
    the call; save() writes the state back after each (a call cut short keeps what its
    finished launches measured)."""
    launches = call.setdefault("launches", [])
    for part in parts:
        left, before = progress(db, part)
        if not left:
            continue
        budget_left = args.budget_s - (time.monotonic() - started)
        if budget_left < MIN_LAUNCH_S:
            print(f"{part.study}: {budget_left:.0f} s of the budget left, next call")
            break
        limit = max(1, int(budget_left - LAUNCH_OVERHEAD_S))
        launch = ["launch", part.study, "--gpus", str(args.gpus), "--backend", args.backend,
                  "--time-limit", str(limit)] + (["--address", args.address] if args.address
                                                 else [])
        t0 = time.monotonic()
        rc = tunefw(db, launch, log)
        _, after = progress(db, part)
        store = open_store(db)
        try:
            with store.session() as s:
                stats = q.get_study(s, part.study).stats or {}
        finally:
            store.close()
        launches.append({"study": part.study, "time_limit_s": limit, "rc": rc,
                         "seconds": round(time.monotonic() - t0, 1), "evaluated_before": before,
                         "evaluated_after": after, "trials_per_s": stats.get("trials_per_s"),
                         "gpu_busy_mean": stats.get("gpu_busy_mean")})
        save()
        print(f"{part.study}: rc {rc}, evaluated {before} -> {after} in "
              f"{launches[-1]['seconds']} s ({stats.get('trials_per_s') or 0:.1f} trials/s)")
        if rc != 0:
            break


def export(db: str, parts: list[Part], dest: Path, source: str) -> dict[str, list[Path]]:
    """Every part's sweeps, one file per problem under dest/SUBDIR/ (`tunefw export --format
    sweep`'s code, in this process: the valid-space counts are shared by the four studies)."""
    store = open_store(db)
    try:
        return {p.study: export_sweeps(store, p.study, dest / p.subdir, source=source)
                for p in parts}
    finally:
        store.close()


def load_calls(state: Path) -> list[dict]:
    path = state / CALLS
    return json.loads(path.read_text()) if path.exists() else []


def finish(db: str, parts: list[Part], calls: list[dict], out: Path | None) -> int:
    """Export the sweeps and write the summary: into ``out`` as a tar and a JSON (a device
    call's $OUT), or (None) into benchmarks/sweeps/ and benchmarks/results/."""
    commits = sorted({c["commit"] for c in calls if c.get("commit")})
    source = f"{SCRIPT} ({len(calls)} call(s), commit {', '.join(commits) or 'unknown'})"
    with tempfile.TemporaryDirectory(prefix="tunefw-records-") as tmp:
        dest = REPO / "benchmarks" / "sweeps" / SWEEPS if out is None else Path(tmp) / SWEEPS
        files = export(db, parts, dest, source)
        result = summarize(db, parts, files, calls, dest, SCRIPT)
        if out is not None:
            with tarfile.open(out / f"sweeps_{SWEEPS}.tar", "w") as tar:
                tar.add(dest, arcname=SWEEPS)
    path = (REPO / "benchmarks" / "results" if out is None else out) / RESULT
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {path}")
    print_table(result)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--backend", default="cuda", help="cuda; sim to try the script on a CPU")
    ap.add_argument("--address", help="a Ray cluster to launch on (default: a local Ray)")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="seconds of launches in this call (export and packing come after)")
    ap.add_argument("--uniform", type=int, default=2000, help="uniform sample per problem")
    ap.add_argument("--tpe-trials", type=int, default=160)
    ap.add_argument("--tpe-seeds", default="0,1,2")
    ap.add_argument("--confirm-top", type=int, help="override the study file's confirm_top")
    ap.add_argument("--study-file", type=Path, default=STUDY_FILE)
    ap.add_argument("--state", type=Path, default=STATE, help="folder of the carried state")
    ap.add_argument("--out", type=Path, help="default $OUT (a device call), else the state")
    ap.add_argument("--only", help="launch only these parts this call (e.g. tpe_s0,uniform)")
    ap.add_argument("--commit", help="the commit, where the tree has no git metadata")
    ap.add_argument("--export-only", action="store_true",
                    help="export the state's complete studies into the repository")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.tpe_seeds.split(",") if s.strip()]
    parts = plan(args.uniform, args.tpe_trials, seeds)
    problems = len(load_study_file(args.study_file).problems)  # a bad file fails first
    # Where this call's results go: the given folder or a device call's $OUT (the state, the
    # log, and once complete the sweeps' tar and the summary), else the state folder and the
    # repository
    given = args.out or (Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    out = given or args.state
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tunefw-records-db-") as work:
        db_path = unpack(args.state, Path(work))
        db = f"sqlite:///{db_path}"
        calls = load_calls(args.state)
        if args.export_only:
            if not db_path.exists() or any(progress(db, p)[0] for p in parts):
                raise SystemExit(f"{args.state}: the recording is not complete")
            return finish(db, parts, calls, args.out)
        log = out / LOG
        call = {"call": len(calls) + 1, "commit": args.commit or commit(),
                "started_utc": _utc(), "gpus": args.gpus, "backend": args.backend,
                "budget_s": args.budget_s, "clocks_start": gpu_clocks(),
                "parts": [asdict(p) for p in parts]}
        calls.append(call)

        def save() -> None:
            pack(db_path, out)
            (out / CALLS).write_text(json.dumps(calls, indent=1) + "\n")

        for part in parts:
            ensure_study(db, part, args.study_file, args.confirm_top, log)
        left = sum(p.trials * problems - progress(db, p)[1] for p in parts)
        print(f"call {call['call']}: {left} trials left, about "
              f"{estimate_s(left, args.gpus, calls):.0f} s of search on {args.gpus} GPU(s) "
              f"(+{LAUNCH_OVERHEAD_S:.0f} s a launch); this call's budget {args.budget_s:.0f} s")
        chosen = [p for p in parts if not args.only or p.subdir in args.only.split(",")]
        run_call(db, chosen, args, log, started, call, save)
        call.update(ended_utc=_utc(), clocks_end=gpu_clocks(),
                    complete=not any(progress(db, p)[0] for p in parts))
        save()
        if not call["complete"]:
            left = sum(p.trials * problems - progress(db, p)[1] for p in parts)
            print(f"not complete ({left} trials left): copy {PACKED} and {CALLS} from {out} "
                  f"into {args.state} and run again")
            return 3
        return finish(db, parts, calls, given)


def _utc() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


if __name__ == "__main__":
    sys.exit(main())
