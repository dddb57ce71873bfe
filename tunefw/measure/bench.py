"""`tunefw bench`: the runtime path (Dispatcher.gemm) vs cuBLAS vs Triton, for every table entry.

One process, the design.md method (tunefw.evaluate.method): verified against a float32
reference before timing (output NaN-poisoned, cuBLAS's own error as the second bound), then
screened with CUDA events, the L2 flushed between launches, each path interleaved with cuBLAS
(F.linear, as nn.Linear calls it); kernels under 0.1 ms are timed as CUDA graphs of repeated
launches, each path the same way. ``overhead_us`` is the host time
of one ``Dispatcher.gemm`` call minus that of the raw launch it wraps (cuLaunchKernel with a
prepared argument buffer; for the cuBLAS path, torch.mm into a preallocated output). A gated
entry is benched through ``Dispatcher.gated`` against the stock form (one cuBLAS GEMM over
[Bg; Bu], then SiLU and the product: method.stock), with no Triton path.
"""
from __future__ import annotations

import datetime
import gc
import math
import statistics
import time
from typing import Callable

import torch

from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.evaluate import method
from tunefw.problem import GemmProblem
from tunefw.measure.roofline import figures, roofline, stream_read_tbs
from tunefw.runtime.dispatch import DispatchTable
from tunefw.runtime.dispatcher import Dispatcher, out_cols, stock_gated
from tunefw.runtime.plan import current_stream

AGAINST = ("cublas", "triton")
HOST_CALLS = 40  # calls per host-time burst
HOST_SAMPLES = 25  # bursts of each path, alternating


def triton_matmul() -> Callable | None:
    """triton_ref.matmul when triton imports, else None."""
    try:
        from tunefw.measure.triton_ref import matmul
    except ImportError:
        return None
    return matmul


