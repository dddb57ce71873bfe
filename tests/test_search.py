import dataclasses

import numpy as np
import optuna

from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES, config_key
from tunefw.tune.search import ProblemSearch, enumerate_valid


def _search(families, sampler="random", problem=GemmProblem(4096, 4096, 4096)):
    storage = optuna.storages.InMemoryStorage()
    return ProblemSearch(storage, "t", sampler, 0, families, problem, H200)


def test_distributions_come_from_the_declaration():
    search = _search(sorted(FAMILIES))
    seen = set()
    for _ in range(100):  # at M = 4096 the decode families are mostly invalid: they come rarely
        prop = search.ask(set())
        family = FAMILIES[prop.family]
        assert set(prop.config) == set(family.param_names)
        for p in family.params:
            assert prop.config[p.name] in p.values
            dist = prop.trial.distributions[f"{prop.family}.{p.name}"]
            # every declared value is reachable, and nothing else: Optuna sees the real values
            reachable = (dist.choices if hasattr(dist, "choices")
                         else range(dist.low, dist.high + 1, dist.step))
            assert sorted(reachable, key=str) == sorted(p.values, key=str)
            assert prop.trial.params[f"{prop.family}.{p.name}"] == prop.config[p.name]
        seen.add(prop.family)
        search.tell(prop.trial, None)
    assert seen == set(FAMILIES)


def test_changing_the_declaration_changes_the_search(monkeypatch):
    fam = FAMILIES["mma_sm80"]
    params = tuple(dataclasses.replace(p, values=(256,)) if p.name == "BM" else p
                   for p in fam.params)
    monkeypatch.setattr(type(fam), "params", params)
    search = _search(["mma_sm80"])
    for _ in range(10):
        prop = search.ask(set())
        assert prop.config["BM"] == 256
        search.tell(prop.trial, None)


def test_invalid_configs_carry_the_check_reason():
    search = _search(sorted(FAMILIES))
    reasons = []
    for _ in range(60):
        prop = search.ask(set())
        if prop.invalid_reason:
            reasons.append(prop.invalid_reason)
            assert FAMILIES[prop.family].check(prop.config, search.problem, H200) == prop.invalid_reason
        search.tell(prop.trial, None)
    assert reasons  # a random walk over the raw space meets impossible configs


def test_grid_enumerates_only_valid_configs_then_stops():
    fam = FAMILIES["mma_sm80"]
    small = tuple(dataclasses.replace(p, values=p.values[:2]) for p in fam.params)
    orig = type(fam).params
    try:
        type(fam).params = small
        problem = GemmProblem(256, 256, 256)
        valid = list(enumerate_valid(["mma_sm80"], problem, H200))
        assert valid, "the reduced space still has valid configs"
        search = _search(["mma_sm80"], "grid", problem)
        known = set()
        while (prop := search.ask(known)) is not None:
            assert prop.invalid_reason is None
            assert prop.key not in known
            known.add(prop.key)
            search.tell(prop.trial, 1.0)
        assert known == {config_key(f, c) for f, c in valid}
    finally:
        type(fam).params = orig


