"""``tunefw search-eval``: how many trials each sampler needs to find a recorded sweep's best.

Offline and in-process (no Ray, no database): for each sweep, sampler and seed, the search of a
sweep (``ProblemSearch``: the sampler, its seed configs, the screen, the stall fallback) asks
one config at a time and is told the recorded outcome, as the replay backend would tell it;
random and grid runs are drawn directly in the order those samplers would propose; ``uniform``
(the study sampler of that name) is random search without the family's seed configs, the
textbook baseline: where a seed config is already near the best, ``random``, which asks the seed
configs first as TPE does, finds it as soon as TPE does.
The search space is the sweep's measured configs: a config the sweep does not hold is
NOT_RECORDED, screened out like a config check() rejects (TPE draws again where a draw holds
no recorded config), told to the sampler as a failure and not counted: trials are evaluated
recorded configs only; so on a sweep that holds a subset of the valid space this measures the
search among that subset (a recorded TPE run's proposals are a biased subset: search-eval on
them says how fast a sampler finds their best, not the space's).
"""
from __future__ import annotations

import contextlib
import math
import multiprocessing
import random
import statistics
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import date
from itertools import repeat
from typing import Iterable

import optuna

from tunefw.device import H200, DeviceSpec
from tunefw.errors import UserError
from tunefw.evaluate.sweepfile import Sweep, merge_sweeps, read_sweep, sweep_paths
from tunefw.outcome import Status
from tunefw.templates import config_key, get_family
from tunefw.tune.sampling import TPE_SETTINGS
from tunefw.tune.search import ProblemSearch
from tunefw.tune.space import space_index

SAMPLERS = (*TPE_SETTINGS, "random", "uniform", "grid", "cmaes")
DEFAULT_SAMPLERS = ("tpe", "random", "grid")
LEFT_OUT = {"cmaes": "Optuna's CmaEsSampler needs the cmaes package (not installed here) and "
                     "proposes off the recorded configs nearly always (no screen)",
            "gp": "Optuna's GPSampler costs about a second an ask on two cores and is told "
                  "every NOT_RECORDED proposal; not run here"}
THRESHOLDS = (0.01, 0.02, 0.05)
DEFAULT_BUDGETS = (16, 32, 64, 128)
ASK_CAP = 200  # asks per evaluated trial before a run is called stuck


class _Restricted:
    """The search's ``known``: measured configs and every config the sweep does not hold."""

    def __init__(self, measured: dict, space: set) -> None:
        self.measured, self.space = measured, space

    def __contains__(self, key: object) -> bool:
        return key in self.measured or key not in self.space


@dataclass
class RunResult:
    """One seeded search of one sweep: each evaluated trial's ratio (None: not OK)."""

    values: list[float | None] = field(default_factory=list)
    asks: int = 0
    not_recorded: int = 0
    invalid: int = 0
    redraws: int = 0  # TPE draws the screen refused and drew again (no ask, no trial)
    exhausted: bool = False

    def trials_to(self, target: float) -> int | None:
        """1-based count of evaluated trials until one reaches ``target``; None if none did."""
        for i, v in enumerate(self.values, 1):
            if v is not None and v >= target:
                return i
        return None

    def best_at(self, budget: int) -> float | None:
        ok = [v for v in self.values[:budget] if v is not None]
        return max(ok) if ok else None


def _drawn(sweep: Sweep, order: list[str]) -> RunResult:
    """A run that evaluates the recorded configs in the given order (every one, no asks lost)."""
    rows, result = sweep.by_key(), RunResult()
    for key in order:
        row = rows[key]
        result.values.append(row.ratio if row.outcome == Status.OK.value else None)
    result.asks, result.exhausted = len(result.values), True
    return result


def _random_order(sweep: Sweep, space: set, seed: int, device: DeviceSpec,
                  seeded: bool = True) -> RunResult:
    """The random sampler's run, drawn directly: the search's seed configs first (those the
    sweep holds; not ``seeded``: none), then the rest of the space in a uniformly random
    order. The same distribution as rejection-sampling the declared space (uniform there, so
    uniform over the recorded configs not yet measured), without its thousands of asks."""
    order: list[str] = []
    for fam in sorted(sweep.header["space_hashes"]) if seeded else ():
        family = get_family(fam)
        for config in family.seed_configs():
            key = config_key(fam, config)
            if key in space and key not in order and family.check(config, sweep.problem,
                                                                  device) is None:
                order.append(key)
    rest = sorted(space - set(order))
    random.Random(seed).shuffle(rest)
    return _drawn(sweep, order + rest)


def _grid_order(sweep: Sweep, space: set) -> RunResult:
    """The grid's run, drawn directly: the recorded configs in the declared order, what the
    search's grid proposes when every other config is known, without walking the declared
    space to them (80 s for wgmma_sm90)."""
    families, rows = sorted(sweep.header["space_hashes"]), sweep.by_key()
    return _drawn(sweep, sorted(space, key=lambda k: (
        families.index(rows[k].family), space_index(get_family(rows[k].family), rows[k].config))))


