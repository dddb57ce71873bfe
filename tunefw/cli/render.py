"""How the listing commands write their figures: a config's knobs on one line, ratios, the
result kind (SIMULATED, REPLAY) every figure carries, and the --json output."""
from __future__ import annotations

import json
from typing import Any

from tunefw.templates import FAMILIES


def knobs(family: str, config: dict) -> str:
    """A config on one line, ``BM=128 BN=256 SCHEDULE=pingpong``: the family's declared order
    (a family or key this tunefw does not declare: by name)."""
    declared = FAMILIES[family].param_names if family in FAMILIES else ()
    names = [k for k in declared if k in config] + sorted(k for k in config if k not in declared)
    return " ".join(f"{k}={config[k]}" for k in names)


def ratio(value: float | None) -> str:
    """A ratio to cuBLAS as the tables show it, ``1.234x``; ``-`` without one."""
    return "-" if value is None else f"{value:.3f}x"


def number(value: float | None, spec: str = ".1f") -> str:
    """A figure (TFLOP/s, seconds) formatted by ``spec``; ``-`` without one."""
    return "-" if value is None else format(value, spec)


def tag(kind: str | None) -> str:
    """What follows a figure of a SIMULATED or REPLAY study: `` [SIMULATED]``; nothing else."""
    return f" [{kind}]" if kind else ""


def startup_figures(stats: dict) -> str:
    """A launch's start-up in words, seconds from the command: its workers up (the first, and
    the last where they differ; the first alone where one never came up) and its first
    finished trial; '' where none was stored (older launches)."""
    first, every, trial = (stats.get(k) for k in ("first_worker_s", "workers_up_s",
                                                  "first_trial_s"))
    parts = []
    if first is not None and every is None:
        parts.append(f"first worker up {first:.1f} s")
    elif first is not None:
        last = "" if f"{every:.1f}" == f"{first:.1f}" else f"-{every:.1f}"
        parts.append(f"workers up {first:.1f}{last} s")
    if trial is not None:
        parts.append(f"first trial {trial:.1f} s")
    return ", ".join(parts) + " after launch" if parts else ""


def launch_line(stats: dict | None, kind: str | None) -> str | None:
    """The last launch's figures in one line (what a launch stored; older launches stored
    fewer), or None where the study never ran."""
    if not stats or "wall_s" not in stats:
        return None
    parts = [f"{stats['trials']} trials in {stats['wall_s']:.1f} s "
             f"({stats['trials_per_s']:.2f}/s)"]
    if "gpu_busy_mean" in stats:
        parts.append(f"GPU busy {stats['gpu_busy_mean']:.0%}")
    startup = startup_figures(stats)
    if startup:
        parts.append(startup)
    return "last launch: " + ", ".join(parts) + tag(kind)


def print_json(data: Any) -> None:
    """--json output: indented, on stdout, nothing else on it."""
    print(json.dumps(data, indent=2, default=str))
