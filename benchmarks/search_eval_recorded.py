"""search-eval on the recorded H200 sweeps -> benchmarks/results/search_eval.json (CPU only).

    PYTHONPATH=. python3 benchmarks/search_eval_recorded.py [--seeds 20] [--skinny-tpe]
    PYTHONPATH=. python3 benchmarks/search_eval_recorded.py --ci

--ci re-measures the CI check instead (benchmarks/results/search_eval_ci.json: its sweep,
seeds and threshold kept, its ``measured`` trials to the threshold per seed rewritten).

decode2_h200 (20 decode shapes, 40 TPE-proposed configs each): tpe, random, grid.
skinny_correctness (7 edge shapes, 48 uniform random configs each): random and grid; tpe only
with --skinny-tpe (its proposals rarely land on 48 of up to 6393 valid configs, so a run is
mostly NOT_RECORDED asks and stall fallbacks: minutes per sweep on two cores).
decode_h200 is skipped by search-eval itself (recorded under an earlier space).
"""
from __future__ import annotations

import argparse
import json
import os
from datetime import date
from importlib.metadata import version
from pathlib import Path

from tunefw.evaluate.sweepfile import read_sweep
from tunefw.tune.search_eval import DEFAULT_BUDGETS, run_search, search_eval, summarize

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "benchmarks" / "sweeps"
LIMITS = ("The recorded sweeps are not full sweeps: decode2_h200 holds the 40 configs one TPE "
          "run proposed per shape (0.6% of 6225-7086 valid configs), skinny_correctness 48 "
          "uniform random valid configs per edge shape (1.2-25% of 189-6393). search-eval "
          "searches among those configs only (others NOT_RECORDED: told as failures, not "
          "counted), so it says how fast a sampler finds the best of the recorded subset, not "
          "of the space; on TPE-proposed subsets the subset itself came from TPE (biased in its "
          "favour), and budgets of 64 and 128 exceed the 40-48 configs held (every run ends "
          "with the subset's best). Issue 17's acceptance (<= 10% of the valid space, the "
          "64-trial budget within 2% of the space's best) needs the full recorded sweeps of its "
          "Deliver 1, which need GPU time not spent yet.")


def assemble(parts: list[dict]) -> dict:
    """One result from several search_eval() runs (their sweeps, skips and samplers merged)."""
    samplers = []
    for part in parts:
        samplers += [s for s in part["samplers"] if s not in samplers]
    result = dict(parts[0], samplers=samplers, sweeps=[e for p in parts for e in p["sweeps"]],
                  skipped=[s for p in parts for s in p["skipped"]])
    result["left_out"] = {k: v for p in parts for k, v in p["left_out"].items() if k not in samplers}
    result["summary"] = summarize(result["sweeps"], samplers)
    result.update(date="2026-12-01", device="NVIDIA H200 (recorded), search-eval on CPU",
                  script="benchmarks/search_eval_recorded.py", limits=LIMITS,
                  sources={"decode2_h200": ["tpe", "random", "grid"],
                           "skinny_correctness": [s for p in parts[1:] for s in p["samplers"]]})
    return result


def measure_ci(path: Path) -> None:
    """Rewrite the CI file's per-seed trials to its threshold (tpe and random, 64 trials)."""
    ci = json.loads(path.read_text())
    sweep = read_sweep(ROOT / ci["sweep"])
    target = sweep.reference()[0] * (1 - ci["within"])
    ci["measured"] = {name: [run_search(sweep, name, seed, 64).trials_to(target)
                             for seed in range(ci["seeds"])] for name in ("tpe", "random")}
    ci["measured"].update(optuna=version("optuna"), date=date.today().isoformat())
    path.write_text(json.dumps(ci, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--skinny-tpe", action="store_true")
    ap.add_argument("--ci", action="store_true", help="re-measure search_eval_ci.json only")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "search_eval.json"))
    args = ap.parse_args()
    if args.ci:
        measure_ci(ROOT / "benchmarks" / "results" / "search_eval_ci.json")
        return
    budgets = list(DEFAULT_BUDGETS)
    out = Path(args.out).resolve()
    os.chdir(ROOT)  # the result names each sweep by its path in the repository
    sweeps = SWEEPS.relative_to(ROOT)
    parts = [search_eval([str(sweeps / "decode2_h200"), str(sweeps / "decode_h200")],
                         ["tpe", "random", "grid"], args.seeds, budgets),
             search_eval([str(sweeps / "skinny_correctness")],
                         (["tpe"] if args.skinny_tpe else []) + ["random", "grid"],
                         args.seeds, budgets)]
    out.write_text(json.dumps(assemble(parts), indent=1) + "\n")


if __name__ == "__main__":
    main()
