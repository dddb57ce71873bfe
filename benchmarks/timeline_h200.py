"""Where a mid-M GEMM's microseconds go: each CTA's phases, timed inside tunefw's kernel.

Nsight Compute has tunefw's mid-M wgmma_sm90 winners 3-7% behind cuBLAS in isolated launches
(profile_midm_h200.json: each of our CTAs is busy ~1.7 us longer at 64x4096x4096) and a chain
of them 1.3-3 us a GEMM behind (launch_gap_h200.json). This compiles the table's configs with
TUNEFW_TIMELINE (kernel_templates/wgmma_sm90.cuh: every CTA records globaltimer and clock64 at
entry, set-up, first and last TMA issue, first stage consumed, main loop done, epilogue done and
exit; the tuned build has none of it) and runs each shape as a CUDA graph of back-to-back GEMMs
over weight copies past L2, launched plainly and programmatically. Per shape and launch mode:
the median CTA's phases, the ramp (last CTA start after the first), the tail (last CTA exit
after the median one), the gap between kernels, and each GEMM's time in the graph beside
cuBLAS's chain in the same run.

    source benchmarks/device_setup.sh && python3 benchmarks/timeline_h200.py --commit SHA

Source variants (--variant NAME=DEFINE,...: the family's source built with those defines too)
and knob overrides (--override MxNxK:KNOB=VALUE,...) run beside the table's configs in the same
run; --family times another family's entries (decode shapes: no phases, the chains only).
Writes $OUT/timeline_h200.json (or --name; else benchmarks/results/) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

TABLE = REPO / "benchmarks" / "results" / "dispatch_llama3_8b_h200.json"
SHAPES = ("64x4096x4096,128x4096x4096,256x4096x4096,512x4096x4096,128x6144x4096,"
          "256x6144x4096,4096x4096x4096")
EVENTS = ("entry", "setup", "first_tma", "last_tma", "first_stage", "mainloop_done",
          "epilogue_done", "exit")
WORDS = 18  # TUNEFW_TIMELINE_WORDS: 8 events x (globaltimer, clock64), id, units
CAPACITY = 8192  # TUNEFW_TIMELINE_CTAS: slots in the buffer
TIMELINED = {"wgmma_sm90"}  # families whose source records the timeline (others: times only)
# (name, from event, to event): a CTA's phases, in microseconds
PHASES = (("setup", "entry", "setup"), ("to_first_tma", "setup", "first_tma"),
          ("first_data", "first_tma", "first_stage"), ("mainloop", "first_stage", "mainloop_done"),
          ("epilogue", "mainloop_done", "epilogue_done"), ("exit", "epilogue_done", "exit"),
          ("life", "entry", "exit"))


def records(raw: Sequence[int], count: int) -> list[dict]:
    """The written ones of the first ``count`` slots of the timeline buffer: each CTA's event
    times (ns, 0 where the CTA did not reach the event), clocks, SM, linear block index and
    work units."""
    out = []
    for s in range(min(count, CAPACITY)):
        w = raw[s * WORDS:(s + 1) * WORDS]
        if not w[0]:
            continue
        out.append({"ns": [int(w[2 * e]) for e in range(len(EVENTS))],
                    "clk": [int(w[2 * e + 1]) for e in range(len(EVENTS))],
                    "sm": int(w[16]) >> 32, "block": int(w[16]) & 0xFFFFFFFF, "units": int(w[17])})
    return out


def launches(ctas: list[dict], grid: int) -> list[list[dict]]:
    """The CTAs of each launch in a chain: ``grid`` CTAs at a time in order of entry (a launch's
    CTAs all enter before the next launch's on a one-wave grid; a repeated block index in a
    group says otherwise and is reported by phases())."""
    ordered = sorted(ctas, key=lambda r: r["ns"][0])
    return [ordered[i:i + grid] for i in range(0, len(ordered) - len(ordered) % grid, grid)]


def _us(ns: float) -> float:
    return round(ns / 1e3, 3)


def phases(launch: list[dict]) -> dict:
    """One launch: its span, ramp and tail, and each phase's median and max over its CTAs
    (a phase over CTAs that reached both of its events)."""
    e = {name: i for i, name in enumerate(EVENTS)}
    start = min(r["ns"][0] for r in launch)
    end = max(r["ns"][e["exit"]] for r in launch)
    exits = [r["ns"][e["exit"]] for r in launch]
    out = {"ctas": len(launch), "start_ns": start, "end_ns": end, "span_us": _us(end - start),
           "ramp_us": _us(max(r["ns"][0] for r in launch) - start),
           "tail_us": _us(end - statistics.median(exits)),
           "mixed": len({r["block"] for r in launch}) != len(launch)}
    for name, a, b in PHASES:
        got = [r["ns"][e[b]] - r["ns"][e[a]] for r in launch if r["ns"][e[a]] and r["ns"][e[b]]]
        if got:
            out[name] = {"median_us": _us(statistics.median(got)), "max_us": _us(max(got))}
    lives = [(r["clk"][e["exit"]] - r["clk"][0], r["ns"][e["exit"]] - r["ns"][0]) for r in launch]
    out["sm_clock_mhz"] = round(statistics.median(c / n * 1e3 for c, n in lives if n > 0), 1)
    return out


def chain_summary(per_launch: list[dict]) -> dict:
    """A chain's launches after the first (its cold start): medians of each figure, and the gap
    from one launch's last CTA exit to the next one's first CTA entry (negative: they overlap)."""
    gaps = [b["start_ns"] - a["end_ns"] for a, b in zip(per_launch, per_launch[1:])]
    warm = per_launch[1:] or per_launch
    out = {"launches": len(per_launch), "gap_us": _us(statistics.median(gaps)) if gaps else None,
           "mixed_launches": sum(p["mixed"] for p in per_launch)}
    for key in ("span_us", "ramp_us", "tail_us", "sm_clock_mhz"):
        out[key] = round(statistics.median(p[key] for p in warm), 3)
    for name, _, _ in PHASES:
        vals = [p[name]["median_us"] for p in warm if name in p]
        if vals:
            out[name + "_us"] = round(statistics.median(vals), 3)
    return out


def timeline_sources(dst: Path, defines: Sequence[str] = (), family: str = "wgmma_sm90") -> Path:
    """A copy of kernel_templates/ whose source of ``family`` defines TUNEFW_TIMELINE and
    ``defines`` (a source variant under test: NAME or NAME=VALUE each)."""
    from tunefw.templates import FAMILIES
    from tunefw.templates.base import TEMPLATE_DIR

    root = dst / "kernel_templates"
    shutil.copytree(TEMPLATE_DIR, root)
    source = root / FAMILIES[family].source
    head = "".join(f"#define {d.replace('=', ' ', 1)}\n" for d in ("TUNEFW_TIMELINE=1", *defines))
    source.write_text(head + source.read_text())
    return root


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """``NAME=DEF1,DEF2`` (``base=``: the source as it is) -> (name, defines)."""
    name, _, defs = text.partition("=")
    if not name:
        raise SystemExit(f"--variant {text!r}: expected NAME=DEFINE[,DEFINE...]")
    return name, tuple(d for d in defs.split(",") if d)


def parse_override(text: str) -> tuple[tuple[int, int, int], dict]:
    """``MxNxK:KEY=VALUE,...`` -> (shape, knob values) to run beside that shape's table config."""
    shape, _, knobs = text.partition(":")
    try:
        dims = tuple(int(v) for v in shape.split("x"))
        pairs = dict(kv.split("=", 1) for kv in knobs.split(",") if kv)
    except ValueError:
        raise SystemExit(f"--override {text!r}: expected MxNxK:KNOB=VALUE[,KNOB=VALUE...]")
    if len(dims) != 3 or not pairs:
        raise SystemExit(f"--override {text!r}: expected MxNxK:KNOB=VALUE[,KNOB=VALUE...]")
    return dims, {k: int(v) if v.lstrip("-").isdigit() else v for k, v in pairs.items()}


