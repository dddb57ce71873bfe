"""`tunefw study ...`, `tunefw trial show`, `tunefw status` and `tunefw db upgrade`: the studies,
their trials and the database (thin: parse, call the store, render)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from tunefw.cli.common import open_db, out, state
from tunefw.errors import UserError

study_app = typer.Typer(help="Create, list, show and delete studies.", no_args_is_help=True)
trial_app = typer.Typer(help="Inspect single trials.", no_args_is_help=True)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)


@study_app.command("create")
def study_create(
    name: str = typer.Argument(..., help="Study name (overrides the file's name)."),
    from_file: Optional[Path] = typer.Option(None, "--from", help="Study YAML file (see README).",
                                             metavar="FILE"),
    shape: List[str] = typer.Option([], "--shape", help="Problem MxNxK; repeat for more.",
                                    metavar="MxNxK"),
    family: List[str] = typer.Option([], "--family", help="Kernel family; repeat for more "
                                     "(default: every family the device supports)."),
    trials: Optional[int] = typer.Option(None, "--trials", help="Evaluated configs per problem "
                                         "(default 64)."),
    sampler: Optional[str] = typer.Option(None, "--sampler", help="tpe | random | grid | cmaes."),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="bf16 | fp16 (default bf16)."),
    from_model: Optional[str] = typer.Option(
        None, "--from-model", metavar="PATH|module:function",
        help="The nn.Linear shapes of a model: a transformers config.json or model directory "
             "on disk, or a function returning an nn.Module (built on the meta device)."),
    m_grid: str = typer.Option("both", "--m-grid", metavar="decode|prefill|both|LIST",
                               help="Token counts M for --from-model (README: the M grid)."),
) -> None:
    """Create a study from a YAML file, --shape options and/or a model's linear layers."""
    from tunefw.study.spec import load_study_file, parse_study

    if from_file is None and not shape and from_model is None:
        raise UserError("study create: give --from FILE, --from-model PATH or at least one "
                        "--shape MxNxK")
    data: dict = {}
    if from_file is not None:
        data = load_study_file(from_file, name).to_dict()
    data["name"] = name
    if shape:
        data["problems"] = list(data.get("problems", [])) + [{"shape": s} for s in shape]
    if from_model is not None:  # the model's own layers, unfused (tunefw.study.model_shapes)
        from tunefw.study.model_shapes import study_problems
        problems, notes = study_problems(from_model, m_grid, dtype or data.get("dtype", "bf16"))
        data["problems"] = list(data.get("problems", [])) + problems
        for note in notes:
            out.print(note, markup=False, highlight=False)
    for key, value in (("families", list(family) or None), ("trials", trials),
                       ("sampler", sampler), ("dtype", dtype)):
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
              f"{spec.trials} trials each, sampler {spec.sampler}")


@study_app.command("list")
def study_list() -> None:
    """List studies with their progress."""
    from tunefw.store import queries as q
    store = open_db()
    table = Table("name", "problems", "evaluated", "ok", "round", "backend", "created")
    with store.session() as s:
        for study in q.list_studies(s):
            rows = [q.problem_summary(s, study, p) for p in study.problems]
            table.add_row(study.name, str(len(rows)), str(sum(r["evaluated"] for r in rows)),
                          str(sum(r["ok"] for r in rows)), str(study.round),
                          study.backend or "-", study.created_at.strftime("%Y-%m-%d %H:%M"))
    out.print(table)


