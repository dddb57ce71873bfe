"""Issue 14's acceptance on an H200: a dispatch table served through ``tunefw.gemm`` on shapes it
was not tuned on, never slower than cuBLAS, with the first-call guard on and with it off.

Shapes (benchmarks/dispatch_guard_plan.py ``plan_shapes``): for each layer (N, K) of the table,
the M of ``UNTUNED_M`` it was not tuned at (1 to 8192, odd M included; lm_head-sized layers only
up to ``WIDE_MAX_M``), plus ``OTHER_MODELS``' layers the table has no entry for (served by the
nearest rule); the verdict is that module's ``summarize``. Parts:

1. **guard on** (a fresh decision cache): per shape, the first call through ``tunefw.gemm``
   (its wall time and the guard's own timing, recorded by a wrapping timer), its output verified
   against a float32 reference, then the runtime timed against cuBLAS as ``tunefw bench`` does
   (tunefw/measure/bench.py: verified, L2 flushed, CUDA graphs under 20 us).
2. **guard off**, the table's rules and calibration evidence only (an unproven shape, with
   evidence on one side of its M only, is served by cuBLAS): a shape whose route differs from
   part 1's is timed again; one with the same route keeps part 1's timing (marked).
3. **exact**: every kernel entry on its own shape against the sweep's confirmed TFLOP/s.
4. **torch.compile** and **CUDA graph** correctness, the graph both on shapes seen before and
   on shapes first seen during capture (a fresh dispatcher: the table's rule, nothing timed).

    source benchmarks/device_setup.sh && python3 benchmarks/dispatch_guard_h200.py \\
        --table DISPATCH.json [--cubins DIR] --commit SHA

Writes $OUT/dispatch_guard_h200.json (else benchmarks/results/); prints a short table last.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from dispatch_guard_plan import plan_shapes, summarize  # noqa: E402
from tunefw.problem import GemmProblem  # noqa: E402
from tunefw.runtime.dispatch import DispatchTable, load  # noqa: E402

SCRIPT = "benchmarks/dispatch_guard_h200.py"

# ---- the GPU parts ----------------------------------------------------------------------------
class RecordingTimer:
    """The guard's timer, wrapped: the wall time of each decision and the pair it measured."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, []

    def __call__(self, kernel, cublas):
        start = time.perf_counter()
        kernel_ms, cublas_ms = self.inner(kernel, cublas)
        self.calls.append(((time.perf_counter() - start) * 1e3, kernel_ms + cublas_ms))
        return kernel_ms, cublas_ms


def _problem(s: dict) -> GemmProblem:
    return GemmProblem(s["M"], s["N"], s["K"], s["dtype"])


def _short(row: dict) -> dict:
    keep = ("M", "N", "K", "path", "entry", "family", "tflops", "cublas_tflops", "ratio", "wrong",
            "rel_err", "why", "graph_launches", "overhead_us")
    return {k: row.get(k) for k in keep}


def each(shapes: list[dict], measure, deadline: float | None = None) -> list[dict]:
    """``measure(i, shape)`` per shape: its row, the error it raised (a wrong result), or
    'skipped' once ``deadline`` (time.monotonic) has passed."""
    rows = []
    for i, s in enumerate(shapes):
        if deadline is not None and time.monotonic() > deadline:
            rows.append({**s, "skipped": "time budget"})
            continue
        try:
            rows.append(measure(i, s))
        except Exception as exc:  # a failing shape is a result; the others still run
            rows.append({**s, "wrong": True,
                         "error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"})
    return rows


def _inputs(s: dict, seed: int):
    """The shape's operands on the GPU, their float32 reference and cuBLAS's own answer."""
    import torch

    from tunefw.evaluate import method

    a, b = method.make_inputs(s["M"], s["N"], s["K"], s["dtype"], seed, device="cuda")
    return a, b, method.reference(a, b), torch.mm(a, b.t())


def _verify(c, ref, baseline, dtype: str) -> dict:
    from tunefw.evaluate import method

    verdict = method.verify(c, ref, dtype, baseline=baseline)
    return {"wrong": not verdict.ok, "rel_err": verdict.rel_err}


