"""`tunefw launch`: pick the backend (refusing what cannot run before Ray starts) and run the
study's sweep with the live progress display."""
from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Optional

import typer

from tunefw.cli.common import err, open_db, out, takes_db
from tunefw.errors import UserError

SIM_MAX_WORKERS = max(8, 4 * (os.cpu_count() or 1))  # simulated workers of a local Ray


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


def _local_gpus() -> int:
    """The GPUs visible here, asked of the CUDA driver (torch's import costs seconds): 0 where
    there is no driver or no device."""
    try:
        from tunefw.cuda.driver import visible_count
        return visible_count()
    except Exception:  # no libcuda, CUDA_ERROR_NO_DEVICE, ...
        return 0


@takes_db
def launch(
    study: Optional[str] = typer.Argument(None, help="Study name (default: the newest).",
                                          metavar="STUDY"),
    gpus: int = typer.Option(1, "--gpus", metavar="N",
                             help="GPU workers: one Ray actor pinned to each GPU."),
    backend: str = typer.Option("auto", "--backend", metavar="auto|sim|cuda|replay:PATH",
                                help="auto (cuda if a GPU is visible, "
                                "else sim) | sim (SIMULATED device on CPU) | cuda | "
                                "replay:PATH[?delay=S] (answer from recorded sweeps)."),
    address: Optional[str] = typer.Option(None, "--address", metavar="HOST:PORT",
                                          help="Join this Ray cluster "
                                          "(e.g. 127.0.0.1:6379) instead of starting one."),
    new_round: bool = typer.Option(False, "--new-round", help="Start a new round (needed after "
                                   "the device or a parameter space changed)."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", metavar="DIR",
                                             help="Cubin cache directory "
                                             "(default $TUNEFW_CACHE_DIR or ~/.cache/tunefw)."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", metavar="SECONDS",
                                               help="Stop asking for new trials (or confirming "
                                               "winners) after this long, finish those in "
                                               "flight; launch again to resume."),
) -> None:
    """Run (or resume) a study's sweep on local Ray or an existing Ray cluster."""
    started_at = time.monotonic()
    from tunefw.cli.progress import LaunchProgress
    from tunefw.cli.render import startup_figures
    from tunefw.cli.startup import expected_device, space_lines, startup_lines
    from tunefw.store import queries as q
    from tunefw.study.spec import StudySpec
    from tunefw.tune.interrupt import stop_on_sigterm
    from tunefw.tune.sweep import LaunchOptions, Sweep, usable_families

    if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
        raise UserError(f"--time-limit {time_limit:g}: expected a finite, positive number of "
                        "seconds")
    store = open_db("write")  # a launch without a database has no study to run
    with store.session() as s:
        row = q.get_study(s, study)  # fail on an unknown study before Ray starts
        name, spec = row.name, StudySpec.from_dict(row.spec)
        idle = not new_round and not q.has_work(s, row, spec.trials, spec.confirm_top)
    chosen = _pick_backend(backend, gpus, address)
    if idle:  # said before Ray and the workers start: they would have nothing to do
        out.print(f"study {name}: nothing left to run (every problem has its budget and its "
                  "confirmed winner); --new-round starts a new round", markup=False,
                  highlight=False)
        return
    replay = backend if chosen == "replay" else None
    device = expected_device(chosen, replay, address)
    # no family runs on a device known ahead: one line, before Ray starts
    families = None if device is None else usable_families(spec, device)
    for line in startup_lines(spec, chosen, gpus, device):  # before Ray starts
        out.print(line, markup=False, highlight=False)
    stop_on_sigterm()
    options = LaunchOptions(gpus=gpus, backend=chosen, address=address, new_round=new_round,
                            cache_dir=cache_dir, time_limit_s=time_limit, replay=replay,
                            started_at=started_at)
    spaces = None if device is None else (lambda: space_lines(spec, families, device, chosen))
    with LaunchProgress(out, spaces_for=spec if device is None else None,
                        while_starting=spaces) as progress:
        stats = Sweep(store, name, options, progress.hook).run()
    if not stats["trials"]:  # every problem had its budget: this launch only confirmed
        _confirm_line(name, stats)
        return
    startup = startup_figures(stats)
    out.print(f"study {name}: {stats['trials']} trials in {stats['wall_s']:.1f} s "
              f"({stats['trials_per_s']:.2f}/s), GPU busy {stats['gpu_busy_mean']:.0%}"
              + (f", {startup}" if startup else "")
              + (" [SIMULATED]" if stats["simulated"] else "")
              + (" [REPLAY]" if stats.get("replay") else ""), markup=False, highlight=False)
    if stats["rejected"]:  # their rows take trial ids: the ids the trial lines skip
        out.print(f"{stats['rejected']} config(s) rejected without running (INVALID: refused "
                  "by the family's checks; NOT_RECORDED under replay): stored as rows of their "
                  "own, with trial ids, counted in no budget", markup=False, highlight=False)
    _confirm_line(None, stats)


def _confirm_line(name: str | None, stats: dict) -> None:
    """What the launch's confirmation did, and whether the time limit cut it or the search."""
    if stats.get("confirmed"):
        out.print(f"{'study ' + name + ': ' if name else ''}{stats['confirmed']} winner(s) "
                  "confirmed", markup=False, highlight=False)
    if stats["stopped_at_time_limit"]:
        out.print("time limit reached: trials in flight were finished; launch again to resume",
                  markup=False, highlight=False)
