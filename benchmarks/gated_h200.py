"""Gated GEMMs (gate silu: C = silu(A Bg^T) * (A Bu^T), B = [Bg; Bu]) on the GPU, in one run:
random valid gated configs of both gated families strictly verified on edge shapes (the first
time the gated epilogues run on a GPU), then a real `tunefw launch` sweep of
benchmarks/studies/gated_h200.yaml (Llama-3-8B's MLP input side at M = 1..2048) against the
stock form timed in the same trials (one cuBLAS GEMM over [Bg; Bu] + SiLU and the product), with
each winner's roofline beside a streaming read measured in the same run.

    source benchmarks/device_setup.sh && python3 benchmarks/gated_h200.py \
        --db /tmp/gated.db --time-limit 300 --result $OUT/gated_h200.json

The sweep resumes from --db (carry it back in); --verify-sample 0 skips the verification part.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from gpu_result import out_path, report_header  # noqa: E402
from sweep_h200 import build_result, print_table, run_studies  # noqa: E402
from tunefw.measure.roofline import figures  # noqa: E402
from tunefw.measure.verify import EDGE_SHAPES, Job, plan  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402

STUDY = REPO / "benchmarks" / "studies" / "gated_h200.yaml"
GATED_FAMILIES = ("stream_sm90", "wgmma_sm90")
# The edge shapes and Llama's gated MLP at decode and prefill sizes, all gated.
GATED_SHAPES = [GemmProblem(m, n, k, gate="silu") for m, n, k in EDGE_SHAPES] + [
    GemmProblem(m, 14336, 4096, gate="silu") for m in (1, 5, 16, 64, 129, 300)]


def verify_jobs(sample: int, seed: int = 0) -> list[Job]:
    """``sample`` random valid configs of each gated family on each gated shape it can serve."""
    jobs: list[Job] = []
    for family in GATED_FAMILIES:
        jobs += plan(family, GATED_SHAPES, sample, seed)
    return jobs


def roofline(row: dict, read_tbs: float) -> dict:
    """The winner's and the stock form's bytes moved (gated: both weight halves), TB/s and
    fraction of the streaming read."""
    p = GemmProblem(row["M"], row["N"], row["K"], row.get("dtype", "bf16"), gate=row.get("gate", "none"))
    mine, theirs = figures(p, row.get("tflops"), read_tbs), figures(p, row.get("cublas_tflops"), read_tbs)
    return {**mine, "bandwidth_read_tbs": read_tbs, "stock_tbs": theirs["tbs"],
            "stock_frac_of_read": theirs["frac_of_read"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, help="state database path (carried between runs)")
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds for the sweep part")
    ap.add_argument("--verify-sample", type=int, default=8, help="configs per family and shape")
    ap.add_argument("--backend", default="cuda", help="cuda; sim only to try the sweep on a CPU")
    ap.add_argument("--result", type=Path, help="default $OUT/gated_h200.json, else benchmarks/results/")
    args = ap.parse_args()
    db = f"sqlite:///{Path(args.db).resolve()}"
    state = Path(args.db).with_suffix(".gated.json")
    saved = json.loads(state.read_text()) if state.exists() else {}
    if args.verify_sample and args.backend == "cuda":
        from tunefw.measure.verify import run_verify, summary
        jobs = verify_jobs(args.verify_sample)
        print(f"verifying {len(jobs)} gated config-shape pairs", flush=True)
        checked = run_verify(jobs)
        print(summary(checked), flush=True)
        saved["verify"] = {k: v for k, v in checked.items() if k != "rows"}
        saved["verify"]["not_ok"] = [r for r in checked["rows"] if r["status"] != "OK"]
        saved["verify"]["shapes"] = [p.key() for p in GATED_SHAPES]
    if args.backend == "cuda":
        from tunefw.measure.roofline import stream_read_tbs
        saved.setdefault("stream_read_runs", []).append(stream_read_tbs())
    state.write_text(json.dumps(saved, indent=1, default=str))
    if not run_studies(db, [STUDY], args.time_limit, 1, args.backend):
        print("sweep not complete: run again with the same --db to resume")
        return 3
    result = build_result(db, [STUDY], [], [])
    result["script"] = "benchmarks/gated_h200.py"
    result.update(report_header(result["script"]) if args.backend == "cuda" else {})
    result.update(saved)
    runs = saved.get("stream_read_runs") or [{"read_tbs_best": 4.21}]  # sim: the brief's figure
    read = min(r["read_tbs_best"] for r in runs)
    for row in result["rows"]:
        row.update(roofline(row, read))
    print_table(result)
    for row in result["rows"]:
        if row.get("tbs"):
            print(f"{row['M']:>5}x{row['N']}x{row['K']}:{row.get('gate')}  {row['tbs']:.2f} TB/s "
                  f"({100 * row['frac_of_read']:.0f}% of {read:.2f}); stock {row['stock_tbs']:.2f}")
    path = out_path("gated_h200.json", args.result)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
