"""Optuna search for one problem: the families' declared spaces become distributions; asks yield
configs, invalid ones are answered at once, repeats reuse stored results, tells close trials."""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any, Container, Iterator, Sequence

import optuna
from optuna.trial import TrialState

from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.templates import config_key, get_family
from tunefw.tune.sampler_host import RemoteTPE, SamplerHost
from tunefw.tune.sampling import (ENUMERATED, FAMILY_PARAM, OBJECTIVE, ScreenedTPE,
                                  distributions_for, encoding_mismatch, make_sampler,
                                  params_for, screen_candidates, suggest_config)
from tunefw.tune.space import uniform_order

__all__ = ["DurableMirror", "ProblemSearch", "Proposal", "enumerate_valid", "trial_attrs"]

STALL_LIMIT = 64  # asks in a row that bring nothing new before the space is enumerated


def enumerate_valid(families: list[str], problem: GemmProblem,
                    device: DeviceSpec) -> Iterator[tuple[str, dict]]:
    """Every valid (family, config) of the problem, in the declared order."""
    for fam_name in families:
        fam = get_family(fam_name)
        for config in fam.iter_space():
            if fam.check(config, problem, device) is None:
                yield fam_name, config


@dataclass
class Proposal:
    """What an ask produced: a config to evaluate, or one answered without evaluation."""

    trial: optuna.trial.Trial
    family: str
    config: dict
    key: str
    invalid_reason: str | None = None


