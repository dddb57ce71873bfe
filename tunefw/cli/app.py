"""The `tunefw` command: thin Typer commands that parse, call the library and render with rich.

Every error, usage errors included, is one line on stderr and a non-zero exit.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.table import Table

from tunefw.cli.console import console
from tunefw.errors import UserError
from tunefw.templates import FAMILIES

FAMILY_NAMES = " | ".join(sorted(FAMILIES))

app = typer.Typer(help=f"tunefw: tune GPU GEMM kernels ({', '.join(sorted(FAMILIES))}) with Optuna on Ray "
                       "workers, store every trial in SQLite, export the winners as a dispatch table.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)
study_app = typer.Typer(help="Create, list, show and delete studies.", no_args_is_help=True)
trial_app = typer.Typer(help="Inspect single trials.", no_args_is_help=True)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(study_app, name="study")
app.add_typer(trial_app, name="trial")
app.add_typer(db_app, name="db")
from tunefw.cli.dispatch import dispatch_app  # noqa: E402  (tunefw dispatch ...)
app.add_typer(dispatch_app, name="dispatch")
from tunefw.cli.verify import verify_cmd  # noqa: E402  (tunefw verify ...)
app.command("verify")(verify_cmd)

out = console()
err = Console(stderr=True, highlight=False, soft_wrap=True)
_state: dict = {"db": None, "stores": []}

DB_HELP = ("Database: a SQLAlchemy URL or a SQLite file path; default $TUNEFW_DB or "
           "sqlite:///tunefw.db.")


@app.callback()
def _root(db: Optional[str] = typer.Option(None, "--db", help=DB_HELP, metavar="URL")) -> None:
    _state["db"] = db


def _store(mode: str = "read"):
    """Open the database: "read" (read-only, never creates), "write" (must exist) or "create"
    (made if missing; says where)."""
    from tunefw.store import open_store
    store = open_store(_state["db"], create=mode == "create", readonly=mode == "read")
    _state["stores"].append(store)  # closed when the command ends (run)
    if store.created:
        from tunefw.store.files import shown_url
        err.print(f"created database {shown_url(store.url)}", markup=False)
    return store


# ---- study ---------------------------------------------------------------------------------
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
    store = _store("create")
    with store.session() as s:
        q.create_study(s, spec)
    optuna_storage(store.url, store.engine).engine.dispose()  # optuna-dashboard opens it now
    out.print(f"created study [bold]{spec.name}[/]: {len(spec.problems)} problem(s), "
              f"{spec.trials} trials each, sampler {spec.sampler}")


@study_app.command("list")
def study_list() -> None:
    """List studies with their progress."""
    from tunefw.store import queries as q
    store = _store()
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
    store = _store()
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
    store = _store("write")
    with store.session() as s:
        names = q.optuna_study_names(q.get_study(s, name))  # unknown name: fail before Optuna
    storage = storage_for(store)
    for optuna_name in sorted(names & set(optuna.get_all_study_names(storage))):
        optuna.delete_study(study_name=optuna_name, storage=storage)
    with store.session() as s:
        q.delete_study(s, name)
    out.print(f"deleted study {name}")


# ---- trial, status, db ------------------------------------------------------------------------
@trial_app.command("show")
def trial_show(trial_id: int = typer.Argument(..., help="Trial id (as in study show)."),
               as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """A trial's config, outcome, timings, device and log."""
    from tunefw.store import queries as q
    from tunefw.store.models import Trial
    store = _store()
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


@app.command("status")
def status() -> None:
    """Studies in progress, the workers of their last launch, and recent errors."""
    from sqlalchemy import select
    from tunefw.store import queries as q
    from tunefw.store.models import Trial
    store = _store()
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
    before, after = upgrade_store(_state["db"])
    out.print(f"database schema {before} -> {after}" if before != after
              else f"database schema {after}: already current")


