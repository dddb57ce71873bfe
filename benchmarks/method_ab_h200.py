"""Two timing methods on the same configs, one after the other in one device call: the pinned
tree's (benchmarks/pinned_tree.sh unpack; the method the resumed studies were measured with)
and this tree's. Each launches benchmarks/studies/method_ab_h200.yaml (a seeded random sampler:
the same configs in both, nothing reused or confirmed) through `tunefw launch`, in a fresh
database. Writes method_ab_h200.json ($OUT, else benchmarks/results/): each launch's trials/s and
GPU busy, each config's screened ratio under both methods (paired by config), and how many
screens the newer method took again.

    source benchmarks/device_setup.sh && bash benchmarks/pinned_tree.sh unpack && \\
        python3 benchmarks/method_ab_h200.py --pinned /tmp/pinned-tree --commit SHA
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STUDY = REPO / "benchmarks" / "studies" / "method_ab_h200.yaml"
SCRIPT = "benchmarks/method_ab_h200.py"


def launch(root: Path, db: Path, gpus: int, backend: str, log: Path) -> int:
    """Create the study and launch it with the tunefw of ``root`` (its own PYTHONPATH)."""
    site = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p.startswith("/tmp/site")]
    env = {**os.environ, "PYTHONPATH": ":".join(site + [str(root)])}
    rc = 0
    with open(log, "a") as out:
        for args in (["study", "create", "method_ab", "--from", str(STUDY)],
                     ["launch", "method_ab", "--gpus", str(gpus), "--backend", backend]):
            rc = rc or subprocess.call([sys.executable, "-m", "tunefw", "--db", f"sqlite:///{db}",
                                        *args], cwd=root, env=env, stdout=out,
                                       stderr=subprocess.STDOUT)
    return rc


def measured(db: Path) -> dict:
    """The launch's figures and each OK trial's screened ratio by (problem, config key)."""
    con = sqlite3.connect(db)
    (stats, fingerprint), = con.execute("SELECT stats, fingerprint FROM tunefw_study").fetchall()
    ratios, again = {}, 0
    for key, config_key, tflops, cublas, log in con.execute(
            "SELECT p.key, t.config_key, t.tflops, t.cublas_tflops, t.log FROM tunefw_trial t "
            "JOIN tunefw_problem p ON p.id = t.problem_id WHERE t.status = 'OK'"):
        ratios[f"{key} {config_key}"] = tflops / cublas
        again += "screened again" in (log or "")
    con.close()
    stats = json.loads(stats or "{}")
    return {"method": json.loads(fingerprint or "{}").get("method"), "ratios": ratios,
            "screened_again": again, "trials": stats.get("trials"),
            "trials_per_s": stats.get("trials_per_s"), "gpu_busy": stats.get("gpu_busy_mean"),
            "wall_s": stats.get("wall_s")}


def compare(old: dict, new: dict) -> dict:
    """Paired figures: the configs both measured, their log-ratio differences, the rates."""
    both = sorted(set(old["ratios"]) & set(new["ratios"]))
    diffs = [math.log(new["ratios"][k] / old["ratios"][k]) for k in both]
    return {"paired_configs": len(both),
            "median_abs_log_ratio_diff": statistics.median(map(abs, diffs)) if diffs else None,
            "median_log_ratio_diff": statistics.median(diffs) if diffs else None,
            "rate_gain": (new["trials_per_s"] / old["trials_per_s"]
                          if old["trials_per_s"] and new["trials_per_s"] else None)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pinned", type=Path, default=Path("/tmp/pinned-tree"),
                    help="the unpacked pinned tree (benchmarks/pinned_tree.sh unpack)")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--backend", default="cuda", help="cuda; sim only to try the script")
    ap.add_argument("--commit", help="this tree's commit (the device tree has no .git)")
    ap.add_argument("--out", type=Path, help="default $OUT, else benchmarks/results/")
    args = ap.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    out.mkdir(parents=True, exist_ok=True)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="tunefw-ab-") as work:
        for name, root in (("pinned", args.pinned), ("this", REPO)):
            db = Path(work) / f"{name}.db"
            rc = launch(root, db, args.gpus, args.backend, out / "method_ab_h200.log")
            runs[name] = {"rc": rc, "root": str(root), **(measured(db) if rc == 0 else {})}
    ok = all(r["rc"] == 0 for r in runs.values())
    result = {"script": SCRIPT, "date": datetime.date.today().isoformat(),
              "commit": args.commit, "pinned_commit": _pinned_commit(args.pinned),
              "study": str(STUDY.relative_to(REPO)), "backend": args.backend,
              "runs": runs, "comparison": compare(runs["pinned"], runs["this"]) if ok else None}
    path = out / "method_ab_h200.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for name, r in runs.items():
        print(f"{name:7s} {r.get('method')}: rc {r['rc']}, {r.get('trials')} trials, "
              f"{r.get('trials_per_s') or 0:.2f} trials/s, screened again {r.get('screened_again')}")
    print(f"wrote {path}: {json.dumps(result['comparison'])}")
    return 0 if ok else 1


def _pinned_commit(tree: Path) -> str | None:
    path = tree / "COMMIT"
    return path.read_text().strip() if path.exists() else None


if __name__ == "__main__":
    sys.exit(main())
