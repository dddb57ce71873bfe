"""A CUDA evaluator in a child process, driven over a Pipe with a deadline per job.

For commands that run trials outside a Ray sweep (`tunefw verify`): a config that poisons the
CUDA context, hangs or kills its process costs that one job (RUNTIME_CRASH, TIMEOUT or
WORKER_LOST), and the next job runs in a fresh child.
"""
from __future__ import annotations

import multiprocessing as mp
from dataclasses import asdict
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Iterable, Iterator

from tunefw.outcome import Status, TrialSpec

STARTUP_S = 180.0  # import torch, create the context, warm up
SLACK_S = 30.0  # past a job's own timeout before the child is killed


def _child(conn: Connection, cache_dir: str | None, mode: str, families: Path | None) -> None:
    """The worker: one CudaEvaluator on cuda:0; a job in, an outcome dict out, until None."""
    import os

    from tunefw.cuda.compiler import compile_kernel
    from tunefw.evaluate.cuda import WARM_UP_S, CudaEvaluator
    from tunefw.templates.family_module import load_family_module

    extra = load_family_module(families)
    # verification times nothing: no warm-up (under a sanitizer each of its products is slow)
    evaluator = CudaEvaluator(0, families=extra.all_families(),
                              warm_up_s=0.0 if mode == "verify" else WARM_UP_S)
    arch = evaluator.device_spec().arch
    conn.send({"ready": evaluator.fingerprint()})
    while True:
        job = conn.recv()
        if job is None:
            break
        spec = TrialSpec(**job)
        compiled = compile_kernel(extra.get(spec.family), spec.config, spec.problem["dtype"], arch,
                                  cache_dir=cache_dir, source_dir=extra.source_dir(spec.family),
                                  gate=spec.problem.get("gate", "none"))
        run = evaluator.verify if mode == "verify" else evaluator.evaluate
        outcome = run(spec, compiled)
        conn.send(outcome.as_dict())
        if outcome.poisoned:
            break
    conn.close()
    os._exit(0)  # no CUDA teardown: a poisoned context must not block the exit


class IsolatedWorker:
    """Runs jobs in order in a child process, replacing it after a poisoned, hung or lost one."""

    def __init__(self, cache_dir: str | None = None, mode: str = "verify",
                 families: Path | None = None) -> None:
        """``families``: a file of more kernel families (templates/family_module.py)."""
        self._cache_dir, self._mode, self._families = cache_dir, mode, families
        self._ctx = mp.get_context("spawn")
        self._proc: Any = None
        self._conn: Connection | None = None
        self.fingerprint: dict = {}

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_child, args=(child, self._cache_dir, self._mode, self._families),
                                       daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not parent.poll(STARTUP_S):
            self._kill()
            raise RuntimeError("the GPU worker process did not start")
        self.fingerprint = parent.recv()["ready"]

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join()
        self._proc = self._conn = None

    def run(self, specs: Iterable[TrialSpec]) -> Iterator[dict]:
        """Each spec's outcome dict, in order."""
        for spec in specs:
            if self._proc is None:
                self._start()
            assert self._conn is not None
            self._conn.send(asdict(spec))
            outcome = self._receive(spec.timeout_s + SLACK_S)
            if outcome.get("poisoned"):
                self._kill()
            yield outcome

    def _receive(self, timeout_s: float) -> dict:
        try:
            if self._conn.poll(timeout_s):
                return self._conn.recv()
            status, log = Status.TIMEOUT, f"no answer within {timeout_s:.0f} s: the worker was killed"
        except (EOFError, OSError):
            status, log = Status.WORKER_LOST, "the worker process died"
        self._kill()
        return {"status": status.value, "log": log, "poisoned": True}

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.send(None)
            except OSError:
                pass
        if self._proc is not None:
            self._proc.join(timeout=10)
        self._kill()
