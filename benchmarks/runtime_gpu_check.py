"""GPU check of the runtime (issue 6): tunefw.gemm / the tunefw::gemm op / tunefw.Linear are
correct for every dispatch entry and for 20 shapes outside the table (nearest or cuBLAS paths),
eagerly, inside torch.compile and replayed from a captured CUDA graph; plus first use from
several threads at once, and the per-call host overhead over the raw launch.

    PYTHONPATH=. python benchmarks/runtime_gpu_check.py [dispatch.json] [--bench]

Without a dispatch.json it builds a small table for this GPU from known-good configs (the
default config of wgmma_sm90 and of mma_sm80, trial_id 0). ``--bench`` also runs `tunefw bench`
on the table (tunefw vs cuBLAS vs Triton) into bench_h200.json / bench_h200.html.
Writes $OUT/runtime_h200.json (else benchmarks/results/). About two minutes on an H200.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import gpu_result  # noqa: E402
import torch  # noqa: E402

import tunefw  # noqa: E402
from tunefw.runtime import ops  # noqa: E402
from tunefw.measure.bench import host_us, overhead_us, run_bench, verify_raw  # noqa: E402
from tunefw.runtime.plan import current_stream  # noqa: E402
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, load  # noqa: E402
from tunefw.errors import UserError  # noqa: E402
from tunefw.evaluate import method  # noqa: E402
from tunefw.report import bench_html  # noqa: E402
from tunefw.templates import FAMILIES  # noqa: E402

WG, MMA = FAMILIES["wgmma_sm90"], FAMILIES["mma_sm80"]
GENERATED = [  # (M, N, K, dtype, family, config changes)
    (4096, 4096, 4096, "bf16", WG, {}),
    (2048, 6144, 4096, "bf16", WG, {}),
    (512, 4096, 14336, "bf16", WG, {}),
    (4096, 4096, 4096, "fp16", WG, {}),
    (128, 6144, 4096, "bf16", MMA, {}),
    (1024, 1024, 1024, "bf16", MMA, {}),
    (64, 2048, 8192, "bf16", MMA, {"SPLIT_K": 2}),  # the split-K workspace path
]
OFF_TABLE = [  # 20 shapes not in the generated table: nearest entries, cuBLAS, odd sizes
    (4000, 4096, 4096, "bf16"), (3000, 4096, 4096, "bf16"), (8192, 8192, 8192, "bf16"),
    (4095, 4104, 4104, "bf16"), (1000, 6144, 4096, "bf16"), (100, 6144, 4096, "bf16"),
    (1, 4096, 4096, "bf16"), (17, 24, 40, "bf16"), (129, 136, 264, "bf16"), (300, 1000, 520, "bf16"),
    (2048, 2048, 2048, "fp16"), (777, 4096, 4096, "fp16"), (16, 4096, 14336, "bf16"),
    (2048, 14336, 4096, "bf16"), (96, 2048, 8192, "bf16"), (1536, 1536, 1536, "bf16"),
    (64, 100, 64, "bf16"),  # N not a multiple of 8: cuBLAS
    (256, 256, 256, "fp32"),  # other dtype: cuBLAS
    (512, 512, 512, "bf16-noncontig"),  # a is a transposed view: cuBLAS
    (33, 4096, 4096, "bf16"),
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def generated_table() -> DispatchTable:
    """Known-good configs at a few shapes, fingerprinted as this GPU."""
    major, minor = torch.cuda.get_device_capability(0)
    fingerprint = {"name": torch.cuda.get_device_name(0), "cc": major * 10 + minor}
    entries = [DispatchEntry(M, N, K, dtype, "TN", fam.family, {**fam.default_config(), **changes},
                             0.0, None, 0) for M, N, K, dtype, fam, changes in GENERATED]
    return DispatchTable(False, fingerprint, entries)


def operands(M: int, N: int, K: int, kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random operands; 'bf16-noncontig' gives a transposed (non-contiguous) a."""
    if kind == "fp32":
        gen = torch.Generator(device="cuda").manual_seed(seed)
        return (torch.randn(M, K, device="cuda", generator=gen),
                torch.randn(N, K, device="cuda", generator=gen))
    dtype = kind.split("-")[0]
    a, b = method.make_inputs(M, N, K, dtype, seed, device="cuda")
    if kind.endswith("noncontig"):
        a = a.t().contiguous().t()
    return a, b