def test_stalled_search_switches_to_the_unmeasured_rest(monkeypatch):
    """Past the stall limit a search asks for the valid configs nothing has measured yet, and
    ends when none is left. (Over a reduced declaration: enumerating the whole mma_sm80 space
    took most of this test's 18 s.)"""
    fam = FAMILIES["mma_sm80"]
    small = tuple(dataclasses.replace(p, values=p.values[:2]) for p in fam.params)
    monkeypatch.setattr(type(fam), "params", small)
    problem = GemmProblem(64, 64, 64)
    valid = {config_key(f, c): c for f, c in enumerate_valid(["mma_sm80"], problem, H200)}
    assert len(valid) > 1
    left = sorted(valid)[len(valid) // 2]
    known = set(valid) - {left}
    search = _search(["mma_sm80"], "random", problem)
    for seed in [c for c in fam.seed_configs() if fam.check(c, problem, H200) is None]:
        prop = search.ask(known)  # a fresh search asks its seeds first (tested above)
        assert prop.config == seed
        search.tell(prop.trial, 1.0)
    search.stall = 10**6  # as if the sampler had only repeated itself
    prop = search.ask(known)
    assert (prop.key, prop.config, prop.invalid_reason) == (left, valid[left], None)
    search.tell(prop.trial, 1.0)
    search.stall = 10**6  # (a new config reset it)
    assert search.ask(known | {left}) is None


def test_a_fresh_search_starts_from_the_seeds_that_can_run_the_problem():
    """The seeds the problem admits come first, in declared order; the others are never asked.
    At 64x4096x4096 two wgmma seeds (2x1 clusters of 128-row tiles) cannot run."""
    fam = FAMILIES["wgmma_sm90"]
    problem = GemmProblem(64, 4096, 4096)
    seeds = fam.seed_configs()
    runnable = [c for c in seeds if fam.check(c, problem, H200) is None]
    ruled_out = [c for c in seeds if c not in runnable]
    assert runnable and ruled_out, "the problem must rule some seeds out, or nothing is tested"
    search = _search(["wgmma_sm90"], "tpe", problem)
    asked = []
    for _ in seeds:
        prop = search.ask(set())
        asked.append(prop.config)
        search.tell(prop.trial, 1.0)
    assert asked[:len(runnable)] == runnable
    assert not [c for c in asked if c in ruled_out]


def _proposal_mix(families, asks, problem=GemmProblem(4096, 4096, 4096)):
    """(new valid, rejected, repeated) proposals of a TPE search over ``asks`` asks past its
    random start, every new config told a value that rewards big tiles."""
    search = _search(families, sampler="tpe", problem=problem)
    known, counts = {}, [0, 0, 0]
    for i in range(10 + asks):
        prop = search.ask(known)
        if prop.invalid_reason is not None:
            kind, value = 1, None
        elif prop.key in known:
            kind, value = 2, known[prop.key]
        else:
            kind, value = 0, float(prop.config.get("BM", 64) * prop.config.get("BN", 64))
            known[prop.key] = value
        search.tell(prop.trial, value)
        if i >= 10:
            counts[kind] += 1
    return counts


def test_tpe_candidates_are_screened_for_validity_and_novelty():
    # wgmma_sm90 declares 2x2 clusters that check() always rejects, among other dead corners:
    # unscreened TPE spent most asks on rejects and repeats.
    new, rejected, repeated = _proposal_mix(["wgmma_sm90"], 60)
    assert new >= 55 and rejected + repeated <= 5


def test_screening_covers_each_family_of_a_mixed_search():
    # the decode families (M <= 64) cannot serve 4096 rows: the family choice is screened too
    new, rejected, repeated = _proposal_mix(sorted(FAMILIES), 60)
    assert new >= 57 and rejected <= 3


def test_the_family_choice_is_screened_by_whether_a_family_serves_the_problem():
    from tunefw.tune.sampling import screen_candidates
    families = ["mma_sm80", "skinny_sm90", "stream_sm90"]
    samples = {"family": np.array([0.0, 1.0, 2.0])}
    big, decode = GemmProblem(4096, 4096, 4096), GemmProblem(4, 4096, 4096)
    assert screen_candidates(samples, families, big, H200, set()).tolist() == [True, False, False]
    assert screen_candidates(samples, families, decode, H200, set()).tolist() == [True, True, True]


def test_a_sampler_process_proposes_what_the_local_sampler_would():
    from tunefw.tune.sampler_host import SamplerHost

    def proposals(host):
        search = ProblemSearch(optuna.storages.InMemoryStorage(), "t", "tpe", 0,
                               sorted(FAMILIES), GemmProblem(4096, 4096, 4096), H200, host=host)
        known, keys = {}, []
        for _ in range(40):  # seeds, the random start, then TPE on what it was told
            prop = search.ask(known)
            keys.append(prop.key)
            value = None if prop.invalid_reason else float(prop.config.get("BM", 64))
            if value is not None:
                known[prop.key] = value
            search.tell(prop.trial, value)
        return keys

    host = SamplerHost()
    try:
        assert proposals(host) == proposals(None)
    finally:
        host.close()
    assert host._proc.poll() is not None  # closing the pipe ends the process


def test_asker_threads_share_the_problems_and_fill_each():
    import time

    from tunefw.tune.asker import Asker, AskState

    problems = [GemmProblem(m, 4096, 4096) for m in (64, 1024, 4096)]
    states = [AskState(search=ProblemSearch(optuna.storages.InMemoryStorage(), f"t{i}", "tpe", i,
                                            ["mma_sm80"], p, H200), budget=50)
              for i, p in enumerate(problems)]
    asker = Asker(states, ahead=4, threads=2)
    assert [t.name for t in asker._threads] == ["tunefw-asker-0", "tunefw-asker-1"]
    asker.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not all(len(st.ready) == 4 for st in states):
        time.sleep(0.05)
    asker.stop()
    asker.check()
    for st in states:
        keys = [prop.key for prop in st.ready]
        assert len(keys) == 4 and len(set(keys)) == 4
        assert all(prop.invalid_reason is None for prop in st.ready)
    rejected = asker.drain_rejected()
    assert asker.asks >= 12 + len(rejected)  # each ask became ready, rejected or a repeat


def test_a_sampler_process_reports_its_screen_redraws_and_misses():
    """The redraws and the missed flag of TPE's screen live in the sampler process: the driver's
    search reads them as from an in-process TPE (launch stats' screen_redraws; the fallback to
    the shuffled valid space after a miss)."""
    from tunefw.tune.sampler_host import SamplerHost
    from tunefw.tune.search import STALL_LIMIT

    problem = GemmProblem(1, 64, 64)
    valid = [config_key(f, c) for f, c in enumerate_valid(["stream_sm90"], problem, H200)]
    assert len(valid) > 50

    def run(host):
        search = ProblemSearch(optuna.storages.InMemoryStorage(), "t", "tpe", 0,
                               ["stream_sm90"], problem, H200, host=host)
        known, keys, stalls = set(valid[6:]), [], []  # all but six valid configs measured
        while (prop := search.ask(known)) is not None:  # to the last valid config
            ok = prop.invalid_reason is None and prop.key not in known
            keys.append(prop.key)
            stalls.append(search.stall)
            search.tell(prop.trial, float(prop.config["STAGES"]) if ok else None)
            known.add(prop.key)
        return keys, stalls, search.redraws, known >= set(valid)

    host = SamplerHost()
    try:
        remote = run(host)
    finally:
        host.close()
    local = run(None)
    assert remote == local
    assert local[2] > 0 and STALL_LIMIT in local[1] and local[3]  # drew again, missed, ended
