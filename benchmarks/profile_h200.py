"""Hardware counters of each dispatch-table kernel beside the cuBLAS kernel of the same shape.

Why: the sweeps say where tunefw loses to cuBLAS, not why. Under Nsight Compute (run it with
--clock-control none: the clocks stay the GPU's own) this runs, per table entry, the tuned
kernel and then torch.mm (cuBLAS) a few times each, so that ncu can report both kernels' time,
DRAM and L2 bytes and throughputs, and the name of the kernel cuBLAS chose (its name encodes
its tile, stages and cluster shape). The script itself only launches; ncu writes the report.

    ncu --clock-control none --csv --page raw --metrics <list> -k regex:. \
        python3 benchmarks/profile_h200.py --table benchmarks/results/dispatch_wgmma_sm90_r3_h200.json
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True, help="a dispatch.json")
    ap.add_argument("--shapes", default="", help="MxNxK,... (default: every entry >= --min-gflop)")
    ap.add_argument("--min-gflop", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=2, help="launches of each kernel per shape")
    args = ap.parse_args()

    import torch

    from tunefw.dispatch import load
    from tunefw.evaluate import method
    from tunefw.runtime import Dispatcher

    table = load(args.table)
    dispatcher = Dispatcher(table)
    wanted = {tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",") if s}
    for i, e in enumerate(table.entries):
        if wanted and (e.M, e.N, e.K) not in wanted:
            continue
        if not wanted and 2.0 * e.M * e.N * e.K < args.min_gflop * 1e9:
            continue
        a, b = method.make_inputs(e.M, e.N, e.K, e.dtype, i, device="cuda")
        plan = dispatcher.plan_for(a, b)
        if plan is None:
            print(f"{e.M}x{e.N}x{e.K}: no kernel ({dispatcher.explain(e.M, e.N, e.K)})")
            continue
        c = torch.empty(e.M, e.N, dtype=a.dtype, device="cuda")
        c_ref = torch.empty_like(c)
        params = plan.args(a.data_ptr(), b.data_ptr(), c.data_ptr())
        stream = torch.cuda.current_stream().cuda_stream
        torch.cuda.nvtx.range_push(f"{e.M}x{e.N}x{e.K}")
        for _ in range(args.repeats):
            plan.launch(params, stream)
        for _ in range(args.repeats):
            torch.mm(a, b.t(), out=c_ref)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        err = float((c.float() - c_ref.float()).norm() / c_ref.float().norm())
        print(f"{e.M}x{e.N}x{e.K}: {plan.entry.config} rel diff vs cuBLAS {err:.2e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