def guard_on(dispatcher, timer: RecordingTimer, shapes: list[dict], flush, deadline: float) -> list[dict]:
    """Part 1: each shape's first call through tunefw.gemm, then its timing against cuBLAS."""
    import torch

    import tunefw
    from tunefw.measure.bench import bench_entry

    tunefw.set_dispatch(dispatcher)

    def measure(i: int, s: dict) -> dict:
        a, b, ref, baseline = _inputs(s, 1000 + i)
        torch.cuda.synchronize()
        decisions = len(timer.calls)
        start = time.perf_counter()
        c = tunefw.gemm(a, b)  # the first call: builds the plan, and the guard times it
        torch.cuda.synchronize()
        first_ms = (time.perf_counter() - start) * 1e3
        guard = timer.calls[decisions] if len(timer.calls) > decisions else None
        first = _verify(c, ref, baseline, s["dtype"])
        route = dispatcher.route(s["M"], s["N"], s["K"], s["dtype"])
        row = _short(bench_entry(dispatcher, _problem(s), 1000 + i, flush, None))
        return {**s, **row, "wrong": row["wrong"] or first["wrong"], "first_call_ms": first_ms,
                "guard_ms": guard[0] if guard else None, "guard_pair_ms": guard[1] if guard else None,
                "rule": route.rule, "explain": dispatcher.explain(s["M"], s["N"], s["K"], s["dtype"])}

    return each(shapes, measure, deadline)


def guard_off(dispatcher, on_rows: list[dict], flush, deadline: float) -> list[dict]:
    """Part 2: the table's rules with calibration evidence, no guard; a shape on the same route
    as in part 1 keeps part 1's timing."""
    from tunefw.measure.bench import bench_entry

    def measure(i: int, prior: dict) -> dict:
        s = {k: prior[k] for k in ("M", "N", "K", "dtype", "kind", "label")}
        route = dispatcher.route(s["M"], s["N"], s["K"], s["dtype"])
        entry = None if route.entry is None else [route.entry.M, route.entry.N, route.entry.K]
        common = {**s, "path": route.path, "explain": dispatcher.explain(s["M"], s["N"], s["K"], s["dtype"])}
        if "ratio" in prior and entry == prior.get("entry"):
            return {**common, **{k: prior[k] for k in ("ratio", "tflops", "cublas_tflops", "wrong")},
                    "entry": entry, "same_route_as_guard_on": True}
        return {**common, **_short(bench_entry(dispatcher, _problem(s), 2000 + i, flush, None)),
                "same_route_as_guard_on": False}

    return each(on_rows, measure, deadline)


def exact_rows(dispatcher, table: DispatchTable, flush, deadline: float) -> list[dict]:
    """Part 3: each kernel entry on its own shape against its sweep confirmation: its ratio to
    cuBLAS now over the confirmed ratio (``ratio_to_confirmed``; clocks change between runs and
    machines, cuBLAS in the same run cancels them), and the raw TFLOP/s over the confirmed."""
    from tunefw.measure.bench import bench_entry

    def measure(i: int, s: dict) -> dict:
        row = _short(bench_entry(dispatcher, _problem(s), 3000 + i, flush, None))
        if row.get("ratio") is None or row.get("tflops") is None:
            return {**s, **row}
        return {**s, **row, "ratio_to_confirmed": row["ratio"] / s["confirmed_ratio"]
                if s["confirmed_ratio"] else None,
                "tflops_to_confirmed": row["tflops"] / s["confirmed_tflops"]
                if s["confirmed_tflops"] else None}

    shapes = [{"M": e.M, "N": e.N, "K": e.K, "dtype": e.dtype, "label": e.label,
               "confirmed_tflops": e.tflops, "confirmed_ratio": e.ratio}
              for e in table.entries if not e.is_cublas]
    return each(shapes, measure, deadline)


def compiled_rows(shapes: list[dict]) -> list[dict]:
    """Part 4a: tunefw.gemm inside torch.compile (dynamic shapes), verified per shape."""
    import torch

    import tunefw

    fn = torch.compile(lambda a, b: tunefw.gemm(a, b), dynamic=True, fullgraph=True)

    def measure(i: int, s: dict) -> dict:
        a, b, ref, baseline = _inputs(s, 4000 + i)
        return {**s, **_verify(fn(a, b), ref, baseline, s["dtype"])}

    return each(shapes, measure)


def graph_rows(dispatcher, shapes: list[dict], first_seen: bool) -> list[dict]:
    """Part 4b: tunefw.gemm captured in a CUDA graph and replayed; ``first_seen``: the shapes'
    first calls happen during the capture (``dispatcher`` has never seen them)."""
    import torch

    import tunefw

    tunefw.set_dispatch(dispatcher)

    def measure(i: int, s: dict) -> dict:
        a, b, ref, baseline = _inputs(s, 5000 + i)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            c = tunefw.gemm(a, b)
        c.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        return {**s, "first_seen_in_capture": first_seen, **_verify(c, ref, baseline, s["dtype"]),
                "explain": dispatcher.explain(s["M"], s["N"], s["K"], s["dtype"])}

    return each(shapes, measure)


