"""The private Optuna hooks tunefw relies on (no public API exists for them): each test here fails
loudly if one disappears or changes meaning, instead of the search silently losing behaviour.
The optuna version range they were checked on is pinned in pyproject.toml."""
from __future__ import annotations

import inspect
import re
from importlib.metadata import version

import optuna
import pytest

from conftest import REPO
from tunefw.tune.sampling import SCREEN_REDRAWS, ScreenedTPE, forget_cached_trials

PACKAGE = REPO / "tunefw"


def test_tpe_still_has_the_acquisition_hook_the_screen_overrides():
    hook = optuna.samplers.TPESampler._compute_acquisition_func
    assert list(inspect.signature(hook).parameters) == ["self", "samples", "mpe_below", "mpe_above"]


def test_the_screen_decides_which_candidate_tpe_proposes():
    sampler = ScreenedTPE(seed=0, n_startup_trials=2, multivariate=True, constant_liar=False)
    calls = []

    def only_seven(samples):
        calls.append(len(samples["x"]))
        return samples["x"] == 7  # internal repr of an IntDistribution: the value itself

    sampler.screen = only_seven
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda t: float(t.suggest_int("x", 0, 9) == 3), n_trials=12)
    after_startup = [t.params["x"] for t in study.trials[2:]]
    assert calls and after_startup == [7] * len(after_startup)


def test_tpe_draws_again_while_the_screen_keeps_none_of_its_candidates():
    sampler = ScreenedTPE(seed=0, n_startup_trials=2, multivariate=True, constant_liar=False)
    sampler.screen = lambda samples: samples["x"] == 7  # one config of 200
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda t: float(t.suggest_int("x", 0, 199) == 3), n_trials=12)
    after_startup = [t.params["x"] for t in study.trials[2:]]
    # 24 candidates a draw rarely hold x=7; up to SCREEN_REDRAWS more draws mostly find it
    assert after_startup.count(7) >= 8 and sampler.redraws > SCREEN_REDRAWS
    assert sampler.missed == (after_startup[-1] != 7)  # the last ask's draws all refused


def test_a_study_still_caches_its_trials_and_forgetting_refreshes_them():
    study = optuna.create_study()
    dist = {"x": optuna.distributions.IntDistribution(0, 3)}
    study.add_trial(optuna.trial.create_trial(params={"x": 1}, distributions=dist, value=1.0))
    assert len(study._get_trials(deepcopy=False, use_cache=True)) == 1
    study.add_trial(optuna.trial.create_trial(params={"x": 2}, distributions=dist, value=2.0))
    assert len(study._get_trials(deepcopy=False, use_cache=True)) == 1  # the stale cache
    forget_cached_trials(study)
    assert len(study._get_trials(deepcopy=False, use_cache=True)) == 2


def test_the_installed_optuna_is_inside_the_tested_range():
    tomllib = pytest.importorskip("tomllib")
    Requirement = pytest.importorskip("packaging.requirements").Requirement
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    optuna_req = next(Requirement(d) for d in deps if Requirement(d).name == "optuna")
    assert any(s.operator == "<" for s in optuna_req.specifier), "optuna needs an upper bound"
    assert optuna_req.specifier.contains(version("optuna"))


def test_private_optuna_attributes_are_used_only_behind_the_pinned_hooks():
    private = re.compile(r"\._(storage|study_id|thread_local)\b")
    users = sorted(str(p.relative_to(REPO)) for p in PACKAGE.rglob("*.py")
                   if private.search(p.read_text()))
    assert users == ["tunefw/tune/sampling.py"]