# ---- launch, export, compile --------------------------------------------------------------
def _pick_backend(backend: str, gpus: int, address: Optional[str]) -> str:
    if backend.startswith("replay:"):
        from tunefw.evaluate.replay import parse_backend
        parse_backend(backend)  # a bad spec fails here, before Ray starts
        return "replay"
    if backend not in ("auto", "sim", "cuda"):
        raise UserError(f"--backend {backend!r}: expected auto, sim, cuda or replay:PATH")
    if gpus < 1:
        raise UserError(f"--gpus {gpus}: expected at least 1")
    if backend == "sim" or (backend == "auto" and address is None and _local_gpus() == 0):
        if backend == "auto":
            err.print("no GPU visible: using the SIMULATED device (--backend sim)")
        if address is None and gpus > SIM_MAX_WORKERS:  # each is a process: more never start
            raise UserError(f"--gpus {gpus}: the simulated device runs at most "
                            f"{SIM_MAX_WORKERS} workers on this machine ({os.cpu_count()} CPUs)")
        return "sim"
    if address is None and _local_gpus() < gpus:
        raise UserError(f"--gpus {gpus}: this machine has {_local_gpus()} visible GPU(s)")
    return "cuda"


SIM_MAX_WORKERS = max(8, 4 * (os.cpu_count() or 1))  # simulated workers of a local Ray


def _local_gpus() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:
        return 0


@app.command("launch")
def launch(
    study: Optional[str] = typer.Argument(None, help="Study name (default: the newest)."),
    gpus: int = typer.Option(1, "--gpus", help="GPU workers: one Ray actor pinned to each GPU."),
    backend: str = typer.Option("auto", "--backend", help="auto (cuda if a GPU is visible, "
                                "else sim) | sim (SIMULATED device on CPU) | cuda | "
                                "replay:PATH[?delay=S] (answer from recorded sweeps)."),
    address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster "
                                          "(e.g. 127.0.0.1:6379) instead of starting one."),
    new_round: bool = typer.Option(False, "--new-round", help="Start a new round (needed after "
                                   "the device or a parameter space changed)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Cubin cache directory "
                                             "(default $TUNEFW_CACHE_DIR or ~/.cache/tunefw)."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", metavar="SECONDS",
                                               help="Stop asking for new trials after this long, "
                                               "finish those in flight; launch again to resume."),
) -> None:
    """Run (or resume) a study's sweep on local Ray or an existing Ray cluster."""
    from tunefw.cli.progress import LaunchProgress
    from tunefw.store import queries as q
    from tunefw.tune.interrupt import stop_on_sigterm
    from tunefw.tune.sweep import LaunchOptions, Sweep

    if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
        raise UserError(f"--time-limit {time_limit:g}: expected a finite, positive number of "
                        "seconds")
    store = _store("write")  # a launch without a database has no study to run
    with store.session() as s:
        name = q.get_study(s, study).name  # fail on an unknown study before Ray starts
    chosen = _pick_backend(backend, gpus, address)
    stop_on_sigterm()
    options = LaunchOptions(gpus=gpus, backend=chosen, address=address, new_round=new_round,
                            cache_dir=cache_dir, time_limit_s=time_limit,
                            replay=backend if chosen == "replay" else None)
    with LaunchProgress(out) as progress:
        stats = Sweep(store, name, options, progress.hook).run()
    if not stats["trials"]:
        out.print(f"study {name}: nothing left to run (every problem has its budget)")
        return
    out.print(f"study {name}: {stats['trials']} trials in {stats['wall_s']:.1f} s "
              f"({stats['trials_per_s']:.2f}/s), GPU busy {stats['gpu_busy_mean']:.0%}"
              + (" [SIMULATED]" if stats["simulated"] else "")
              + (" [REPLAY]" if stats.get("replay") else ""))
    if stats["stopped_at_time_limit"]:
        out.print("time limit reached: trials in flight were finished; launch again to resume")


@app.command("export")
def export_cmd(
    path: Path = typer.Argument(Path("dispatch.json"), help="Output file."),
    study: Optional[str] = typer.Option(None, "--study", help="Study name (default: the newest)."),
    fmt: str = typer.Option("json", "--format", help="json | csv | cpp (a C++ header) | sweep "
                            "(recorded sweeps: PATH is a directory, or a file for one problem)."),
    allow_mixed: bool = typer.Option(False, "--allow-mixed-devices",
                                     help="Export even if winners come from different devices."),
    min_ratio: float = typer.Option(1.0, "--min-ratio", metavar="RATIO",
                                    help="Winners below this ratio to cuBLAS are exported as "
                                    "cuBLAS routes (default 1.0)."),
    from_table: Optional[Path] = typer.Option(None, "--from", metavar="DISPATCH.json",
                                              help="Render this dispatch.json (e.g. a "
                                              "calibrated one) instead of a study's winners."),
    problem: Optional[str] = typer.Option(None, "--problem", metavar="MxNxK",
                                          help="--format sweep: only this problem."),
) -> None:
    """Write the study's winners as a dispatch table (schema in the README), or its sweeps."""
    if fmt == "sweep":
        from tunefw.export.sweeps import export_sweeps
        from tunefw.problem import parse_shape
        paths = export_sweeps(_store("read"), study, path,
                              parse_shape(problem) if problem else None)
        out.print(f"wrote {len(paths)} sweep file(s) under {path}")
        return
    from tunefw.export.table import export, export_table
    if from_table is not None:
        from tunefw.runtime.dispatch import load
        table = export_table(load(from_table), path, fmt)
    else:
        table = export(_store("read"), path, study, fmt, allow_mixed, min_ratio)
    losses = sum(e.is_cublas for e in table.entries)
    out.print(f"wrote {path}: {len(table.entries)} entries"
              + (f" ({losses} cuBLAS routes)" if losses else "")
              + (" (SIMULATED device)" if table.simulated else "")
              + (" (REPLAY of recorded sweeps)" if table.fingerprint.get("replay") else ""))


