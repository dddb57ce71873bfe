"""CPU: the bytes each committed wgmma_sm90 probe row moved from L2 into shared memory, and what
that explains. For every OK row of membound_probe_h200.json and membound2_probe_h200.json with
M >= 32: the work units (tiles x SPLIT_K), the tile utilisation, and the modelled L2 -> SM bytes
(every unit loads its BM x K/S and BN x K/S operand slices, a multicast cluster once per
cluster, plus the split-K fp32 partials written and read once) over the measured time. Per
shape it writes the fastest configs with those figures and the rank correlation of time with
L2 -> SM bytes (near zero or negative: the traffic is not what orders the configs).

    python3 benchmarks/probe_traffic.py   # -> benchmarks/results/probe_traffic.json
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PROBES = ("membound_probe_h200.json", "membound2_probe_h200.json")
SHOWN = 8  # fastest configs listed per shape


def traffic(row: dict) -> dict:
    """Work units, tile utilisation and modelled L2 -> SM megabytes of one probe row."""
    c, M, N, K = row["config"], row["M"], row["N"], row["K"]
    rows_k, cols_k = (N, M) if c.get("SWAP_AB") else (M, N)  # the kernel's own M x N
    bm, bn, split = c["BM"], c["BN"], c["SPLIT_K"]
    tiles = math.ceil(rows_k / bm) * math.ceil(cols_k / bn)
    operands = tiles * K * 2 * (bm / c["CLUSTER_N"] + bn / c["CLUSTER_M"])
    partials = tiles * split * bm * bn * 4 * 2 if split > 1 else 0
    return {"units": tiles * split, "utilisation": round(M * N / (tiles * bm * bn), 3),
            "l2_to_sm_mb": round((operands + partials) / 1e6, 1),
            "partials_mb": round(partials / 1e6, 1)}


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Rank correlation (ties broken by order: enough for a sign and a size)."""
    rx, ry = _ranks(xs), _ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    var = math.sqrt(sum((a - mx) ** 2 for a in rx) * sum((b - my) ** 2 for b in ry))
    return round(cov / var, 3) if var else 0.0


def main() -> None:
    by_shape: dict[str, list[dict]] = defaultdict(list)
    for name in PROBES:
        for row in json.loads((RESULTS / name).read_text())["rows"]:
            if row["status"] == "OK" and row.get("family", "wgmma_sm90") == "wgmma_sm90" \
                    and row["M"] >= 32:
                us = row["median_ms"] * 1e3
                t = traffic(row)
                by_shape[f'{row["M"]}x{row["N"]}x{row["K"]}'].append(
                    {"probe": name, "config": row["config"], "us": round(us, 2),
                     "ratio": round(row["ratio"], 3), **t,
                     "l2_to_sm_tbs": round(t["l2_to_sm_mb"] / us, 2)})
    shapes = {}
    for key, rows in sorted(by_shape.items()):
        rows.sort(key=lambda r: r["us"])
        shapes[key] = {"rows": len(rows),
                       "spearman_time_vs_l2_bytes": spearman([r["l2_to_sm_mb"] for r in rows],
                                                              [r["us"] for r in rows]),
                       "fastest": rows[:SHOWN]}
        best = rows[0]
        print(f"{key:18s} {len(rows):4d} rows  rho {shapes[key]['spearman_time_vs_l2_bytes']:+.2f}"
              f"  best {best['us']:6.1f} us {best['units']:4d} units "
              f"{best['l2_to_sm_mb']:6.0f} MB L2->SM ({best['l2_to_sm_tbs']:.1f} TB/s)")
    out = {"script": "benchmarks/probe_traffic.py", "probes": list(PROBES),
           "model": "units = tiles x SPLIT_K; L2 -> SM bytes = tiles x K x 2 x (BM / CLUSTER_N "
                    "+ BN / CLUSTER_M) + split-K partials (tiles x S x BM x BN x 4, written and "
                    "read); the kernel's M x N is swapped under SWAP_AB",
           "shapes": shapes}
    (RESULTS / "probe_traffic.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