@study_app.command("show")
def study_show(name: str = typer.Argument(..., help="Study name."),
               as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Per problem: trials evaluated, outcomes, and the best config so far."""
    from tunefw.store import queries as q
    store = open_db()
    with store.session() as s:
        study = q.get_study(s, name)
        summary = {"name": study.name, "round": study.round, "stats": study.stats,
                   "problems": [q.problem_summary(s, study, p) for p in study.problems]}
    from tunefw.runtime.dispatch import DEFAULT_MIN_RATIO
    for p in summary["problems"]:  # what `tunefw export` (default --min-ratio) ships for it
        ratio = (p["best"] or {}).get("ratio")
        p["export_route"] = None if p["best"] is None else (
            "kernel" if ratio is not None and ratio >= DEFAULT_MIN_RATIO else "cublas")
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    sim = bool(summary["stats"] and summary["stats"].get("simulated"))
    replay = bool(summary["stats"] and summary["stats"].get("replay"))
    table = Table("problem", "evaluated", "ok", "outcomes", "best vs cuBLAS", "TFLOP/s",
                  "cuBLAS", "family", "trial", "export",
                  title=f"study {study.name}" + (" (SIMULATED)" if sim else "")
                  + (" (REPLAY)" if replay else ""))
    for p in summary["problems"]:
        best = p["best"] or {}
        outcomes = ", ".join(f"{k}:{v}" for k, v in p["outcomes"].items())
        table.add_row(f"{p['M']}x{p['N']}x{p['K']} {p['dtype']}", str(p["evaluated"]),
                      str(p["ok"]), outcomes,
                      f"{best['ratio']:.3f}x" if best.get("ratio") else "-",
                      f"{best['tflops']:.1f}" if best else "-",
                      f"{best['cublas_tflops']:.1f}" if best.get("cublas_tflops") else "-",
                      best.get("family", "-"), str(best.get("trial_id", "-")),
                      {"kernel": "kernel", "cublas": "cuBLAS (loses)", None: "-"}[p["export_route"]])
    out.print(table)


@study_app.command("delete")
def study_delete(name: str = typer.Argument(..., help="Study name.")) -> None:
    """Delete a study, its trials and its Optuna searches."""
    import optuna
    from tunefw.store import queries as q
    from tunefw.tune.sweep import storage_for
    from tunefw.store.lease import db_now, held_message, live_holder
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


@trial_app.command("show")
def trial_show(trial_id: int = typer.Argument(..., help="Trial id (as in study show)."),
               as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """A trial's config, outcome, timings, device and log."""
    from tunefw.store import queries as q
    from tunefw.store.lease import db_now, holder_of
    from tunefw.store.models import Trial
    store = open_db()
    with store.session() as s:
        t = s.get(Trial, trial_id)
        if t is None:
            raise UserError(f"trial {trial_id} not found in {q.database_of(s)}")
        data = {c.name: getattr(t, c.name) for c in Trial.__table__.columns}
        data["ratio"] = t.ratio  # to the cuBLAS of the same screen: what the search ranked by
    data["created_at"] = str(data["created_at"])
    if as_json:
        print(json.dumps(data, indent=2))
        return
    log = data.pop("log")
    for k, v in data.items():
        out.print(f"[bold]{k}[/]: {json.dumps(v) if isinstance(v, (dict, list)) else v}")
    out.print("[bold]log[/]:")
    out.print(log or "(empty)", markup=False, highlight=False)


def status() -> None:
    """Studies in progress, the workers of their last launch, and recent errors."""
    from sqlalchemy import select
    from tunefw.store import queries as q
    from tunefw.store.lease import db_now, holder_of
    from tunefw.store.models import Trial
    store = open_db()
    with store.session() as s:
        studies = q.list_studies(s)
        if not studies:
            out.print("no studies yet")
            return
        for study in studies:
            rows = [q.problem_summary(s, study, p) for p in study.problems]
            target = sum(study.spec["trials"] for _ in rows)
            done = sum(min(r["evaluated"], study.spec["trials"]) for r in rows)
            state = "done" if done >= target else ("in progress" if done else "not started")
            out.print(f"[bold]{study.name}[/] round {study.round}: {done}/{target} evaluated, {state}")
            lease = holder_of(s.connection(), study.id)
            if lease is not None:
                now = db_now(s.connection())
                stale = lease.stale(now)
                out.print(f"  launched by {lease.named()}, last heartbeat "
                          f"{(now - lease.beat_at).total_seconds():.0f} s ago"
                          + (f" (stale: {stale}; the next launch takes it over)" if stale else ""),
                          markup=False)
            stats = study.stats or {}
            for gpu, busy in (stats.get("gpu_busy") or {}).items():
                rate = stats["trials_per_s_per_gpu"].get(gpu, 0.0)
                out.print(f"  worker GPU {gpu}: {rate:.2f} trials/s, busy {busy:.0%}"
                          + (" (SIMULATED)" if stats.get("simulated") else ""))
            starved = stats.get("starved_s") or {}
            if any(starved.values()):
                out.print("  GPU idle, waiting on: " + ", ".join(
                    f"{cause} {seconds:.1f} s" for cause, seconds in starved.items() if seconds)
                    + (f" (sampler: {stats['asks']} asks in {stats['ask_s']:.1f} s)"
                       if "asks" in stats else ""))
            errors = s.scalars(select(Trial).where(
                Trial.study_id == study.id,
                Trial.status.notin_(["OK", "INVALID"])).order_by(Trial.id.desc()).limit(3))
            for t in errors:
                first = (t.log or "").strip().splitlines()[:1]
                out.print(f"  trial {t.id} {t.status}: {first[0][:100] if first else ''}",
                          markup=False)


@db_app.command("upgrade")
def db_upgrade() -> None:
    """Upgrade an older tunefw database to this version's schema."""
    from tunefw.store import upgrade_store
    before, after = upgrade_store(state["db"])
    out.print(f"database schema {before} -> {after}" if before != after
              else f"database schema {after}: already current")