def with_overrides(entry, shape: tuple[int, int, int],
                   overrides: Sequence[tuple[tuple[int, int, int], dict]]) -> list[tuple]:
    """The table entry (knobs None) and, for each override of its shape, the entry with those
    knobs changed (knobs: the override)."""
    return [(entry, None)] + [(replace(entry, config={**entry.config, **knobs}), knobs)
                              for dims, knobs in overrides if dims == shape]


def run_shape(entry, sources: Path, cache: Path, links: int, rounds: int) -> dict:
    """One table entry: the kernel verified against torch.mm, its chain captured plain and
    programmatic, each replayed once into a cleared timeline (a family that records one: see
    TIMELINED), then all timed beside cuBLAS."""
    import torch

    from hf_llama_steps import interleaved
    from launch_gap_h200 import chain_operands
    from pdl_check_h200 import captured
    from tunefw.cuda import driver
    from tunefw.cuda.compiler import compile_kernel
    from tunefw.problem import GemmProblem
    from tunefw.runtime.plan import Plan
    from tunefw.templates import FAMILIES

    template, m, n, k = FAMILIES[entry.family], entry.M, entry.N, entry.K
    problem = GemmProblem(m, n, k, entry.dtype)
    spec = driver.local_spec(0)
    launch = template.launch(entry.config, problem, spec)
    built = compile_kernel(template, entry.config, entry.dtype, spec.arch, cache_dir=cache,
                           source_dir=sources)
    if not built.ok:
        return {"shape": f"{m}x{n}x{k}", "config": entry.config, "error": built.log[-400:]}
    context = driver.primary_context(driver.device(0))
    driver.set_current(context)
    module, function = driver.load(built.cubin, built.lowered_name)
    driver.configure(function, launch)
    timed = entry.family in TIMELINED
    if timed:
        buf = driver.module_global(module, "tunefw_timeline")
        nxt = driver.module_global(module, "tunefw_timeline_next")
    plans = {pdl: Plan(template, entry, problem, launch, function, context,
                       torch.device("cuda", 0), programmatic=pdl) for pdl in (False, True)}

    x, weights = chain_operands(m, n, k, links)
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(links)]

    def chain(pdl: bool):
        plan = plans[pdl]
        stream = torch.cuda.current_stream().cuda_stream
        for w, c in zip(weights, outs):
            plan.launch(plan.args(x.data_ptr(), w.data_ptr(), c.data_ptr()), stream, programmatic=pdl)
        return outs[0]

    chain(False)
    ref = torch.mm(x, weights[0].t())
    err = float((outs[0].float() - ref.float()).norm() / ref.float().norm())
    graphs = {"cublas": captured(lambda: [torch.mm(x, w.t()) for w in weights])[0],
              "plain": captured(lambda: chain(False))[0],
              "programmatic": captured(lambda: chain(True))[0]}
    row = {"shape": f"{m}x{n}x{k}", "config": entry.config, "grid": list(launch.grid),
           "cluster": list(launch.cluster), "links": links, "rel_diff_vs_cublas": err}
    grid = launch.grid[0] * launch.grid[1] * launch.grid[2]
    for mode in ("plain", "programmatic"):
        row[mode] = {}
        if not timed:
            continue
        for _ in range(3):
            graphs[mode].replay()
        torch.cuda.synchronize()
        driver.zero_device(*buf)
        driver.zero_device(*nxt)
        torch.cuda.synchronize()
        graphs[mode].replay()
        torch.cuda.synchronize()
        raw = memoryview(driver.read_device(*buf)).cast("Q")
        per = [phases(group) for group in launches(records(raw, links * grid), grid)]
        row[mode] = chain_summary(per)
    for mode in ("plain", "programmatic"):
        pair = interleaved(graphs["cublas"].replay, graphs[mode].replay, rounds, 10, True)
        row[mode]["gemm_us"] = round(pair["patched"]["median_ms"] * 1e3 / links, 3)
        row[mode]["cublas_gemm_us"] = round(pair["stock"]["median_ms"] * 1e3 / links, 3)
        row[mode]["ratio"] = round(pair["speedup"]["median"], 4)
    driver.unload(module)
    return row


