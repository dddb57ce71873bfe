"""Run a sample of a family's configs under compute-sanitizer (memcheck, racecheck) on the GPU.

Each config is verified on small edge shapes as `tunefw verify --sanitize` verifies it (the
product's code: tunefw/measure/sanitize.py), under each tool: the strict verification (guard
bands, inputs unchanged, a second launch with the same bits, a small grid) in an isolated worker
the sanitizer follows, recording each tool's ERROR SUMMARY and the verdicts of its run. Writes
$OUT/sanitize_<family>.json (or --out).

    python3 benchmarks/sanitize_h200.py --family mma_sm80 --tools memcheck --sample 6
    python3 benchmarks/sanitize_h200.py --family wgmma_sm90 --tools memcheck,racecheck --split-k
    python3 benchmarks/sanitize_h200.py --family stream_sm90 --shapes 1x8x520,3x24x1032,9x1032x1040 --split-k
    python3 benchmarks/sanitize_h200.py --family wgmma_sm90 --tools memcheck,racecheck --split-k \
        --where SWAP_AB=1 --shapes 17x24x40,129x136x264,200x1000x520
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import sys
from pathlib import Path

SHAPES = [(17, 24, 40), (129, 136, 264), (300, 1000, 520)]
MAX_DRAWS = 200_000  # random draws before a sample that cannot be filled is an error


def split(config: dict) -> int:
    """How many ways the config splits K (SPLIT_K, or the decode families' cluster CK)."""
    return config.get("SPLIT_K", config.get("CK", 1))


def sample_configs(family: str, n: int, seed: int, split_k: bool = False,
                   where: dict | None = None, max_draws: int = MAX_DRAWS) -> list[dict]:
    """n random configs valid on every sample shape (the default first, where valid: a runtime
    given an invalid one serves cuBLAS, which the sanitizer would not test); split_k: the sampled ones
    all split K (the partial-sum and reduction path); where: knob values every config holds
    (e.g. SWAP_AB=1)."""
    from tunefw.device import H200
    from tunefw.problem import GemmProblem
    from tunefw.templates import get_family
    tpl = get_family(family)
    rng = random.Random(seed)
    problems = [GemmProblem(*s) for s in SHAPES]
    where = where or {}
    def fits(config: dict) -> bool:
        return (all(config[k] == v for k, v in where.items())
                and all(tpl.check(config, p, H200) is None for p in problems))
    configs = [c for c in [tpl.default_config()] if fits(c)]
    for _ in range(max_draws):
        if len(configs) >= n:
            break
        config = {**{p.name: rng.choice(p.values) for p in tpl.params}, **where}
        if split_k and split(config) == 1:
            continue
        if config not in configs and fits(config):
            configs.append(config)
    if len(configs) < n:  # e.g. split-K asked on a K that one stage of the asked BK covers
        shapes = ", ".join("x".join(map(str, (p.M, p.N, p.K))) for p in problems)
        raise SystemExit(f"--sample {n}: only {len(configs)} {family} config(s) in {max_draws} "
                         f"draws fit {where or 'any knob'}{' with split-K' if split_k else ''} "
                         f"on every shape ({shapes})")
    return configs


def parse_where(text: str | None) -> dict:
    """'KNOB=VALUE,...' -> {KNOB: value} (ints where the value is one)."""
    out = {}
    for part in filter(None, (text or "").split(",")):
        knob, _, value = part.partition("=")
        out[knob.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", required=True)
    ap.add_argument("--tools", default="memcheck")
    ap.add_argument("--sample", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=240, help="seconds per tool's whole run")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--split-k", action="store_true",
                    help="sample only configs that split K (after the default config)")
    ap.add_argument("--shapes", help="MxNxK,... instead of the default edge shapes (decode "
                    "families serve small M only)")
    ap.add_argument("--where", help="KNOB=VALUE,... every sampled config holds (e.g. SWAP_AB=1)")
    args = ap.parse_args()
    from tunefw.measure import sanitize
    from tunefw.measure.verify import Job
    from tunefw.problem import GemmProblem

    if args.shapes:
        SHAPES[:] = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    tools = sanitize.parse_tools(args.tools)
    configs = sample_configs(args.family, args.sample, args.seed, args.split_k,
                             parse_where(args.where))
    jobs = [Job(args.family, config, GemmProblem(*shape), f"config {i}")
            for i, config in enumerate(configs) for shape in SHAPES]
    runs = [sanitize.run_tool(t, jobs, timeout_s=args.timeout) for t in tools]
    result = {"script": "benchmarks/sanitize_h200.py", "date": datetime.date.today().isoformat(),
              "family": args.family, "shapes": SHAPES, "split_k_only": args.split_k,
              "where": parse_where(args.where),
              "configs": configs, "jobs": [j.as_dict() for j in jobs], "tools": runs}
    out = args.out or Path(os.environ.get("OUT", ".")) / f"sanitize_{args.family}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    for t in runs:
        print(f"{args.family} {t['tool']}: errors={t['errors']} verified={t['verified']} "
              f"statuses={t['statuses']} {sanitize.verdict(t)}")
    return 0 if all(t["clean"] and t["all_ok"] for t in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
