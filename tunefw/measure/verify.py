"""`tunefw verify`: the strict verification of every trial (evaluate/strict.py), as a product
command over a dispatch table's winners or a sample of a family's valid configs, on the table's
own shapes and on edge shapes, each job in an isolated GPU worker process (the GPU scripts run
their jobs here too, optionally timed as a sweep trial is)."""
from __future__ import annotations

import datetime
import itertools
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path

from tunefw.device import DeviceSpec, H200
from tunefw.errors import UserError
from tunefw.outcome import TrialSpec, cublas_ratio
from tunefw.problem import GemmProblem, parse_shape
from tunefw.templates import get_family
from tunefw.templates.family_module import FamilyModule, load_family_module
from tunefw.tune.space import random_valid

# Odd M, N and K just past tile multiples, one k-step, one row tile, decode and skinny shapes.
EDGE_SHAPES = ((1, 8, 8), (3, 24, 40), (17, 4104, 4104), (129, 136, 264), (1, 4096, 14336),
               (7, 136, 264), (64, 8, 4096), (33, 4104, 520), (257, 4104, 4096), (300, 1000, 520))
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Job:
    """One config of one family on one shape, and where it came from."""

    family: str
    config: dict
    problem: GemmProblem
    source: str  # "entry MxNxK" or "sample"

    def spec(self, trial_id: int, timeout_s: float = TIMEOUT_S) -> TrialSpec:
        return TrialSpec(trial_id, self.family, dict(self.config), self.problem.as_dict(), timeout_s)

    def as_dict(self) -> dict:
        return {"family": self.family, "config": self.config, "problem": self.problem.as_dict(),
                "source": self.source}

    @classmethod
    def from_dict(cls, data: dict) -> "Job":
        return cls(data["family"], data["config"], GemmProblem(**data["problem"]), data["source"])


def parse_shapes(text: str | None, dtype: str = "bf16") -> list[GemmProblem]:
    """'edge' (the built-in edge shapes), a file of MxNxK lines, or none."""
    if not text:
        return []
    if text == "edge":
        return [GemmProblem(m, n, k, dtype) for m, n, k in EDGE_SHAPES]
    path = Path(text)
    if not path.is_file():
        raise UserError(f"--shapes {text!r}: expected 'edge' or a file of MxNxK lines")
    lines = [line.split("#")[0].strip() for line in path.read_text(errors="replace").splitlines()]
    return [parse_shape(line, dtype) for line in lines if line]


def plan(target: str, shapes: list[GemmProblem], sample: int, seed: int,
         device: DeviceSpec = H200, families: FamilyModule | None = None) -> list[Job]:
    """The jobs for a dispatch table (each served entry on its shape and on every given shape it
    is valid for) or a family (``sample`` random valid configs on each given shape; tunefw's or
    one of ``families``)."""
    known = (families or load_family_module(None)).all_families()
    if target in known:
        family = known[target]
        if not shapes:
            raise UserError(f"verify {target}: give --shapes edge or a shapes file")
        rng = random.Random(seed)
        jobs = []
        for problem in shapes:
            valid = random_valid(family, rng, problem, device)
            jobs += [Job(target, c, problem, "sample") for c in itertools.islice(valid, sample)]
        return jobs
    from tunefw.runtime.dispatch import load
    table = load(target)
    jobs = []
    for e in table.entries:
        if e.is_cublas:
            continue
        family = get_family(e.family)
        where = f"entry {e.M}x{e.N}x{e.K}"
        jobs.append(Job(e.family, e.config, e.problem, where))
        jobs += [Job(e.family, e.config, p, where) for p in shapes
                 if p != e.problem and family.check(e.config, p, device) is None]
    return jobs


