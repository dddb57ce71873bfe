"""`tunefw export --format sweep`: a study's rows as recorded-sweep files (the format:
tunefw/evaluate/sweepfile.py), one per problem, with the share of the valid space each holds."""
from __future__ import annotations

import functools
from pathlib import Path

from tunefw.device import H200, DeviceSpec
from tunefw.errors import UserError
from tunefw.evaluate.sweepfile import (FORMAT, SUFFIX, VERSION, Sweep, SweepRow, declared_spaces,
                                       problem_filename, write_sweep)
from tunefw.outcome import Status, cublas_ratio
from tunefw.problem import GemmProblem
from tunefw.store import queries as q
from tunefw.store.models import Winner
from tunefw.templates import FAMILIES, get_family
from tunefw.tune.space import count_valid


@functools.lru_cache(maxsize=256)
def valid_space(families: tuple[str, ...], problem: GemmProblem, device: DeviceSpec) -> int:
    """The valid-space size of the families for the problem (counted once per process: the
    sweeps of several studies of one problem share it)."""
    return count_valid(families, problem, device)


def coverage(rows: list[SweepRow], space_hashes: dict, problem: GemmProblem,
             device: DeviceSpec = H200) -> dict:
    """Distinct valid configs measured, out of the valid space of the declared families (the
    space size only where every family's recorded space is the current declaration)."""
    measured = {r.key: r for r in rows if r.outcome != Status.INVALID.value}
    stale = [f for f, h in space_hashes.items() if f not in FAMILIES
             or get_family(f).space_hash() != h]
    out: dict = {"distinct_measured": len(measured)}
    if stale:
        out.update(valid_space=None, fraction=None,
                   note=f"recorded under an earlier space of {', '.join(stale)}: its valid-space "
                        "size is not known to this tunefw")
        return out
    valid = valid_space(tuple(sorted(space_hashes)), problem, device)
    held = sum(1 for r in measured.values() if r.family in space_hashes
               and get_family(r.family).check(r.config, problem, device) is None)
    out.update(distinct_valid=held, valid_space=valid,
               fraction=round(held / valid, 5) if valid else None)
    return out


def _stable_fingerprint(fp: dict) -> dict:
    """The fingerprint without the clock, power and temperature read at one moment."""
    return {k: v for k, v in fp.items() if k not in ("sm_clock_mhz", "power_w", "temperature_c")}


def build_sweeps(store, study_name: str | None, problem_filter: GemmProblem | None = None,
                 source: str = "") -> list[Sweep]:
    """One Sweep per problem of the study's current round (the round's rows, first of each
    config, WORKER_LOST attempts left out; INVALID rows included with their reason)."""
    sweeps = []
    with store.session() as s:
        study = q.get_study(s, study_name)
        problems = [p for p in study.problems
                    if problem_filter is None or q.as_problem(p) == problem_filter]
        if not problems:
            raise UserError(f"study {study.name!r} has no problem "
                            f"{problem_filter.key() if problem_filter else ''}")
        if study.fingerprint is None:
            raise UserError(f"study {study.name!r} was never launched: nothing to export")
        for prow in problems:
            seen, rows = set(), []
            for t in q.problem_trials(s, study, prow):
                if t.config_key in seen or t.status == Status.WORKER_LOST.value:
                    continue  # a lost attempt: its retry's row is the config's outcome
                seen.add(t.config_key)
                ok = t.status == Status.OK.value
                first = (t.log or "").strip().splitlines()[:1]
                rows.append(SweepRow(t.family, t.config, t.status,
                                     cublas_ratio(t.tflops, t.cublas_tflops) if ok else None,
                                     t.median_ms if ok else None, t.tflops if ok else None,
                                     t.cublas_tflops if ok else None,
                                     "" if ok else (first[0][:200] if first else "")))
            winner = s.get(Winner, prow.id)
            problem = q.as_problem(prow)
            hashes = dict(study.space_hashes or {})
            header = {
                "format": FORMAT, "version": VERSION, "study": study.name,
                "round": study.round, "problem": problem.as_dict(), "label": prow.label,
                "space_hashes": hashes, "spaces": declared_spaces(hashes),
                "source_hashes": sorted({t.source_hash for t in q.problem_trials(s, study, prow)}),
                "method": study.fingerprint.get("method"),
                "fingerprint": _stable_fingerprint(study.fingerprint),
                "evaluator": study.backend, "sampler": study.spec.get("sampler"),
                "seed": study.spec.get("seed"), "budget": study.spec.get("trials"),
                "rows": len(rows), "source": source,
                "winner": None if winner is None else {
                    "family": winner.family, "config": winner.config, "tflops": winner.tflops,
                    "cublas_tflops": winner.cublas_tflops,
                    "ratio": cublas_ratio(winner.tflops, winner.cublas_tflops),
                    "confirmed": winner.confirmed, "trial_id": winner.trial_id},
                "coverage": coverage(rows, hashes, problem),
            }
            sweeps.append(Sweep(header, rows))
    return sweeps


def export_sweeps(store, study_name: str | None, out: Path, problem: GemmProblem | None = None,
                  source: str = "") -> list[Path]:
    """Write one sweep file per problem: ``out`` is a directory, or a file for one problem."""
    sweeps = build_sweeps(store, study_name, problem, source)
    out = Path(out)
    if str(out).endswith(SUFFIX):
        if len(sweeps) != 1:
            raise UserError(f"{out}: one file holds one problem, the study has {len(sweeps)} "
                            "(give a directory, or --problem MxNxK)")
        paths = [out]
    else:
        paths = [out / problem_filename(sw.problem) for sw in sweeps]
    for path, sw in zip(paths, sweeps):
        write_sweep(path, sw)
    return paths
