"""Confirmation: each problem's top configs re-timed interleaved with cuBLAS on the search's
pipeline and pool; the best ratio picks the problem's winner, and the pick is re-timed once more
on its own (held out): the best of N noisy confirmations overstates the winner's ratio (the
winner's curse), and a dispatch table decides on that figure whether to ship the kernel or
cuBLAS. A pick whose re-run fails (a wrong answer on another launch) is passed over."""
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
    """Confirms a round's top ``top`` configs per problem, stores the winners and reports them
    (event "confirmed": each winner's confirmed and screened ratio)."""

    def __init__(self, pipeline: Pipeline, round_: int, top: int) -> None:
        self.pipeline = pipeline
        self.round = round_
        self.top = top
        self.screened: dict[int, float | None] = {}  # trial id -> the ratio its screen measured

    def jobs(self) -> list[Job]:
        """One confirm job per top config of each problem (context: problem id, trial id)."""
        jobs = []
        with self.pipeline.recorder.store.session() as s:
            for st in self.pipeline.states.values():
                for t in q.top_trials(s, st.row, self.round, self.top):
                    self.screened[t.id] = t.ratio
                    spec = self.pipeline.trial_spec(st, t.optuna_trial or t.id, t.family,
                                                    t.config)
                    jobs.append(Job(spec, kind="confirm", context=(st.row.id, t.id)))
        return jobs

    def held_out(self, results: dict[int, list[tuple[int, Outcome]]],
                 specs: dict[int, TrialSpec]) -> dict[int, tuple[int, Outcome]]:
        """Each problem's pick re-timed on its own (``specs``: trial id -> what its confirmation
        ran), that figure its winner's; a pick whose re-run fails gives way to the next confirmed
        config (none left: no winner this launch)."""
        queue = {problem_id: ranked(rows) for problem_id, rows in results.items()}
        picked: dict[int, tuple[int, Outcome]] = {}
        while queue:
            jobs = [Job(specs[rows[0][0]], kind="confirm", context=(problem_id, rows[0][0]))
                    for problem_id, rows in queue.items()]
            for job, outcome in self.pipeline.run_jobs(jobs):
                problem_id, trial_id = job.context
                if outcome.ok:
                    picked[problem_id] = (trial_id, outcome)
                    del queue[problem_id]
                else:
                    queue[problem_id].pop(0)
                    if not queue[problem_id]:
                        del queue[problem_id]
        return picked

    def run(self) -> dict[int, tuple[int, Outcome]]:
        """Confirm, store and return the winners: problem id -> (trial id, confirmation)."""
        jobs = self.jobs()
        if not jobs:
            return {}
        self.pipeline.progress("confirm", {"configs": len(jobs)})
        results: dict[int, list[tuple[int, Outcome]]] = {}
        for job, outcome in self.pipeline.run_jobs(jobs):
            problem_id, trial_id = job.context
            if outcome.ok:
                results.setdefault(problem_id, []).append((trial_id, outcome))
        picked = self.held_out(results, {job.context[1]: job.spec for job in jobs})
        self.pipeline.recorder.winners(picked)
        states = self.pipeline.states
        self.pipeline.progress("confirmed", {"winners": [
            {"key": states[problem_id].row.key, "trial_id": trial_id, "ratio": best.ratio,
             "tflops": best.tflops, "screen_ratio": self.screened.get(trial_id)}
            for problem_id, (trial_id, best) in picked.items()]})
        return picked