def _env(commit: str | None) -> dict:
    import torch

    from gpu_result import smi
    from hf_llama_h200 import git_commit
    from tunefw.runtime.dispatcher import live_spec

    spec = live_spec(0)
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "commit": commit or git_commit(), "gpu": spec.name, "cc": spec.cc,
            "torch": torch.__version__, "cuda": torch.version.cuda, "nvidia_smi": smi()}


def run(table_path: Path, cubins: Path | None, commit: str | None, budget_s: float) -> dict:
    """Every part, within about ``budget_s`` (parts past it record their shapes as skipped)."""
    import torch

    from tunefw.evaluate import method
    from tunefw.runtime.dispatcher import Dispatcher, live_spec
    from tunefw.runtime.guard import cuda_timer

    deadline = time.monotonic() + budget_s
    table = load(table_path)
    shapes = plan_shapes(table)
    l2 = live_spec(0).l2_bytes
    flush = method.L2Flush(l2)
    torch.mm(torch.ones(8, 8, device="cuda"), torch.ones(8, 8, device="cuda"))  # cuBLAS set up
    result = {"script": SCRIPT, "env": _env(commit), "table": str(table_path),
              "cubins": str(cubins or ""), "shapes": len(shapes)}
    with tempfile.TemporaryDirectory() as tmp:
        timer = RecordingTimer(cuda_timer(l2))
        # the timed comparisons launch plainly, as the sweeps and the guard time (a flush before
        # each launch: runtime/plan.py); `fresh` serves the graphs as a user's runtime does
        on = Dispatcher(table, cubin_dir=cubins, guard=True, guard_timer=timer,
                        guard_cache=Path(tmp) / "guard.json", programmatic=False)
        result["guard_on"] = guard_on(on, timer, shapes, flush, deadline - 0.45 * budget_s)
        off = Dispatcher(table, cubin_dir=cubins, guard=False, programmatic=False)
        result["guard_off"] = guard_off(off, result["guard_on"], flush, deadline - 0.3 * budget_s)
        result["exact"] = exact_rows(off, table, flush, deadline - 0.15 * budget_s)
        few = shapes[:: max(1, len(shapes) // 6)][:6]
        result["compile"] = compiled_rows(few)
        fresh = Dispatcher(table, cubin_dir=cubins, guard=True, guard_cache=Path(tmp) / "fresh.json")
        result["programmatic_launches"] = {"timed": on.programmatic, "graphs_first_seen_in_capture":
                                           fresh.programmatic}
        result["graph"] = graph_rows(on, few, False) + graph_rows(fresh, few, True)
    result["summary"] = summarize(result)
    return result


def print_table(result: dict) -> None:
    print(f"\n{result['table']}: {result['shapes']} untuned shapes on {result['env'].get('gpu')}")
    print(f"{'shape':>18} {'kind':>11} {'guard on':>18} {'ratio':>6} {'guard ms':>8} "
          f"{'guard off':>10} {'ratio':>6}")
    for on, off in zip(result["guard_on"], result["guard_off"]):
        fmt = lambda r, k, f: format(r[k], f) if r.get(k) is not None else "-"  # noqa: E731
        print(f"{on['M']:>6}x{on['N']}x{on['K']:<6} {on['kind']:>11} {str(on.get('path', '-')):>18} "
              f"{fmt(on, 'ratio', '6.3f')} {fmt(on, 'guard_ms', '8.2f')} "
              f"{str(off.get('path', '-')):>10} {fmt(off, 'ratio', '6.3f')}")
    for name, point in result["summary"].items():
        if name != "all":
            print(f"  {name:24s} {'PASS' if point['ok'] else 'FAIL'}  "
                  + ", ".join(f"{k}={v}" for k, v in point.items() if k != "ok" and v not in ([], {})))
    print(f"acceptance: {'PASS' if result['summary']['all'] else 'FAIL'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True, help="dispatch.json (a calibrated one)")
    ap.add_argument("--cubins", type=Path, help="shipped cubin directory for the table")
    ap.add_argument("--budget-s", type=float, default=240.0, help="wall-time budget of the parts")
    ap.add_argument("--commit", help="the commit measured (the device tree has no .git)")
    ap.add_argument("--out", type=Path, help="result file (default: $OUT or benchmarks/results)")
    ap.add_argument("--plan", action="store_true", help="print the shapes and stop (no GPU)")
    args = ap.parse_args(argv)
    if args.plan:
        for s in plan_shapes(load(args.table)):
            print(f"{s['M']}x{s['N']}x{s['K']} {s['dtype']}  # {s['kind']}: {s['label']}")
        return 0
    from gpu_result import out_path

    out = out_path("dispatch_guard_h200.json", args.out)
    result = run(args.table, args.cubins, args.commit, args.budget_s)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {out}")
    print_table(result)
    return 0 if result["summary"]["all"] else 1


if __name__ == "__main__":
    sys.exit(main())
