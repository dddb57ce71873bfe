"""Where a patched Hugging Face Llama's eager step loses time: torch.profiler over stock, patched
and patched-with-every-route-cuBLAS steps of the same model (hf_llama_h200.py's cases).

hf_llama_h200.json has the patched model eagerly 0.94x stock at prefill 512 (1.7 ms a step, every
round alike) while each of its GEMMs enqueues faster than nn.Linear and the graphed step is
1.03x: the profile says which ops (host time, self CPU) and which kernels (GPU time) differ.
A deep copy of the stock model, unpatched, says what the copy alone changes (the patched models
are copies of the stock one). Each model's steps also run under cProfile (Python functions by
own time; tunefw's by cumulative time). The last model (a table with no entries: tunefw.Linear
over cuBLAS everywhere) separates the wrapper's cost from the kernels'. Each patched model's
steps make its own table the process-wide one (tunefw::gemm serves one table a process; the
first run, at 3197beb, patched both models before timing, so both served the empty table: its
"patched" rows are the wrapper over cuBLAS).

    source benchmarks/device_setup.sh && python3 benchmarks/hf_eager_profile_h200.py \
        --table /tmp/hf_llama3_8b/dispatch.json --cubins /tmp/hf_llama3_8b/cubins

Writes $OUT/hf_eager_profile_h200.json (else benchmarks/results/); prints a short table last.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402

import gpu_result  # noqa: E402
import tunefw  # noqa: E402
from hf_llama_steps import LLAMA3_8B, Decode, Prefill, build_model, time_per_call_ms, twin  # noqa: E402
from tunefw.runtime.dispatch import load  # noqa: E402

TOP = 25
BUILDS = [0]  # kernel argument buffers built (Plan.args: a miss of the per-plan address cache)


def _count_builds() -> None:
    """Count Plan.args calls: a patched step whose calls keep missing the address cache pays
    for a fresh argument buffer (tensor maps included) on every launch."""
    from tunefw.runtime import plan

    built = plan.Plan.args

    def args(self, a_ptr: int, b_ptr: int, c_ptr: int) -> int:
        BUILDS[0] += 1
        return built(self, a_ptr, b_ptr, c_ptr)
    plan.Plan.args = args


def profile(step, steps: int) -> dict:
    """``steps`` eager steps under torch.profiler: the ops by self CPU time and the kernels by
    GPU time (per step, microseconds), and the steps' GPU-event milliseconds beside it."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    ops, kernels = [], []
    for ev in prof.key_averages():
        dev_us = getattr(ev, "self_device_time_total", 0.0) or 0.0
        row = {"name": ev.key[:120], "calls": ev.count // steps,
               "self_cpu_us": ev.self_cpu_time_total / steps, "cpu_us": ev.cpu_time_total / steps,
               "self_device_us": dev_us / steps}
        (kernels if ev.self_cpu_time_total == 0 and dev_us > 0 else ops).append(row)
    ops.sort(key=lambda r: -r["self_cpu_us"])
    kernels.sort(key=lambda r: -r["self_device_us"])
    return {"self_cpu_us": sum(r["self_cpu_us"] for r in ops),
            "device_us": sum(r["self_device_us"] for r in kernels),
            "ops": ops[:TOP], "kernels": kernels[:TOP]}


