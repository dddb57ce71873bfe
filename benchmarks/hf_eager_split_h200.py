"""Where a patched Hugging Face Llama's eager step gains or loses host time, split by route.

hf_llama_aa_h200.json has the patched model eagerly 0.961x stock at decode b=64 and 0.943x at
prefill 512 (a copy of stock: 1.000x and 0.997x), in cases whose GEMMs are mostly cuBLAS routes
beside 33-65 wgmma_sm90 calls, while b=1 and b=16 (stream/rows kernels) gain 2.5-3.4%; the
profiles (hf_eager_profile_h200.json) were too short to split it. Five models, timed
interleaved over many rounds (the host's step time varies +-15% round to round): stock, a copy,
patched with the study's table, patched with the same table but its wgmma_sm90 entries made
cuBLAS routes (``nowgmma``), and patched over an empty table (every GEMM a cuBLAS route through
tunefw.Linear); and the patched model's own steps with its tuned kernels not launched
(``nolaunch``: the same plans, arguments and outputs, no cuLaunchKernel; its logits are garbage),
which leaves the driver's launch out of the comparison (the compiled call path launches without
Plan.launch: there ``nolaunch`` is the patched model); and a copy of stock whose nn.Linear layers
are a plain subclass of it (``subclass``: the class alone, the forward unchanged). Every model's linear layers are timed on the host (a perf_counter around each
forward, the same wrapper on nn.Linear and tunefw.Linear) and the tuned launches apart
(Plan.__call__), so a step's extra time is either in its GEMM calls or outside them.

    source benchmarks/device_setup.sh && python3 benchmarks/hf_eager_split_h200.py \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins

Writes $OUT/hf_eager_split_h200.json (else benchmarks/results/); prints a short table last.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import random
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402

import gpu_result  # noqa: E402
import tunefw  # noqa: E402
from hf_llama_steps import LLAMA3_8B, Decode, Prefill, build_model, twin  # noqa: E402
from tunefw.runtime.dispatch import apply_min_ratio, load  # noqa: E402

NS = {"linear": 0, "tuned": 0, "calls": 0, "tuned_calls": 0}  # host ns inside forwards / launches
SKIP_LAUNCH = [False]  # the nolaunch steps: Plan.launch returns at once


class PlainSubclass(torch.nn.Linear):
    """nn.Linear under another class, nothing else: does the class alone cost host time?"""


def _instrument() -> None:
    """The same perf_counter wrapper around nn.Linear's and tunefw.Linear's forward, and one
    around Plan.__call__ (the tuned launches)."""
    from tunefw.runtime import ops, plan

    clock = time.perf_counter_ns

    def wrap(cls, key: str, count: str):
        inner = cls.__dict__["forward" if key == "linear" else "__call__"]

        def timed(self, *args, **kwargs):
            t = clock()
            y = inner(self, *args, **kwargs)
            NS[key] += clock() - t
            NS[count] += 1
            return y
        setattr(cls, "forward" if key == "linear" else "__call__", timed)

    launch = plan.Plan.launch

    def maybe_launch(self, *args, **kwargs):
        if not SKIP_LAUNCH[0]:
            launch(self, *args, **kwargs)
    plan.Plan.launch = maybe_launch
    wrap(torch.nn.Linear, "linear", "calls")
    wrap(ops.Linear, "linear", "calls")
    wrap(plan.Plan, "tuned", "tuned_calls")


def step_times(step, cuda_sync: bool = True) -> dict:
    """One step: host ms to enqueue, GPU-event ms, and the host ms inside linear forwards and
    tuned launches."""
    before = dict(NS)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    step()
    host = (time.perf_counter() - t0) * 1e3
    end.record()
    end.synchronize()
    return {"ms": start.elapsed_time(end), "host_ms": host,
            "linear_ms": (NS["linear"] - before["linear"]) / 1e6,
            "tuned_ms": (NS["tuned"] - before["tuned"]) / 1e6,
            "calls": NS["calls"] - before["calls"],
            "tuned_calls": NS["tuned_calls"] - before["tuned_calls"]}


def served_routes(models: dict, tables: dict, make) -> dict:
    """Per patched model: each GEMM shape of one step and the route its dispatcher serves it by
    (after the warm-up steps: guard decisions included), so a run says which shapes were tuned."""
    out = {}
    for name, dispatcher in tables.items():
        if dispatcher is None:
            continue
        shapes: set = set()

        def hook(module, inputs, seen=shapes):
            seen.add((inputs[0].numel() // module.in_features, module.out_features, module.in_features))
        handles = [m.register_forward_pre_hook(hook) for m in models[name].modules()
                   if isinstance(m, torch.nn.Linear)]
        try:
            tunefw.set_dispatch(dispatcher)
            make(models[name])()
        finally:
            for h in handles:
                h.remove()
        out[name] = {f"{m}x{n}x{k}": dispatcher.explain(m, n, k) for m, n, k in sorted(shapes)}
    return out


def paired(stock: list[float], other: list[float], seed: int = 0) -> dict:
    """Median of the paired ratios stock/other and a 95% bootstrap interval of that median."""
    ratios = [s / o for s, o in zip(stock, other)]
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {"median": statistics.median(ratios), "ci95": [meds[49], meds[1949]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True)
    ap.add_argument("--cubins", type=Path)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=201, help="interleaved rounds per case")
    ap.add_argument("--commit")
    args = ap.parse_args()
    dev = torch.device("cuda")
    _instrument()
    stock = build_model(dict(LLAMA3_8B), args.layers, dev)
    table = load(args.table)
    nowgmma = dataclasses.replace(table, entries=[
        apply_min_ratio(e, 99.0, "experiment: wgmma_sm90 entries as cuBLAS routes,")
        if e.family == "wgmma_sm90" else e for e in table.entries])
    tables = {"stock": None, "copy": None,
              "patched": tunefw.Dispatcher(table, cubin_dir=args.cubins),
              "nowgmma": tunefw.Dispatcher(nowgmma, cubin_dir=args.cubins),
              "cublas": tunefw.Dispatcher(dataclasses.replace(table, entries=[], evidence=[]))}
    tables["subclass"] = None
    models = {name: stock if name == "stock" else twin(stock) for name in tables}
    for name, dispatcher in tables.items():
        if dispatcher is not None:
            tunefw.patch(models[name], dispatcher)
    for layer in models["subclass"].modules():  # nn.Linear's own forward in another class
        if type(layer) is torch.nn.Linear:
            layer.__class__ = PlainSubclass
    cases = {"decode b=64": lambda m: Decode(m, stock, 64, 512, torch.Generator().manual_seed(64)),
             "prefill 512": lambda m: Prefill(m, 512, torch.Generator().manual_seed(512))}
    report = {**gpu_result.report_header("benchmarks/hf_eager_split_h200.py", args.commit),
              "table": str(args.table), "layers": args.layers, "rounds": args.rounds, "cases": {}}

    def serving(name, step):
        def run():
            if tables[name] is not None:  # tunefw::gemm serves one process-wide table
                tunefw.set_dispatch(tables[name])
            return step()
        return run

    def without_launches(step):
        def run():
            tunefw.set_dispatch(tables["patched"])
            SKIP_LAUNCH[0] = True
            try:
                return step()
            finally:
                SKIP_LAUNCH[0] = False
        return run

    with torch.no_grad():
        for label, make in cases.items():
            steps = {name: serving(name, make(m)) for name, m in models.items()}
            steps["nolaunch"] = without_launches(make(models["patched"]))
            for s in steps.values():  # first uses: builds, verification, guard decisions
                for _ in range(3):
                    s()
            torch.cuda.synchronize()
            rows: dict[str, list[dict]] = {name: [] for name in steps}
            order = list(steps.items())
            gc.collect()
            gc.disable()
            try:
                for r in range(args.rounds):
                    random.Random(r).shuffle(order)  # no model keeps a place in the round
                    for name, s in order:
                        rows[name].append(step_times(s))
            finally:
                gc.enable()
            case = {}
            for name, rs in rows.items():
                med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                med["outside_ms"] = statistics.median(r["host_ms"] - r["linear_ms"] for r in rs)
                case[name] = {"median": med,
                              "host_vs_stock": paired([r["host_ms"] for r in rows["stock"]],
                                                      [r["host_ms"] for r in rs]),
                              "raw_host_ms": [round(r["host_ms"], 4) for r in rs],
                              "raw_linear_ms": [round(r["linear_ms"], 4) for r in rs]}
            report["cases"][label] = case
            report.setdefault("routes", {})[label] = served_routes(models, tables, make)
            print(f"{label}: done", flush=True)
    out = gpu_result.out_path("hf_eager_split_h200.json", None)
    out.write_text(json.dumps(report, indent=1))
    print(f"{'case':12s} {'model':8s} {'host':>7s} {'linear':>7s} {'tuned':>6s} {'outside':>7s} "
          f"{'calls':>5s} {'tuned':>5s}  stock/model [95% CI]")
    for label, case in report["cases"].items():
        for name, c in case.items():
            m, p = c["median"], c["host_vs_stock"]
            print(f"{label:12s} {name:8s} {m['host_ms']:7.2f} {m['linear_ms']:7.2f} "
                  f"{m['tuned_ms']:6.2f} {m['outside_ms']:7.2f} {m['calls']:5.0f} "
                  f"{m['tuned_calls']:5.0f}  {p['median']:.3f} [{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]")
    print("->", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
