"""`tunefw verify`: strict verification of a table's winners or a family's configs, optionally
once more under compute-sanitizer (thin)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from tunefw.problem import problem_text
from tunefw.cli.console import console

out = console()


def verify_cmd(
    target: str = typer.Argument(..., help="dispatch.json, or a family name (skinny_sm90, ...).",
                                 metavar="DISPATCH.json|FAMILY"),
    families: Optional[Path] = typer.Option(
        None, "--families", metavar="FILE", help="A Python file defining FAMILIES (kernel "
        "templates whose sources lie beside it): its families can be verified by name."),
    shapes: Optional[str] = typer.Option(None, "--shapes", metavar="edge|FILE",
                                         help="'edge' or a file of MxNxK lines "
                                         "(a family needs them; a table adds them to its own)."),
    sample: int = typer.Option(8, "--sample", metavar="N",
                               help="Random valid configs per shape (a family)."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Sampling seed."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here.",
                                            metavar="FILE"),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", metavar="DIR",
                                             help="Cubin cache directory."),
    sanitize_tools: Optional[str] = typer.Option(
        None, "--sanitize", metavar="TOOLS", help="Verify once more under compute-sanitizer, per "
        "tool: memcheck, racecheck or memcheck,racecheck (errors and verdicts per tool)."),
) -> None:
    """Verify configs as every trial is verified (guard bands, inputs, a second launch, small
    grids) on a GPU; exit 1 if any is not OK (or, with --sanitize, not clean)."""
    from tunefw.errors import UserError
    from tunefw.export.files import write_atomic
    from tunefw.measure import sanitize, verify
    from tunefw.templates.family_module import load_family_module

    if sample < 1:
        raise UserError(f"--sample {sample}: expected at least 1")
    tools = sanitize.parse_tools(sanitize_tools) if sanitize_tools is not None else []
    extra = load_family_module(families)
    jobs = verify.plan(target, verify.parse_shapes(shapes), sample, seed, families=extra)
    if not jobs:
        raise UserError(f"verify {target}: nothing to verify")
    if tools:
        sanitize.sanitizer()  # on PATH, before any GPU work
    cache = str(cache_dir) if cache_dir else None
    result = verify.run_verify(jobs, cache, families=extra)
    if tools:
        sanitize.sanitize(result, jobs, tools, cache, families=extra)
    for row in result["rows"]:
        if row["status"] != "OK":
            out.print(f"{row['status']} {problem_text(row)} {row['family']} "
                      f"{row['config']}: {row['log']}", markup=False, soft_wrap=True)
    out.print(verify.summary(result), markup=False, soft_wrap=True)
    if tools:
        out.print(sanitize_table(result))
    if out_path:
        write_atomic(out_path, json.dumps(result, indent=1, default=str))
    raise typer.Exit(1 if result["failed"] or not result.get("sanitize_clean", True) else 0)


def sanitize_table(result: dict) -> Table:
    """Per tool: its errors, the verdicts of its run, clean or not, and its first findings."""
    from tunefw.measure.sanitize import verdict
    from tunefw.measure.verify import counts_text
    table = Table("sanitizer", "errors", "verdicts", "result", "first findings",
                  title="under compute-sanitizer")
    for entry in result["sanitize"]:
        errors = "?" if entry["errors"] is None else str(entry["errors"])
        table.add_row(entry["tool"], errors, counts_text(entry["statuses"]), verdict(entry),
                      "\n".join(entry["report"][:4]))
    return table