def python_profile(step, steps: int) -> dict:
    """``steps`` eager steps under cProfile: the Python functions by own time and tunefw's by
    cumulative time (per step, microseconds): where a patched step's extra host time goes."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    rows = [{"function": f"{Path(file).name}:{line}:{name}", "calls": calls // steps,
             "own_us": own * 1e6 / steps, "cumulative_us": cum * 1e6 / steps,
             "tunefw": "/tunefw/" in file}
            for (file, line, name), (_, calls, own, cum, _) in pstats.Stats(prof).stats.items()]
    return {"by_own_time": sorted(rows, key=lambda r: -r["own_us"])[:TOP],
            "tunefw_by_cumulative": sorted((r for r in rows if r["tunefw"]),
                                           key=lambda r: -r["cumulative_us"])[:TOP]}


def _serving(dispatcher, step):
    """``step`` run with ``dispatcher`` as the process-wide table (None: leave it)."""
    if dispatcher is None:
        return step

    def run():
        tunefw.set_dispatch(dispatcher)
        return step()
    return run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True)
    ap.add_argument("--cubins", type=Path)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10, help="profiled steps per model and case")
    ap.add_argument("--rounds", type=int, default=41, help="alternating timed rounds per case")
    ap.add_argument("--commit")
    args = ap.parse_args()
    dev = torch.device("cuda")
    _count_builds()
    stock = build_model(dict(LLAMA3_8B), args.layers, dev)
    table = load(args.table)
    # stock_twin: the copy hf_llama_h200.py patches, unpatched (what copying alone costs)
    models = {"stock": stock, "stock_twin": twin(stock), "patched": twin(stock),
              "patched_cublas": twin(stock)}
    # tunefw::gemm serves one process-wide table: each patched model's steps make theirs current
    tables = {"stock": None, "stock_twin": None,
              "patched": tunefw.Dispatcher(table, cubin_dir=args.cubins),
              "patched_cublas": tunefw.Dispatcher(dataclasses.replace(table, entries=[],
                                                                      evidence=[]))}
    for name in ("patched", "patched_cublas"):
        tunefw.patch(models[name], tables[name])
    cases = {"prefill 512": lambda m: Prefill(m, 512, torch.Generator().manual_seed(512)),
             "decode b=64": lambda m: Decode(m, stock, 64, 512, torch.Generator().manual_seed(64))}
    report = {**gpu_result.report_header("benchmarks/hf_eager_profile_h200.py", args.commit),
              "table": str(args.table), "layers": args.layers, "steps": args.steps, "cases": {}}
    with torch.no_grad():
        for label, make in cases.items():
            steps = {name: _serving(tables[name], make(m)) for name, m in models.items()}
            for s in steps.values():  # first uses: builds, verification, guard decisions
                for _ in range(3):
                    s()
            torch.cuda.synchronize()
            times: dict[str, list] = {name: [] for name in steps}
            builds = {name: 0 for name in steps}
            for r in range(args.rounds):
                order = list(steps.items())
                for name, s in (order if r % 2 == 0 else order[::-1]):
                    before = BUILDS[0]
                    times[name].append(time_per_call_ms(s, 1, True))
                    builds[name] += BUILDS[0] - before
            case = {name: {"median_ms": statistics.median(t[0] for t in ts),
                           "host_ms": statistics.median(t[1] for t in ts),
                           "arg_builds_per_step": builds[name] / args.rounds}
                    for name, ts in times.items()}
            for name, s in steps.items():
                case[name]["profile"] = profile(s, args.steps)
                case[name]["python"] = python_profile(s, args.steps)
            report["cases"][label] = case
            print(f"{label}: done", flush=True)
    out = gpu_result.out_path("hf_eager_profile_h200.json", None)
    out.write_text(json.dumps(report, indent=1))
    for label, case in report["cases"].items():
        print(f"== {label}")
        for name, c in case.items():
            p = c["profile"]
            print(f"  {name:15s} {c['median_ms']:7.2f} ms (host {c['host_ms']:6.2f}, "
                  f"{c['arg_builds_per_step']:.1f} arg builds) self-CPU "
                  f"{p['self_cpu_us'] / 1e3:6.2f} ms GPU {p['device_us'] / 1e3:6.2f} ms")
        for name in ("stock", "patched"):
            print(f"  {name} top ops:", "; ".join(f"{r['name'][:40]} x{r['calls']} "
                                                  f"{r['self_cpu_us']:.0f}us"
                                                  for r in case[name]["profile"]["ops"][:8]))
    print("->", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
