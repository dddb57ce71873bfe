"""`tunefw trial list` and `tunefw trial show`: a study's trials one row each, and one trial
whole (its problem and layer, config, outcome, timings, ptxas's figures, log)."""
from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table

from tunefw.cli.common import JSON_HELP, open_db, out, takes_db
from tunefw.problem import problem_text
from tunefw.cli.render import knobs, number, print_json, ratio, tag
from tunefw.errors import UserError
from tunefw.outcome import Status

trial_app = typer.Typer(help="List and inspect trials.", no_args_is_help=True)
OUTCOMES = ", ".join(s.value for s in Status)


def _outcome(text: Optional[str]) -> Optional[str]:
    if text is None:
        return None
    known = [s.value for s in Status]
    if text.upper() not in known:
        raise UserError(f"--outcome {text!r}: expected one of {', '.join(known)}")
    return text.upper()


def list_data(study_name: str, problem: Optional[str], outcome: Optional[str],
              top: Optional[int]) -> dict:
    """The round's trials of a study (one problem's, one outcome's), by id; with ``top`` the
    best ``top`` by ratio to cuBLAS (trials without one last)."""
    from tunefw.problem import parse_shape
    from tunefw.report.data import result_kind
    from tunefw.store import queries as q
    if top is not None and top < 1:
        raise UserError(f"--top {top}: expected at least 1")
    status = _outcome(outcome)
    wanted = parse_shape(problem) if problem is not None else None
    with open_db().session() as s:
        study = q.get_study(s, study_name)
        if wanted is not None and not any((p.M, p.N, p.K) == (wanted.M, wanted.N, wanted.K)
                                          for p in study.problems):
            raise UserError(f"--problem {problem}: study {study.name!r} has no such problem "
                            f"(it has {', '.join(p.key.split(':')[0] for p in study.problems)})")
        rows = [{"id": t.id, "problem": {"M": p.M, "N": p.N, "K": p.K, "dtype": p.dtype, "gate": p.gate},
                 "label": p.label, "family": t.family, "outcome": t.status, "ratio": t.ratio,
                 "tflops": t.tflops, "cublas_tflops": t.cublas_tflops, "config": t.config}
                for t, p in q.study_trials(s, study, wanted, status)]
        kind = result_kind(study.backend, study.fingerprint or {}, study.stats or {})
        data = {"study": study.name, "round": study.round, "kind": kind, "trials": rows}
    if top is not None:
        rows.sort(key=lambda r: (r["ratio"] is None, -(r["ratio"] or 0.0), r["id"]))
        del rows[top:]
    return data


@trial_app.command("list")
@takes_db
def trial_list(
    study: str = typer.Argument(..., metavar="STUDY", help="Study name."),
    problem: Optional[str] = typer.Option(None, "--problem", metavar="MxNxK",
                                          help="Only this problem's trials."),
    outcome: Optional[str] = typer.Option(None, "--outcome", metavar="OUTCOME",
                                          help=f"Only trials of this outcome ({OUTCOMES})."),
    top: Optional[int] = typer.Option(None, "--top", metavar="N",
                                      help="The best N by ratio to cuBLAS, best first."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """A study's trials of its current round, one row each: problem and layer, family,
    outcome, ratio to cuBLAS, TFLOP/s and the config's knobs."""
    data = list_data(study, problem, outcome, top)
    if as_json:
        print_json(data)
        return
    rows, kind = data["trials"], data["kind"]
    table = Table("id", "problem", "label", "family", "outcome", "vs cuBLAS", "TFLOP/s", "knobs",
                  title=f"study {data['study']} round {data['round']}: {len(rows)} trial(s)"
                  + (", best first" if top is not None else "") + tag(kind))
    for r in rows:
        table.add_row(str(r["id"]), problem_text(r["problem"]), r["label"] or "-", r["family"],
                      r["outcome"], ratio(r["ratio"]), number(r["tflops"]),
                      knobs(r["family"], r["config"]))
    out.print(table)


@trial_app.command("show")
@takes_db
def trial_show(trial_id: int = typer.Argument(..., metavar="ID",
                                              help="Trial id (as in trial list, study show)."),
               as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """A trial's problem and layer, config, outcome, timings, ptxas's figures, device and log."""
    from tunefw.store import queries as q
    from tunefw.store.models import Problem, Study, Trial
    with open_db().session() as s:
        t = s.get(Trial, trial_id)
        if t is None:
            raise UserError(f"trial {trial_id} not found in {q.database_of(s)}")
        p = s.get(Problem, t.problem_id)
        data = {"study": s.get(Study, t.study_id).name,
                "problem": {"M": p.M, "N": p.N, "K": p.K, "dtype": p.dtype, "layout": p.layout,
                            "gate": p.gate},
                "label": p.label}
        data.update({c.name: getattr(t, c.name) for c in Trial.__table__.columns})
        data["ratio"] = t.ratio  # to the cuBLAS of the same screen: what the search ranked by
    data["created_at"] = str(data["created_at"])
    if as_json:
        print_json(data)
        return
    log = data.pop("log")
    problem, label = data.pop("problem"), data.pop("label")
    figures = [data.pop(k) for k in ("ptxas_regs", "ptxas_smem_bytes", "ptxas_spill_bytes")]
    out.print(f"[bold]trial {data.pop('id')}[/] of study {data.pop('study')}: "
              f"{problem_text(problem)} {problem['layout']}"
              + (f", layer {label}" if label else ""), highlight=False)
    out.print("[bold]ptxas[/]: " + ("- (nothing compiled)" if figures[0] is None else
              f"{figures[0]} registers/thread, {figures[1]} B static shared memory, "
              f"{figures[2]} B spilled"), highlight=False)
    for k, v in data.items():
        out.print(f"[bold]{k}[/]: {json.dumps(v) if isinstance(v, (dict, list)) else v}")
    out.print("[bold]log[/]:")
    out.print(log or "(empty)", markup=False, highlight=False)
