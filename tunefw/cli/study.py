"""`tunefw study ...`: create, list, show and delete studies (thin: parse, call the store,
render; every listing also as --json)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from tunefw.cli.common import JSON_HELP, open_db, out, takes_db
from tunefw.problem import problem_text
from tunefw.cli.render import knobs, launch_line, number, print_json, ratio
from tunefw.errors import UserError
from tunefw.study.schema import SAMPLERS

study_app = typer.Typer(help="Create, list, show and delete studies.", no_args_is_help=True)


def _option_values(trials: Optional[int], seed: Optional[int], timeout: Optional[float],
                   confirm_top: Optional[int]) -> dict:
    """The study-file fields the options set, each checked by the file's rule (one line naming
    the option)."""
    from tunefw.study.schema import field_error
    values = {}
    for option, field, value in (("--trials", "trials", trials), ("--seed", "seed", seed),
                                 ("--timeout", "timeout_s", timeout),
                                 ("--confirm-top", "confirm_top", confirm_top)):
        if value is None:
            continue
        reason = field_error(field, value)
        if reason:
            shown = f"{value:g}" if isinstance(value, float) else value
            raise UserError(f"{option} {shown}: {reason}")
        values[field] = value
    return values


@study_app.command("create")
@takes_db
def study_create(
    name: str = typer.Argument(..., metavar="NAME",
                                         help="Study name (overrides the file's name)."),
    from_file: Optional[Path] = typer.Option(None, "--from", help="Study YAML file (see README).",
                                             metavar="FILE"),
    shape: List[str] = typer.Option([], "--shape", help="Problem MxNxK; repeat for more.",
                                    metavar="MxNxK"),
    family: List[str] = typer.Option([], "--family", metavar="FAMILY",
                                     help="Kernel family; repeat for more (default: every "
                                     "family the device supports)."),
    trials: Optional[int] = typer.Option(None, "--trials", metavar="N",
                                         help="Evaluated configs per problem (default 64)."),
    sampler: Optional[str] = typer.Option(None, "--sampler", metavar="|".join(SAMPLERS),
                                          help="The search's sampler (default tpe)."),
    dtype: Optional[str] = typer.Option(None, "--dtype", metavar="bf16|fp16",
                                        help="Element type (default bf16)."),
    seed: Optional[int] = typer.Option(None, "--seed", metavar="N",
                                       help="The samplers' seed (default 0)."),
    timeout: Optional[float] = typer.Option(None, "--timeout", metavar="SECONDS",
                                            help="Per-trial timeout (default 60)."),
    confirm_top: Optional[int] = typer.Option(
        None, "--confirm-top", metavar="N", help="How many of each problem's best screened "
        "configs are re-timed against cuBLAS to pick its winner (default 3; 0: none)."),
    from_model: Optional[str] = typer.Option(
        None, "--from-model", metavar="PATH|module:function",
        help="The nn.Linear shapes of a model: a transformers config.json or model directory "
             "on disk, or a function returning an nn.Module (built on the meta device)."),
    m_grid: str = typer.Option("both", "--m-grid", metavar="decode|prefill|both|LIST",
                               help="Token counts M for --from-model (README: the M grid)."),
    fuse: bool = typer.Option(False, "--fuse", help="With --from-model: tune each sibling group "
                              "(q/k/v; tunefw/study/siblings.py) as the one GEMM tunefw.patch(model, fuse=True) runs."),
    gated: bool = typer.Option(False, "--gated", help="With --from-model: tune each SwiGLU MLP's "
                               "gate and up as the one gated GEMM tunefw.patch(model, gated=True) runs."),
) -> None:
    """Create a study from a YAML file, --shape options and/or a model's linear layers; the
    options override the file's fields."""
    from tunefw.study.spec import load_study_file, parse_study

    if from_file is None and not shape and from_model is None:
        raise UserError("study create: give --from FILE, --from-model PATH or at least one "
                        "--shape MxNxK")
    overrides = _option_values(trials, seed, timeout, confirm_top)
    data: dict = {}
    if from_file is not None:
        data = load_study_file(from_file, name).to_dict()
    data["name"] = name
    if shape:
        data["problems"] = list(data.get("problems", [])) + [{"shape": s} for s in shape]
    for flag, given in (("--fuse", fuse), ("--gated", gated)):
        if given and from_model is None:
            raise UserError(f"study create: {flag} applies to --from-model only")
    if from_model is not None:  # the model's own layers (tunefw.study.model_shapes)
        from tunefw.study.model_shapes import study_problems
        problems, notes = study_problems(from_model, m_grid, dtype or data.get("dtype", "bf16"),
                                         fuse, gated)
        data["problems"] = list(data.get("problems", [])) + problems
        for note in notes:
            out.print(note, markup=False, highlight=False)
    for key, value in (("families", list(family) or None), ("sampler", sampler),
                       ("dtype", dtype), *overrides.items()):
        if value is not None:
            data[key] = value
    spec = parse_study(data, str(from_file) if from_file else "command line")
    from tunefw.store import queries as q
    from tunefw.store.files import optuna_storage
    store = open_db("create")
    with store.session() as s:
        q.create_study(s, spec)
    optuna_storage(store.url, store.engine).engine.dispose()  # optuna-dashboard opens it now
    out.print(f"created study [bold]{spec.name}[/]: {len(spec.problems)} problem(s), "
              f"{spec.trials} trials each, sampler {spec.sampler}, seed {spec.seed}, "
              f"timeout {spec.timeout_s:g} s, confirm top {spec.confirm_top}")


