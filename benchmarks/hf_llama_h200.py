"""End to end on an H200: a Hugging Face Llama stock against the same model after ``tunefw.patch``.

LlamaForCausalLM with Llama-3-8B's layer sizes (hidden 4096, intermediate 14336, 32 heads, 8 KV
heads, vocabulary 128256) and its 32 decoder layers (``--layers``), random bf16 weights. The depth
matters to the ratio: lm_head (1 GB, read by cuBLAS at the HBM roofline already) is a fifth of a
2-layer decode step's GEMM time and a fiftieth of the real model's. Cases: decode of batch 1, 16 and
64 (one new token over a static KV cache of 512 past tokens) and prefill of 512 and 2048 tokens
(batch 1, last-token logits). Each case runs eagerly and as a captured CUDA graph (the decode step
is captured as serving captures it: static cache, static inputs), stock and patched timed in the
same run, alternately, ``--rounds`` times; eagerly also stock against an unpatched copy of it
(an A/A: the eager step is host-bound, and models doing the same work have measured a few
percent apart, hf_eager_profile_h200.json). Also: the logits' relative error patched vs stock (and
both vs a twin whose GEMMs are exact to bf16 rounding), at this depth and on a model of the issue's
2 layers (``--logits-layers``), where the 1e-2 bar is judged: 32 random layers amplify any GEMM's
rounding to a few percent; the
host cost per call of tunefw.Linear against nn.Linear on each of the model's shapes at each
case's input (calls back to back, no sync between); which route (rule, family) served each GEMM of each case.

    source benchmarks/device_setup.sh && python3 benchmarks/hf_llama_h200.py --table TABLE.json

``--table`` may be any dispatch table: shapes it does not cover go to cuBLAS through the first-call
guard and the fallback routes, which is a case worth timing too. Writes $OUT/hf_llama_h200.json
(else benchmarks/results/); prints a short table last. About 2-4 minutes on an H200, most of it
the first build of each kernel the table names. ``--cpu-smoke``: a tiny model on the CPU (where
tunefw.Linear is F.linear and no graph is captured), to check the script, not a result.
``--arch mistral|qwen2|phi3|...``: another transformers architecture at the same sizes (its own
attention and MLP modules: Phi-3's fused qkv_proj and gate_up_proj), hf_llama_as_ARCH_h200.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402

import tunefw  # noqa: E402
from gpu_result import out_path, smi  # noqa: E402
from hf_routes import call_units, gated_mlps, linear_shapes, routes  # noqa: E402
from hf_llama_steps import (LLAMA3_8B, TINY, Decode, Graphed, Prefill, build_model,  # noqa: E402
                            dearer_beyond_noise, host_us, interleaved, rel_error, rounded_twin,
                            twin)
from tunefw.runtime import fastpath  # noqa: E402
from tunefw.runtime.guard import table_hash  # noqa: E402

PAST = 512
LAYERS = 32
DECODE_BATCHES, PREFILL_TOKENS = (1, 16, 64), (512, 2048)
SMOKE = dict(past=8, decode=(1, 3), prefill=(16,), rounds=3, layers=2, calls=2, host_calls=10)


def calls_per_round(kind: str, size: int, layers: int) -> int:
    """Steps per timed round: about 40 decoder layers' worth of decode (2 layers: 20 steps), and
    8192 prefill tokens through 2 layers' worth; at least one."""
    base = 20 if kind == "decode" else max(2, 4096 // size)
    return max(1, round(base * 2 / max(layers, 1)))


def host_inputs(smoke: bool) -> list[tuple[int, int]]:
    """(batch, tokens) of each case's linear input: decode (b, 1), prefill (1, t)."""
    return [(size, 1) if kind == "decode" else (1, size) for _, kind, size in cases(smoke)]


def host_costs(stock: torch.nn.Module, patched: torch.nn.Module, cuda: bool, inputs: list[tuple[int, int]],
               calls: int = 200, repeats: int = 15) -> dict:
    """Per (N, K) the model runs (call_units) and per case's input (batch, tokens, K): enqueue
    and wall microseconds per call, nn.Linear (stock) and tunefw.Linear (patched), medians of
    ``repeats`` alternating repeats, and each repeat's pair of enqueue times (what the verdict
    tests); fewer calls where a call's GPU work is long (prefill). A fused group's call is its
    members' calls on one input, in both models."""
    dev = next(stock.parameters()).device
    out = {}
    for n, k, names in call_units(stock, patched):
        pair = {label: _unit([model.get_submodule(name) for name in names])
                for label, model in (("nn.Linear", stock), ("tunefw.Linear", patched))}
        for batch, tokens in inputs:
            x = torch.randn(batch, tokens, k, device=dev, dtype=torch.bfloat16)
            reps = calls if batch * tokens <= 64 else max(10, calls // 8)
            samples: dict[str, list] = {name: [] for name in pair}
            with torch.no_grad():
                for layer in pair.values():
                    host_us(layer, x, 20, cuda)  # warm: kernels built, guard decided, allocator primed
                for r in range(repeats):
                    for name in (list(pair) if r % 2 == 0 else list(pair)[::-1]):
                        samples[name].append(host_us(pair[name], x, reps, cuda))
            first = patched.get_submodule(names[0])
            group = (" mlp:silu" if names[0] in gated_mlps(patched) else "" if len(names) == 1
                     else " " + "+".join(x.rsplit(".", 1)[-1] for x in names))
            out[f"{batch * tokens}x{n}x{k}{group}"] = {
                "input": [batch, tokens, k], "layers": names,
                "type_patched": type(first).__name__,
                # the input's route in the patched layer's compiled map (its calls are one C++ call)
                "compiled_route": len(getattr(first, "_fast", None) or ()) > 0,
                **{name: {"enqueue_us": statistics.median(s[0] for s in v),
                          "wall_us": statistics.median(s[1] for s in v)} for name, v in samples.items()},
                "enqueue_pairs_us": [[a[0], b[0]] for a, b in zip(samples["nn.Linear"],
                                                               samples["tunefw.Linear"])]}
    return out


def _unit(layers: list[torch.nn.Module]):
    """One host-cost call: ``layers`` called in order on one input (a layer, or a sibling group)."""
    if len(layers) == 1:
        return layers[0]
    return lambda x: [layer(x) for layer in layers]


def run_case(name: str, make, stock, patched, rounded, dispatcher, rounds: tuple[int, int],
             calls: int, cuda: bool, copy=None) -> dict:
    """One case: warm-up, routes, eager timing and error, then the same as CUDA graphs
    (``rounds``: eager's, graphs'). The logits are also compared with the ``rounded`` twin's
    (every GEMM exact to bf16 rounding): how far stock's cuBLAS and the patch each move them.
    ``copy`` (an unpatched copy of stock, like the patched one): stock against it eagerly, the
    same way (``eager_aa``): how far two models doing the same work measure apart here."""
    s_step, p_step = make(stock), make(patched)
    for _ in range(3):  # the patched model's first calls build its kernels and run the guard
        s_step(), p_step()
    if cuda:
        torch.cuda.synchronize()
    result: dict = {"case": name, "routes": routes(p_step, patched, dispatcher)}
    ref, exact = s_step().clone(), make(rounded)().clone()
    out = p_step().clone()
    result["eager"] = {**interleaved(s_step, p_step, rounds[0], calls, cuda),
                       "logits": rel_error(out, ref),
                       "logits_vs_rounded": {"stock": rel_error(ref, exact),
                                             "patched": rel_error(out, exact)}}
    del exact
    if copy is not None:
        c_step = make(copy)
        c_step()
        result["eager_aa"] = {k: v for k, v in interleaved(s_step, c_step, rounds[0], calls,
                                                           cuda).items() if k != "raw_host_ms"}
    if not cuda:
        result["graph"] = {"skipped": "no CUDA: nothing to capture"}
        return result
    try:
        g_stock, g_patched = Graphed(s_step), Graphed(p_step)
    except Exception as exc:  # a capture that fails is a result, and the other cases still run
        result["graph"] = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
        return result
    result["graph"] = {**interleaved(g_stock, g_patched, rounds[1], calls, cuda),
                       "logits": rel_error(g_patched().clone(), g_stock().clone()),
                       "stock_graph_vs_eager": rel_error(g_stock().clone(), ref)}
    del g_stock, g_patched
    torch.cuda.empty_cache()
    return result


def git_commit() -> str | None:
    """HEAD of this checkout, or None (the device's copy has no .git: scripts take --commit)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=REPO, timeout=20).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _elapsed(since: datetime.datetime) -> float:
    return (datetime.datetime.now(datetime.timezone.utc) - since).total_seconds()


def cases(smoke: bool) -> list[tuple[str, str, int]]:
    """(label, kind, size): decode batches, then prefill lengths."""
    decode = SMOKE["decode"] if smoke else DECODE_BATCHES
    prefill = SMOKE["prefill"] if smoke else PREFILL_TOKENS
    return [(f"decode b={b}", "decode", b) for b in decode] + \
           [(f"prefill {t}", "prefill", t) for t in prefill]


def _routes_text(case: dict) -> str:
    fam = case.get("routes", {}).get("calls_by_family", {})
    return ", ".join(f"{k} {v}" for k, v in sorted(fam.items()))


def print_table(report: dict) -> None:
    """Host cost per shape, then one line per case and mode."""
    print(f"\n{report['label']}: {report['env'].get('gpu', 'CPU')}, table {report['env']['table']}")
    print(f"{'host us/call':38s} {'nn.Linear':>18s} {'tunefw.Linear':>18s}   (enqueue / wall)")
    for shape, v in report.get("host_cost", {}).items():
        a, b = v["nn.Linear"], v["tunefw.Linear"]
        print(f"  {shape:36s} {a['enqueue_us']:8.1f} /{a['wall_us']:8.1f} "
              f"{b['enqueue_us']:8.1f} /{b['wall_us']:8.1f}")
    print(f"{'case':14s} {'mode':6s} {'stock ms':>9s} {'tunefw ms':>9s} {'speedup [min..max]':>22s} "
          f"{'rel err':>9s} {'host ms s/t':>13s}  GEMM calls by family")
    for case in report["cases"]:
        for mode in ("eager", "graph"):
            m = case.get(mode, {})
            if "speedup" not in m:
                print(f"{case['case']:14s} {mode:6s} {m.get('error') or m.get('skipped') or '-'}")
                continue
            s = m["speedup"]
            print(f"{case['case']:14s} {mode:6s} {m['stock']['median_ms']:9.4f} "
                  f"{m['patched']['median_ms']:9.4f} {s['median']:8.3f} [{s['min']:.3f}..{s['max']:.3f}] "
                  f"{m['logits']['rel_err']:9.2e} {_host_text(m):>13s}  {_routes_text(case)}")


def _host_text(timed: dict) -> str:
    """The host's enqueue ms per step, stock / tunefw (a result without them: '-')."""
    host = timed.get("host_ms")
    return f"{host['stock']:.2f}/{host['patched']:.2f}" if host else "-"


def logits_at_depth(sizes: dict, layers: int, dev: torch.device, dispatcher, past: int,
                    smoke: bool, fuse: bool = False, gated: bool = False, arch: str = "llama") -> dict:
    """Each case's eager logits, patched vs stock and both vs the rounded twin, on a model of
    ``layers`` decoder layers (the issue's 2): through 32 random layers any other correct GEMM
    (the rounded twin's, tunefw's) moves them by a few percent, so the 1e-2 bar is judged here,
    beside the deep figures."""
    stock = build_model(sizes, layers, dev, seed=1, arch=arch)
    patched, rounded = twin(stock), rounded_twin(stock)
    tunefw.patch(patched, dispatcher, fuse=fuse, gated=gated)
    errors, vs_twin = {}, {}
    for label, kind, size in cases(smoke):
        def make(m, kind=kind, size=size):
            gen = torch.Generator().manual_seed(size)
            return Decode(m, stock, size, past, gen) if kind == "decode" else Prefill(m, size, gen)
        ref, out, exact = (make(m)().clone() for m in (stock, patched, rounded))
        errors[label] = rel_error(out, ref)["rel_err"]
        vs_twin[label] = {"stock": rel_error(ref, exact)["rel_err"],
                          "patched": rel_error(out, exact)["rel_err"]}
    del stock, patched, rounded
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"layers": layers, "rel_err": errors, "vs_rounded_twin": vs_twin}


# issue 19's bars: eager never slower; graphed decode 1.10x, prefill 1.02x; logits within 1e-2
# (judged at the 2 layers where logits_at_depth ran; the deep run's errors beside them)
EAGER_MIN, GRAPH_DECODE_MIN, GRAPH_PREFILL_MIN, LOGITS_MAX = 1.00, 1.10, 1.02, 1e-2


def logits_point(report: dict, deep: dict[str, float], deep_twin: dict) -> dict:
    """The logits bar, judged at the issue's depth where that check ran, else on the deep run."""
    shallow = report.get("logits_at_depth")
    judged = shallow["rel_err"] if shallow else deep
    return {"ok": bool(judged) and max(judged.values()) <= LOGITS_MAX, "max": LOGITS_MAX,
            "judged_at_layers": (shallow or report.get("model", {})).get(
                "layers" if shallow else "num_hidden_layers"),
            "rel_err": judged, "deep_rel_err": deep, "deep_vs_rounded_twin": deep_twin,
            "vs_rounded_twin": shallow["vs_rounded_twin"] if shallow else deep_twin}


def summarize(report: dict) -> dict:
    """Each acceptance point with its evidence: per case the median speedups, the logits' error
    against stock and both models' against the twin whose GEMMs are exact to bf16 rounding, and
    every shape whose tunefw.Linear host cost exceeds nn.Linear's beyond the noise (a sign test
    over the alternating repeats' pairs; by the medians alone beside it)."""
    timed = [c for c in report["cases"] if "speedup" in c.get("eager", {})]
    graphed = [c for c in timed if "speedup" in c.get("graph", {})]

    def speedups(cases: list[dict], mode: str, kind: str | None = None) -> dict[str, float]:
        return {c["case"]: c[mode]["speedup"]["median"] for c in cases
                if kind is None or c["case"].startswith(kind)}

    def bar(values: dict[str, float], floor: float) -> dict:
        return {"ok": bool(values) and min(values.values()) >= floor, "min": floor,
                "cases": values, "below": sorted(k for k, v in values.items() if v < floor)}

    errors = {f"{c['case']} {mode}": c[mode]["logits"]["rel_err"] for c in timed
              for mode in ("eager", "graph") if "logits" in c.get(mode, {})}
    twin = {c["case"]: {who: c["eager"]["logits_vs_rounded"][who]["rel_err"]
                        for who in ("stock", "patched")}
            for c in timed if "logits_vs_rounded" in c["eager"]}
    host = report.get("host_cost", {})
    by_median = sorted(k for k, v in host.items()
                       if v["tunefw.Linear"]["enqueue_us"] > v["nn.Linear"]["enqueue_us"])
    dearer = sorted(k for k in by_median if "enqueue_pairs_us" not in host[k]
                    or dearer_beyond_noise(host[k]["enqueue_pairs_us"]))
    aa = {c["case"]: c["eager_aa"]["speedup"]["median"] for c in timed if "eager_aa" in c}
    points = {
        # beside the bar: an unpatched copy against stock, the same way (the eager step is
        # host-bound, and two models doing the same work have measured a few percent apart)
        "eager_never_slower": {**bar(speedups(timed, "eager"), EAGER_MIN), "copy_vs_stock": aa},
        "graph_decode": bar(speedups(graphed, "graph", "decode"), GRAPH_DECODE_MIN),
        "graph_prefill": bar(speedups(graphed, "graph", "prefill"), GRAPH_PREFILL_MIN),
        "logits": logits_point(report, errors, twin),
        "host_cost": {"ok": bool(host) and not dearer, "shapes": len(host), "dearer": dearer,
                      "dearer_by_median": by_median},
    }
    points["all"] = all(p["ok"] for p in points.values())
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", type=Path, required=True, help="dispatch table (dispatch.json)")
    ap.add_argument("--cubins", type=Path, help="shipped cubin directory for the table")
    ap.add_argument("--rounds", type=int, help="alternating timing rounds per case as graphs (41)")
    ap.add_argument("--eager-rounds", type=int, help="the same, eager (161: an eager step's host "
                    "time spreads +-30%% round to round on the H200 machine, 41 left the median "
                    "within about 3%%)")
    ap.add_argument("--vocab", type=int, default=LLAMA3_8B["vocab_size"])
    ap.add_argument("--layers", type=int, default=LAYERS, help=f"decoder layers ({LAYERS}, Llama-3-8B's)")
    ap.add_argument("--logits-layers", type=int, default=2,
                    help="decoder layers of the model the logits bar is judged on (the issue's 2)")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="start no new case after this many seconds (the rest are marked skipped)")
    ap.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD)")
    ap.add_argument("--out", type=Path, help="result file (default: $OUT or benchmarks/results)")
    ap.add_argument("--no-aa", action="store_true",
                    help="skip the eager A/A (stock against an unpatched copy of it)")
    ap.add_argument("--fuse", action="store_true", help="patch with fuse=True: q/k/v "
                    "one GEMM (the table should be a fused study's: --from-model --fuse)")
    ap.add_argument("--gated", action="store_true", help="patch with gated=True: each MLP's "
                    "gate and up one gated GEMM (a table with gated entries: --from-model --gated)")
    ap.add_argument("--arch", default="llama", help="transformers model_type built at Llama-3-8B's "
                    "sizes (llama; mistral, qwen2, phi3: other attention and MLP modules, the "
                    "result named hf_llama_as_ARCH_*)")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny model on the CPU, to check the script (not a result)")
    args = ap.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    cuda = not args.cpu_smoke
    if cuda and not torch.cuda.is_available():
        raise SystemExit("hf_llama_h200: no CUDA device (use --cpu-smoke to check the script on CPU)")
    import transformers

    dev = torch.device("cuda" if cuda else "cpu")
    sizes = dict(TINY) if args.cpu_smoke else {**LLAMA3_8B, "vocab_size": args.vocab}
    layers, past = (SMOKE["layers"], SMOKE["past"]) if args.cpu_smoke else (args.layers, PAST)
    rounds = args.rounds or (SMOKE["rounds"] if args.cpu_smoke else 41)
    eager_rounds = args.eager_rounds or (SMOKE["rounds"] if args.cpu_smoke else 161)
    kind = "llama" if args.arch == "llama" else f"llama_as_{args.arch}"
    name = f"hf_{kind}_cpu_smoke.json" if args.cpu_smoke else f"hf_{kind}_h200.json"
    out = out_path(name, args.out)

    stock = build_model(sizes, layers, dev, arch=args.arch)
    patched, rounded = twin(stock), rounded_twin(stock)
    copy = None if args.no_aa else twin(stock)
    torch.backends.cuda.matmul.allow_tf32 = False  # the rounded twin's float32 GEMMs: no TF32
    dispatcher = tunefw.Dispatcher(args.table, cubin_dir=args.cubins)
    patch = tunefw.patch(patched, dispatcher, fuse=args.fuse, gated=args.gated)
    env = {"date": started.isoformat(timespec="seconds"), "commit": args.commit or git_commit(),
           "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "arch": args.arch,
           "python": platform.python_version(),
           "table": str(args.table), "table_hash": table_hash(dispatcher.table),
           "table_gpu": dispatcher.table.fingerprint.get("name"), "cubins": str(args.cubins or ""),
           "programmatic_launches": dispatcher.programmatic,
           # tunefw.Linear's compiled call path (tunefw/runtime/fastpath.py), built or not
           "compiled_call_path": fastpath.module() is not None}
    if cuda:
        env.update(gpu=torch.cuda.get_device_name(), nvidia_smi_start=smi())
    report = {"label": "CPU smoke (torch.matmul; not a GPU result)" if args.cpu_smoke
              else "H200 end to end: HF Llama stock vs tunefw.patch",
              "env": env, "model": {**sizes, "num_hidden_layers": layers, "dtype": "bf16",
                                    "past_tokens": past, "attention": "sdpa"},
              "patch": {"swapped": len(patch.swapped), "skipped": patch.skipped,
                        "fused_groups": len(patch.fused), "gated_mlps": len(patch.gated),
                        "ungated": patch.ungated},
              "shapes": {f"{n}x{k}": v for (n, k), v in linear_shapes(stock).items()},
              "rounds": rounds, "eager_rounds": eager_rounds, "cases": []}
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        for label, kind, size in cases(args.cpu_smoke):
            if _elapsed(started) > args.budget_s:
                report["cases"].append({"case": label, "eager": {"skipped": "time budget"},
                                        "graph": {"skipped": "time budget"}})
                continue
            def make(m, kind=kind, size=size):  # the same seed for both: same tokens
                gen = torch.Generator().manual_seed(size)
                return Decode(m, stock, size, past, gen) if kind == "decode" else Prefill(m, size, gen)
            calls = SMOKE["calls"] if args.cpu_smoke else calls_per_round(kind, size, layers)
            report["cases"].append(run_case(label, make, stock, patched, rounded, dispatcher,
                                                 (eager_rounds, rounds), calls, cuda, copy))
            out.write_text(json.dumps(report, indent=1, default=str))  # partial results survive
            print(f"{label}: done at {_elapsed(started):.0f} s", flush=True)
        report["logits_at_depth"] = logits_at_depth(sizes, args.logits_layers, dev, dispatcher,
                                                    past, args.cpu_smoke, args.fuse, args.gated,
                                                    args.arch)
        report["host_cost"] = host_costs(stock, patched, cuda, host_inputs(args.cpu_smoke),
                                         SMOKE["host_calls"] if args.cpu_smoke else 200)
    if cuda:
        env["nvidia_smi_end"] = smi()
    env["wall_s"] = round(_elapsed(started), 1)
    report["summary"] = summarize(report)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")
    print_table(report)
    print("acceptance:", ", ".join(f"{k} {'ok' if v['ok'] else 'FAILED'}"
                                   for k, v in report["summary"].items() if k != "all"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
