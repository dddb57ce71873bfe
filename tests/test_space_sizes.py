"""Each family's search-space size for a study's problems (tunefw.tune.space): the declared
configs, and the valid ones counted exactly where the space is small, else estimated from a
seeded uniform sample (the launch's start-up summary prints both)."""
from __future__ import annotations

import math

import pytest

from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import get_family
from tunefw.tune import space
from tunefw.tune.space import declared_size, space_sizes

DECODE = GemmProblem(16, 28672, 4096)
SQUARE = GemmProblem(4096, 4096, 4096)


def _exact(family: str, problem: GemmProblem) -> int:
    fam = get_family(family)
    return sum(fam.check(c, problem, H200) is None for c in fam.iter_space())


def test_declared_size_is_the_product_of_the_knobs_values():
    fam = get_family("wgmma_sm90")
    assert declared_size("wgmma_sm90") == math.prod(len(p.values) for p in fam.params)
    assert declared_size("stream_sm90") == sum(1 for _ in get_family("stream_sm90").iter_space())


def test_a_small_space_is_counted_exactly(monkeypatch):
    monkeypatch.setattr(space, "CHECKS_BUDGET", 2 * 43200)  # both problems' checks fit it
    (size,) = space_sizes(["stream_sm90"], [SQUARE, DECODE], H200)
    assert (size.family, size.declared, size.sampled) == ("stream_sm90", 43200, 0)
    assert size.valid == [0, _exact("stream_sm90", DECODE)] == [0, 4240]


def test_a_large_space_is_estimated_from_a_seeded_sample(monkeypatch):
    monkeypatch.setattr(space, "CHECKS_BUDGET", 8192)
    (size,) = space_sizes(["skinny_sm90"], [DECODE], H200)
    exact = _exact("skinny_sm90", DECODE)
    assert size.sampled == 8192 and size.declared == 48600
    assert size.valid[0] == pytest.approx(exact, rel=0.1)  # binomial: about 3% at this share
    assert space_sizes(["skinny_sm90"], [DECODE], H200) == [size]  # the same figures again


def test_every_problem_gets_at_least_the_minimum_sample(monkeypatch):
    monkeypatch.setattr(space, "CHECKS_BUDGET", 10)
    sizes = space_sizes(["mma_sm80", "wgmma_sm90"], [SQUARE, DECODE], H200)
    assert [s.sampled for s in sizes] == [space.SAMPLE_MIN] * 2
    assert all(len(s.valid) == 2 and all(0 <= v <= s.declared for v in s.valid) for s in sizes)


def test_count_valid_is_exact_in_chunks_and_processes():
    from tunefw.tune.space import count_valid
    families = ["stream_sm90", "rows_sm90"]
    exact = sum(_exact(f, DECODE) for f in families)
    assert count_valid(families, DECODE, H200, processes=1, chunk=1000) == exact
    assert count_valid(families, DECODE, H200, processes=2, chunk=700) == exact  # 2 spawned
    assert count_valid(["stream_sm90"], SQUARE, H200) == 0