def host_us(call: Callable[[], object], calls: int = HOST_CALLS) -> float:
    """Host microseconds per call over one burst of ``calls`` (the GPU is drained first)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls * 1e6


def host_overhead_us(call: Callable[[], object], raw: Callable[[], object],
                     samples: int = HOST_SAMPLES) -> float:
    """Least host time per ``call`` minus least per ``raw``, bursts alternating so clock or load
    drift hits both alike; the garbage collector is paused so it lands in neither."""
    host_us(call, calls=10)  # warm
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        pairs = [(host_us(raw), host_us(call)) for _ in range(samples)]
    finally:
        if was_enabled:
            gc.enable()
        torch.cuda.synchronize()
    return min(c for _, c in pairs) - min(r for r, _ in pairs)


def _tflops(problem: GemmProblem, ms: float) -> float:
    return problem.flops / (ms * 1e-3) / 1e12


def time_paths(paths: dict[str, Callable[[], object]], cublas: Callable[[], object],
               flush: method.L2Flush,
               rotations: Callable[[], dict[str, list[Callable[[], object]]]] | None = None
               ) -> dict[str, tuple[method.Timing, method.Timing]]:
    """Each path screened interleaved with cuBLAS (A B A B ..., each launch flushed: the sweep's
    anchored screen), so the two share one clock and their ratio holds while it drifts; if the
    fastest runs under GRAPH_BELOW_MS, again as CUDA graphs, each cycling over ``rotations()``'s
    operand copies ('cublas' among them). Per path: (its timing, cuBLAS's beside it)."""
    wait = torch.cuda.synchronize
    timings = {name: method.anchored_screen(fn, cublas, flush, wait) for name, fn in paths.items()}
    fastest = min(min(t.median_ms, c.median_ms) for t, c in timings.values())
    if fastest >= method.GRAPH_BELOW_MS:
        return timings
    repeats = method.graph_repeats(fastest)
    cycled = rotations() if rotations else {**{name: [fn] for name, fn in paths.items()},
                                             "cublas": [cublas]}
    anchor = method.capture_graph(cycled["cublas"], repeats)
    return {name: method.anchored_screen(method.capture_graph(cycled[name], repeats), anchor,
                                         flush, wait, launches_per_sample=repeats)
            for name in paths}


def verify_raw(plan, a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, dtype: str,
               baseline: torch.Tensor) -> method.Verdict:
    """The plan's kernel into a NaN-filled output, judged by method.verify."""
    c = torch.full(plan.out_shape, float("nan"), dtype=a.dtype, device=a.device)
    plan.launch(plan.args(a.data_ptr(), b.data_ptr(), c.data_ptr()), current_stream(a.device.index))
    torch.cuda.synchronize()
    return method.verify(c, ref, dtype, baseline=baseline)


def _paths(dispatcher: Dispatcher, gate: str) -> tuple[Callable, Callable]:
    """(tunefw's call, the stock call) of (a, b) for a problem of ``gate``."""
    if gate == "none":
        return dispatcher.gemm, torch.nn.functional.linear  # cuBLAS as nn.Linear calls it
    return (lambda x, y: dispatcher.gated(x, y, gate)), (lambda x, y: stock_gated(x, y, gate))


def overhead_us(dispatcher: Dispatcher, a: torch.Tensor, b: torch.Tensor, gate: str = "none") -> float:
    """Host time of dispatcher.gemm(a, b) (gated: .gated) minus that of its raw launch, in
    microseconds."""
    plan = dispatcher.plan_for(a, b, gate)
    if plan is None:
        scratch = torch.empty(a.shape[0], out_cols(b, gate), dtype=a.dtype, device=a.device)
        raw = lambda: method.stock(a, b, gate, scratch)  # noqa: E731
    else:
        c = a.new_empty(plan.out_shape)
        params = plan.args(a.data_ptr(), b.data_ptr(), c.data_ptr())
        stream = current_stream(a.device.index)
        raw = lambda: plan.launch(params, stream)  # noqa: E731
    serve = _paths(dispatcher, gate)[0]
    return host_overhead_us(lambda: serve(a, b), raw)


def bench_entry(dispatcher: Dispatcher, problem: GemmProblem, seed: int, flush: method.L2Flush,
                triton: Callable | None) -> dict:
    """One row: correctness of each path, then TFLOP/s of each, and the runtime's overhead."""
    gate = problem.gate
    a, b = method.make_inputs(problem.M, problem.weight_rows, problem.K, problem.dtype, seed,
                              device="cuda")
    ref = method.reference(a, b, gate)
    cublas_out = torch.empty(problem.M, problem.N, dtype=a.dtype, device=a.device)
    method.stock(a, b, gate, cublas_out)
    serve, linear = _paths(dispatcher, gate)  # the stock call makes a fresh output, like serve
    out = serve(a, b)  # builds the plan (compile or load) outside any timing
    route = (dispatcher.route_for(a, b) if gate == "none" else
             dispatcher.route(problem.M, problem.N, problem.K, a.dtype, a.get_device(), gate))
    verdict = method.verify(out, ref, problem.dtype, baseline=cublas_out)
    plan = dispatcher.plan_for(a, b, gate)
    if plan is not None and verdict.ok:
        verdict = verify_raw(plan, a, b, ref, problem.dtype, cublas_out)
    triton = triton if gate == "none" else None  # Triton's matmul has no gated epilogue
    paths = {"tunefw": lambda: serve(a, b)}
    row: dict = {"family": route.entry.family if route.entry else "cublas", "dtype": problem.dtype,
                 "M": problem.M, "N": problem.N, "K": problem.K, "gate": gate,
                 "config": route.entry.config if route.entry else None, "path": route.path,
                 "entry": None if route.entry is None else [route.entry.M, route.entry.N, route.entry.K],
                 "wrong": not verdict.ok, "rel_err": verdict.rel_err, "why": verdict.reason or None,
                 "configs_checked": 1, "triton_tflops": None, "triton_ratio": None,
                 "triton_wrong": None}
    if triton is not None:
        t_out = torch.empty_like(cublas_out)
        triton(a, b, t_out)  # autotunes this shape
        t_out.fill_(float("nan"))
        triton(a, b, t_out)
        row["triton_wrong"] = not method.verify(t_out, ref, problem.dtype, baseline=cublas_out).ok
        paths["triton"] = lambda: triton(a, b, t_out)
    def rotations() -> dict[str, list[Callable[[], object]]]:
        """Every path over the same operand copies (A and B cloned; the first set is a, b)."""
        per_copy = (a.numel() + b.numel()) * a.element_size()
        sets = [(a, b)] + [(a.clone(), b.clone())
                           for _ in range(method.rotation_copies(per_copy, flush.l2_bytes) - 1)]
        cycled = {"tunefw": [lambda x=x, y=y: serve(x, y) for x, y in sets],
                  "cublas": [lambda x=x, y=y: linear(x, y) for x, y in sets]}
        if "triton" in paths:
            cycled["triton"] = [lambda x=x, y=y: triton(x, y, t_out) for x, y in sets]
        return cycled

    timings = time_paths(paths, lambda: linear(a, b), flush, rotations)
    mine, beside = timings["tunefw"]
    row["tflops"] = _tflops(problem, mine.median_ms)
    row["cublas_tflops"] = _tflops(problem, beside.median_ms)
    row["ratio"] = row["tflops"] / row["cublas_tflops"]
    row["graph_launches"] = mine.launches_per_sample
    if "triton" in timings:
        theirs, beside_theirs = timings["triton"]
        row["triton_tflops"] = _tflops(problem, theirs.median_ms)
        # tunefw over Triton through the cuBLAS each was timed beside (one clock per pair)
        row["triton_ratio"] = row["ratio"] * theirs.median_ms / beside_theirs.median_ms
    row["overhead_us"] = overhead_us(dispatcher, a, b, gate)
    return row


def add_roofline(row: dict, read_tbs: float, device: DeviceSpec) -> dict:
    """Bytes, effective TB/s (tunefw and cuBLAS), their share of the measured read and the
    ceiling that bounds the shape on ``device``."""
    problem = GemmProblem(row["M"], row["N"], row["K"], row["dtype"], gate=row.get("gate", "none"))
    mine, theirs = figures(problem, row["tflops"], read_tbs), figures(problem, row["cublas_tflops"], read_tbs)
    row.update(mine, cublas_tbs=theirs["tbs"], cublas_frac_of_read=theirs["frac_of_read"],
               bound=roofline(problem, device).bound)
    return row


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v]
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else None