def run_search(sweep: Sweep, sampler: str, seed: int, budget: int,
               device: DeviceSpec = H200) -> RunResult:
    """Search the sweep's recorded configs with ``sampler`` for ``budget`` evaluated trials."""
    rows = sweep.by_key()
    space = {k for k, r in rows.items() if r.outcome != Status.INVALID.value}
    if sampler in ("random", "uniform", "grid"):
        run = _grid_order(sweep, space) if sampler == "grid" else \
            _random_order(sweep, space, seed, device, seeded=sampler == "random")
        run.values = run.values[:budget]
        return run
    families = sorted(sweep.header["space_hashes"])
    search = ProblemSearch(optuna.storages.InMemoryStorage(), f"search-eval/{seed}", sampler,
                           seed, families, sweep.problem, device)
    measured: dict[str, float | None] = {}
    known = _Restricted(measured, space)
    result = RunResult()
    top = sweep.best_ratio()
    # Past the sweep's best ratio nothing can improve: stop there (exact, and the late asks
    # of a nearly enumerated space are the costly ones: each stalls up to STALL_LIMIT times).
    while len(result.values) < min(budget, len(space)) and not (
            top is not None and result.values and (result.best_at(budget) or 0.0) >= top):
        if result.asks > ASK_CAP * (len(result.values) + 1):
            break
        prop = search.ask(known)
        if prop is None:
            result.exhausted = True
            break
        result.asks += 1
        if prop.invalid_reason is not None:
            result.invalid += 1
            search.tell(prop.trial, None)
        elif prop.key in measured:  # a repeat: answered from the row, costs nothing
            search.tell(prop.trial, measured[prop.key])
        elif prop.key not in space:  # NOT_RECORDED: a failure to the sampler, not counted
            result.not_recorded += 1
            search.tell(prop.trial, None)
        else:
            row = rows[prop.key]
            value = row.ratio if row.outcome == Status.OK.value else None
            search.tell(prop.trial, value)
            measured[prop.key] = value
            result.values.append(value)
    result.exhausted = result.exhausted or len(result.values) >= len(space)
    result.redraws = search.redraws
    return result


def _median(values: Iterable[float | None]) -> float | None:
    """Median with None as +inf (a seed that never got there): None if most never did."""
    vals = sorted(math.inf if v is None else v for v in values)
    if not vals:
        return None
    m = statistics.median(vals)
    return None if math.isinf(m) else m


def evaluate_sweep(sweep: Sweep, samplers: list[str], seeds: int, budgets: list[int],
                   device: DeviceSpec = H200, pool: Executor | None = None) -> dict:
    """Per sampler over the seeds: median trials to reach each threshold, median best per
    budget (the seeds' runs on ``pool``'s processes where given: the same runs, sooner)."""
    reference, kind = sweep.reference()
    if reference is None:
        raise UserError(f"{sweep.path}: no OK trial to measure against")
    space = len(sweep.measured())
    out = {"path": sweep.path, "study": sweep.header.get("study"),
           "problem": sweep.problem.key(), "label": sweep.header.get("label", ""),
           "recorded_sampler": sweep.header.get("sampler"), "space": space,
           "merged_from": sweep.header.get("merged_from"),
           "coverage": sweep.header.get("coverage"), "reference_ratio": round(reference, 5),
           "reference": kind, "best_ratio": round(sweep.best_ratio() or 0.0, 5), "samplers": {}}
    for name in samplers:
        if name == "grid":  # the declared order: one run is every seed's run
            runs = [run_search(sweep, name, 0, max(budgets), device)] * seeds
        else:
            runs = list((pool.map if pool else map)(run_search, repeat(sweep), repeat(name),
                                                     range(seeds), repeat(max(budgets)),
                                                     repeat(device)))
        entry: dict = {"median_trials_to": {}, "reached": {}, "median_best_at": {},
                       "median_asks": _median(r.asks for r in runs),
                       "median_not_recorded": _median(r.not_recorded for r in runs),
                       "median_invalid": _median(r.invalid for r in runs),
                       "median_redraws": _median(r.redraws for r in runs)}
        for t in THRESHOLDS:
            hits = [r.trials_to(reference * (1 - t)) for r in runs]
            entry["median_trials_to"][f"{t:.0%}"] = _median(hits)
            entry["reached"][f"{t:.0%}"] = sum(h is not None for h in hits)
        for b in budgets:
            best = _median(r.best_at(b) for r in runs)
            entry["median_best_at"][str(b)] = None if best is None else round(best, 5)
        # the convergence plot's line: the median best ratio after each evaluated trial
        curve = (_median(r.best_at(n) for r in runs) for n in range(1, max(budgets) + 1))
        entry["median_best_curve"] = [None if v is None else round(v, 4) for v in curve]
        out["samplers"][name] = entry
    return out