def compile_all(jobs: list[Job], arch: str, cache_dir: str | None = None,
                families: FamilyModule | None = None) -> dict:
    """Every distinct kernel of the jobs compiled on all cores into the cache the worker reads
    (it compiles one at a time, so a cold cache would serialize the compiles); per kernel
    ("family name-expression") its CompileResult."""
    from tunefw.cuda.compiler import CompilePool

    module = families or load_family_module(None)
    kernels: dict[str, Job] = {}
    for job in jobs:
        template = module.get(job.family)
        name = template.name_expression(job.config, job.problem.dtype, job.problem.gate)
        kernels.setdefault(f"{job.family} {name}", job)
    results = {}
    for source_dir in {module.source_dir(j.family) for j in kernels.values()}:
        mine = {k: j for k, j in kernels.items() if module.source_dir(j.family) == source_dir}
        with CompilePool(min(os.cpu_count() or 1, len(mine)), cache_dir=cache_dir,
                         source_dir=source_dir) as pool:
            futures = {k: pool.submit(module.get(j.family), j.config, j.problem.dtype, arch,
                                      gate=j.problem.gate)
                       for k, j in mine.items()}
            results.update({k: f.result() for k, f in futures.items()})
    return results


def run_verify(jobs: list[Job], cache_dir: str | None = None, timeout_s: float = TIMEOUT_S,
               families: FamilyModule | None = None, timed: bool = False) -> dict:
    """Strictly verify every job on cuda:0 (isolated worker, ``timeout_s`` each; the jobs'
    families are tunefw's or ``families'``), their kernels compiled first on all cores; the
    result-file dict. ``timed``: each job runs as a sweep trial (verified, then screened
    interleaved with cuBLAS), its row with TFLOP/s, cuBLAS TFLOP/s and their ratio."""
    import torch
    if not torch.cuda.is_available():
        raise UserError("tunefw verify needs a CUDA GPU (none is visible)")
    from tunefw.cuda.driver import local_spec
    from tunefw.evaluate.isolated import IsolatedWorker

    start = time.monotonic()
    compiled = compile_all(jobs, local_spec(0).arch, cache_dir, families)
    compile_s = round(time.monotonic() - start, 1)
    worker = IsolatedWorker(cache_dir, mode="evaluate" if timed else "verify",
                            families=families and families.path)
    rows = []
    try:
        for job, outcome in zip(jobs, worker.run(j.spec(i, timeout_s) for i, j in enumerate(jobs))):
            rows.append(result_row(job, outcome, timed))
    finally:
        worker.close()
    return {"script": "tunefw verify", "date": datetime.date.today().isoformat(),
            "device": worker.fingerprint, "checked": len(rows),
            "wrong": sum(r["status"] == "WRONG_ANSWER" for r in rows),
            "failed": sum(r["status"] != "OK" for r in rows),
            "statuses": status_counts(rows), "rows": rows,
            "compile": {"kernels": len(compiled), "ok": sum(r.ok for r in compiled.values()),
                        "seconds": compile_s}}


def result_row(job: Job, outcome: dict, timed: bool = False) -> dict:
    """A job's row of the result file from its outcome dict (and, timed, its figures)."""
    row = {"family": job.family, "config": job.config, **job.problem.as_dict(),
           "source": job.source, "status": outcome["status"],
           "log": (outcome.get("log") or "")[:300], "rel_err": outcome.get("rel_err")}
    if timed:
        row.update({k: outcome.get(k) for k in ("tflops", "cublas_tflops", "median_ms",
                                                 "min_ms", "iqr_ms", "cublas_median_ms")},
                   ratio=cublas_ratio(outcome.get("tflops"), outcome.get("cublas_tflops")))
    return row


def status_counts(rows: list[dict]) -> dict[str, int]:
    """How many rows ended in each status, by status name."""
    return {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}


def counts_text(statuses: dict[str, int]) -> str:
    """'12 OK, 1 WRONG_ANSWER' (or '-' for none)."""
    return ", ".join(f"{n} {s}" for s, n in statuses.items()) or "-"


def summary(result: dict) -> str:
    """One line: how many were checked and how they ended."""
    return (f"verified {result['checked']} config-shape pairs on "
            f"{result['device'].get('name')}: {counts_text(result['statuses'])}")
