"""How much faster a Llama decode step can get from its GEMMs alone, from committed H200 results
(no GPU): per decode batch, the step's GEMM time under cuBLAS, under the served table (each
shape's measured winner, cuBLAS where it lost), at the HBM roofline (bytes / measured stream
read) and at the launch ceiling (benchmarks/launch_roofline.py: a launch's fixed cost plus its
bytes over the fitted bandwidth, the bound one GEMM launch has), against the stock graph step of benchmarks/hf_llama_h200.py; the rest of the step
(attention, norms, launch gaps) is what stock spends beyond its GEMMs and no GEMM kernel
changes it. End-to-end ceilings are given for the benchmark's depth and for the real model's.

    python3 benchmarks/decode_ceiling.py [--table-run RESULT] [--hf RESULT] [--layers 32]

Writes benchmarks/results/decode_ceiling.json and prints a table.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO / "benchmarks"))

from launch_roofline import ceiling_us, launch_floor  # noqa: E402
# GEMM calls per decoder layer by (N, K) in HF's unfused Llama: q, o; k, v; gate, up; down
PER_LAYER = {(4096, 4096): 2, (1024, 4096): 2, (14336, 4096): 2, (4096, 14336): 1}
LM_HEAD = (128256, 4096)


def gemm_us(rows: list[dict], m: int, read_tbs: float,
            floor: dict) -> dict[tuple[int, int], dict]:
    """Per (N, K) at M=m: microseconds under cuBLAS, served (the faster of winner and cuBLAS), at
    the roofline and at the launch ceiling (``floor``: launch_roofline.launch_floor)."""
    out = {}
    for r in rows:
        if r["M"] != m:
            continue
        flops = 2.0 * m * r["N"] * r["K"]
        nbytes = 2.0 * (r["N"] * r["K"] + m * r["K"] + m * r["N"])
        out[(r["N"], r["K"])] = {
            "cublas_us": flops / r["cublas_tflops"] / 1e6,
            "served_us": flops / max(r["tflops"], r["cublas_tflops"]) / 1e6,
            "roofline_us": nbytes / (read_tbs * 1e12) * 1e6,
            "launch_us": ceiling_us(nbytes, floor)}
    return out


def step_ceilings(per_shape: dict, stock_ms: float, layers: int, at_layers: int) -> dict:
    """The step's GEMM totals at ``layers`` (the measured model) and the end-to-end speedups the
    served and roofline GEMMs allow at ``at_layers``, the rest per layer held as measured."""
    def total(kind: str, n: int) -> float:
        return n * sum(c * per_shape[s][kind] for s, c in PER_LAYER.items()) + per_shape[LM_HEAD][kind]

    stock_us = stock_ms * 1e3
    rest_per_layer = (stock_us - total("cublas_us", layers)) / layers
    stock_at = total("cublas_us", at_layers) + rest_per_layer * at_layers
    return {"gemm_cublas_us": total("cublas_us", layers), "gemm_served_us": total("served_us", layers),
            "gemm_roofline_us": total("roofline_us", layers), "rest_per_layer_us": rest_per_layer,
            "layers": at_layers, "stock_step_us": stock_at,
            "served_speedup": stock_at / (stock_at - total("cublas_us", at_layers) + total("served_us", at_layers)),
            "roofline_speedup": stock_at / (stock_at - total("cublas_us", at_layers) + total("roofline_us", at_layers)),
            "gemm_launch_us": total("launch_us", layers),
            "launch_speedup": stock_at / (stock_at - total("cublas_us", at_layers) + total("launch_us", at_layers))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table-run", type=Path, default=RESULTS / "model_table_hf_llama3_8b_h200.json")
    ap.add_argument("--hf", type=Path, default=RESULTS / "hf_llama_h200.json")
    ap.add_argument("--read", type=Path, default=RESULTS / "membound_probe_h200.json",
                    help="a result holding stream_read (the measured HBM read)")
    ap.add_argument("--micro", type=Path, default=RESULTS / "stream_micro_h200.json",
                    help="the stream micro whose reads fit the launch ceiling")
    ap.add_argument("--layers", type=int, default=32, help="the real model's depth")
    ap.add_argument("--out", type=Path, default=RESULTS / "decode_ceiling.json")
    args = ap.parse_args()
    rows = json.loads(args.table_run.read_text())["phases"]["sweep"]["rows"]
    hf = json.loads(args.hf.read_text())
    read_tbs = json.loads(args.read.read_text())["stream_read"]["read_tbs_best"]
    floor = launch_floor(json.loads(args.micro.read_text()))
    depth = hf["model"]["num_hidden_layers"]
    cases = []
    for case in hf["cases"]:
        if not case["case"].startswith("decode") or "stock" not in case.get("graph", {}):
            continue
        m = int(case["case"].split("=")[1])
        per_shape = gemm_us(rows, m, read_tbs, floor)
        if not all(s in per_shape for s in (*PER_LAYER, LM_HEAD)):
            continue
        stock_ms = case["graph"]["stock"]["median_ms"]
        cases.append({"case": case["case"], "M": m, "stock_graph_ms": stock_ms,
                      "measured_graph_speedup": case["graph"]["speedup"]["median"],
                      "at_benchmark_depth": step_ceilings(per_shape, stock_ms, depth, depth),
                      "at_model_depth": step_ceilings(per_shape, stock_ms, depth, args.layers)})
    report = {"script": "benchmarks/decode_ceiling.py", "inputs": [str(p.relative_to(REPO)) for p in
              (args.table_run, args.hf, args.read, args.micro)], "read_tbs": read_tbs,
              "launch_floor": floor, "benchmark_layers": depth,
              "cases": cases}
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"HBM read {read_tbs:.2f} TB/s; graph decode step, GEMMs only changed "
          f"(depth {depth} measured, {args.layers} extrapolated)")
    print(f"{'case':12s} {'measured':>9s} {'served@' + str(depth):>10s} {'roof@' + str(depth):>9s} "
          f"{'launch@' + str(depth):>10s} {'served@' + str(args.layers):>10s} "
          f"{'roof@' + str(args.layers):>9s} {'launch@' + str(args.layers):>10s}")
    for c in cases:
        a, b = c["at_benchmark_depth"], c["at_model_depth"]
        print(f"{c['case']:12s} {c['measured_graph_speedup']:9.3f} {a['served_speedup']:10.3f} "
              f"{a['roofline_speedup']:9.3f} {a['launch_speedup']:10.3f} {b['served_speedup']:10.3f} "
              f"{b['roofline_speedup']:9.3f} {b['launch_speedup']:10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