def judge(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, baseline: torch.Tensor) -> dict:
    """method.verify against the float32 reference (float32 inputs: a loose fixed bound)."""
    ref = method.reference(a, b)
    if a.dtype == torch.float32:
        err = method.frobenius_error(out, ref)
        return {"ok": bool(torch.isfinite(out).all()) and err < 1e-3, "rel_err": err}
    verdict = method.verify(out, ref, "bf16" if a.dtype == torch.bfloat16 else "fp16", baseline=baseline)
    return {"ok": verdict.ok, "rel_err": verdict.rel_err, "why": verdict.reason or None}


def check_shape(dispatcher, compiled, M: int, N: int, K: int, kind: str, seed: int,
                in_table: bool) -> dict:
    """Eager op, raw kernel (NaN-poisoned), torch.compile, CUDA graph (twice, new inputs), overhead."""
    a, b = operands(M, N, K, kind, seed)
    baseline = torch.matmul(a, b.t())
    modes = {"eager": judge(tunefw.gemm(a, b), a, b, baseline)}
    route = dispatcher.route_for(a, b)
    if route.entry is not None:
        plan = dispatcher.plan_for(a, b)
        dtype = "bf16" if a.dtype == torch.bfloat16 else "fp16"
        verdict = verify_raw(plan, a, b, method.reference(a, b), dtype, baseline)
        modes["raw_nan_poisoned"] = {"ok": verdict.ok, "rel_err": verdict.rel_err,
                                     "why": verdict.reason or None}
    modes["compiled"] = judge(compiled(a, b), a, b, baseline)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = tunefw.gemm(a, b)
    static_out.fill_(float("nan"))
    graph.replay()
    modes["graph"] = judge(static_out, a, b, baseline)
    a2, _ = operands(M, N, K, kind, seed + 1000)
    a.copy_(a2)
    static_out.fill_(float("nan"))
    graph.replay()
    modes["graph_new_inputs"] = judge(static_out, a, b, torch.matmul(a, b.t()))
    torch.cuda.synchronize()
    return {"M": M, "N": N, "K": K, "dtype": kind, "in_table": in_table, "path": route.path,
            "family": route.entry.family if route.entry else "cublas",
            "entry": [route.entry.M, route.entry.N, route.entry.K] if route.entry else None,
            "config": route.entry.config if route.entry else None, "why": route.reason, "modes": modes,
            "wrong": not all(m["ok"] for m in modes.values()),
            "overhead_us": overhead_us(dispatcher, a, b)}


def overhead_breakdown(dispatcher, M: int, N: int, K: int) -> dict:
    """Host microseconds of each step of Dispatcher.gemm's hot path (least of 15 bursts), so an
    overhead over budget says where it goes."""
    a, b = method.make_inputs(M, N, K, "bf16", 5, device="cuda")
    plan = dispatcher.plan_for(a, b)
    c = a.new_empty(plan.out_shape)
    params, stream = plan.args(a.data_ptr(), b.data_ptr(), c.data_ptr()), current_stream(0)
    key = (a.shape, b.shape, a.dtype, b.dtype, a.get_device(), b.get_device())
    steps = {
        "key": lambda: (a.shape, b.shape, a.dtype, b.dtype, a.get_device(), b.get_device()),
        "plan_lookup": lambda: dispatcher._plans.get(key, False),
        "operand_checks": lambda: ((a.data_ptr() | b.data_ptr()) % 16, a.is_contiguous(),
                                   b.is_contiguous()),
        "alloc_c": lambda: torch.empty(M, N, dtype=a.dtype, device=a.device),
        "alloc_c_new_empty": lambda: a.new_empty(plan.out_shape),
        "args_lookup": lambda: plan._args.get((a.data_ptr(), b.data_ptr(), c.data_ptr())),
        "current_stream": lambda: current_stream(0),
        "raw_launch": lambda: plan.launch(params, stream),
        "gemm": lambda: dispatcher.gemm(a, b),
        "torch_mm_out": lambda: torch.mm(a, b.t(), out=c),
    }
    result = {name: min(host_us(fn) for _ in range(15)) for name, fn in steps.items()}
    torch.cuda.synchronize()
    return {"shape": [M, N, K], "us": result}


