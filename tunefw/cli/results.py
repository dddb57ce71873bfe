"""`tunefw export`, `tunefw bench`, `tunefw search-eval` and `tunefw report`: what a study's
results become (dispatch tables, sweeps, timings, an HTML page)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from tunefw.cli.common import err, open_db, out, takes_db
from tunefw.problem import problem_text
from tunefw.errors import UserError


@takes_db
def export_cmd(
    path: Path = typer.Argument(Path("dispatch.json"), help="Output file.", metavar="PATH"),
    study: Optional[str] = typer.Option(None, "--study", help="Study name (default: the newest).",
                                        metavar="NAME"),
    fmt: str = typer.Option("json", "--format", metavar="json|csv|cpp|sweep",
                            help="json | csv | cpp (a C++ header) | sweep "
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
        paths = export_sweeps(open_db("read"), study, path,
                              parse_shape(problem) if problem else None)
        out.print(f"wrote {len(paths)} sweep file(s) under {path}")
        return
    from tunefw.export.table import export, export_table
    if from_table is not None:
        from tunefw.runtime.dispatch import load
        table = export_table(load(from_table), path, fmt)
        screened = 0
    else:
        store = open_db("read")
        table = export(store, path, study, fmt, allow_mixed, min_ratio)
        from tunefw.store import queries as q
        with store.session() as s:
            screened = len(q.unconfirmed(s, q.get_study(s, study)))
    losses = sum(e.is_cublas for e in table.entries)
    out.print(f"wrote {path}: {len(table.entries)} entries"
              + (f" ({losses} cuBLAS routes)" if losses else "")
              + (" (SIMULATED device)" if table.simulated else "")
              + (" (REPLAY of recorded sweeps)" if table.fingerprint.get("replay") else ""))
    if screened:  # a screen's best overstates it (the winner's curse): confirmation re-times it
        out.print(f"{screened} of them from screened figures, not confirmed yet: launch the "
                  "study again to confirm them", markup=False, highlight=False)


@takes_db
def bench_cmd(
    path: Optional[Path] = typer.Argument(None, help="dispatch.json (or use --study).",
                                          metavar="DISPATCH.json"),
    study: Optional[str] = typer.Option(None, "--study", help="Bench this study's winners.",
                                        metavar="NAME"),
    against: str = typer.Option("cublas,triton", "--against", metavar="LIST",
                                help="Baselines: cublas,triton."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here.",
                                            metavar="FILE"),
    html_path: Optional[Path] = typer.Option(None, "--html", help="Write an HTML page here.",
                                             metavar="FILE"),
    cubin_dir: Optional[Path] = typer.Option(None, "--cubin-dir", metavar="DIR",
                                             help="Shipped cubins (runtime docs)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", metavar="DIR",
                                             help="Cubin cache directory."),
) -> None:
    """Time the runtime path, cuBLAS and Triton for every dispatch entry (needs a GPU)."""
    from tunefw.export.files import write_atomic
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
        table = build_table(open_db("read"), study)
    result = run_bench(table, names, cubin_dir=cubin_dir, cache_dir=cache_dir,
                       progress=lambda r: err.print(f"  {problem_text(r)}: "
                                                    f"{r['path']}, {r['tflops']:.1f} TFLOP/s"))
    table_out = Table("shape", "path", "tunefw", "cuBLAS", "Triton", "ratio", "vs Triton",
                      "overhead us", "wrong", title="TFLOP/s" + (" (table SIMULATED)" if table.simulated else ""))
    fmt = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    for r in result["rows"]:
        table_out.add_row(problem_text(r), r["path"], fmt(r["tflops"]),
                          fmt(r["cublas_tflops"]), fmt(r["triton_tflops"]), fmt(r["ratio"], ".3f"),
                          fmt(r["triton_ratio"], ".3f"), fmt(r["overhead_us"], ".2f"), str(r["wrong"]))
    out.print(table_out)
    geo = result["geomean"]
    out.print(f"geomean ratio vs cuBLAS {fmt(geo['ratio'], '.3f')}, vs Triton {fmt(geo['triton_ratio'], '.3f')}")
    if out_path:
        write_atomic(out_path, json.dumps(result, indent=2) + "\n")
    if html_path:
        write_atomic(html_path, bench_html(result))


def search_eval_cmd(
    sweeps: List[Path] = typer.Argument(..., help="Sweep files or directories of them.",
                                        metavar="SWEEPS..."),
    samplers: str = typer.Option("tpe,random,grid", "--samplers", metavar="LIST",
                                 help="Comma-separated: tpe, random, grid, cmaes, or TPE's "
                                 "alternative settings tpe_ei48, tpe_startup20, "
                                 "tpe_independent."),
    seeds: int = typer.Option(20, "--seeds", metavar="N",
                              help="Seeded runs per sweep and sampler."),
    budgets: str = typer.Option("16,32,64,128", "--budgets", metavar="LIST",
                                help="Comma-separated budgets."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here.",
                                            metavar="FILE"),
    merge: bool = typer.Option(False, "--merge", help="Search the sweeps of one problem (a "
                               "uniform sample and TPE runs of it) as one: their union."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", metavar="PNG",
                                             help="Write the convergence plot here."),
    jobs: int = typer.Option(1, "--jobs", metavar="N",
                             help="Processes the seeded runs share (the same results)."),
) -> None:
    """Offline: trials each sampler needs to reach 1/2/5% of a recorded sweep's best."""
    from tunefw.export.files import write_atomic
    from tunefw.tune.search_eval import search_eval, table_rows
    try:
        budget_list = [int(b) for b in budgets.split(",") if b.strip()]
    except ValueError:
        raise UserError(f"--budgets {budgets!r}: expected comma-separated integers") from None
    result = search_eval([str(p) for p in sweeps], [x.strip() for x in samplers.split(",")
                                                    if x.strip()], seeds, budget_list,
                         merge=merge, jobs=jobs)
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
    if plot_path:
        from tunefw.report.search_figures import search_eval_figure
        write_atomic(plot_path, search_eval_figure(result))


@takes_db
def report_cmd(
    study: str = typer.Argument(..., help="Study name.", metavar="STUDY"),
    html_path: Path = typer.Option(..., "--html", help="Write the HTML report here.",
                                   metavar="FILE"),
    ptxas: bool = typer.Option(False, "--ptxas", help="Compile each winner whose trial stored "
                               "no ptxas figures (simulated, replayed) for its registers, "
                               "shared memory and spills (NVRTC, no GPU)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", metavar="DIR",
                                             help="Cubin cache directory (with --ptxas)."),
) -> None:
    """A self-contained HTML report: TFLOP/s vs cuBLAS, convergence, outcomes, winners, device."""
    from tunefw.report import write_report
    data = write_report(open_db("read"), study, html_path, ptxas, cache_dir)
    out.print(f"wrote {html_path}: {len(data['problems'])} problem(s)"
              + (" (SIMULATED)" if data["simulated"] else "")
              + (f"; ptxas figures of {data['compiled']} winner(s) compiled for it"
                 if data["compiled"] else ""))
