"""Run a sample of a family's configs under compute-sanitizer (memcheck, racecheck) on the GPU.

The child process compiles each config and runs it through the runtime's launch path on small
edge shapes, verifying each output; the parent runs the child under each sanitizer tool and
records its ERROR SUMMARY and the children's verdicts. Writes $OUT/sanitize_<family>.json (or --out).

    python3 benchmarks/sanitize_h200.py --family mma_sm80 --tools memcheck --sample 6
    python3 benchmarks/sanitize_h200.py --family wgmma_sm90 --tools memcheck,racecheck --split-k
    python3 benchmarks/sanitize_h200.py --family stream_sm90 --shapes 1x8x520,3x24x1032,9x1032x1040 --split-k
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

SHAPES = [(17, 24, 40), (129, 136, 264), (300, 1000, 520)]


def split(config: dict) -> int:
    """How many ways the config splits K (SPLIT_K, or the decode families' cluster CK)."""
    return config.get("SPLIT_K", config.get("CK", 1))


def sample_configs(family: str, n: int, seed: int, split_k: bool = False) -> list[dict]:
    """n random configs valid on every sample shape (the default first, where valid: a runtime
    given an invalid one serves cuBLAS, which the sanitizer would not test); split_k: the sampled ones
    all split K (the partial-sum and reduction path)."""
    from tunefw.device import H200
    from tunefw.problem import GemmProblem
    from tunefw.templates import get_family
    tpl = get_family(family)
    rng = random.Random(seed)
    problems = [GemmProblem(*s) for s in SHAPES]
    configs = [c for c in [tpl.default_config()] if all(tpl.check(c, p, H200) is None for p in problems)]
    while len(configs) < n:
        config = {p.name: rng.choice(p.values) for p in tpl.params}
        if split_k and split(config) == 1:
            continue
        if config not in configs and all(tpl.check(config, p, H200) is None for p in problems):
            configs.append(config)
    return configs


def child(family: str, configs: list[dict]) -> None:
    """Run each config twice on each shape through the runtime (the kernel's own launch path,
    no timing loops: under racecheck every launch is slow) and verify the second output, which
    was NaN-poisoned first: the first run must also leave split-K state ready for the next."""
    import torch

    from tunefw.evaluate import method
    from tunefw.runtime.dispatch import DispatchEntry, DispatchTable
    from tunefw.runtime.dispatcher import Dispatcher

    major, minor = torch.cuda.get_device_capability(0)
    fingerprint = {"name": torch.cuda.get_device_name(0), "cc": major * 10 + minor}
    for i, config in enumerate(configs):
        entries = [DispatchEntry(M, N, K, "bf16", "TN", family, config, 0.0, None, 0)
                   for M, N, K in SHAPES]
        dispatcher = Dispatcher(DispatchTable(False, fingerprint, entries))
        for M, N, K in SHAPES:
            a, b = method.make_inputs(M, N, K, "bf16", i, device="cuda")
            plan = dispatcher.plan_for(a, b)
            if plan is None:
                print(f"RESULT {i} {M}x{N}x{K} NOT_BUILT {dispatcher.explain(M, N, K)}", flush=True)
                continue
            plan(a, b)
            out = torch.full((M, N), float("nan"), dtype=a.dtype, device="cuda")
            plan.launch(plan.args(a.data_ptr(), b.data_ptr(), out.data_ptr()),
                        torch.cuda.current_stream().cuda_stream)
            torch.cuda.synchronize()
            verdict = method.verify(out, method.reference(a, b), "bf16", baseline=torch.mm(a, b.t()))
            status = "OK" if verdict.ok else "WRONG_ANSWER"
            print(f"RESULT {i} {M}x{N}x{K} {status} {verdict.reason[:80]}", flush=True)


def run_tool(tool: str, family: str, configs: list[dict], timeout: float) -> dict:
    # API errors off: cuda-bindings' cuInit probes every driver entry point with
    # cuGetProcAddress and memcheck counted each missing one (34 "errors", none in a kernel).
    cmd = ["compute-sanitizer", f"--tool={tool}", "--print-limit=20", "--report-api-errors=no",
           sys.executable, __file__, "--child", "--family", family, "--configs", json.dumps(configs),
           "--shapes", ",".join("x".join(map(str, s)) for s in SHAPES)]
    try:
        # One cudaMalloc per tensor, so memcheck sees each buffer's true bounds.
        env = {**os.environ, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        text = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        text = (exc.stdout or b"").decode() + (exc.stderr or b"").decode() + "\nTIMEOUT"
    # memcheck: "ERROR SUMMARY: N errors"; racecheck: "RACECHECK SUMMARY: ... (N errors, M warnings)"
    summary = (re.findall(r"ERROR SUMMARY: (\d+) errors?\s*$", text, re.MULTILINE)
               or re.findall(r"RACECHECK SUMMARY: .*\((\d+) errors?, \d+ warnings?\)", text))
    results = re.findall(r"^RESULT (\d+) (\S+) (\S+)", text, re.MULTILINE)
    return {"tool": tool, "errors": int(summary[-1]) if summary else None,
            "runs": len(results), "statuses": sorted({r[2] for r in results}),
            "all_ok": bool(results) and all(r[2] == "OK" for r in results),
            "clean": bool(summary) and int(summary[-1]) == 0 and len(results) > 0,
            "head": text[:1500], "tail": text[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--tools", default="memcheck")
    ap.add_argument("--sample", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--configs")
    ap.add_argument("--split-k", action="store_true",
                    help="sample only configs that split K (after the default config)")
    ap.add_argument("--shapes", help="MxNxK,... instead of the default edge shapes (decode "
                    "families serve small M only)")
    args = ap.parse_args()
    if args.shapes:
        SHAPES[:] = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if args.child:
        child(args.family, json.loads(args.configs))
        return 0
    configs = sample_configs(args.family, args.sample, args.seed, args.split_k)
    tools = [run_tool(t, args.family, configs, args.timeout) for t in args.tools.split(",")]
    result = {"script": "benchmarks/sanitize_h200.py", "date": datetime.date.today().isoformat(),
              "family": args.family, "shapes": SHAPES, "split_k_only": args.split_k,
              "configs": configs, "tools": tools}
    out = args.out or Path(os.environ.get("OUT", ".")) / f"sanitize_{args.family}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    for t in tools:
        print(f"{args.family} {t['tool']}: errors={t['errors']} runs={t['runs']} "
              f"statuses={t['statuses']} clean={t['clean']}")
    return 0 if all(t["clean"] and t["all_ok"] for t in tools) else 1


if __name__ == "__main__":
    sys.exit(main())
