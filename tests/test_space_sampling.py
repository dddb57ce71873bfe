"""The tests' index-based space sampling (tests/space.py) draws exactly what listing the space
and sampling or shuffling the list would; the product's lazy random order (tunefw/tune/space.py)
draws every valid config once."""
import itertools
import random

from space import sample_space, shuffled_valid, space_point, space_size

from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES, get_family
from tunefw.tune.space import random_valid


def test_points_by_index_are_the_listed_points():
    for family in FAMILIES.values():
        listed = list(itertools.islice(family.iter_space(), 3000))
        assert [space_point(family, i) for i in range(len(listed))] == listed
        assert space_point(family, space_size(family) - 1) == {p.name: p.values[-1]
                                                               for p in family.params}


def test_samples_and_shuffles_match_the_listed_space():
    family = get_family("skinny_sm90")  # the smallest space: listing it is quick
    listed = list(family.iter_space())
    assert space_size(family) == len(listed)
    assert sample_space(family, random.Random(3), 500) == random.Random(3).sample(listed, 500)
    problem = GemmProblem(16, 4096, 4096)
    random.Random(5).shuffle(listed)
    valid = [c for c in listed if family.check(c, problem, H200) is None][:20]
    assert list(itertools.islice(shuffled_valid(family, random.Random(5), problem, H200), 20)) == valid


def test_random_valid_configs_are_each_valid_config_once_in_a_seeded_order():
    family = get_family("skinny_sm90")
    problem = GemmProblem(16, 4096, 4096)
    valid = [c for c in family.iter_space() if family.check(c, problem, H200) is None]
    drawn = list(random_valid(family, random.Random(7), problem, H200))
    assert sorted(map(str, drawn)) == sorted(map(str, valid)) and drawn != valid
    assert list(itertools.islice(random_valid(family, random.Random(7), problem, H200), 9)) == drawn[:9]
    wgmma = get_family("wgmma_sm90")  # ~8M points: a few draws checked, not a listing
    big = GemmProblem(4096, 4096, 4096)
    first = list(itertools.islice(random_valid(wgmma, random.Random(1), big, H200), 5))
    assert len({str(c) for c in first}) == 5
