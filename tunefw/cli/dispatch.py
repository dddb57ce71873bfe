"""`tunefw dispatch ...`: explain, calibrate and describe dispatch tables (thin)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from tunefw.cli.console import console

dispatch_app = typer.Typer(help="Explain, calibrate and describe dispatch tables.",
                           no_args_is_help=True)
out = console()


@dispatch_app.command("explain")
def dispatch_explain(
    path: Path = typer.Argument(..., help="dispatch.json", metavar="DISPATCH.json"),
    shapes: List[str] = typer.Argument(..., help="One or more MxNxK (gated: MxNxK:silu).",
                                       metavar="MxNxK..."),
    dtype: str = typer.Option("bf16", "--dtype", metavar="bf16|fp16", help="bf16 | fp16."),
) -> None:
    """Which rule serves each shape, from which entry, on what evidence (no GPU needed)."""
    from tunefw.problem import parse_shape
    from tunefw.runtime.dispatcher import Dispatcher

    problems = [parse_shape(s, dtype) for s in shapes]
    dispatcher = Dispatcher(path)
    for p in problems:
        out.print(dispatcher.explain(p.M, p.N, p.K, p.dtype, gate=p.gate), markup=False, highlight=False,
                  soft_wrap=True)


@dispatch_app.command("calibrate")
def dispatch_calibrate(
    path: Path = typer.Argument(..., help="dispatch.json (rewritten unless --out).",
                                metavar="DISPATCH.json"),
    shapes: Optional[Path] = typer.Option(None, "--shapes", metavar="FILE",
                                          help="Shapes: one MxNxK [dtype] per line, or a JSON list."),
    model: Optional[str] = typer.Option(None, "--model", metavar="NAME",
                                        help="Or: in-between M of the layers labelled NAME.*"),
    out_path: Optional[Path] = typer.Option(None, "--out", metavar="PATH",
                                            help="Write the calibrated table here instead."),
    min_ratio: Optional[float] = typer.Option(None, "--min-ratio", metavar="RATIO",
                                              help="A measured ratio below this routes the "
                                              "shape to cuBLAS (default: the table's, 1.0)."),
    cubin_dir: Optional[Path] = typer.Option(None, "--cubin-dir", metavar="DIR",
                                             help="Shipped cubins."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", metavar="DIR",
                                             help="Cubin cache directory."),
) -> None:
    """Time each non-exact rule on in-between shapes against cuBLAS; record it as evidence."""
    from tunefw.errors import UserError
    from tunefw.export import calibrate as cal
    from tunefw.export.table import render
    from tunefw.export.files import write_atomic
    from tunefw.runtime.dispatch import load

    table = load(path)
    if (shapes is None) == (model is None):
        raise UserError("dispatch calibrate: give --shapes FILE or --model NAME (one of them)")
    problems = cal.read_shapes(shapes) if shapes else cal.between_shapes(table, model)
    measure = cal.cuda_measure(cubin_dir, cache_dir)
    result = cal.calibrate(table, problems, measure, min_ratio, progress=lambda v: out.print(
        f"  {v.M}x{v.N}x{v.K} {v.dtype}: {v.rule} entry {'x'.join(map(str, v.served_by))}: "
        f"{v.ratio:.3f}x cuBLAS", highlight=False))
    target = out_path or path
    write_atomic(target, render(result, "json"))
    losses = sum(v.ratio < result.evidence_min_ratio for v in result.evidence)
    out.print(f"wrote {target}: {len(result.evidence)} measured shapes, {losses} below "
              f"{result.evidence_min_ratio:g}x (served by cuBLAS)")


@dispatch_app.command("schema")
def dispatch_schema(path: Optional[Path] = typer.Argument(
        None, help="Write here (default: stdout).", metavar="PATH")) -> None:
    """The JSON schema of dispatch.json (schema_version 2)."""
    from tunefw.export.files import write_atomic
    from tunefw.runtime.dispatch_schema import json_schema
    if path is None:
        print(json_schema(), end="")
    else:
        write_atomic(path, json_schema())
