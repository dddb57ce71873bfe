"""The summary of benchmarks/record_sweeps_h200.py, built from its state database and the sweep
files it exported: the device and its clocks per call, and per shape and study the configs
measured, their outcomes, the best screened and the confirmed ratio to cuBLAS."""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from tunefw.evaluate.sweepfile import read_sweep
from tunefw.outcome import Status, cublas_ratio
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.store.models import Winner

REPO = Path(__file__).resolve().parent.parent
# read at one moment on the study's first GPU: the per-call clocks say more
MOMENT_KEYS = ("uuid", "sm_clock_mhz", "power_w", "temperature_c")


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def shape_part(s, study, prow, sweep_path: Path) -> dict:
    """One study's record of one problem: counts, outcomes, ratios, the confirmed winner."""
    rows = q.problem_trials(s, study, prow)
    counts = q.outcome_counts(s, prow, study.round)
    ok = [t for t in rows if t.status == Status.OK.value and t.ratio is not None]
    winner = s.get(Winner, prow.id)
    sweep = read_sweep(sweep_path)
    cov = sweep.header["coverage"]
    confirmed = None
    if winner is not None and winner.confirmed:
        screened = next((t.ratio for t in rows if t.id == winner.trial_id), None)
        confirmed = {"ratio": round(cublas_ratio(winner.tflops, winner.cublas_tflops) or 0, 4),
                     "tflops": winner.tflops, "cublas_tflops": winner.cublas_tflops,
                     "screened_ratio": screened, "trial_id": winner.trial_id,
                     "config": winner.config}
    return {"evaluated": q.evaluated_count(counts), "outcomes": dict(sorted(counts.items())),
            "distinct_configs": cov["distinct_measured"], "valid_space": cov.get("valid_space"),
            "fraction_of_valid": cov.get("fraction"),
            "reused": sum(t.reused_from is not None for t in rows),
            "best_screened_ratio": round(max(t.ratio for t in ok), 4) if ok else None,
            "median_screened_ratio": _median([t.ratio for t in ok]),
            "cublas_tflops_median": _median([t.cublas_tflops for t in ok if t.cublas_tflops]),
            "confirmed": confirmed, "sweep_rows": len(sweep.rows),
            "sweep": f"benchmarks/sweeps/{sweep_path.relative_to(sweep_path.parents[2])}"}


def _union(parts: dict[str, dict], keys: set[str]) -> dict:
    """Over a shape's studies: distinct configs, and the best confirmed ratio and its study."""
    confirmed = [(p["confirmed"]["ratio"], name) for name, p in parts.items() if p["confirmed"]]
    best = max(confirmed) if confirmed else (None, None)
    screened = [p["best_screened_ratio"] for p in parts.values() if p["best_screened_ratio"]]
    return {"distinct_configs": len(keys), "best_confirmed_ratio": best[0],
            "best_confirmed_by": best[1], "best_screened_ratio": max(screened, default=None)}


def _clocks(calls: list[dict]) -> list[dict]:
    """Per call: the SM and memory clocks, power and temperature nvidia-smi read at its start
    and end, each as the range over the GPUs."""
    def span(readings: Any, field: str) -> list[float] | None:
        values = [float(g[field]) for g in readings if isinstance(readings, list)
                  and g.get(field, "").replace(".", "", 1).isdigit()]
        return [min(values), max(values)] if values else None

    return [{"call": c["call"], "started_utc": c["started_utc"], "ended_utc": c.get("ended_utc"),
             **{f"{when}_{field.replace('.', '_')}": span(c.get(f"clocks_{when}"), field)
                for when in ("start", "end")
                for field in ("clocks.sm", "clocks.max.sm", "clocks.mem", "power.draw",
                              "temperature.gpu")}} for c in calls]