def check_threads(dispatcher) -> dict:
    """Four threads make first use of four new shapes at once (plan build under the lock)."""
    shapes = [(1200 + 8 * i, 4096, 4096) for i in range(4)]

    def one(shape):
        a, b = method.make_inputs(*shape, "bf16", 7, device="cuda")
        out = dispatcher.gemm(a, b)
        torch.cuda.synchronize()
        return judge(out, a, b, torch.matmul(a, b.t()))["ok"]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, shapes))
    return {"shapes": shapes, "ok": all(results)}


def check_linear() -> dict:
    """tunefw.Linear against nn.Linear on a 3-D input, eager and compiled."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(4096, 6144, device="cuda", dtype=torch.bfloat16)
    mine = tunefw.Linear.from_linear(ref)
    x = torch.randn(2, 64, 4096, device="cuda", dtype=torch.bfloat16)
    want = ref(x).float()
    got = {"eager": mine(x), "compiled": torch.compile(mine, fullgraph=True)(x)}
    errs = {k: method.frobenius_error(v.reshape(-1, 6144), want.reshape(-1, 6144)) for k, v in got.items()}
    return {"rel_err": errs, "ok": all(e < 2e-2 for e in errs.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("table", nargs="?", help="dispatch.json (default: a generated table)")
    parser.add_argument("--bench", action="store_true", help="also run tunefw bench on the table")
    args = parser.parse_args()
    started = time.time()
    table = load(args.table) if args.table else generated_table()
    dispatcher = ops.set_dispatch(table)
    compiled = torch.compile(lambda a, b: tunefw.gemm(a, b), fullgraph=True, dynamic=True)
    in_table = {(e.M, e.N, e.K, e.dtype) for e in table.entries}
    rows = [check_shape(dispatcher, compiled, e.M, e.N, e.K, e.dtype, i, True)
            for i, e in enumerate(table.entries)]
    rows += [check_shape(dispatcher, compiled, M, N, K, kind, 100 + i, (M, N, K, kind) in in_table)
             for i, (M, N, K, kind) in enumerate(OFF_TABLE)]
    for r in rows:
        print(f"{r['M']}x{r['N']}x{r['K']} {r['dtype']:>14} {r['path']:>7} {r['family']:>10} "
              f"wrong={r['wrong']} overhead={r['overhead_us']:.2f}us", flush=True)
    result = {
        "script": "benchmarks/runtime_gpu_check.py", "date": datetime.date.today().isoformat(), "commit": gpu_result.commit(),
        "device": device_info(), "table": args.table or "generated (default configs, trial_id 0)",
        "rows": rows, "threads": check_threads(dispatcher), "linear": check_linear(),
        "all_correct": not any(r["wrong"] for r in rows),
        "max_overhead_us_kernel_paths": max((r["overhead_us"] for r in rows if r["path"] != "cublas"),
                                            default=None),
        "paths": {p: sum(r["path"] == p for r in rows) for p in ("exact", "nearest", "cublas")},
        "overhead_breakdown": next((overhead_breakdown(dispatcher, r["M"], r["N"], r["K"]) for r in rows
                                    if r["path"] != "cublas" and r["dtype"] == "bf16"), None),
    }
    out_dir = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    result["wall_s"] = time.time() - started
    (out_dir / "runtime_h200.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.bench:
        bench = run_bench(table, ("cublas", "triton"))
        (out_dir / "bench_h200.json").write_text(json.dumps(bench, indent=2) + "\n")
        print(json.dumps({"bench_geomean": bench["geomean"],
                          "bench_max_overhead_us": bench["max_overhead_us"]}), flush=True)
        try:
            (out_dir / "bench_h200.html").write_text(bench_html(bench))
        except UserError as exc:  # matplotlib missing: the JSON is the result
            print(f"no HTML: {exc}")
    print(json.dumps({k: result[k] for k in ("all_correct", "max_overhead_us_kernel_paths", "paths",
                                             "threads", "linear", "overhead_breakdown", "wall_s")}, indent=1, default=str))


def device_info() -> dict:
    """The design.md device block (via the CUDA evaluator's fingerprint)."""
    from tunefw.evaluate.cuda import CudaEvaluator
    fp = CudaEvaluator(0).fingerprint()
    return {k: fp.get(k) for k in ("name", "uuid", "driver", "cuda", "compiler", "sm_clock_mhz",
                                   "power_limit_w", "cc", "sm_count")}


if __name__ == "__main__":
    main()