@study_app.command("list")
@takes_db
def study_list(as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List studies with their progress."""
    from tunefw.store import queries as q
    store = open_db()
    rows = []
    with store.session() as s:
        for study in q.list_studies(s):
            summaries = [q.problem_summary(s, study, p) for p in study.problems]
            rows.append({"name": study.name, "problems": len(summaries),
                         "evaluated": sum(r["evaluated"] for r in summaries),
                         "ok": sum(r["ok"] for r in summaries), "round": study.round,
                         "backend": study.backend,
                         "created_at": study.created_at.strftime("%Y-%m-%d %H:%M")})
    if as_json:
        print_json(rows)
        return
    table = Table("name", "problems", "evaluated", "ok", "round", "backend", "created")
    for r in rows:
        table.add_row(r["name"], str(r["problems"]), str(r["evaluated"]), str(r["ok"]),
                      str(r["round"]), r["backend"] or "-", r["created_at"])
    out.print(table)


def _best_ratio(best: dict) -> str:
    """The best config's ratio, marked confirmed or screened; the screen's beside a confirmed
    one where they differ."""
    if best.get("ratio") is None:
        return "-"
    if not best["confirmed"]:
        return f"{ratio(best['ratio'])} screened"
    shown = f"{ratio(best['ratio'])} confirmed"
    if ratio(best.get("screen_ratio")) not in ("-", ratio(best["ratio"])):
        shown += f" (screened {ratio(best['screen_ratio'])})"
    return shown


def show_data(name: str) -> dict:
    """What `study show` prints: per problem its outcomes, best config (confirmed and screen
    figures, ptxas's) and export route; the last launch's figures; the result kind."""
    from tunefw.report.data import result_kind
    from tunefw.runtime.dispatch import DEFAULT_MIN_RATIO
    from tunefw.store import queries as q
    from tunefw.templates import changed_source
    store = open_db()
    with store.session() as s:
        study = q.get_study(s, name)
        data = {"name": study.name, "round": study.round, "stats": study.stats,
                "kind": result_kind(study.backend, study.fingerprint or {}, study.stats or {}),
                "problems": [q.problem_summary(s, study, p) for p in study.problems]}
    for p in data["problems"]:  # what `tunefw export` (default --min-ratio) ships for it, why
        best = p["best"]
        loses = best is not None and (best["ratio"] is None or best["ratio"] < DEFAULT_MIN_RATIO)
        stale = best is not None and changed_source(best["family"], best["source_hash"]) is not None
        p["export_route"] = None if best is None else "cublas" if loses or stale else "kernel"
        p["export_why"] = "loses" if loses else "source changed" if stale else None
    return data


@study_app.command("show")
@takes_db
def study_show(name: str = typer.Argument(..., metavar="NAME", help="Study name."),
               as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Per problem: trials evaluated, outcomes, and the best config so far (its knobs, its
    confirmed and screened ratio to cuBLAS)."""
    data = show_data(name)
    if as_json:
        print_json(data)
        return
    kind = data["kind"]
    table = Table("problem", "label", "evaluated", "ok", "outcomes", "best vs cuBLAS", "TFLOP/s",
                  "cuBLAS", "family", "knobs", "trial", "export",
                  title=f"study {data['name']} round {data['round']}"
                  + (f" ({kind})" if kind else ""))
    for p in data["problems"]:
        best = p["best"] or {}
        table.add_row(problem_text(p), p["label"] or "-",
                      str(p["evaluated"]), str(p["ok"]),
                      ", ".join(f"{k}:{v}" for k, v in p["outcomes"].items()) or "-",
                      _best_ratio(best), number(best.get("tflops")),
                      number(best.get("cublas_tflops")), best.get("family", "-"),
                      knobs(best["family"], best["config"]) if best else "-",
                      str(best.get("trial_id", "-")),
                      "-" if p["export_route"] is None else "kernel" if p["export_route"] ==
                      "kernel" else f"cuBLAS ({p['export_why']})")
    out.print(table)
    line = launch_line(data["stats"], kind)
    if line:
        out.print(line, markup=False, highlight=False)


@study_app.command("delete")
@takes_db
def study_delete(name: str = typer.Argument(..., metavar="NAME", help="Study name.")) -> None:
    """Delete a study, its trials and its Optuna searches."""
    import optuna
    from tunefw.store import queries as q
    from tunefw.store.lease import db_now, held_message, live_holder
    from tunefw.tune.sweep import storage_for
    store = open_db("write")
    with store.session() as s:
        study = q.get_study(s, name)
        names = q.optuna_study_names(study)  # unknown name: fail before Optuna
        holder = live_holder(s, study.id)
        if holder is not None:  # its searches would vanish under a running launch
            raise UserError(held_message(name, holder, db_now(s.connection())))
    storage = storage_for(store)
    for optuna_name in sorted(names & set(optuna.get_all_study_names(storage))):
        optuna.delete_study(study_name=optuna_name, storage=storage)
    with store.session() as s:
        q.delete_study(s, name)
    out.print(f"deleted study {name}")
