"""Whether the first-call guard's one-pair verdicts on large shapes measure the kernel or host work.

In the dispatch acceptance runs at 15f6855 and c229d29 the guard measured 0.79-0.93x cuBLAS for
the tables' bucket and nearest kernels on shapes of 3000-8192 rows, whose single flushed pair
takes most of its ~3 ms budget, while calibration on both sides of those M had measured
1.00-1.03x; where a pair fits the budget several times its verdicts matched calibration. The
kernel's deficit was ~100-200 us a shape, about the same at every size: a fixed cost, not a rate.
Until this tree the guard timed ``plan(a, b)`` (a new C, and on first use of an address triple
its tensor maps built, between the timing's events) against ``torch.matmul(a, b.t())``.

Each of ``--processes`` fresh processes per variant, for each shape (the guard's donor kernel
given the shape as an exact entry of a derived table, so a guard-off Dispatcher builds and
verifies its plan as the guard's first call does): the first flushed pair timed as the guard
timed it before (variant ``call``) or as it does now (``prepared``: Plan.prepared and matmul into
a C allocated before), the host time of each call, then ``--pairs`` more flushed pairs of the
prepared launches (the steady ratio). Variant ``guard``: this tree's guard itself (original
table, guard on, cache off), its pair times and verdict.

    source benchmarks/device_setup.sh && python3 benchmarks/guard_first_pair_h200.py --table T.json

Writes $OUT/guard_first_pair_h200.json (else benchmarks/results/); prints a short table last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

# bucket / nearest shapes of the hf_llama3_8b table the guard sent to cuBLAS at c229d29, one pair
# each, and one (8192x4096x4096, 2-3 pairs) it judged near calibration
DEFAULT_SHAPES = ("3000x4096x14336,4097x4096x14336,8192x4096x14336,4097x14336x4096,"
                  "8192x14336x4096,3000x28672x4096,4096x3584x18944,8192x4096x4096")
VARIANTS = ("call", "prepared", "guard")


def timed_calls(launches: list, flush, sync) -> tuple[list[float], list[float]]:
    """method.time_each with each launch's host time (ms) recorded beside its GPU time."""
    from tunefw.evaluate import method

    host: list[float] = []

    def clocked(launch):
        def run():
            t0 = time.perf_counter()
            launch()
            host.append((time.perf_counter() - t0) * 1e3)
        return run

    return method.time_each([clocked(x) for x in launches], flush, sync), host


def child(args: argparse.Namespace) -> dict:
    """One process's measurements for one variant (printed as one JSON line)."""
    import torch

    import tunefw
    from tunefw.evaluate import method
    from tunefw.runtime import guard as guard_module

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush, sync = method.L2Flush(l2), torch.cuda.synchronize
    flush_ms = min(method.time_each([flush] * 3, None, sync))
    guard_pairs: list = []
    real = guard_module.cuda_timer(l2)

    def recording(kernel, cublas):
        times = real(kernel, cublas)
        guard_pairs.append(times)
        return times

    guarded = tunefw.Dispatcher(args.table, cubin_dir=args.cubins, guard=True, guard_cache=False,
                                guard_timer=recording)
    rows = {}
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        donor = guarded.route(m, n, k, "bf16").candidate
        if args.variant == "guard":
            guard_pairs.clear()
            guarded.plan_for(a, b)
            rows[shape] = {"guard": guarded.explain(m, n, k),
                           "pairs_ms": [list(p) for p in guard_pairs]}
            continue
        if donor is None:
            rows[shape] = {"error": "the table's rule names no kernel for the shape"}
            continue
        table = guarded.table
        derived = dataclasses.replace(table, entries=[*table.entries,
                                                      dataclasses.replace(donor, M=m, N=n, K=k)])
        plan = tunefw.Dispatcher(derived, cubin_dir=args.cubins, guard=False).plan_for(a, b)
        if plan is None:
            rows[shape] = {"error": "no plan for the derived exact entry"}
            continue
        c_ref = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        bt = b.t()
        prepared = [plan.prepared(a, b), lambda: torch.matmul(a, bt, out=c_ref)]
        first = ([lambda: plan(a, b, programmatic=False), lambda: torch.matmul(a, b.t())]
                 if args.variant == "call" else prepared)
        gpu, host = timed_calls(first, flush, sync)
        steady = method.time_each(prepared * args.pairs, flush, sync)
        kern, cub = steady[0::2], steady[1::2]
        rows[shape] = {"donor": f"{donor.M}x{donor.N}x{donor.K}", "family": donor.family,
                       "first_ms": gpu, "first_host_ms": host,
                       "first_ratio": gpu[1] / gpu[0],
                       "steady_ratio_median": statistics.median(cub) / statistics.median(kern),
                       "steady_ratio_min": min(cub) / min(kern),
                       "steady_median_ms": [statistics.median(kern), statistics.median(cub)]}
    return {"variant": args.variant, "seed": args.seed, "flush_ms": flush_ms, "shapes": rows}


def main() -> int:
    from gpu_result import (child_json, out_path, probe_child_command, report_header,
                            table_probe_parser, write)

    ap = table_probe_parser(__doc__, DEFAULT_SHAPES, processes=2, pairs=12)
    ap.add_argument("--variant", choices=VARIANTS, default="call", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return 0

    start = time.monotonic()
    result = {**report_header("benchmarks/guard_first_pair_h200.py", args.commit),
              "table": args.table, "pairs": args.pairs, "processes": []}
    base = probe_child_command(__file__, args)
    for p in range(args.processes):
        for variant in VARIANTS:
            result["processes"].append(child_json(base + ["--seed", str(p), "--variant", variant],
                                                  {"variant": variant, "seed": p}))
    result["wall_s"] = round(time.monotonic() - start, 1)
    write(result, out_path("guard_first_pair_h200.json", args.out))
    print(f"{'shape':>16} {'variant':>8} proc  first k/c ms        host k/c ms   first  steady")
    for proc in result["processes"]:
        for shape, r in proc.get("shapes", {}).items():
            if "first_ms" in r:
                print(f"{shape:>16} {proc['variant']:>8} {proc['seed']:4d}  "
                      f"{r['first_ms'][0]:7.3f} {r['first_ms'][1]:7.3f}  {r['first_host_ms'][0]:7.3f} "
                      f"{r['first_host_ms'][1]:7.3f}  {r['first_ratio']:.3f}  "
                      f"{r['steady_ratio_median']:.3f}")
            elif "guard" in r:
                print(f"{shape:>16} {'guard':>8} {proc['seed']:4d}  {r['guard'].split(': ', 2)[-1][:60]}")
            else:
                print(f"{shape:>16} {proc.get('variant', '?'):>8} {proc.get('seed', '?')}  {r}")
        if "error" in proc:
            print(f"process {proc.get('variant')} {proc.get('seed')}: {proc['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
