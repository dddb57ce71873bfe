"""search-eval on the recorded H200 sweeps -> benchmarks/results/search_eval.json, its table and
the convergence plot search_eval.png (CPU only).

    PYTHONPATH=. python3 benchmarks/search_eval_recorded.py [--seeds 20] [--skinny-tpe]
        [--sources records,decode2,skinny] [--jobs N]
    PYTHONPATH=. python3 benchmarks/search_eval_recorded.py --ci

--ci re-measures the CI check instead (benchmarks/results/search_eval_ci.json: its sweep,
seeds and threshold kept, its ``measured`` trials to the threshold per seed rewritten).

records (benchmarks/sweeps/wgmma_sm90_h200/, from benchmarks/record_sweeps_h200.py: per shape
a uniform sample of the valid space and three seeded TPE runs, searched as one sweep per shape,
their union): tpe, random, uniform (random search without the seed configs), grid, and issue
17's acceptance figures; the plot shows these.
decode2_h200 (20 decode shapes, 40 TPE-proposed configs each): tpe, random, grid.
skinny_correctness (7 edge shapes, 48 uniform random configs each): random and grid; tpe only
with --skinny-tpe (its proposals rarely land on 48 of up to 6393 valid configs, so a run is
mostly NOT_RECORDED asks and stall fallbacks: minutes per sweep on two cores).
decode_h200 is skipped by search-eval itself (recorded under an earlier space).
"""
from __future__ import annotations

import argparse
import json
import math
import os
from datetime import date
from importlib.metadata import version
from pathlib import Path

from tunefw.evaluate.sweepfile import read_sweep
from tunefw.tune.search_eval import (DEFAULT_BUDGETS, run_search, search_eval, summarize,
                                     table_rows)

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = ROOT / "benchmarks" / "sweeps"
RECORDS = SWEEPS / "wgmma_sm90_h200"
SOURCES = ("records", "decode2", "skinny")
LIMITS = {
    "records": ("The full recorded sweeps hold per shape a uniform sample of the valid space "
                "(2000 configs; each sweep's coverage counts its valid space) and every config "
                "three seeded TPE "
                "runs proposed; search-eval searches their union (others NOT_RECORDED: told as "
                "failures, not counted), so 'within X% of the best' is of the best recorded "
                "config, and the TPE-proposed part of each union is biased towards TPE's own "
                "picks (the uniform part is not). Trials as a share of the valid space are "
                "therefore small by construction; the share of the recorded configs and the "
                "comparison with random search over the same configs are what they say."),
    "subsets": ("decode2_h200 holds the 40 configs one TPE run proposed per shape (0.6% of "
                "6225-7086 valid configs), skinny_correctness 48 uniform random valid configs "
                "per edge shape (1.2-25% of 189-6393): search-eval finds the best of those "
                "subsets, biased in TPE's favour on TPE-proposed ones, and budgets of 64 and "
                "128 exceed the 40-48 configs held (every run ends with the subset's best)."),
}


def acceptance(part: dict) -> dict:
    """Issue 17's acceptance on the full recorded sweeps, per sweep: the default sampler's
    median trials to within 2% as a share of the valid space and of the recorded configs,
    against random search's (fewer, or both at the first trial), and whether its 64-trial
    budget gets within 2%. Random search is ``uniform`` where it ran (no seed configs: tunefw's
    own random sampler asks the family's seed configs first, as TPE does, and ties it wherever
    one of them is already near the best), tunefw's ``random`` otherwise; the other one's
    figures stay beside it."""
    rows = []
    for e in part["sweeps"]:
        tpe, rnd = e["samplers"]["tpe"], e["samplers"]["random"]
        base = e["samplers"].get("uniform", rnd)
        t2, r2 = tpe["median_trials_to"]["2%"], rnd["median_trials_to"]["2%"]
        b2 = base["median_trials_to"]["2%"]
        valid = (e.get("coverage") or {}).get("valid_space")
        at64 = tpe["median_best_at"].get("64")
        rows.append({"problem": e["problem"], "label": e["label"], "valid_space": valid,
                     "recorded": e["space"], "tpe_trials_to_2pct": t2,
                     "random_trials_to_2pct": r2,
                     "uniform_trials_to_2pct": base["median_trials_to"]["2%"]
                     if "uniform" in e["samplers"] else None,
                     "baseline": "uniform" if "uniform" in e["samplers"] else "random",
                     "share_of_valid": None if t2 is None or not valid else round(t2 / valid, 6),
                     "share_of_recorded": None if t2 is None else round(t2 / e["space"], 4),
                     "within_10pct_of_valid": t2 is not None and bool(valid)
                     and t2 <= 0.1 * valid,
                     # both at the first trial: no sampler can be below that, so the tie is
                     # kept as such, not counted as a loss
                     "tied_at_first_trial": t2 == b2 == 1,
                     "fewer_than_baseline": t2 is not None and (b2 is None or t2 < b2),
                     "fewer_than_random": t2 is not None and (r2 is None or t2 < r2),
                     "within_2pct_at_64": at64 is not None
                     and at64 >= 0.98 * e["reference_ratio"]})
    at64 = sum(r["within_2pct_at_64"] for r in rows)
    need = math.ceil(0.8 * len(rows))
    search = bool(rows) and all(r["within_10pct_of_valid"] and (
        r["fewer_than_baseline"] or r["tied_at_first_trial"]) for r in rows)
    reached = sorted(r["tpe_trials_to_2pct"] for r in rows if r["tpe_trials_to_2pct"] is not None)
    return {"sweeps": rows, "within_2pct_at_64": at64,
            # the budget whose median run gets within 2% on four of five sweeps (the README's
            # where 64 does not), and on every one
            "budget_within_2pct_on_most": math.ceil(reached[need - 1]) if len(reached) >= need
            else None,
            "budget_within_2pct_on_all": math.ceil(reached[-1])
            if rows and len(reached) == len(rows) else None,
            # the search's bars (its share of the space, fewer trials than random search) and,
            # with them, the default budget's; where 64 falls short the issue asks the README to
            # name the budget that does (tests/test_search_eval_merge.py checks that it does)
            "search_pass": search, "pass": search and at64 >= need}


