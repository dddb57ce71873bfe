"""The uniform sampler: a seeded uniformly random order of the valid space (tunefw/tune/space.py),
proposed without invalid configs or seed configs, resumed where a launch stopped."""
from __future__ import annotations

import itertools
import statistics

import optuna
import pytest

from fakepool import FakePool, Killed
from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.store.models import Trial
from tunefw.study.spec import parse_study
from tunefw.templates import config_key, get_family
from tunefw.tune.search import ProblemSearch, enumerate_valid
from tunefw.tune.space import uniform_order
from tunefw.tune.sweep import LaunchOptions, Sweep

SMALL = GemmProblem(1, 64, 64)  # a few hundred valid stream_sm90 configs of 6000 declared
BIG = GemmProblem(4096, 4096, 4096)


def _keys(pairs) -> list[str]:
    return [config_key(f, c) for f, c in pairs]


def test_the_order_holds_every_valid_config_once_and_depends_on_the_seed():
    valid = _keys(enumerate_valid(["stream_sm90"], SMALL, H200))
    orders = [_keys(uniform_order(["stream_sm90"], SMALL, H200, seed)) for seed in (0, 0, 1)]
    assert sorted(orders[0]) == sorted(valid) and len(set(orders[0])) == len(valid)
    assert orders[0] == orders[1] and orders[0] != orders[2]
    assert orders[0] != valid  # not the declared order


def test_the_first_config_of_the_order_is_uniform_over_the_valid_space():
    valid = _keys(enumerate_valid(["stream_sm90"], SMALL, H200))
    firsts = [valid.index(_keys(itertools.islice(
        uniform_order(["stream_sm90"], SMALL, H200, seed), 1))[0]) for seed in range(300)]
    # a uniform pick of n has mean (n-1)/2 (sd of the mean over 300: n/60) and rarely repeats
    assert abs(statistics.mean(firsts) - (len(valid) - 1) / 2) < len(valid) / 12
    assert len(set(firsts)) > 150


def test_a_joint_order_covers_each_family_of_a_mixed_search():
    families = ["mma_sm80", "wgmma_sm90"]
    head = list(itertools.islice(uniform_order(families, BIG, H200, 3), 200))
    assert all(get_family(f).check(c, BIG, H200) is None for f, c in head)
    shares = {f: sum(1 for g, _ in head if g == f) for f in families}
    assert all(n > 20 for n in shares.values()), shares  # both spaces drawn from, by size


def test_a_uniform_search_proposes_the_order_and_stops_at_the_end():
    search = ProblemSearch(optuna.storages.InMemoryStorage(), "u", "uniform", 5,
                           ["stream_sm90"], SMALL, H200)
    proposed: list[str] = []
    while (prop := search.ask(set(proposed))) is not None:
        assert prop.invalid_reason is None and prop.key not in proposed
        proposed.append(prop.key)
        search.tell(prop.trial, 1.0)
    assert proposed == _keys(uniform_order(["stream_sm90"], SMALL, H200, 5))  # no seeds first


def test_a_resumed_uniform_search_continues_the_same_order():
    order = _keys(itertools.islice(uniform_order(["wgmma_sm90"], BIG, H200, 2), 12))
    search = ProblemSearch(optuna.storages.InMemoryStorage(), "u", "uniform", 2,
                           ["wgmma_sm90"], BIG, H200)
    known = set(order[:4]) | {order[6]}  # measured before, one of them out of order
    proposed = []
    for _ in range(6):
        prop = search.ask(known)
        known.add(prop.key)
        proposed.append(prop.key)
    assert proposed == order[4:6] + order[7:11]


@pytest.fixture
def store(db_url):
    store = open_store(db_url)
    yield store
    store.close()


def _launch(store, pool):
    return Sweep(store, "u", LaunchOptions(gpus=len(pool.slots), backend="sim"),
                 pool_factory=lambda opts, spec, replay: pool).run()


def test_a_uniform_launch_measures_the_first_valid_configs_of_its_order_across_a_kill(store):
    with store.session() as s:
        q.create_study(s, parse_study({"name": "u", "trials": 10, "sampler": "uniform",
                                       "seed": 7, "families": ["wgmma_sm90"], "confirm_top": 2,
                                       "problems": ["4096x4096x4096", "257x4096x4096"]}, "test"))
    with pytest.raises(Killed):
        _launch(store, FakePool(workers=2, stop_after=7))
    stats = _launch(store, FakePool(workers=2))
    with store.session() as s:
        study = q.get_study(s, "u")
        for prow in study.problems:
            rows = s.query(Trial).filter(Trial.problem_id == prow.id).order_by(Trial.id).all()
            expected = _keys(itertools.islice(
                uniform_order(["wgmma_sm90"], q.as_problem(prow), H200, 7 + prow.id), 10))
            assert [t.status for t in rows] == ["OK"] * 10  # no INVALID row, nothing measured twice
            assert sorted(t.config_key for t in rows) == sorted(expected)
    assert 0 < stats["trials"] < 20  # the second launch ran only what the first had not