def print_table(rows: list[dict]) -> None:
    """One line per row and launch mode: times, ratio to cuBLAS, the median CTA's phases."""
    print(f"{'variant':>10} {'shape':>15} {'mode':>5} {'gemm':>6} {'cuBLAS':>6} {'ratio':>6} "
          f"{'span':>6} {'gap':>6} {'ramp':>5} {'setup':>5} {'1stTMA':>6} {'1stdat':>6} "
          f"{'main':>6} {'epi':>5} {'tail':>5}")
    for r in rows:
        label = r["shape"] + ("*" if r["override"] else "")
        for mode in ("plain", "programmatic"):
            s = r.get(mode)
            if not s:
                print(f"{r['variant'][:10]:>10} {label:>15} {(r.get('error') or '')[:80]}")
                break
            print(f"{r['variant'][:10]:>10} {label:>15} {mode[:5]:>5} {s['gemm_us']:6.2f} "
                  f"{s['cublas_gemm_us']:6.2f} {s['ratio']:6.3f} {s.get('span_us', 0):6.2f} "
                  f"{s.get('gap_us') or 0:6.2f} {s.get('ramp_us', 0):5.2f} "
                  f"{s.get('setup_us', 0):5.2f} "
                  f"{s.get('to_first_tma_us', 0):6.2f} {s.get('first_data_us', 0):6.2f} "
                  f"{s.get('mainloop_us', 0):6.2f} {s.get('epilogue_us', 0):5.2f} "
                  f"{s.get('tail_us', 0):5.2f}")
    for r in rows:
        if r["override"]:
            print(f"* {r['variant']} {r['shape']}: {r['override']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, default=TABLE)
    ap.add_argument("--family", default="wgmma_sm90",
                    help="the table entries of this family (phases where it records them)")
    ap.add_argument("--shapes", help=f"MxNxK,... of its entries (default: wgmma_sm90's {SHAPES}; "
                    "another family's: all of them)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds per timing")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=DEFINE[,DEFINE...]: the kernel source built with these defines "
                         "too (repeatable; default: base=, the source as it is)")
    ap.add_argument("--override", action="append", default=[],
                    help="MxNxK:KNOB=VALUE,...: also run that shape's table config with these "
                         "knobs changed (repeatable)")
    ap.add_argument("--name", default="timeline_h200.json",
                    help="result file name (in $OUT, else benchmarks/results/)")
    ap.add_argument("--commit")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    import torch

    import gpu_result
    from profile_h200 import kernel_routes
    from tunefw.evaluate.method import rotation_copies
    from tunefw.cuda import driver
    from tunefw.problem import GemmProblem
    from tunefw.runtime.dispatch import load
    from tunefw.templates import FAMILIES

    entries = {(e.M, e.N, e.K): e for e in load(kernel_routes(args.table)).entries
               if e.family == args.family and e.config}
    shapes = args.shapes or (SHAPES if args.family == "wgmma_sm90" else
                             ",".join("x".join(map(str, k)) for k in sorted(entries)))
    wanted = [tuple(int(v) for v in s.split("x")) for s in shapes.split(",") if s]
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    variants = [parse_variant(v) for v in args.variant] or [("base", ())]
    overrides = [parse_override(o) for o in args.override]
    tmp = Path(tempfile.mkdtemp())
    spec = driver.local_spec(0)
    rows = []
    for name, defines in variants:
        sources = timeline_sources(tmp / name, defines, args.family)
        for shape in wanted:
            if shape not in entries:
                print(f"{'x'.join(map(str, shape))}: no {args.family} entry in {args.table.name}")
                continue
            links = max(8, rotation_copies(2 * shape[1] * shape[2], l2))
            for entry, knobs in with_overrides(entries[shape], shape, overrides):
                problem = GemmProblem(*shape, entry.dtype)
                why = FAMILIES[entry.family].check(entry.config, problem, spec)
                row = ({"shape": "x".join(map(str, shape)), "config": entry.config, "error": why}
                       if why else run_shape(entry, sources, tmp / name / "cache", links,
                                             args.rounds))
                rows.append({"variant": name, "defines": list(defines), "override": knobs, **row})
    report = {**gpu_result.report_header("benchmarks/timeline_h200.py", args.commit),
              "table": str(args.table), "family": args.family, "rounds": args.rounds,
              "events": EVENTS,
              "variants": {name: list(defines) for name, defines in variants}, "rows": rows}
    out = gpu_result.out_path(args.name, args.out)
    out.write_text(json.dumps(report, indent=1))
    print_table(rows)
    print("->", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
