"""The compiled call path (tunefw/runtime/fastpath.cpp) on an H200: right, and cheaper on the host.

For every shape a table serves with a tuned kernel (its exact entries, plus ``--shapes``), with a
layer's input as a model gives it (2-D and 3-D): the compiled launch's C equals the Python
launch's bit for bit, on two launches and replayed from a CUDA graph captured through it; then
host microseconds per call, back to back without syncs, median of alternating repeats, of
F.linear (nn.Linear's call), tunefw.Linear on its compiled route, tunefw.Linear on its Python
path (TUNEFW_FASTPATH's effect, switched per layer) and Plan.__call__ both ways.

    source benchmarks/device_setup.sh && python3 benchmarks/fastpath_check_h200.py --table T.json

Writes $OUT/fastpath_check_h200.json (else benchmarks/results/); prints a short table last.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tunefw  # noqa: E402
from gpu_result import out_path, report_header, write  # noqa: E402
from tunefw.runtime import fastpath  # noqa: E402


def per_call_us(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) * 1e6 / calls


def host_table(paths: dict, calls: int, repeats: int) -> dict:
    """Median enqueue microseconds per call of each path, repeats alternating in order."""
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for fn in paths.values():
        per_call_us(fn, 20)  # warm
    for r in range(repeats):
        for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
            samples[name].append(per_call_us(paths[name], calls))
    return {name: round(statistics.median(v), 2) for name, v in samples.items()}


def check_shape(dispatcher, m: int, n: int, k: int, lead: tuple[int, ...], calls: int,
                repeats: int) -> dict:
    x = torch.randn(*lead, k, device="cuda", dtype=torch.bfloat16)
    layer = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=torch.bfloat16)
    mine = tunefw.Linear.from_linear(layer)
    row = {"shape": f"{m}x{n}x{k}", "input": [*lead, k], "route": dispatcher.explain(m, n, k)}
    plan = dispatcher.plan_for(x.reshape(-1, k), layer.weight)
    if plan is None or plan.fast is None:
        return {**row, "compiled": False, "why": "cuBLAS route" if plan is None else
                "the plan launches programmatically"}
    with torch.no_grad():
        args = (x, layer.weight) if len(lead) == 1 else (x, layer.weight, lead)
        fast = [plan(*args) for _ in range(2)]
        kept, plan.fast = plan.fast, None
        python = plan(*args)
        plan.fast = kept
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            plan(*args)  # warm on the capture stream
            with torch.cuda.graph(graph, stream=stream):
                captured = plan(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        for _ in range(3):
            mine(x)  # settles the layer's compiled route
        compiled_layer = len(mine._fast or ())
        python_layer = tunefw.Linear.from_linear(layer)
        # no routes learned (and plan.fast off for the call): TUNEFW_FASTPATH=0's path
        python_layer._remember = lambda dispatcher, x, plan: None
        reference = F.linear(x, layer.weight)
        times = host_table({
            "F.linear": lambda: F.linear(x, layer.weight),
            "tunefw.Linear compiled": lambda: mine(x),
            "tunefw.Linear python": lambda: _python_call(plan, (x,), python_layer),
            "Plan compiled": lambda: plan(*args),
            "Plan python": lambda: _python_call(plan, args),
        }, calls, repeats)
    err = ((fast[0].float() - reference.float()).norm() / reference.float().norm()).item()
    return {**row, "compiled": True, "cluster": list(plan.launch_geometry.cluster),
            "compiled_route_in_layer": compiled_layer == 1,
            "bitwise": {"second_launch": torch.equal(fast[0], fast[1]),
                        "python_launch": torch.equal(fast[0], python),
                        "graph_replay": torch.equal(fast[0], captured),
                        "layer": torch.equal(mine(x), fast[0])},
            "rel_err_vs_cublas": err, "host_us": times}


def _python_call(plan, args, fn=None):
    """``(fn or plan)(*args)`` with the plan's compiled launcher off for the call."""
    kept, plan.fast = plan.fast, None
    try:
        return (fn or plan)(*args)
    finally:
        plan.fast = kept


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True)
    ap.add_argument("--cubins", type=Path)
    ap.add_argument("--shapes", default="1x4096x4096,16x4096x4096,64x4096x4096,64x14336x4096,"
                                        "64x4096x14336,512x4096x4096,512x14336x4096",
                    help="MxNxK list checked besides the table's exact entries")
    ap.add_argument("--max-entries", type=int, default=12)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    start = time.monotonic()
    result = report_header("benchmarks/fastpath_check_h200.py", args.commit)
    t0 = time.monotonic()
    built = fastpath.module() is not None
    result["fastpath"] = {"built": built, "build_or_load_s": round(time.monotonic() - t0, 1)}
    dispatcher = tunefw.set_dispatch(args.table, cubin_dir=args.cubins)
    own = [(e.M, e.N, e.K) for e in dispatcher.table.entries
           if not e.is_cublas and e.dtype == "bf16"][: args.max_entries]
    extra = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s]
    rows = []
    for m, n, k in dict.fromkeys(own + extra):
        for lead in ((m,), (m, 1) if m <= 128 else (1, m)):
            rows.append(check_shape(dispatcher, m, n, k, lead, args.calls, args.repeats))
    compiled = [r for r in rows if r["compiled"]]
    result.update(rows=rows, summary={
        "shapes": len(rows), "compiled": len(compiled),
        "all_bitwise": all(all(r["bitwise"].values()) for r in compiled),
        "layer_not_dearer_than_f_linear": sum(r["host_us"]["tunefw.Linear compiled"]
                                             <= r["host_us"]["F.linear"] for r in compiled),
        "median_us": {name: statistics.median(r["host_us"][name] for r in compiled)
                      for name in (compiled[0]["host_us"] if compiled else {})}},
        wall_s=round(time.monotonic() - start, 1))
    write(result, out_path("fastpath_check_h200.json", args.out))
    print(f"{'shape':>16} {'input':>18} bitwise  F.linear  compiled  python  plan-c  plan-py")
    for r in compiled:
        h = r["host_us"]
        print(f"{r['shape']:>16} {str(r['input']):>18} {str(all(r['bitwise'].values())):>7} "
              f"{h['F.linear']:9.1f} {h['tunefw.Linear compiled']:9.1f} "
              f"{h['tunefw.Linear python']:7.1f} {h['Plan compiled']:7.1f} {h['Plan python']:8.1f}")
    print(result["summary"])


if __name__ == "__main__":
    main()
