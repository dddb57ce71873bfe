"""`tunefw verify`: strict verification of a table's winners or a family's configs (thin)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from tunefw.cli.console import console

out = console()


def verify_cmd(
    target: str = typer.Argument(..., help="dispatch.json, or a family name (skinny_sm90, ...)."),
    shapes: Optional[str] = typer.Option(None, "--shapes", help="'edge' or a file of MxNxK lines "
                                         "(a family needs them; a table adds them to its own)."),
    sample: int = typer.Option(8, "--sample", help="Random valid configs per shape (a family)."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed."),
    out_path: Optional[Path] = typer.Option(None, "--out", help="Write the result JSON here."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Cubin cache directory."),
) -> None:
    """Verify configs as every trial is verified (guard bands, inputs, a second launch, small
    grids) on a GPU; exit 1 if any is not OK."""
    from tunefw.errors import UserError
    from tunefw.measure import verify

    if sample < 1:
        raise UserError(f"--sample {sample}: expected at least 1")
    jobs = verify.plan(target, verify.parse_shapes(shapes), sample, seed)
    if not jobs:
        raise UserError(f"verify {target}: nothing to verify")
    result = verify.run_verify(jobs, str(cache_dir) if cache_dir else None)
    for row in result["rows"]:
        if row["status"] != "OK":
            out.print(f"{row['status']} {row['M']}x{row['N']}x{row['K']} {row['family']} "
                      f"{row['config']}: {row['log']}", markup=False, soft_wrap=True)
    out.print(verify.summary(result), markup=False, soft_wrap=True)
    if out_path:
        verify.write(result, out_path)
    raise typer.Exit(1 if result["failed"] else 0)
