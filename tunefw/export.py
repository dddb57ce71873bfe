"""Winners of a study -> dispatch table (JSON, versioned schema) or CSV."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from tunefw.dispatch import DispatchEntry, DispatchTable
from tunefw.errors import UserError
from tunefw.store import Store
from tunefw.store import queries as q
from tunefw.store.models import Winner

FORMATS = ("json", "csv")


def build_table(store: Store, study_name: str | None, allow_mixed: bool = False) -> DispatchTable:
    """One entry per problem: its confirmed winner, else its best OK trial."""
    with store.session() as s:
        study = q.get_study(s, study_name)
        entries, fingerprints, evaluators = [], {}, set()
        for prow in study.problems:
            winner = s.get(Winner, prow.id)
            if winner is not None:
                trial = s.get(q.Trial, winner.trial_id)
                tflops, cublas = winner.tflops, winner.cublas_tflops
            else:
                trial = q.best_trial(s, prow, study.round)
                if trial is None:
                    continue
                tflops, cublas = trial.tflops, trial.cublas_tflops
            fingerprints.setdefault(trial.fingerprint_key, trial.fingerprint)
            evaluators.add(trial.evaluator)
            entries.append(DispatchEntry(prow.M, prow.N, prow.K, prow.dtype, prow.layout,
                                         trial.family, trial.config, tflops, cublas, trial.id))
        if not entries:
            raise UserError(f"study {study.name!r} has no OK trial to export (launch it first)")
        if len(fingerprints) > 1 and not allow_mixed:
            names = sorted({fp.get("name", "?") for fp in fingerprints.values()})
            raise UserError(f"study {study.name!r} mixes results from {len(fingerprints)} devices "
                            f"({', '.join(names)}): pass --allow-mixed-devices to export anyway")
        fingerprint = next(iter(fingerprints.values())) if len(fingerprints) == 1 else {
            "mixed": list(fingerprints.values())}
        return DispatchTable(simulated="sim" in evaluators, fingerprint=fingerprint,
                             entries=entries)


def render(table: DispatchTable, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(table.as_dict(), indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["M", "N", "K", "dtype", "layout", "family", "config", "tflops",
                         "cublas_tflops", "trial_id", "simulated"])
        for e in table.entries:
            writer.writerow([e.M, e.N, e.K, e.dtype, e.layout, e.family,
                             json.dumps(e.config, sort_keys=True), e.tflops, e.cublas_tflops,
                             e.trial_id, table.simulated])
        return out.getvalue()
    raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")


def export(store: Store, path: Path, study_name: str | None, fmt: str,
           allow_mixed: bool = False) -> DispatchTable:
    """Write the study's dispatch table to ``path``; nothing is written on error."""
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}")
    table = build_table(store, study_name, allow_mixed)
    text = render(table, fmt)
    tmp = Path(str(path) + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror})") from None
    return table
