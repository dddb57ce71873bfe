"""Winners of a study -> dispatch table (JSON, versioned schema), CSV, or a C++ header."""
from __future__ import annotations

import csv
import io
import json
from dataclasses import replace
from pathlib import Path

from tunefw.errors import UserError
from tunefw.export.cpp import render_cpp
from tunefw.export.files import write_atomic
from tunefw.templates import FAMILIES, changed_source
from tunefw.runtime.dispatch import DEFAULT_MIN_RATIO, DispatchEntry, DispatchTable, apply_min_ratio
from tunefw.store import Store
from tunefw.store import queries as q
from tunefw.store.models import Winner

FORMATS = ("json", "csv", "cpp")


def build_table(store: Store, study_name: str | None, allow_mixed: bool = False,
                min_ratio: float = DEFAULT_MIN_RATIO) -> DispatchTable:
    """One entry per problem: its confirmed winner, else its best OK trial (by ratio to cuBLAS);
    an entry whose ratio is below ``min_ratio`` (or unknown), or whose family's kernel source
    changed since it was measured, is a cuBLAS route with its reason."""
    if not (min_ratio >= 0 and min_ratio < float("inf")):
        raise UserError(f"--min-ratio {min_ratio}: expected a finite number >= 0")
    with store.session() as s:
        study = q.get_study(s, study_name)
        entries, fingerprints, evaluators = [], {}, set()
        for prow in study.problems:
            winner = s.get(Winner, prow.id)
            if winner is not None:
                trial = s.get(q.Trial, winner.trial_id)
                tflops, cublas = winner.tflops, winner.cublas_tflops
                what = "confirmed" if winner.confirmed else "screened"
            else:
                trial = q.best_trial(s, prow, study.round)
                if trial is None:
                    continue
                tflops, cublas, what = trial.tflops, trial.cublas_tflops, "screened"
            fingerprints.setdefault(trial.fingerprint_key, trial.fingerprint)
            evaluators.add(trial.evaluator)
            config = FAMILIES[trial.family].upgrade(trial.config) if trial.family in FAMILIES else trial.config
            entry = DispatchEntry(prow.M, prow.N, prow.K, prow.dtype, prow.layout, trial.family,
                                  config, tflops, cublas, trial.id, label=prow.label or "",
                                  source_hash=trial.source_hash or None, gate=prow.gate)
            entries.append(_source_unchanged(apply_min_ratio(entry, min_ratio, what),
                                             trial.source_hash))
        if not entries:
            raise UserError(f"study {study.name!r} has no OK trial to export (launch it first)")
        entries.sort(key=lambda e: (e.dtype, e.layout, e.gate, e.N, e.K, e.M))  # grouped by layer
        if len(fingerprints) > 1 and not allow_mixed:
            names = sorted({fp.get("name", "?") for fp in fingerprints.values()})
            raise UserError(f"study {study.name!r} mixes results from {len(fingerprints)} devices "
                            f"({', '.join(names)}): pass --allow-mixed-devices to export anyway")
        fingerprint = next(iter(fingerprints.values())) if len(fingerprints) == 1 else {
            "mixed": list(fingerprints.values())}
        return DispatchTable(simulated="sim" in evaluators, fingerprint=fingerprint,
                             entries=entries, min_ratio=min_ratio)


def _source_unchanged(entry: DispatchEntry, measured: str) -> DispatchEntry:
    """The entry as a cuBLAS route when its family's kernel source changed since the trial was
    measured: the kernel a runtime would build from today's source was never timed or verified."""
    now = changed_source(entry.family, measured)
    if entry.is_cublas or now is None:
        return entry
    return replace(entry, route="cublas", reason=f"{entry.family}'s kernel source changed since "
                   f"trial {entry.trial_id} was measured ({measured} -> {now}): launch a new "
                   "round to tune it again")


def render(table: DispatchTable, fmt: str) -> str:
    """The table as dispatch.json (version 2), CSV, or a C++ header."""
    if fmt == "json":
        return json.dumps(table.as_dict(), indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["M", "N", "K", "dtype", "layout", "label", "family", "config", "tflops",
                         "cublas_tflops", "ratio", "trial_id", "route", "reason", "simulated",
                         "gate"])
        for e in table.entries:
            writer.writerow([e.M, e.N, e.K, e.dtype, e.layout, e.label, e.family,
                             json.dumps(e.config, sort_keys=True), e.tflops, e.cublas_tflops,
                             "" if e.ratio is None else f"{e.ratio:.4f}", e.trial_id, e.route,
                             e.reason or "", table.simulated, e.gate])
        return out.getvalue()
    if fmt == "cpp":
        return render_cpp(table)
    raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")


def export(store: Store, path: Path, study_name: str | None, fmt: str,
           allow_mixed: bool = False, min_ratio: float = DEFAULT_MIN_RATIO) -> DispatchTable:
    """Write the study's dispatch table to ``path``; nothing is written on error."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    table = build_table(store, study_name, allow_mixed, min_ratio)
    text = render(table, fmt)
    write_atomic(path, text)
    return table


def export_table(table: DispatchTable, path: Path, fmt: str) -> DispatchTable:
    """Write an already loaded table (e.g. a calibrated dispatch.json) in ``fmt``."""
    write_atomic(path, render(table, fmt))
    return table
