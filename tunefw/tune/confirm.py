"""Confirmation: each problem's top configs re-timed interleaved with cuBLAS on the search's
pipeline and pool; the best ratio picks the problem's winner, and the pick is re-timed once more
on its own (held out): the best of N noisy confirmations overstates the winner's ratio (the
winner's curse), and a dispatch table decides on that figure whether to ship the kernel or
cuBLAS. A pick whose re-run fails (a wrong answer on another launch) is passed over. Each
problem's winner is stored as soon as it is known: confirming a large study takes minutes, and
a launch cut in the middle keeps what it confirmed."""
from __future__ import annotations

from tunefw.outcome import Outcome, TrialSpec
from tunefw.store import queries as q
from tunefw.tune.pipeline import Pipeline
from tunefw.tune.pool import Job


def ranked(rows: list[tuple[int, Outcome]]) -> list[tuple[int, Outcome]]:
    """A problem's confirmations, best first: by the ratio to the cuBLAS interleaved with each.
    Each confirmation runs at its own point of the GPU's power cycle (on the H200 the clock
    moved 8% within a second at 4096^3); its own cuBLAS figure cancels that, raw TFLOP/s do not."""
    if all(o.ratio is not None for _, o in rows):
        return sorted(rows, key=lambda r: r[1].ratio, reverse=True)
    return sorted(rows, key=lambda r: r[1].tflops or 0.0, reverse=True)


class Confirmer:
    """Confirms a round's top ``top`` configs per problem and stores each problem's winner the
    moment its held-out re-run is in (event "confirmed", one per winner: its confirmed and
    screened ratio). Problems whose winner this round already confirmed are skipped, so a launch
    cut during confirmation (time limit, Ctrl-C, a kill) redoes only the problems it had not
    finished. Where every candidate fails, the next ``top`` configs of the ranking are tried."""

    def __init__(self, pipeline: Pipeline, round_: int, top: int) -> None:
        self.pipeline = pipeline
        self.round = round_
        self.top = top
        self.screened: dict[int, float | None] = {}  # trial id -> the ratio its screen measured
        self.specs: dict[int, TrialSpec] = {}  # trial id -> what its confirmation runs
        self.waiting: dict[int, int] = {}  # problem id -> confirmations not yet in
        self.results: dict[int, list[tuple[int, Outcome]]] = {}  # problem id -> OK confirmations
        self.queue: dict[int, list[tuple[int, Outcome]]] = {}  # problem id -> held-out candidates
        self.picked: dict[int, tuple[int, Outcome]] = {}
        self.compiled: dict[int, object] = {}  # trial id -> its confirmation's cubin (re-runs)
        self.tried: dict[int, set[int]] = {}  # problem id -> trial ids confirmed this launch

    def jobs(self) -> list[Job]:
        """One confirm job per top config of each problem not yet confirmed this round
        (context: problem id, trial id, "confirm")."""
        jobs = []
        with self.pipeline.recorder.store.session() as s:
            for st in self.pipeline.states.values():
                if not q.confirmed_in_round(s, st.row, self.round):
                    jobs += self._confirm_jobs(s, st.row.id)
        return jobs

    def _confirm_jobs(self, s, problem_id: int) -> list[Job]:
        """The problem's next ``top`` OK configs by screened ratio not yet confirmed, one
        confirm job each (none left: the problem gets no winner this launch)."""
        st = self.pipeline.states[problem_id]
        tried = self.tried.setdefault(problem_id, set())
        jobs = []
        for t in q.top_trials(s, st.row, self.round, len(tried) + self.top):
            if t.id in tried:
                continue
            tried.add(t.id)
            self.screened[t.id] = t.ratio
            self.specs[t.id] = self.pipeline.trial_spec(st, t.optuna_trial or t.id, t.family,
                                                        t.config)
            jobs.append(Job(self.specs[t.id], kind="confirm",
                            context=(problem_id, t.id, "confirm")))
        self.waiting[problem_id] = len(jobs)
        return jobs

    def _next_held_out(self, problem_id: int) -> list[Job]:
        """The problem's best confirmed config not yet passed over, re-timed on its own (the
        held-out figure is the winner's: the best of N noisy confirmations overstates it); when
        every candidate failed (a wrong answer or a crash on another launch), the next ``top``
        configs of the ranking are confirmed: a problem whose top configs are unsound still
        gets its best sound one, and a finished study is never left waiting for it."""
        rows = self.queue.get(problem_id)
        if rows:
            trial_id = rows[0][0]
            return [Job(self.specs[trial_id], compiled=self.compiled.get(trial_id),
                        kind="confirm", context=(problem_id, trial_id, "held_out"))]
        self.queue.pop(problem_id, None)
        with self.pipeline.recorder.store.session() as s:
            return self._confirm_jobs(s, problem_id)

    def _arrived(self, job: Job, outcome: Outcome) -> list[Job]:
        """One confirmation's outcome: the jobs it leads to (a held-out re-run, or the next
        candidate's when a pick's re-run fails)."""
        problem_id, trial_id, stage = job.context
        if stage == "confirm":
            self.compiled[trial_id] = job.compiled
            if outcome.ok:
                self.results.setdefault(problem_id, []).append((trial_id, outcome))
            self.waiting[problem_id] -= 1
            if self.waiting[problem_id]:
                return []
            self.queue[problem_id] = ranked(self.results.pop(problem_id, []))
            return self._next_held_out(problem_id)
        if not outcome.ok:  # a pick whose re-run fails (a wrong answer on another launch)
            self.queue[problem_id].pop(0)
            return self._next_held_out(problem_id)
        del self.queue[problem_id]
        self._store(problem_id, trial_id, outcome)
        return []

    def _store(self, problem_id: int, trial_id: int, best: Outcome) -> None:
        """Write one winner (its own transaction) and report it."""
        self.picked[problem_id] = (trial_id, best)
        self.pipeline.recorder.winners({problem_id: (trial_id, best)})
        self.pipeline.progress("confirmed", {"winners": [
            {"key": self.pipeline.states[problem_id].row.key, "trial_id": trial_id,
             "ratio": best.ratio, "tflops": best.tflops,
             "screen_ratio": self.screened.get(trial_id)}]})

    def run(self, deadline: float | None = None) -> dict[int, tuple[int, Outcome]]:
        """Confirm and store the winners of the problems not yet confirmed this round: problem
        id -> (trial id, confirmation). Past ``deadline`` (time.monotonic()) nothing more
        starts (``self.pipeline.cut`` then says so): the next launch confirms the rest."""
        jobs = self.jobs()
        if not jobs:
            return {}
        self.pipeline.progress("confirm", {"configs": len(jobs),
                                           "problems": sum(n > 0 for n in self.waiting.values())})
        self.pipeline.run_jobs(jobs, self._arrived, deadline)
        return self.picked
