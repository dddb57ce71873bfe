"""`tunefw verify`: the strict verification of every trial (evaluate/strict.py), as a product
command over a dispatch table's winners or a sample of a family's valid configs, on the table's
own shapes and on edge shapes, each job in an isolated GPU worker process."""
from __future__ import annotations

import datetime
import json
import random
from dataclasses import dataclass
from pathlib import Path

from tunefw.device import DeviceSpec, H200
from tunefw.errors import UserError
from tunefw.outcome import TrialSpec
from tunefw.problem import GemmProblem, parse_shape
from tunefw.templates import get_family
from tunefw.templates.family_module import FamilyModule, load_family_module

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
            space = [c for c in family.iter_space() if family.check(c, problem, device) is None]
            rng.shuffle(space)
            jobs += [Job(target, c, problem, "sample") for c in space[:sample]]
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


def run_verify(jobs: list[Job], cache_dir: str | None = None, timeout_s: float = TIMEOUT_S,
               families: FamilyModule | None = None) -> dict:
    """Strictly verify every job on cuda:0 (isolated worker, ``timeout_s`` each; the jobs'
    families are tunefw's or ``families``'); the result-file dict."""
    import torch
    if not torch.cuda.is_available():
        raise UserError("tunefw verify needs a CUDA GPU (none is visible)")
    from tunefw.evaluate.isolated import IsolatedWorker

    worker = IsolatedWorker(cache_dir, mode="verify", families=families and families.path)
    rows = []
    try:
        for job, outcome in zip(jobs, worker.run(j.spec(i, timeout_s) for i, j in enumerate(jobs))):
            rows.append({"family": job.family, "config": job.config, **job.problem.as_dict(),
                         "source": job.source, "status": outcome["status"],
                         "log": (outcome.get("log") or "")[:300], "rel_err": outcome.get("rel_err")})
    finally:
        worker.close()
    return {"script": "tunefw verify", "date": datetime.date.today().isoformat(),
            "device": worker.fingerprint, "checked": len(rows),
            "wrong": sum(r["status"] == "WRONG_ANSWER" for r in rows),
            "failed": sum(r["status"] != "OK" for r in rows),
            "statuses": status_counts(rows), "rows": rows}


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


def write(result: dict, path: Path) -> None:
    from tunefw.fileio import write_atomic
    write_atomic(path, json.dumps(result, indent=1, default=str))
