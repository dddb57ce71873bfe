"""`tunefw family` and `tunefw compile`: the kernel families' declared knobs, and compiling
configs without a GPU (tunefw/cli/compile.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from tunefw.cli.common import JSON_HELP, out
from tunefw.cli.render import print_json
from tunefw.templates import FAMILIES

FAMILY_NAMES = " | ".join(sorted(FAMILIES))


def family_cmd(name: Optional[str] = typer.Argument(
        None, metavar="FAMILY",
        help=f"Kernel family ({FAMILY_NAMES}); default: list the families."),
        as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the kernel families, or one family's knobs as declared: values (default first),
    Optuna encoding, C++ template-argument tokens, meaning."""
    from tunefw.templates import get_family
    if name is None:
        families = [{"name": fam, "kernel": t.kernel, "source": t.source, "min_cc": t.min_cc,
                     "knobs": list(t.param_names)} for fam, t in sorted(FAMILIES.items())]
        if as_json:
            print_json(families)
            return
        for f in families:
            out.print(f"{f['name']}  {f['kernel']} in {f['source']}, cc >= {f['min_cc']}, "
                      f"{len(f['knobs'])} knobs")
        return
    template = get_family(name)
    if as_json:  # the real values (the table joins them into text)
        print_json({"name": name, "kernel": template.kernel, "knobs": [
            {"name": p.name, "values": list(p.values), "default": p.values[0],
             "optuna": p.describe_encoding(),
             "cpp": None if p.cpp is None else dict(p.cpp), "help": p.help}
            for p in template.params]})
        return
    table = Table(title=f"{name}: {template.kernel}<DTYPE, {', '.join(template.param_names)}>")
    for column in ("knob", "values", "optuna", "c++", "meaning"):
        table.add_column(column, overflow="fold")
    for row in template.describe():
        table.add_row(row["name"], row["values"], row["optuna"], row["cpp"], row["help"])
    out.print(table)


def compile_cmd(
    family: str = typer.Argument(..., help=f"Kernel family ({FAMILY_NAMES}).", metavar="FAMILY"),
    arch: str = typer.Option(..., "--arch", metavar="sm_80|sm_90|sm_90a",
                             help="sm_80 | sm_90 | sm_90a."),
    sample: int = typer.Option(8, "--sample", metavar="N", help="How many random valid configs."),
    seed: int = typer.Option(0, "--seed", metavar="N", help="Sampling seed."),
    config: Optional[str] = typer.Option(None, "--config", metavar="JSON",
                                         help="One config as JSON instead."),
    check_sass: bool = typer.Option(False, "--check-sass", help="Fail configs whose SASS uses "
                                    "local memory (LDL/STL) or lacks the family's tensor-core op "
                                    "(HGMMA for wgmma_sm90, HMMA otherwise)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", metavar="DIR",
                                             help="Cubin cache directory."),
    dtype: str = typer.Option("bf16", "--dtype", metavar="bf16|fp16", help="bf16 | fp16."),
    shape: str = typer.Option("4096x4096x4096", "--shape", metavar="MxNxK",
                              help="The problem the configs are sampled and checked for, and "
                              "whose launch sets the dynamic shared memory shown."),
) -> None:
    """Compile sampled (or given) configs without a GPU; report ptxas's registers, static
    shared memory and spills, and the dynamic shared memory each launch asks for on --shape."""
    from tunefw.cli.compile import run_compile
    code = run_compile(family, arch, sample, seed, config, check_sass, cache_dir, dtype, out,
                       shape=shape)
    raise typer.Exit(code)
