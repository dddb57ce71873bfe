"""Confirmation: each problem's top configs re-timed interleaved with cuBLAS on the search's
pipeline and pool; the best ratio becomes the problem's winner."""
from __future__ import annotations

from tunefw.outcome import Outcome
from tunefw.store import queries as q
from tunefw.tune.pipeline import Pipeline
from tunefw.tune.pool import Job


def pick_confirmed(rows: list[tuple[int, Outcome]]) -> tuple[int, Outcome]:
    """The winner among a problem's confirmations: the best ratio to the cuBLAS interleaved with
    it. Each confirmation runs at its own point of the GPU's power cycle (on the H200 the clock
    moved 8% within a second at 4096^3); its own cuBLAS figure cancels that, raw TFLOP/s do not."""
    if all(o.ratio is not None for _, o in rows):
        return max(rows, key=lambda r: r[1].ratio)
    return max(rows, key=lambda r: r[1].tflops or 0.0)


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
        picked = {problem_id: pick_confirmed(rows) for problem_id, rows in results.items()}
        self.pipeline.recorder.winners(picked)
        states = self.pipeline.states
        self.pipeline.progress("confirmed", {"winners": [
            {"key": states[problem_id].row.key, "trial_id": trial_id, "ratio": best.ratio,
             "tflops": best.tflops, "screen_ratio": self.screened.get(trial_id)}
            for problem_id, (trial_id, best) in picked.items()]})
        return picked
