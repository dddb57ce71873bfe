"""How large each family's search space is for a study's problems: the configs it declares
(every value combination) and how many of them check() accepts on a device, counted where the
space is small and estimated from a seeded uniform sample where it is not (listing the
wgmma_sm90 space and checking it takes about a minute per problem; a launch says these sizes
within a second); and a space's valid configs in a seeded random order, drawn lazily."""
from __future__ import annotations

import math
import multiprocessing
import os
import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.templates import get_family
from tunefw.templates.base import KernelTemplate

CHECKS_BUDGET = 32_768  # check() calls for a whole study (about half a second on one core)
SAMPLE_MIN = 64  # configs drawn per family and problem, however many problems
COUNT_CHUNK = 65_536  # declared points a process checks at a time (count_valid)
COUNT_PROCESSES = 32


@dataclass(frozen=True)
class SpaceSize:
    """One family's space: declared configs and, per problem (the study's order), the valid
    ones; ``sampled``: configs drawn per problem for the estimate (0: counted exactly)."""

    family: str
    declared: int
    valid: list[int]
    sampled: int


def declared_size(family: str) -> int:
    """Configs the family declares: the product of its knobs' value counts."""
    return space_size(get_family(family))


def space_size(family: KernelTemplate) -> int:
    """How many points ``family.iter_space()`` yields."""
    return math.prod(len(p.values) for p in family.params)


def space_point(family: KernelTemplate, index: int) -> dict:
    """The ``index``-th point of ``family.iter_space()`` (itertools.product order: the last
    parameter changes fastest), without listing the points before it."""
    values = []
    for p in reversed(family.params):
        index, digit = divmod(index, len(p.values))
        values.append(p.values[digit])
    return dict(zip(family.param_names, reversed(values)))


def space_index(family: KernelTemplate, config: dict) -> int:
    """Where a config of the declared space stands in ``family.iter_space()`` (the inverse of
    space_point)."""
    index = 0
    for p in family.params:
        index = index * len(p.values) + p.values.index(config[p.name])
    return index


def sparse_permutation(size: int, rng: random.Random) -> Iterator[int]:
    """0..size-1 in a uniformly random order, drawn as far as the caller reads: a Fisher-Yates
    shuffle that keeps only the swapped indices, so a prefix costs its length in time and
    memory (a whole permutation of wgmma_sm90's 30M points is 240 MB and two seconds)."""
    swapped: dict[int, int] = {}
    for i in range(size):
        j = rng.randrange(i, size)
        yield swapped.get(j, j)
        swapped[j] = swapped.pop(i, i)


def uniform_order(families: Sequence[str], problem: GemmProblem, device: DeviceSpec,
                  seed: int) -> Iterator[tuple[str, dict]]:
    """Every valid (family name, config) of the problem once, in the order of a seeded
    uniformly random permutation of the families' joint declared space, checked only as far as
    the caller reads: any prefix is a uniform sample without replacement of the valid space."""
    templates = [get_family(f) for f in families]
    offsets = np.cumsum([0] + [space_size(t) for t in templates])
    for i in sparse_permutation(int(offsets[-1]), random.Random(f"uniform/{seed}")):
        j = int(np.searchsorted(offsets, i, side="right")) - 1
        config = space_point(templates[j], int(i - offsets[j]))
        if templates[j].check(config, problem, device) is None:
            yield families[j], config


def space_sizes(families: list[str], problems: list[GemmProblem], device: DeviceSpec,
                seed: int = 0) -> list[SpaceSize]:
    """Each family's declared and valid space for each problem on ``device``; exact where the
    space fits the per-problem share of CHECKS_BUDGET, else estimated from that many configs
    drawn uniformly (seeded: the same study prints the same figures)."""
    share = max(SAMPLE_MIN, CHECKS_BUDGET // max(1, len(families) * len(problems)))
    sizes = []
    for name in families:
        family, declared = get_family(name), declared_size(name)
        rng = random.Random(f"{seed}/{name}")
        valid = []
        for problem in problems:
            if declared <= share:
                valid.append(sum(family.check(c, problem, device) is None
                                 for c in family.iter_space()))
                continue
            hits = sum(family.check({p.name: rng.choice(p.values) for p in family.params},
                                    problem, device) is None for _ in range(share))
            valid.append(round(declared * hits / share))
        sizes.append(SpaceSize(name, declared, valid, 0 if declared <= share else share))
    return sizes


def random_valid(family: KernelTemplate, rng: random.Random, problem: GemmProblem,
                 device: DeviceSpec) -> Iterator[dict]:
    """The family's configs valid for ``problem``, each once, in a uniformly random order drawn
    as far as the caller reads (sparse_permutation of the point indices)."""
    for index in sparse_permutation(space_size(family), rng):
        config = space_point(family, index)
        if family.check(config, problem, device) is None:
            yield config


def _count_chunk(family: str, start: int, stop: int, problem: GemmProblem,
                 device: DeviceSpec) -> int:
    template = get_family(family)
    return sum(template.check(space_point(template, i), problem, device) is None
               for i in range(start, stop))


def count_valid(families: Sequence[str], problem: GemmProblem, device: DeviceSpec,
                processes: int = 0, chunk: int = COUNT_CHUNK) -> int:
    """Exactly how many configs of the families check() accepts for the problem: every
    declared point checked, by index in chunks, on ``processes`` processes (0: the cores, at
    most COUNT_PROCESSES). The wgmma_sm90 space takes about 80 s on one core."""
    jobs = [(f, lo, min(lo + chunk, n), problem, device)
            for f in families for n in [declared_size(f)] for lo in range(0, n, chunk)]
    workers = min(processes or min(os.cpu_count() or 1, COUNT_PROCESSES), len(jobs))
    if workers <= 1:
        return sum(_count_chunk(*job) for job in jobs)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return sum(pool.map(_count_chunk, *zip(*jobs)))