class ProblemSearch:
    """The Optuna study of one (tunefw study, problem, round).

    The sampler works on an in-memory study (an ask in Optuna's RDB storage costs a transaction
    per parameter); every evaluated trial is mirrored into the durable study in the database in
    one write, so optuna.load_study and optuna-dashboard see the search and a resumed launch
    starts from it.
    """

    def __init__(self, storage: optuna.storages.BaseStorage, study_name: str, sampler: str,
                 seed: int, families: list[str], problem: GemmProblem,
                 device: DeviceSpec, mirror: "DurableMirror | None" = None,
                 host: SamplerHost | None = None,
                 prior: Sequence[tuple[str, dict]] = ()) -> None:
        """``host``: run TPE in that sampler process (a sweep's driver does); else in-process.
        ``prior``: (family, config) pairs a fresh search asks before the seeds (a new round
        starts from every earlier round's best, so it never knows less than any of them did)."""
        self.families = families
        self.mirror = mirror
        self.problem = problem
        self.device = device
        self.grid = sampler == "grid"
        self.enumerated = sampler in ENUMERATED
        self.durable = optuna.create_study(storage=storage, study_name=study_name,
                                           direction="maximize", load_if_exists=True)
        if self.durable.metric_names != [OBJECTIVE]:
            self.durable.set_metric_names([OBJECTIVE])
        self.study = optuna.create_study(
            direction="maximize",
            sampler=(host.sampler(seed, families, problem, device) if host and sampler == "tpe"
                     else make_sampler(sampler, seed, len(families))))
        stored = self.durable.get_trials(deepcopy=False)
        mismatch = encoding_mismatch(stored, families)
        if mismatch:
            raise UserError(f"Optuna study {study_name!r} stores {mismatch} in another encoding "
                            "(an older tunefw): pass --new-round to start a new round")
        for trial in stored:
            if trial.state in (TrialState.COMPLETE, TrialState.FAIL):
                self.study.add_trial(_steering_copy(trial))
        self._next_number = len(stored)  # numbers the durable study will give our next writes
        self._seed = seed
        self._order: Iterator[tuple[str, dict]] | None = None  # the valid space, as enumerated
        self.stall = 0
        if not stored and not self.enumerated:
            self._enqueue_seeds(prior)

    def _enqueue_seeds(self, prior: Sequence[tuple[str, dict]]) -> None:
        """A fresh search starts from the prior configs, then each family's seed configs, that
        can run this problem (in this search's families)."""
        seeds = [(f, c) for f, c in prior if f in self.families]
        seeds += [(f, c) for f in self.families for c in get_family(f).seed_configs()]
        for fam_name, config in seeds:
            family = get_family(fam_name)
            if family.check(config, self.problem, self.device) is None:
                self.study.enqueue_trial(params_for(family, config, self.families),
                                         skip_if_exists=True)

    def _enqueue_next(self, known: Container[str]) -> bool:
        """Enumerated mode: enqueue the next config not yet known; False when none is left.
        The grid walks the declared order; every other sampler (uniform, and a search's
        fallback after a stall) the seeded uniform order, so a resumed search walks the same
        order and skips what it measured."""
        if self._order is None:
            self._order = (enumerate_valid(self.families, self.problem, self.device) if self.grid
                           else uniform_order(self.families, self.problem, self.device,
                                              self._seed))
        for fam, config in self._order:
            if config_key(fam, config) not in known:
                self.study.enqueue_trial(params_for(get_family(fam), config, self.families),
                                         skip_if_exists=False)
                return True
        return False

    def ask(self, known: Container[str]) -> Proposal | None:
        """One proposal; None when the valid space holds nothing that is not already known."""
        if self.enumerated or self.stall >= STALL_LIMIT:
            if not self._enqueue_next(known):
                return None
        sampler = self.study.sampler
        if isinstance(sampler, ScreenedTPE):
            sampler.screen = lambda samples: screen_candidates(samples, self.families,
                                                               self.problem, self.device, known)
        elif isinstance(sampler, RemoteTPE):
            sampler.known = known
        screened = isinstance(sampler, (ScreenedTPE, RemoteTPE))
        if screened:
            sampler.missed = False
        trial = self.study.ask()
        fam_name = (trial.suggest_categorical(FAMILY_PARAM, self.families)
                    if len(self.families) > 1 else self.families[0])
        family = get_family(fam_name)
        config = suggest_config(trial, family)
        key = config_key(fam_name, config)
        reason = family.check(config, self.problem, self.device)
        if reason is not None or key in known:
            # TPE's redraws found nothing the screen keeps: enumerate on the next ask
            missed = screened and sampler.missed
            self.stall = STALL_LIMIT if missed else self.stall + 1
        else:
            self.stall = 0
        return Proposal(trial, fam_name, config, key, reason)

    @property
    def redraws(self) -> int:
        """Relative draws TPE's screen refused and drew again (in this process or, for a
        RemoteTPE, in the sampler process: it reports them with each relative sample)."""
        sampler = self.study.sampler
        return sampler.redraws if isinstance(sampler, (ScreenedTPE, RemoteTPE)) else 0

    def restore(self, recorded: list[tuple]) -> None:
        """Write back durable trials a killed launch recorded as rows but never mirrored:
        rows (optuna number, family, config, objective value or None[, user attrs]) numbered
        past the durable study."""
        for number, fam_name, config, value, *attrs in sorted(
                (r for r in recorded if r[0] >= self._next_number), key=lambda r: r[0]):
            family = get_family(fam_name)
            trial = optuna.trial.create_trial(
                params=params_for(family, config, self.families),
                distributions=distributions_for(family, self.families),
                value=value, state=TrialState.COMPLETE if value is not None else TrialState.FAIL,
                user_attrs=attrs[0] if attrs else None)
            self.durable.add_trial(trial)
            self.study.add_trial(_steering_copy(trial))
            self._next_number += 1

    def tell(self, trial: optuna.trial.Trial, value: float | None) -> optuna.trial.FrozenTrial:
        """Close a trial with its objective value (the sweep's: the ratio to cuBLAS), or None for
        no result (invalid, wrong, crashed...). The sampler sees a failure as 0, so it learns to
        avoid impossible regions (failed trials are invisible to TPE)."""
        return self.study.tell(trial, value if value is not None else 0.0)

    @property
    def next_number(self) -> int:
        """The number the durable study gives the next trial ``record`` writes."""
        return self._next_number

    def record(self, told: optuna.trial.FrozenTrial, value: float | None,
               attrs: dict[str, Any] | None = None) -> None:
        """Write a told trial to the durable study (FAILED when it has no result) with the
        user attributes a dashboard shows beside it (trial_attrs()). Call it after the tunefw
        row is committed: a kill in between leaves a row without a durable copy, which
        restore() repairs, never a durable trial without its row."""
        durable = optuna.trial.create_trial(
            params=told.params, distributions=told.distributions, user_attrs=attrs,
            value=value, state=TrialState.COMPLETE if value is not None else TrialState.FAIL)
        self._next_number += 1
        if self.mirror is None:
            self.durable.add_trial(durable)
        else:
            self.mirror.put(self.durable, durable)


def trial_attrs(tflops: float | None, cublas_tflops: float | None, trial_id: int,
                outcome: str) -> dict[str, Any]:
    """The user attributes of a durable Optuna trial: what the tunefw row says about it."""
    return {"tflops": tflops, "cublas_tflops": cublas_tflops, "tunefw_trial_id": trial_id,
            "outcome": outcome}


class DurableMirror:
    """Writes finished trials into their durable Optuna studies on one background thread, in
    order, so the driver does not wait on those commits; close() waits for the last one."""

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="tunefw-optuna-mirror",
                                        daemon=True)
        self._thread.start()

    def put(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._queue.put((study, trial))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            study, trial = item
            study.add_trial(trial)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


def _steering_copy(trial: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial:
    """A stored trial as the in-memory sampler sees it: failures count as 0."""
    return optuna.trial.create_trial(params=trial.params, distributions=trial.distributions,
                                     value=trial.value if trial.state == TrialState.COMPLETE
                                     else 0.0)
