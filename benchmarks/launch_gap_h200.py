"""Where the constant mid-M deficit goes: tunefw's kernel, launched plainly and programmatically,
beside cuBLAS, each as a CUDA graph of back-to-back GEMMs (a model's layers in a row).

The llama3_8b table's wgmma_sm90 winners on the 4096- and 6144-wide layers lose to cuBLAS by a
roughly constant 1.3-3.3 us a launch from M = 64 to 4096 (model_table_llama3_8b_h200.json), a
per-launch cost rather than a per-tile rate. Each shape's chain holds LINKS GEMMs, each on its
own weight copy (cycled past the L2, as a served model reads each layer's weight after the
others), served three ways in interleaved rounds: cuBLAS (torch.mm), tunefw plain, tunefw with
programmatic stream serialization (its CTAs start while the GEMM before ends; they wait for it
themselves). Per shape: the three per-GEMM times, the deficit in us, and what programmatic
launches win back. Entries exported as cuBLAS routes run their tuned config (profile_h200's
--any-route copy of the table).

    source benchmarks/device_setup.sh && python3 benchmarks/launch_gap_h200.py --commit SHA

Writes $OUT/launch_gap_h200.json (else benchmarks/results/) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

TABLE = REPO / "benchmarks" / "results" / "dispatch_llama3_8b_h200.json"
SHAPES = ("64x4096x4096,128x4096x4096,256x4096x4096,512x4096x4096,1024x4096x4096,"
          "4096x4096x4096,128x6144x4096,256x6144x4096")
MIN_LINKS = 8


def per_gemm(timed: dict, links: int) -> dict:
    """Per-GEMM microseconds of both sides of an interleaved(stock, patched) timing."""
    return {side: round(timed[side]["median_ms"] * 1e3 / links, 3) for side in ("stock", "patched")}


def gap_row(shape: str, links: int, vs_plain: dict, vs_pdl: dict) -> dict:
    """A shape's row from two timings, both with cuBLAS as ``stock``: against the plain launch
    and against the programmatic one (each per chain of ``links`` GEMMs)."""
    plain, pdl = per_gemm(vs_plain, links), per_gemm(vs_pdl, links)
    cublas_us = (plain["stock"] + pdl["stock"]) / 2
    return {"shape": shape, "links": links, "cublas_us": round(cublas_us, 3),
            "plain_us": plain["patched"], "programmatic_us": pdl["patched"],
            "ratio_plain": round(vs_plain["speedup"]["median"], 4),
            "ratio_programmatic": round(vs_pdl["speedup"]["median"], 4),
            "deficit_us": round(plain["patched"] - plain["stock"], 3),
            "programmatic_gain_us": round(plain["patched"] - pdl["patched"], 3)}


def chain_operands(m: int, n: int, k: int, links: int) -> tuple:
    """A chain's activations (M x K) and its ``links`` weight copies (N x K), bf16, seeded by
    the shape: a model's layers in a row, each read from HBM."""
    import torch

    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n)
    x = torch.randn(m, k, device="cuda", generator=gen).mul_(0.1).to(torch.bfloat16)
    weights = [torch.randn(n, k, device="cuda", generator=gen).mul_(0.02).to(torch.bfloat16)
               for _ in range(links)]
    return x, weights


def run_shape(shape: str, plain, pdl, rounds: int, l2_bytes: int) -> dict:
    """One shape: the weight copies, the three chains captured, two interleaved timings."""
    import torch

    from hf_llama_steps import interleaved
    from pdl_check_h200 import captured
    from tunefw.evaluate.method import rotation_copies

    m, n, k = (int(v) for v in shape.split("x"))
    links = max(MIN_LINKS, rotation_copies(2 * n * k, l2_bytes))
    x, weights = chain_operands(m, n, k, links)
    ways = {"cublas": lambda: [torch.mm(x, w.t()) for w in weights],
            "plain": lambda: [plain.gemm(x, w) for w in weights],
            "programmatic": lambda: [pdl.gemm(x, w) for w in weights]}
    first = {name: fn()[0] for name, fn in ways.items()}  # plans built, kernels verified
    err = float((first["plain"].float() - first["cublas"].float()).norm()
                / first["cublas"].float().norm())
    graphs = {name: captured(fn)[0] for name, fn in ways.items()}
    vs_plain = interleaved(graphs["cublas"].replay, graphs["plain"].replay, rounds, 10, True)
    vs_pdl = interleaved(graphs["cublas"].replay, graphs["programmatic"].replay, rounds, 10, True)
    row = gap_row(shape, links, vs_plain, vs_pdl)
    row.update(rel_diff_vs_cublas=err, explain=plain.explain(m, n, k),
               programmatic_plans=pdl.programmatic)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--shapes", default=SHAPES, help="MxNxK,... (exact entries of the table)")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved rounds per timing")
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch

    import gpu_result
    import tunefw
    from profile_h200 import kernel_routes

    table = kernel_routes(args.table)
    plain = tunefw.Dispatcher(table, programmatic=False, guard=False)
    pdl = tunefw.Dispatcher(table, programmatic=True, guard=False)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    rows = [run_shape(s, plain, pdl, args.rounds, l2) for s in args.shapes.split(",") if s]
    report = {**gpu_result.report_header("benchmarks/launch_gap_h200.py", args.commit),
              "table": str(args.table), "rounds": args.rounds, "rows": rows}
    out = gpu_result.out_path("launch_gap_h200.json", args.out)
    out.write_text(json.dumps(report, indent=1))
    print(f"{'shape':>16} {'cuBLAS us':>9} {'plain us':>9} {'pdl us':>8} {'deficit':>8} "
          f"{'pdl gain':>8} {'ratio':>6} {'pdl ratio':>9}")
    for r in rows:
        print(f"{r['shape']:>16} {r['cublas_us']:9.2f} {r['plain_us']:9.2f} "
              f"{r['programmatic_us']:8.2f} {r['deficit_us']:8.2f} {r['programmatic_gain_us']:8.2f} "
              f"{r['ratio_plain']:6.3f} {r['ratio_programmatic']:9.3f}")
    print("->", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
