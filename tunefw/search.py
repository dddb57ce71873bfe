"""Optuna search for one problem: the families' declared spaces become distributions; asks yield
configs, invalid ones are answered at once, repeats reuse stored results, tells close trials."""
from __future__ import annotations

import hashlib
import json
import queue
import random
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Container, Iterator

import numpy as np
import optuna
from optuna.trial import TrialState

from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.sampler_host import RemoteTPE, SamplerHost
from tunefw.templates import get_family
from tunefw.templates.base import KernelTemplate

optuna.logging.set_verbosity(optuna.logging.WARNING)
# TPE's multivariate/group modes are "experimental" in Optuna; they are what conditional
# (per-family) spaces need, so the warning is noise here.
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

STALL_LIMIT = 64  # asks in a row that bring nothing new before the space is enumerated


def config_key(family: str, config: dict) -> str:
    """Canonical identity of a config: the reuse and dedupe key."""
    text = json.dumps({"family": family, "config": config}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _is_ordinal(values: tuple) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _suggest(trial: optuna.Trial, family: KernelTemplate) -> dict:
    """Sample a config of one family from its declared params (ordinal ones by sorted index)."""
    config = {}
    for p in family.params:
        name = f"{family.family}.{p.name}"
        if _is_ordinal(p.values) and len(p.values) > 1:
            ordered = sorted(p.values)
            config[p.name] = ordered[trial.suggest_int(name, 0, len(ordered) - 1)]
        else:
            config[p.name] = trial.suggest_categorical(name, list(p.values))
    return config


def _distributions_for(family: KernelTemplate, families: list[str]) -> dict:
    """The distributions ``_suggest`` (and the family choice) use, by Optuna param name."""
    dists: dict[str, optuna.distributions.BaseDistribution] = {}
    if len(families) > 1:
        dists["family"] = optuna.distributions.CategoricalDistribution(families)
    for p in family.params:
        name = f"{family.family}.{p.name}"
        if _is_ordinal(p.values) and len(p.values) > 1:
            dists[name] = optuna.distributions.IntDistribution(0, len(p.values) - 1)
        else:
            dists[name] = optuna.distributions.CategoricalDistribution(list(p.values))
    return dists


def _params_for(family: KernelTemplate, config: dict) -> dict:
    """The Optuna params that make ``_suggest`` reproduce ``config`` (for enqueue_trial)."""
    params: dict[str, Any] = {}
    for p in family.params:
        name = f"{family.family}.{p.name}"
        if _is_ordinal(p.values) and len(p.values) > 1:
            params[name] = sorted(p.values).index(config[p.name])
        else:
            params[name] = config[p.name]
    return params


class ScreenedTPE(optuna.samplers.TPESampler):
    """TPE that screens its candidates before choosing one: a candidate the screen refuses
    (a config check() rejects, or one already measured) cannot win while any other can.

    Plain TPE proposed ~2 rejected or repeated configs per new one for mma_sm80 and ~5 for
    wgmma_sm90 (2x2 clusters, say, are never valid), and each ask costs milliseconds on the
    driver. The hook is TPESampler._compute_acquisition_func (private; Optuna 3.6 to 5.0):
    where it is missing this is plain TPE."""

    screen: Callable[[dict[str, np.ndarray]], np.ndarray | None] | None = None

    def _compute_acquisition_func(self, samples, *estimators):  # type: ignore[override]
        values = super()._compute_acquisition_func(samples, *estimators)
        keep = self.screen(samples) if self.screen is not None else None
        if keep is not None and keep.any():
            values = np.where(keep, values, -np.inf)
        return values


def screen_candidates(samples: dict[str, np.ndarray], families: list[str], problem: GemmProblem,
                      device: DeviceSpec, known: Container[str]) -> np.ndarray | None:
    """For TPE's candidates of one family's whole config (internal representation: value
    indices): True where the config is valid for the problem and not yet known; None for a
    sample that is not one family's config (the family choice of a multi-family search)."""
    for fam_name in families:
        family = get_family(fam_name)
        # Each param's values in _suggest's index order, by Optuna param name.
        values = {f"{fam_name}.{p.name}": (p.name, sorted(p.values) if _is_ordinal(p.values)
                                           and len(p.values) > 1 else list(p.values))
                  for p in family.params}
        if not samples or not set(samples) <= set(values):
            continue
        n = len(next(iter(samples.values())))
        keep = np.zeros(n, dtype=bool)
        for i in range(n):
            # Optuna leaves single-valued params out of the search space.
            config = {param: choices[int(samples[name][i])] if name in samples else choices[0]
                      for name, (param, choices) in values.items()}
            keep[i] = (config_key(fam_name, config) not in known
                       and family.check(config, problem, device) is None)
        return keep
    return None


def make_sampler(name: str, seed: int, families: int = 1) -> optuna.samplers.BaseSampler:
    """The sampler by name. TPE decomposes the space into groups only when several families
    (conditional parameters) share a search: that pass walks every past trial on each ask and
    doubled the ask time of one-family searches."""
    if name == "tpe":
        # constant_liar off (Optuna 5 turned it on by default): configs in flight are already
        # screened out as known, and a sampler process sees only finished trials.
        return ScreenedTPE(seed=seed, multivariate=True, group=families > 1, n_startup_trials=10,
                           constant_liar=False)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
    if name == "grid":  # configs come from enumerate_valid() through enqueue_trial
        return optuna.samplers.RandomSampler(seed=seed)
    raise UserError(f"sampler {name!r}: expected tpe, random, grid or cmaes")


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
                 host: SamplerHost | None = None) -> None:
        """``host``: run TPE in that sampler process (a sweep's driver does); else in-process."""
        self.families = families
        self.mirror = mirror
        self.problem = problem
        self.device = device
        self.grid = sampler == "grid"
        self.durable = optuna.create_study(storage=storage, study_name=study_name,
                                           direction="maximize", load_if_exists=True)
        self.study = optuna.create_study(
            direction="maximize",
            sampler=(host.sampler(seed, families, problem, device) if host and sampler == "tpe"
                     else make_sampler(sampler, seed, len(families))))
        stored = self.durable.get_trials(deepcopy=False)
        for trial in stored:
            if trial.state in (TrialState.COMPLETE, TrialState.FAIL):
                self.study.add_trial(_steering_copy(trial))
        self._next_number = len(stored)  # numbers the durable study will give our next writes
        self._rng = random.Random(seed)
        self._queue: list[tuple[str, dict]] | None = None  # enumerated configs still to try
        self.stall = 0
        if not stored and not self.grid:
            self._enqueue_seeds()

    def _enqueue_seeds(self) -> None:
        """A fresh search starts from each family's seed configs that can run this problem."""
        for fam_name in self.families:
            family = get_family(fam_name)
            for config in family.seed_configs():
                if family.check(config, self.problem, self.device) is None:
                    params = {"family": fam_name} if len(self.families) > 1 else {}
                    params.update(_params_for(family, config))
                    self.study.enqueue_trial(params, skip_if_exists=True)

    def _enqueue_next(self, known: Container[str]) -> bool:
        """Enumerated mode: enqueue the next config not yet known; False when none is left."""
        if self._queue is None:
            self._queue = list(enumerate_valid(self.families, self.problem, self.device))
            if not self.grid:
                self._rng.shuffle(self._queue)
        while self._queue:
            fam, config = self._queue.pop(0)
            if config_key(fam, config) not in known:
                params = {"family": fam} if len(self.families) > 1 else {}
                params.update(_params_for(get_family(fam), config))
                self.study.enqueue_trial(params, skip_if_exists=False)
                return True
        return False

    def ask(self, known: Container[str]) -> Proposal | None:
        """One proposal; None when the valid space holds nothing that is not already known."""
        if self.grid or self.stall >= STALL_LIMIT:
            if not self._enqueue_next(known):
                return None
        sampler = self.study.sampler
        if isinstance(sampler, ScreenedTPE):
            sampler.screen = lambda samples: screen_candidates(samples, self.families,
                                                               self.problem, self.device, known)
        elif isinstance(sampler, RemoteTPE):
            sampler.known = known
        trial = self.study.ask()
        fam_name = (trial.suggest_categorical("family", self.families)
                    if len(self.families) > 1 else self.families[0])
        family = get_family(fam_name)
        config = _suggest(trial, family)
        key = config_key(fam_name, config)
        reason = family.check(config, self.problem, self.device)
        if reason is not None or key in known:
            self.stall += 1
        else:
            self.stall = 0
        return Proposal(trial, fam_name, config, key, reason)

    def restore(self, recorded: list[tuple[int, str, dict, float | None]]) -> None:
        """Write back durable trials a killed launch recorded as rows but never mirrored:
        rows (optuna number, family, config, objective value or None) numbered past the
        durable study."""
        for number, fam_name, config, value in sorted(r for r in recorded
                                                      if r[0] >= self._next_number):
            family = get_family(fam_name)
            params = {"family": fam_name} if len(self.families) > 1 else {}
            params.update(_params_for(family, config))
            trial = optuna.trial.create_trial(
                params=params, distributions=_distributions_for(family, self.families),
                value=value, state=TrialState.COMPLETE if value is not None else TrialState.FAIL)
            self.durable._storage.create_new_trial(self.durable._study_id, template_trial=trial)
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

    def record(self, told: optuna.trial.FrozenTrial, value: float | None) -> None:
        """Write a told trial to the durable study (FAILED when it has no result). Call it after
        the tunefw row is committed: a kill in between leaves a row without a durable copy,
        which restore() repairs, never a durable trial without its row."""
        durable = optuna.trial.create_trial(
            params=told.params, distributions=told.distributions,
            value=value, state=TrialState.COMPLETE if value is not None else TrialState.FAIL)
        self._next_number += 1
        if self.mirror is None:
            self.durable._storage.create_new_trial(self.durable._study_id, template_trial=durable)
        else:
            self.mirror.put(self.durable, durable)


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
            study._storage.create_new_trial(study._study_id, template_trial=trial)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()


def _steering_copy(trial: optuna.trial.FrozenTrial) -> optuna.trial.FrozenTrial:
    """A stored trial as the in-memory sampler sees it: failures count as 0."""
    return optuna.trial.create_trial(params=trial.params, distributions=trial.distributions,
                                     value=trial.value if trial.state == TrialState.COMPLETE
                                     else 0.0)
