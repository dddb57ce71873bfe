"""Issue 13's targets against the HBM roofline, from the committed H200 decode rounds (no GPU): per
acceptance shape, cuBLAS's effective bandwidth and the run's measured streaming read in the same
run, the ratio a kernel moving A, B and C once at that read speed would reach over cuBLAS (no
launch, no fill, no tail: an upper bound), the target, the confirmed sweep winner of the latest
round that measured the shape (earlier rounds' best are listed, not judged: their timing
changed), and the verdict: met, open (below the roofline: the share of the read it needs), at the roofline
(it needs 95% of the read or more), or beyond it (no kernel can reach it on this GPU).

    python3 benchmarks/decode_targets.py [ROUND.json ...]

Writes benchmarks/results/decode_targets.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
ROUNDS = ("decode_h200.json", "decode2_h200.json", "decode3_h200.json", "decode3b_h200.json",
          "decode4_h200.json", "decode5_h200.json", "decode6_h200.json")
LAYERS = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))
ODD = ((129, 4096, 4096), (1000, 4096, 4096), (4097, 4096, 4096))


def targets() -> list[tuple[int, int, int, float, str]]:
    """(M, N, K, target ratio, band) of every acceptance shape."""
    out = [(m, n, k, 1.05, "M<=16") for n, k in LAYERS for m in (1, 2, 4, 8, 16)]
    out += [(m, n, k, 1.10, "32<=M<=128") for n, k in LAYERS for m in (32, 64, 128)]
    return out + [(m, n, k, 1.00, "odd M") for m, n, k in ODD]


NEAR = 0.95  # a target that needs this share of the streaming read or more: at the roofline


def verdict(target: float, ratio: float, ceiling: float, need: float) -> str:
    """met; beyond roofline (no kernel reaches it); at roofline (it needs >= 95% of the read of
    a 4 GB stream on a read a few hundred MB at most, with launch, fill and tail); open."""
    if ratio >= target:
        return "met"
    if ceiling < target:
        return "beyond roofline"
    return "at roofline" if need >= NEAR else "open"


METHOD3 = ("decode4_h200.json", "decode5_h200.json", "decode6_h200.json")  # timing anchored-3


def _us(r: dict, tflops: float) -> float:
    return 2.0 * r["M"] * r["N"] * r["K"] / (tflops * 1e6)


def floor_us(m: int, n: int, k: int, rows: list[dict]) -> float | None:
    """The fastest any kernel (a winner or cuBLAS) ran this layer at M' <= m under the current
    timing method: a kernel for M rows moves at least the bytes of M' rows."""
    times = [_us(r, t) for r in rows if r["round"] in METHOD3 and (r["N"], r["K"]) == (n, k)
             and r["M"] <= m for t in (r["tflops"], r["cublas_tflops"])]
    return min(times, default=None)


def shape_row(m: int, n: int, k: int, target: float, band: str, rows: list[dict]) -> dict:
    """One acceptance shape over every round that measured it."""
    mine = [r for r in rows if (r["M"], r["N"], r["K"]) == (m, n, k) and r.get("cublas_tbs")]
    if not mine:
        return {"shape": f"{m}x{n}x{k}", "band": band, "target": target, "verdict": "unmeasured"}
    # the roofline over cuBLAS per round (its read and its cuBLAS): the lowest is the bound
    ceilings = [r["bandwidth_read_tbs"] / r["cublas_tbs"] for r in mine]
    ceiling = min(ceilings)
    cur = mine[-1]  # the latest round (ROUNDS is in time order)
    worst_cublas = max(mine, key=lambda r: r["cublas_tbs"] / r["bandwidth_read_tbs"])
    need = target * worst_cublas["cublas_tbs"] / worst_cublas["bandwidth_read_tbs"]
    return {"shape": f"{m}x{n}x{k}", "band": band, "target": target, "bytes": cur["bytes"],
            "rounds": len(mine), "cublas_tbs": [round(r["cublas_tbs"], 3) for r in mine],
            "read_tbs": [round(r["bandwidth_read_tbs"], 3) for r in mine],
            "roofline_over_cublas": round(ceiling, 4),
            "target_needs_share_of_read": round(need, 4),
            "ratio_by_round": {r["round"]: round(r["ratio"], 4) for r in mine},
            "current_ratio": round(cur["ratio"], 4), "current_family": cur["family"],
            "current_trial": cur["trial_id"], "current_round": cur["round"],
            "current_tbs": round(cur["tbs"], 3),
            "target_us": round(_us(cur, cur["cublas_tflops"]) / target, 2),
            "floor_us": round(floor_us(m, n, k, rows) or 0.0, 2),
            "verdict": verdict(target, cur["ratio"], ceiling, need)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rounds", nargs="*", type=Path, help=f"decode rounds (default: {', '.join(ROUNDS)})")
    ap.add_argument("--out", type=Path, default=RESULTS / "decode_targets.json")
    args = ap.parse_args()
    rows = []
    for path in args.rounds or [RESULTS / r for r in ROUNDS if (RESULTS / r).exists()]:
        rows += [{**r, "round": path.name} for r in json.loads(path.read_text())["rows"]]
    shapes = [shape_row(*t, rows) for t in targets()]
    counts: dict[str, dict[str, int]] = {}
    for s in shapes:
        counts.setdefault(s["band"], {}).setdefault(s["verdict"], 0)
        counts[s["band"]][s["verdict"]] += 1
    small = [s["current_ratio"] for s in shapes if s["band"] == "M<=16" and "current_ratio" in s]
    report = {"script": "benchmarks/decode_targets.py",
              "rounds": sorted({r["round"] for r in rows}),
              "note": "roofline_over_cublas = measured streaming read / cuBLAS's bandwidth on the shape "
                      "in the same run, the lowest over the rounds: a kernel that moved A, B and C "
                      "once at the read speed, with no launch, fill or tail, reaches that ratio",
              "floor_note": "floor_us: the fastest any kernel (winner or cuBLAS) ran the layer at "
                            "M' <= M in a round timed like today (anchored-3); target_us: "
                            "cuBLAS's time over the target",
              "verdicts": counts,
              "m16_current_geomean": math.exp(sum(map(math.log, small)) / len(small)) if small else None,
              "shapes": shapes}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{'shape':>16} {'band':>10} {'target':>6} {'now':>6} {'roofline':>8} {'needs':>6} "
          f"{'goal us':>7} {'floor':>6}  verdict")
    for s in shapes:
        if "current_ratio" in s:
            print(f"{s['shape']:>16} {s['band']:>10} {s['target']:6.2f} {s['current_ratio']:6.3f} "
                  f"{s['roofline_over_cublas']:8.3f} {s['target_needs_share_of_read']:6.1%} "
                  f"{s['target_us']:7.2f} {s['floor_us']:6.2f}  {s['verdict']}")
    print(json.dumps(counts), f"M<=16 current geomean {report['m16_current_geomean']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