def assemble(parts: dict[str, dict]) -> dict:
    """One result from the sources' search_eval() runs (sweeps, skips and samplers merged),
    a summary per source, and the acceptance figures where the full sweeps were searched."""
    samplers: list[str] = []
    for part in parts.values():
        samplers += [s for s in part["samplers"] if s not in samplers]
    first = next(iter(parts.values()))
    result = dict(first, samplers=samplers,
                  sweeps=[e for p in parts.values() for e in p["sweeps"]],
                  skipped=[s for p in parts.values() for s in p["skipped"]],
                  merged={name: p["merged"] for name, p in parts.items()})
    result["left_out"] = {k: v for p in parts.values() for k, v in p["left_out"].items()
                          if k not in samplers}
    result["summary"] = summarize(result["sweeps"], samplers)
    result["summary_by_source"] = {name: p["summary"] for name, p in parts.items()}
    kinds = dict.fromkeys("records" if name == "records" else "subsets" for name in parts)
    result.update(date=date.today().isoformat(),
                  device="NVIDIA H200 (recorded), search-eval on CPU",
                  script="benchmarks/search_eval_recorded.py",
                  limits=" ".join(LIMITS[kind] for kind in kinds),
                  sources={name: p["samplers"] for name, p in parts.items()})
    if "records" in parts:
        result["acceptance"] = acceptance(parts["records"])
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


def run_sources(sources: list[str], records: Path, seeds: int, skinny_tpe: bool,
                jobs: int) -> dict:
    """search_eval() of each source present (paths relative to the repository)."""
    budgets = list(DEFAULT_BUDGETS)
    rel = lambda p: str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)  # noqa: E731
    parts = {}
    if "records" in sources and records.is_dir():
        parts["records"] = search_eval([rel(records)], ["tpe", "random", "uniform", "grid"],
                                       seeds, budgets, merge=True, jobs=jobs)
    if "decode2" in sources:
        parts["decode2"] = search_eval([rel(SWEEPS / "decode2_h200"),
                                        rel(SWEEPS / "decode_h200")],
                                       ["tpe", "random", "grid"], seeds, budgets, jobs=jobs)
    if "skinny" in sources:
        parts["skinny"] = search_eval([rel(SWEEPS / "skinny_correctness")],
                                      (["tpe"] if skinny_tpe else []) + ["random", "grid"],
                                      seeds, budgets, jobs=jobs)
    return parts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--skinny-tpe", action="store_true")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="processes for the seeded runs (the same results)")
    ap.add_argument("--sources", default=",".join(SOURCES), help="some of " + ",".join(SOURCES))
    ap.add_argument("--records", type=Path, default=RECORDS, help="the full recorded sweeps")
    ap.add_argument("--ci", action="store_true", help="re-measure search_eval_ci.json only")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "benchmarks" / "results" / "search_eval.json")
    ap.add_argument("--plot", type=Path, help="default: --out with .png")
    args = ap.parse_args(argv)
    if args.ci:
        measure_ci(ROOT / "benchmarks" / "results" / "search_eval_ci.json")
        return 0
    sources = [s for s in args.sources.split(",") if s]
    if not set(sources) <= set(SOURCES) or not sources:
        ap.error(f"--sources {args.sources}: expected some of {','.join(SOURCES)}")
    out, plot = args.out.resolve(), (args.plot or args.out.with_suffix(".png")).resolve()
    records = args.records.resolve()
    os.chdir(ROOT)  # the result names each sweep by its path in the repository
    parts = run_sources(sources, records, args.seeds, args.skinny_tpe, args.jobs)
    if not parts:
        raise SystemExit(f"nothing to search: no {records} and no other source chosen")
    result = assemble(parts)
    out.write_text(json.dumps(result, indent=1) + "\n")
    from tunefw.report.search_figures import search_eval_figure
    plot.write_bytes(search_eval_figure(parts.get("records") or next(iter(parts.values()))))
    shown = parts.get("records") or result
    for row in table_rows(shown):
        print("  ".join(row))
    if "acceptance" in result:
        acc = result["acceptance"]
        print(f"acceptance: {'PASS' if acc['pass'] else 'FAIL'}; search "
              f"{'PASS' if acc['search_pass'] else 'FAIL'}; tpe within 2% at 64 trials on "
              f"{acc['within_2pct_at_64']} of {len(acc['sweeps'])} sweeps, at "
              f"{acc['budget_within_2pct_on_most']} on most, at {acc['budget_within_2pct_on_all']} "
              "on all")
    print(f"wrote {out} and {plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
