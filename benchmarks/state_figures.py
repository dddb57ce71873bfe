"""Figures read off the committed H200 states (CPU only; nothing is measured here): the
llama3_8b table's search (benchmarks/state/llama3_8b_state.tar.gz) and issue 17's recording
(benchmarks/state/records/records_h200.db.xz). Writes benchmarks/results/state_figures_h200.json:

- llama3_8b: trials by outcome, the stored launch figures, each problem's best screened ratio by
  family and whether a winner is confirmed (the search's state, not a table's result);
- records: screens whose cuBLAS anchor ran at under ``--anchor-below`` of its problem's median
  cuBLAS rate (a disturbed GPU: what the anchored-4 method screens again), with their ratios;
  each problem's and study's best screened ratio, with and without those screens.

    python3 benchmarks/state_figures.py
"""
from __future__ import annotations

import argparse
import json
import lzma
import sqlite3
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STATE = REPO / "benchmarks" / "state"
SCRIPT = "benchmarks/state_figures.py"


def llama(db: str) -> dict:
    """The llama3_8b study's current round: its trials, launch figures and per-problem best
    screened ratios (an earlier round's rows stay in the database, measured with other code)."""
    con = sqlite3.connect(db)
    (stats, fingerprint, round_), = con.execute("SELECT stats, fingerprint, round FROM tunefw_study")
    outcomes = dict(con.execute("SELECT status, count(*) FROM tunefw_trial WHERE round = ? "
                                "GROUP BY status", (round_,)))
    best: dict[str, dict] = {}
    for key, family, ratio in con.execute(
            "SELECT p.key, t.family, max(t.tflops / t.cublas_tflops) FROM tunefw_trial t JOIN "
            "tunefw_problem p ON p.id = t.problem_id WHERE t.status = 'OK' AND t.round = ? "
            "GROUP BY p.id, t.family", (round_,)):
        best.setdefault(key, {})[family] = round(ratio, 4)
    confirmed = con.execute("SELECT count(*) FROM tunefw_winner WHERE confirmed").fetchone()[0]
    con.close()
    fp = json.loads(fingerprint or "{}")
    return {"round": round_, "outcomes": outcomes, "last_launch": json.loads(stats or "{}"),
            "device": {k: fp.get(k) for k in ("name", "driver", "method")},
            "confirmed_winners": confirmed, "best_screened_ratio": best}


def disturbed(db: str, below: float) -> dict:
    """Screens whose cuBLAS anchor ran under ``below`` of its problem's median cuBLAS rate."""
    con = sqlite3.connect(db)
    rows = con.execute("SELECT p.key, t.id, t.cublas_tflops, t.tflops, t.created_at, s.name "
                       "FROM tunefw_trial t JOIN tunefw_problem p ON p.id = t.problem_id JOIN "
                       "tunefw_study s ON s.id = t.study_id WHERE t.status = 'OK'").fetchall()
    con.close()
    medians = {}
    for key in {r[0] for r in rows}:
        medians[key] = statistics.median(r[2] for r in rows if r[0] == key)
    slow = [{"problem": key, "trial_id": tid, "study": study, "created_at": when,
             "cublas_rate_of_median": round(cublas / medians[key], 3),
             "ratio": round(tflops / cublas, 4), "tflops": round(tflops, 1)}
            for key, tid, cublas, tflops, when, study in rows if cublas < below * medians[key]]
    best: dict[str, dict] = {}  # per problem and study: best screened ratio, all and undisturbed
    for key, _, cublas, tflops, _, study in rows:
        b = best.setdefault(key, {}).setdefault(study, {"screens": 0, "best": 0.0,
                                                        "best_undisturbed": 0.0})
        b["screens"] += 1
        b["best"] = max(b["best"], round(tflops / cublas, 4))
        if cublas >= below * medians[key]:
            b["best_undisturbed"] = max(b["best_undisturbed"], round(tflops / cublas, 4))
    return {"ok_screens": len(rows), "anchor_below": below, "disturbed": len(slow),
            "rows": sorted(slow, key=lambda r: r["created_at"]),
            "best_screened_ratio": {k: dict(sorted(v.items())) for k, v in sorted(best.items())}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--anchor-below", type=float, default=0.7)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" /
                    "state_figures_h200.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        with tarfile.open(STATE / "llama3_8b_state.tar.gz") as tar:
            tar.extractall(work, filter="data")
        records = Path(work) / "records.db"
        records.write_bytes(lzma.decompress((STATE / "records" / "records_h200.db.xz").read_bytes()))
        result = {"script": SCRIPT, "note": "read off committed states; nothing measured here",
                  "llama3_8b": llama(str(Path(work) / "state.db")),
                  "records": disturbed(str(records), args.anchor_below)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    r, l = result["records"], result["llama3_8b"]
    print(f"llama3_8b: {l['outcomes']}, {l['confirmed_winners']} winners confirmed; records: "
          f"{r['disturbed']} of {r['ok_screens']} screens with cuBLAS under "
          f"{r['anchor_below']:g}x its problem's median; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