def search_eval(paths: list[str], samplers: list[str], seeds: int, budgets: list[int],
                progress=None, merge: bool = False, jobs: int = 1) -> dict:
    """Run search-eval over sweep files/directories; sweeps of an earlier space are skipped.
    ``merge``: the sweeps of one problem (a uniform sample and TPE runs of it) are searched as
    one, the union of their configs. ``jobs``: processes the seeds' runs share."""
    bad = [s for s in samplers if s not in SAMPLERS]
    if bad:
        raise UserError(f"--samplers {','.join(bad)}: expected some of {', '.join(SAMPLERS)}"
                        + "".join(f"; {s}: {LEFT_OUT[s]}" for s in bad if s in LEFT_OUT))
    if seeds < 1 or not budgets or min(budgets) < 1 or jobs < 1:
        raise UserError("--seeds, --budgets and --jobs: expected positive numbers")
    files = [f for p in paths for f in sweep_paths(p)]
    result = {"script": "tunefw search-eval", "date": date.today().isoformat(),
              "samplers": samplers,
              "left_out": {k: v for k, v in LEFT_OUT.items() if k not in samplers},
              "seeds": seeds, "budgets": budgets, "thresholds": [f"{t:.0%}" for t in THRESHOLDS],
              "method": ("each run asks one config at a time (no parallel asks) and is told the "
                         "recorded screened ratio; the space is each sweep's measured configs "
                         "(others NOT_RECORDED: told as failures, not counted); trials to reach "
                         "X% = evaluated trials until a ratio >= (1-X) x the reference; median "
                         "over seeds, null where most seeds never reached it"),
              "counted": ("trials (budgets, trials to X%) count evaluated recorded configs "
                          "only; INVALID and NOT_RECORDED proposals, repeats and TPE's screen "
                          "redraws are not trials: asks, median_invalid, median_not_recorded "
                          "and median_redraws say what they cost"),
              "merged": merge, "sweeps": [], "skipped": []}
    sweeps: dict[str, list[Sweep]] = {}  # by problem where merged, else by file
    for file in files:
        sweep = read_sweep(file)
        stale = sweep.stale_families()
        if stale:
            result["skipped"].append({"path": str(file), "reason": "recorded under an earlier "
                                      f"{', '.join(stale)} parameter space than today's"})
            continue
        sweeps.setdefault(sweep.problem.key() if merge else str(file), []).append(sweep)
    with contextlib.ExitStack() as stack:
        pool = None if jobs == 1 else stack.enter_context(ProcessPoolExecutor(
            jobs, mp_context=multiprocessing.get_context("spawn")))
        for group in sweeps.values():
            sweep = merge_sweeps(group) if len(group) > 1 else group[0]
            entry = evaluate_sweep(sweep, samplers, seeds, budgets, pool=pool)
            result["sweeps"].append(entry)
            if progress:
                progress(entry)
    result["summary"] = summarize(result["sweeps"], samplers)
    return result


def summarize(entries: list[dict], samplers: list[str]) -> dict:
    """Per sampler over the sweeps: median of the per-sweep medians, sweeps reached in budget."""
    out = {}
    for name in samplers:
        have = [e for e in entries if name in e["samplers"]]
        per = [e["samplers"][name] for e in have]
        out[name] = {
            "median_trials_to": {t: _median(p["median_trials_to"][t] for p in per)
                                 for t in (f"{x:.0%}" for x in THRESHOLDS)},
            "sweeps_within_2pct_at_64": sum(
                1 for e, p in zip(have, per) if p["median_best_at"].get("64") is not None
                and p["median_best_at"]["64"] >= 0.98 * e["reference_ratio"]),
            "sweeps": len(per)}
        if name != "random":  # issue 17's bar: fewer trials to 2% than random search
            pairs = [(e["samplers"][name]["median_trials_to"]["2%"],
                      e["samplers"]["random"]["median_trials_to"]["2%"])
                     for e in have if "random" in e["samplers"]]
            out[name]["sweeps_fewer_trials_to_2pct_than_random"] = sum(
                1 for a, b in pairs if a is not None and (b is None or a < b))
            out[name]["sweeps_compared_with_random"] = len(pairs)
    return out


def table_rows(result: dict) -> list[list[str]]:
    """The rows of the printed table: sweep, space, sampler, trials to 1/2/5%, best at budgets."""
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    rows = []
    for e in result["sweeps"]:
        for name, s in e["samplers"].items():  # noqa: B007
            rows.append([f"{e['study']}/{e['problem'].split(':')[0]}", str(e["space"]), name]
                        + [fmt(s["median_trials_to"][t], "g") for t in result["thresholds"]]
                        + [fmt(s["median_best_at"][str(b)], ".3f") for b in result["budgets"]])
    return rows
