"""Why the first-call guard's verdict on one shape flips between processes: the thin exact entry
64x1024x4096 (confirmed 1.039x cuBLAS) was measured by the guard at 1.973x and 1.711x in two
hf_llama_h200.py processes and at 0.946x and 0.972x in two others (session 22's runs). The answer
(benchmarks/results/guard_probe_h200.json): cuBLAS's own time for the shape is bimodal.

Each of ``--processes`` fresh processes, for each shape: cuBLAS's first call in the process
(one flushed sample), the guard's own verdict (a Dispatcher with the guard on, its cache off),
then ``--pairs`` interleaved flushed samples of the tuned kernel (a Dispatcher with the guard
off serves the exact entry), ``torch.matmul(a, b.t())`` (what the guard times) and
``F.linear(a, b)`` (what a model runs), and the operands' addresses modulo 1024 (cuBLAS may pick
its kernel by alignment). The parent prints, per shape, each process's guard ratio beside the
steady ratios, so a bimodal verdict shows whether cuBLAS itself is bimodal or the guard's timing.

    source benchmarks/device_setup.sh && python3 benchmarks/guard_probe_h200.py --table T.json

Writes $OUT/guard_probe_h200.json (else benchmarks/results/); prints a short table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

DEFAULT_SHAPES = "64x1024x4096,16x128256x4096,2048x4096x4096,2048x14336x4096"


def child(args: argparse.Namespace) -> dict:
    """One process's measurements (printed as one JSON line)."""
    import torch

    import tunefw
    from tunefw.evaluate import method

    torch.manual_seed(args.seed)
    guarded = tunefw.Dispatcher(args.table, cubin_dir=args.cubins, guard=True, guard_cache=False)
    plain = tunefw.Dispatcher(args.table, cubin_dir=args.cubins, guard=False)
    flush = method.L2Flush(50 * 2**20)
    sync = torch.cuda.synchronize
    rows = {}
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        cold = method.time_each([lambda: torch.matmul(a, b.t())], flush, sync)[0]
        guarded.plan_for(a, b)  # the first call: the guard times kernel and cuBLAS now
        plan = plain.plan_for(a, b)
        if plan is None:
            rows[shape] = {"error": "no kernel for the shape in the table", "cold_cublas_ms": cold}
            continue
        runs = {"kernel": lambda: plan(a, b, programmatic=False),
                "matmul": lambda: torch.matmul(a, b.t()),
                "linear": lambda: torch.nn.functional.linear(a, b)}
        times = method.time_each(list(runs.values()) * args.pairs, flush, sync)
        each = {name: times[i::len(runs)] for i, name in enumerate(runs)}
        med = {name: statistics.median(v) for name, v in each.items()}
        rows[shape] = {
            "guard": guarded.explain(m, n, k), "cold_cublas_ms": cold,
            "median_ms": med, "min_ms": {name: min(v) for name, v in each.items()},
            "ratio_matmul": med["matmul"] / med["kernel"],
            "ratio_linear": med["linear"] / med["kernel"],
            "address_mod_1024": {"a": a.data_ptr() % 1024, "b": b.data_ptr() % 1024}}
    return {"seed": args.seed, "shapes": rows}


def main() -> int:
    from gpu_result import (child_json, out_path, probe_child_command, report_header,
                            table_probe_parser, write)

    args = table_probe_parser(__doc__, DEFAULT_SHAPES, processes=6, pairs=40).parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    start = time.monotonic()
    result = {**report_header("benchmarks/guard_probe_h200.py", args.commit),
              "table": args.table, "pairs": args.pairs, "processes": []}
    base = probe_child_command(__file__, args)
    for p in range(args.processes):
        result["processes"].append(child_json(base + ["--seed", str(p)], {"seed": p}))
    result["wall_s"] = round(time.monotonic() - start, 1)
    write(result, out_path("guard_probe_h200.json", args.out))
    print(f"{'shape':>18} proc  guard verdict (first 60)                              "
          f"cold us  matmul/k linear/k  a%1024 b%1024")
    for proc in result["processes"]:
        for shape, r in proc.get("shapes", {}).items():
            if "guard" not in r:
                continue
            print(f"{shape:>18} {proc['seed']:4d}  {r['guard'].split(': ', 1)[-1][:52]:52s} "
                  f"{r['cold_cublas_ms'] * 1e3:7.1f} {r['ratio_matmul']:8.3f} {r['ratio_linear']:8.3f}"
                  f"  {r['address_mod_1024']['a']:6d} {r['address_mod_1024']['b']:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