def parse_against(text: str) -> tuple[str, ...]:
    """'cublas,triton' -> the baselines asked for (cuBLAS is always timed: ratios need it)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in AGAINST]
    if unknown:
        raise UserError(f"--against {text!r}: expected a comma list of {', '.join(AGAINST)}")
    return names


def run_bench(table: DispatchTable, against: tuple[str, ...], *, cubin_dir=None, cache_dir=None,
              progress: Callable[[dict], None] | None = None) -> dict:
    """Bench every entry of the table on cuda:0; returns the result-file dict."""
    if not torch.cuda.is_available():
        raise UserError("tunefw bench needs a CUDA GPU (none is visible)")
    from tunefw.evaluate.cuda import CudaEvaluator

    evaluator = CudaEvaluator(0)  # the device fingerprint (NVML clocks, power) and float32 reference
    # kernel against cuBLAS after L2 flushes: plain launches, as the sweeps timed (runtime/plan.py)
    dispatcher = Dispatcher(table, cubin_dir=cubin_dir, cache_dir=cache_dir, programmatic=False)
    triton = triton_matmul() if "triton" in against else None
    flush = method.L2Flush(evaluator.device_spec().l2_bytes)
    bandwidth = stream_read_tbs()  # what memory-bound rows are read against, this run
    rows = []
    for seed, entry in enumerate(table.entries):
        row = add_roofline(bench_entry(dispatcher, entry.problem, seed, flush, triton),
                           bandwidth["read_tbs_best"], evaluator.device_spec())
        rows.append(row)
        if progress:
            progress(row)
    fp = evaluator.fingerprint()
    device = {k: fp.get(k) for k in ("name", "uuid", "driver", "cuda", "compiler",
                                     "sm_clock_mhz", "power_limit_w", "cc", "sm_count")}
    return {"script": "tunefw bench", "date": datetime.date.today().isoformat(), "device": device,
            "simulated_table": table.simulated, "table_fingerprint": table.fingerprint,
            "programmatic_launches": dispatcher.programmatic,
            "stream_read": bandwidth,
            "triton": None if triton is None else {"version": _triton_version(),
                                                   "configs": _triton_configs()},
            "rows": rows,
            "geomean": {"ratio": geomean([r["ratio"] for r in rows]),
                        "triton_ratio": geomean([r["triton_ratio"] for r in rows])},
            "max_overhead_us": max(r["overhead_us"] for r in rows)}


def _triton_version() -> str:
    import triton
    return triton.__version__


def _triton_configs() -> int:
    from tunefw.measure.triton_ref import CONFIGS
    return len(CONFIGS)
