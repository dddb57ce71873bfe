"""What `tunefw report` shows, read from the database in one session: per problem its trials and
best config, the device the study ran on, and which kind of result it is (a measurement, or a
SIMULATED or REPLAY stand-in for one)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from tunefw.device import KNOWN_DEVICES, DeviceSpec
from tunefw.outcome import NOT_COUNTED, Status
from tunefw.problem import GemmProblem
from tunefw.store import Store
from tunefw.store import queries as q
from tunefw.templates import FAMILIES

# The device-name prefixes of results that are not measurements (evaluate/sim.py, replay.py).
KIND_PREFIXES = ("SIMULATED ", "REPLAY ")


@dataclass(frozen=True)
class TrialPoint:
    """One evaluated trial as the figures plot it (INVALID and NOT_RECORDED rows never ran and
    are not points)."""

    id: int  # the trial's row id
    index: int  # 1-based among the problem's evaluated trials: the search's trial number
    order: int  # 1-based among the whole study's evaluated trials, in the order they were written
    status: str
    family: str
    config: dict
    ratio: float | None  # TFLOP/s over cuBLAS's: OK trials with a cuBLAS figure only


@dataclass
class ProblemReport:
    """One problem: its label, outcome counts, evaluated trials and best config."""

    label: str
    problem: GemmProblem
    outcomes: dict[str, int]
    trials: list[TrialPoint]
    best: dict | None  # queries.problem_summary's best: the winner, else the best OK trial

    @property
    def curve(self) -> list[float | None]:
        """Best ratio so far after each evaluated trial."""
        return best_so_far(self.trials)


@dataclass
class StudyReport:
    """Everything the page shows; ``kind`` is 'SIMULATED', 'REPLAY' or None (a measurement)."""

    name: str
    round: int
    backend: str | None
    kind: str | None
    fingerprint: dict
    device: DeviceSpec | None  # the known device the results came from (None: rates unknown)
    problems: list[ProblemReport]
    stats: dict = field(default_factory=dict)

    @property
    def families(self) -> list[str]:
        """The families with evaluated trials, in the registry's order."""
        used = {t.family for p in self.problems for t in p.trials}
        return [f for f in FAMILIES if f in used] + sorted(used - set(FAMILIES))


def best_so_far(trials: Iterable[Any]) -> list[float | None]:
    """Running best ratio to cuBLAS of the OK trials over the evaluated ones (INVALID and
    NOT_RECORDED ones cost nothing and are skipped)."""
    best: float | None = None
    out = []
    for t in trials:
        if t.status in NOT_COUNTED:
            continue
        if t.status == Status.OK.value and t.ratio is not None:
            best = t.ratio if best is None else max(best, t.ratio)
        out.append(best)
    return out


def result_kind(backend: str | None, fingerprint: dict, stats: dict) -> str | None:
    """'SIMULATED' or 'REPLAY' where the study's results are not measurements, else None."""
    if backend == "sim" or fingerprint.get("simulated") or stats.get("simulated"):
        return "SIMULATED"
    if backend == "replay" or fingerprint.get("replay") or stats.get("replay"):
        return "REPLAY"
    return None


def device_of(fingerprint: dict) -> DeviceSpec | None:
    """The known device a fingerprint names (a SIMULATED or REPLAY one: the device it stands
    for), or None where tunefw/device.py declares no rates for it."""
    name = str(fingerprint.get("name", ""))
    for prefix in KIND_PREFIXES:
        name = name.removeprefix(prefix)
    return KNOWN_DEVICES.get(name)


def study_data(store: Store, name: str) -> StudyReport:
    """The report of study ``name``, read in one session."""
    with store.session() as s:
        study = q.get_study(s, name)
        rows = {p.id: q.problem_trials(s, study, p) for p in study.problems}
        evaluated = sorted(t.id for ts in rows.values() for t in ts if t.status not in NOT_COUNTED)
        order = {trial_id: n for n, trial_id in enumerate(evaluated, 1)}
        problems = []
        for p in study.problems:
            points = [TrialPoint(t.id, i, order[t.id], t.status, t.family, dict(t.config),
                                 t.ratio if t.status == Status.OK.value else None)
                      for i, t in enumerate((t for t in rows[p.id] if t.id in order), 1)]
            summary = q.problem_summary(s, study, p)
            problems.append(ProblemReport(
                f"{p.M}x{p.N}x{p.K} {p.dtype}" + (f" ({p.label})" if p.label else ""),
                q.as_problem(p), summary["outcomes"], points, summary["best"]))
        fingerprint = study.fingerprint or next(
            (t.fingerprint for ts in rows.values() for t in ts if t.fingerprint), {})
        stats = dict(study.stats or {})
        return StudyReport(study.name, study.round, study.backend,
                           result_kind(study.backend, fingerprint, stats), dict(fingerprint),
                           device_of(fingerprint), problems, stats)