def summarize(db: str, parts: list, files: dict[str, list[Path]], calls: list[dict],
              sweeps_dir: Path, script: str) -> dict:
    """The summary JSON of a finished recording."""
    by_problem = {study: {read_sweep(p).problem.key(): p for p in paths}
                  for study, paths in files.items()}
    store = open_store(db)
    shapes: dict[str, dict] = {}
    keys: dict[str, set[str]] = {}
    stats, fingerprint, outcomes, families = {}, {}, {}, ""
    try:
        with store.session() as s:
            for part in parts:
                study = q.get_study(s, part.study)
                fingerprint = fingerprint or dict(study.fingerprint or {})
                families = ", ".join(study.spec.get("families") or ["every family"])
                stats[part.study] = study.stats
                for prow in study.problems:
                    entry = shapes.setdefault(prow.key, {"shape": f"{prow.M}x{prow.N}x{prow.K}",
                                                         "label": prow.label, "parts": {}})
                    one = shape_part(s, study, prow, by_problem[part.study][prow.key])
                    entry["parts"][part.study] = one
                    entry["valid_space"] = one["valid_space"]
                    keys.setdefault(prow.key, set()).update(
                        t.config_key for t in q.problem_trials(s, study, prow)
                        if t.status not in (Status.INVALID.value, Status.WORKER_LOST.value))
                    for status, n in one["outcomes"].items():
                        outcomes[status] = outcomes.get(status, 0) + n
    finally:
        store.close()
    for key, entry in shapes.items():
        entry["union"] = _union(entry["parts"], keys[key])
    sweep_files = sorted(sweeps_dir.rglob("*.jsonl.gz"))
    gpus = {(g.get("uuid"), g.get("name")) for c in calls if isinstance(c.get("clocks_start"), list)
            for g in c["clocks_start"]}
    uniform = next(p for p in parts if p.sampler == "uniform")
    tpe = [p for p in parts if p.sampler == "tpe"]
    return {
        "script": script, "date": (calls[-1].get("ended_utc") or "")[:10] if calls else None,
        "commit": ", ".join(sorted({c["commit"] for c in calls if c.get("commit")})) or None,
        "device": {k: v for k, v in fingerprint.items() if k not in MOMENT_KEYS},
        "gpus": [{"uuid": u, "name": n} for u, n in sorted(gpus, key=str)],
        "clocks": _clocks(calls), "calls": calls,
        "what": (f"per shape: a uniform sample of the valid space of {families} (sampler "
                 "uniform: the "
                 f"first {uniform.trials} valid configs of a seeded uniformly random order of "
                 "the declared space) and every config TPE proposed in "
                 f"{len(tpe)} seeded runs of {tpe[0].trials if tpe else 0} trials; each study a "
                 "real tunefw launch, anchored screens, its top configs confirmed; a config one "
                 "study measured is reused by another (reuse: true)"),
        "method": fingerprint.get("method"),
        "parts": [dict(vars(p)) for p in parts],
        "issue_sample_met": uniform.trials >= 2000 and len(tpe) >= 3
        and all(p.trials >= 160 for p in tpe),
        "shapes": list(shapes.values()),
        "totals": {"evaluated": sum(p["evaluated"] for e in shapes.values()
                                    for p in e["parts"].values()),
                   "outcomes": dict(sorted(outcomes.items())),
                   "distinct_configs": sum(len(k) for k in keys.values())},
        "sweeps": {"dir": f"benchmarks/sweeps/{sweeps_dir.name}", "files": len(sweep_files),
                   "bytes": sum(f.stat().st_size for f in sweep_files)},
        "launch_stats": stats,
    }


def print_table(result: dict) -> None:
    fmt = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    names = [p["study"] for p in result["parts"]]
    print(f"{'shape':>17} {'valid':>7} " + " ".join(f"{n[8:]:>14}" for n in names)
          + f" {'best conf.':>10} {'cuBLAS TF/s':>11}")
    for e in result["shapes"]:
        cells = []
        for name in names:
            p = e["parts"][name]
            conf = p["confirmed"]["ratio"] if p["confirmed"] else None
            cells.append(f"{p['evaluated']:>6} {fmt(conf, '.3f'):>7}")
        cublas = [p["cublas_tflops_median"] for p in e["parts"].values()
                  if p["cublas_tflops_median"]]
        print(f"{e['shape']:>17} {fmt(e['valid_space'], 'd'):>7} " + " ".join(
            f"{c:>14}" for c in cells) + f" {fmt(e['union']['best_confirmed_ratio'], '.3f'):>10}"
            f" {fmt(max(cublas, default=None), '.1f'):>11}")
    t = result["totals"]
    print(f"evaluated {t['evaluated']}, distinct configs {t['distinct_configs']}, outcomes "
          f"{t['outcomes']}; {result['sweeps']['files']} sweep files, "
          f"{result['sweeps']['bytes'] / 1e6:.2f} MB ({result['device'].get('name')}, "
          f"{len(result['gpus'])} distinct GPU(s) over {len(result.get('calls', []))} call(s), "
          f"commit {result['commit']})")
