"""Issue 13's result: real `tunefw launch` sweeps of the decode studies (benchmarks/sweep_h200.py,
resumable over several device runs) plus the roofline of every confirmed winner.

Each device run first measures this GPU's streaming read (>= 4 GB, benchmarks/decode_probe.py)
and appends it to the state directory, so each row's effective TB/s (A, B and C moved once over
the confirmed median time) is shown beside the bandwidth measured on the same machine and run.

    python3 benchmarks/decode_h200.py --db benchmarks/state/decode.db --time-limit 420 \
        [--gpus 8] --result $OUT/decode_h200.json studies/llama3_8b_decode.yaml
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from sweep_h200 import build_result, print_table, run_studies  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.measure.roofline import figures  # noqa: E402


def roofline(row: dict, read_tbs: float) -> dict:
    """Bytes a GEMM must move, the TB/s its median time gives, and the fraction of `read_tbs`,
    for the kernel and for the cuBLAS timed beside it."""
    p = GemmProblem(row["M"], row["N"], row["K"], row.get("dtype", "bf16"))
    mine, theirs = figures(p, row.get("tflops"), read_tbs), figures(p, row.get("cublas_tflops"), read_tbs)
    return {**mine, "bandwidth_read_tbs": read_tbs, "cublas_tbs": theirs["tbs"],
            "cublas_frac_of_read": theirs["frac_of_read"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("studies", nargs="+", type=Path)
    ap.add_argument("--db", required=True)
    ap.add_argument("--time-limit", type=float, default=420.0)
    ap.add_argument("--gpus", type=int, default=1, help="GPUs of this host to sweep on")
    ap.add_argument("--result", type=Path)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    state = Path(args.db).with_suffix(".bandwidth.json")
    runs = json.loads(state.read_text()) if state.exists() else []
    if not args.report_only:
        from tunefw.measure.roofline import stream_read_tbs
        runs.append(stream_read_tbs())
        state.write_text(json.dumps(runs, indent=1))
        if not run_studies(args.db, args.studies, args.time_limit, args.gpus, "cuda"):
            print("not complete: run again with the same --db to resume")
            return 3
    if not runs:
        raise SystemExit(f"no streaming-read measurement in {state}: run without --report-only first")
    result = build_result(args.db, args.studies, [], [])
    read = min(r["read_tbs_best"] for r in runs)  # the most conservative run's streaming read
    result["stream_read_runs"] = runs
    for study in result["studies"].values():
        for row in study["rows"]:
            row.update(roofline(row, read))
    result["rows"] = next(iter(result["studies"].values()))["rows"]
    print_table(result)
    for row in result["rows"]:
        if row.get("tbs"):
            print(f"{row['M']:>5}x{row['N']:>5}x{row['K']:>5}  {row['tbs']:.2f} TB/s "
                  f"({100 * row['frac_of_read']:.0f}% of {read:.2f}); cuBLAS {row['cublas_tbs']:.2f}")
    if args.result:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        args.result.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
