"""The sweep's only database writer: each trial row in its own transaction (a kill loses at most
the trials in flight), the rejected configs in one, the confirmed winners and the figures."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from sqlalchemy.orm import Session

from tunefw.outcome import Outcome, Status, fingerprint_key
from tunefw.store import Store
from tunefw.store import queries as q
from tunefw.store.models import Problem, Study, Trial
from tunefw.templates import FAMILIES, get_family
from tunefw.tune.interrupt import deferred


@dataclass
class Row:
    """What a trial row says beyond its outcome: the problem, the config and its key."""

    problem_id: int
    family: str
    config: dict
    key: str


class Recorder:
    """Writes one study's rows (trials of its current round, winners, stats), each write
    first through ``fence`` (the launch lease's: no row is written once the lease is lost)."""

    def __init__(self, store: Store, study_id: int, evaluator: str,
                 fence: Callable[[Session], None] | None = None) -> None:
        self.store = store
        self.study_id = study_id
        self.evaluator = evaluator
        self.source_hash = {f: get_family(f).source_hash() for f in FAMILIES}
        self.fence = fence or (lambda s: None)

    @contextmanager
    def _session(self) -> Iterator[Session]:
        """A write transaction, fenced first; a Ctrl-C or SIGTERM waits for its end."""
        with deferred(), self.store.session() as s:
            self.fence(s)
            yield s

    def trial(self, row: Row, outcome: Outcome, optuna_trial: int | None, attempts: int = 1,
              reused: int | None = None, retry_of: int | None = None) -> int:
        """Store one finished trial; its row id."""
        with self._session() as s:
            return self._add(s, row, outcome, optuna_trial, attempts, reused, retry_of)

    def rejected(self, rows: list[tuple[Row, Outcome]]) -> None:
        """Store configs answered without evaluation (INVALID, NOT_RECORDED) in one
        transaction: TPE's rejects can outnumber the trials, and a commit each slowed the loop."""
        if not rows:
            return
        with self._session() as s:
            for row, outcome in rows:
                self._add(s, row, outcome, None)

    def _add(self, s, row: Row, outcome: Outcome, optuna_trial: int | None, attempts: int = 1,
             reused: int | None = None, retry_of: int | None = None) -> int:
        study = s.get(Study, self.study_id)
        return q.record_trial(s, study, s.get(Problem, row.problem_id), row.family, row.config,
                              row.key, outcome, self.source_hash[row.family], optuna_trial,
                              attempts, reused, retry_of).id

    def reusable(self, problem: Problem, family: str, key: str,
                 fingerprint: dict) -> tuple[int, Outcome] | None:
        """A stored measurement of the same config, sources, evaluator and device (its row id
        and outcome), or None."""
        with self.store.session() as s:
            old = q.find_reusable(s, q.as_problem(problem), key, self.source_hash[family],
                                  self.evaluator, fingerprint_key(fingerprint))
            if old is None:
                return None
            return old.id, Outcome(Status(old.status), log=f"reused trial {old.id}\n{old.log}",
                                   median_ms=old.median_ms, min_ms=old.min_ms,
                                   iqr_ms=old.iqr_ms, tflops=old.tflops, rel_err=old.rel_err,
                                   cublas_tflops=old.cublas_tflops,
                                   fingerprint=old.fingerprint, gpu=old.gpu,
                                   evaluator=old.evaluator, ptxas_regs=old.ptxas_regs,
                                   ptxas_smem_bytes=old.ptxas_smem_bytes,
                                   ptxas_spill_bytes=old.ptxas_spill_bytes)

    def winners(self, picked: dict[int, tuple[int, Outcome]]) -> None:
        """Store each problem's confirmed winner: problem id -> (trial id, confirmation)."""
        with self._session() as s:
            for problem_id, (trial_id, best) in picked.items():
                q.set_winner(s, s.get(Problem, problem_id), s.get(Trial, trial_id),
                             best.tflops, best.cublas_tflops, confirmed=True)

    def stats(self, stats: dict) -> None:
        """Store a launch's sweep figures with the study."""
        with self._session() as s:
            s.get(Study, self.study_id).stats = stats
