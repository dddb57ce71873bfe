"""The `tunefw` command: thin Typer commands that parse, call the library and render with rich
(one module per command group, registered here).

Every error, usage errors included, is one line on stderr and a non-zero exit.
"""
from __future__ import annotations

from typing import List, Optional

import typer

from tunefw.cli.common import DB_HELP, close_all, err, state
from tunefw.cli.dispatch import dispatch_app
from tunefw.cli.kernels import compile_cmd, family_cmd
from tunefw.cli.launch import launch
from tunefw.cli.results import bench_cmd, export_cmd, report_cmd, search_eval_cmd
from tunefw.cli.status import db_app, status
from tunefw.cli.study import study_app
from tunefw.cli.trials import trial_app
from tunefw.cli.verify import verify_cmd
from tunefw.templates import FAMILIES

app = typer.Typer(help=f"tunefw: tune GPU GEMM kernels ({', '.join(sorted(FAMILIES))}) with Optuna on Ray "
                       "workers, store every trial in SQLite, export the winners as a dispatch table.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)
app.add_typer(study_app, name="study")
app.add_typer(trial_app, name="trial")
app.add_typer(db_app, name="db")
app.add_typer(dispatch_app, name="dispatch")
for name, command in (("verify", verify_cmd), ("status", status), ("launch", launch),
                      ("export", export_cmd), ("family", family_cmd), ("compile", compile_cmd),
                      ("bench", bench_cmd), ("search-eval", search_eval_cmd),
                      ("report", report_cmd)):
    app.command(name)(command)


@app.callback()
def _root(db: Optional[str] = typer.Option(None, "--db", help=DB_HELP, metavar="URL")) -> None:
    state["db"] = db


def run(args: List[str]) -> int:
    """Run the app on ``args``; every error becomes one line on stderr; returns the exit code."""
    from tunefw.cli.exit import run_command
    try:
        return run_command(typer.main.get_command(app), list(args), err)
    finally:
        close_all()