@app.command("family")
def family_cmd(name: Optional[str] = typer.Argument(
        None, help=f"Kernel family ({FAMILY_NAMES}); default: list the families.")) -> None:
    """List the kernel families, or one family's knobs as declared: values (default first),
    Optuna encoding, C++ template-argument tokens, meaning."""
    from tunefw.templates import get_family
    if name is None:
        for fam in sorted(FAMILIES):
            t = FAMILIES[fam]
            out.print(f"{fam}  {t.kernel} in {t.source}, cc >= {t.min_cc}, {len(t.params)} knobs")
        return
    template = get_family(name)
    table = Table(title=f"{name}: {template.kernel}<DTYPE, {', '.join(template.param_names)}>")
    for column in ("knob", "values", "optuna", "c++", "meaning"):
        table.add_column(column, overflow="fold")
    for row in template.describe():
        table.add_row(row["name"], row["values"], row["optuna"], row["cpp"], row["help"])
    out.print(table)


@app.command("compile")
def compile_cmd(
    family: str = typer.Argument(..., help=f"Kernel family ({FAMILY_NAMES})."),
    arch: str = typer.Option(..., "--arch", help="sm_80 | sm_90 | sm_90a."),
    sample: int = typer.Option(8, "--sample", help="How many random valid configs."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    config: Optional[str] = typer.Option(None, "--config", help="One config as JSON instead."),
    check_sass: bool = typer.Option(False, "--check-sass", help="Fail configs whose SASS uses "
                                    "local memory (LDL/STL) or lacks the family's tensor-core op "
                                    "(HGMMA for wgmma_sm90, HMMA otherwise)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Cubin cache directory."),
    dtype: str = typer.Option("bf16", "--dtype", help="bf16 | fp16."),
    shape: str = typer.Option("4096x4096x4096", "--shape",
                              help="MxNxK the configs are sampled and checked for."),
) -> None:
    """Compile sampled (or given) configs without a GPU; report registers, smem, spills."""
    from tunefw.cli.compile import run_compile
    code = run_compile(family, arch, sample, seed, config, check_sass, cache_dir, dtype, out,
                       shape=shape)
    raise typer.Exit(code)


@app.command("bench")
def bench_cmd(
    path: Optional[Path] = typer.Argument(None, help="dispatch.json (or use --study)."),
    study: Optional[str] = typer.Option(None, "--study", help="Bench this study's winners."),
    against: str = typer.Option("cublas,triton", "--against", help="Baselines: cublas,triton."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here."),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write an HTML page here."),
    cubin_dir: Optional[Path] = typer.Option(None, "--cubin-dir", help="Shipped cubins (runtime docs)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Cubin cache directory."),
) -> None:
    """Time the runtime path, cuBLAS and Triton for every dispatch entry (needs a GPU)."""
    from tunefw.fileio import write_atomic
    from tunefw.measure.bench import parse_against, run_bench
    from tunefw.report import bench_html
    from tunefw.runtime.dispatch import load

    if (path is None) == (study is None):
        raise UserError("bench: give a dispatch.json path or --study NAME (not both)")
    names = parse_against(against)
    if path is not None:
        table = load(path)
    else:
        from tunefw.export.table import build_table
        table = build_table(_store("read"), study)
    result = run_bench(table, names, cubin_dir=cubin_dir, cache_dir=cache_dir,
                       progress=lambda r: err.print(f"  {r['M']}x{r['N']}x{r['K']} {r['dtype']}: "
                                                    f"{r['path']}, {r['tflops']:.1f} TFLOP/s"))
    table_out = Table("shape", "path", "tunefw", "cuBLAS", "Triton", "ratio", "vs Triton",
                      "overhead us", "wrong", title="TFLOP/s" + (" (table SIMULATED)" if table.simulated else ""))
    fmt = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    for r in result["rows"]:
        table_out.add_row(f"{r['M']}x{r['N']}x{r['K']} {r['dtype']}", r["path"], fmt(r["tflops"]),
                          fmt(r["cublas_tflops"]), fmt(r["triton_tflops"]), fmt(r["ratio"], ".3f"),
                          fmt(r["triton_ratio"], ".3f"), fmt(r["overhead_us"], ".2f"), str(r["wrong"]))
    out.print(table_out)
    geo = result["geomean"]
    out.print(f"geomean ratio vs cuBLAS {fmt(geo['ratio'], '.3f')}, vs Triton {fmt(geo['triton_ratio'], '.3f')}")
    if out_path:
        write_atomic(out_path, json.dumps(result, indent=2) + "\n")
    if html_path:
        write_atomic(html_path, bench_html(result))


@app.command("search-eval")
def search_eval_cmd(
    sweeps: List[Path] = typer.Argument(..., help="Sweep files or directories of them."),
    samplers: str = typer.Option("tpe,random,grid", "--samplers",
                                 help="Comma-separated: tpe, random, grid, cmaes."),
    seeds: int = typer.Option(20, "--seeds", help="Seeded runs per sweep and sampler."),
    budgets: str = typer.Option("16,32,64,128", "--budgets", help="Comma-separated budgets."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here."),
) -> None:
    """Offline: trials each sampler needs to reach 1/2/5% of a recorded sweep's best."""
    from tunefw.fileio import write_atomic
    from tunefw.tune.search_eval import search_eval, table_rows
    try:
        budget_list = [int(b) for b in budgets.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--budgets {budgets!r}: expected comma-separated integers") from None
    result = search_eval([str(p) for p in sweeps], [x.strip() for x in samplers.split(",")
                                                    if x.strip()], seeds, budget_list)
    table = Table("sweep", "space", "sampler", *(f"trials to {t}" for t in result["thresholds"]),
                  *(f"best@{b}" for b in result["budgets"]),
                  title=f"search-eval: median over {seeds} seeds")
    for row in table_rows(result):
        table.add_row(*row)
    out.print(table)
    for name, s in result["summary"].items():
        out.print(f"{name}: median trials to 1/2/5% " + "/".join(
            "-" if v is None else f"{v:g}" for v in s["median_trials_to"].values())
            + f"; within 2% at 64 trials on {s['sweeps_within_2pct_at_64']} of {s['sweeps']}")
    for skip in result["skipped"]:
        out.print(f"skipped {skip['path']}: {skip['reason']}", markup=False)
    if out_path:
        write_atomic(out_path, json.dumps(result, indent=2) + "\n")


@app.command("report")
def report_cmd(
    study: str = typer.Argument(..., help="Study name."),
    html_path: Path = typer.Option(..., "--html", help="Write the HTML report here."),
) -> None:
    """A self-contained HTML report: TFLOP/s vs cuBLAS, convergence, outcomes, winners, device."""
    from tunefw.report import write_report
    data = write_report(_store("read"), study, html_path)
    out.print(f"wrote {html_path}: {len(data['problems'])} problem(s)"
              + (" (SIMULATED)" if data["simulated"] else ""))


def hoist_db(args: List[str]) -> List[str]:
    """``--db URL`` (or ``--db=URL``) may be typed after the subcommand, where people type it;
    it moves to the front, where the app's callback reads it."""
    front, rest, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest += args[i:]
            break
        if a == "--db" and i + 1 < len(args):
            front += args[i:i + 2]
            i += 2
            continue
        if a.startswith("--db="):
            front.append(a)
        else:
            rest.append(a)
        i += 1
    return front + rest


def run(args: List[str]) -> int:
    """Run the app on ``args``; every error becomes one line on stderr; returns the exit code."""
    from tunefw.cli.exit import run_command
    try:
        return run_command(typer.main.get_command(app), hoist_db(list(args)), err)
    finally:
        while _state["stores"]:
            _state["stores"].pop().close()


def main() -> None:
    """Entry point: run the app, turning every error into one line on stderr."""
    sys.exit(run(sys.argv[1:]))
