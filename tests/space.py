"""Random points of a family's declared space by their index in ``iter_space()`` order: the same
samples as ``rng.sample(list(family.iter_space()), k)`` and ``rng.shuffle(list(...))`` draw, without
building millions of dicts (a listed wgmma_sm90 space and a full check() pass took a minute)."""
from __future__ import annotations

import random
from typing import Iterator

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem
from tunefw.templates.base import KernelTemplate
from tunefw.tune.space import space_point, space_size

__all__ = ["sample_space", "shuffled_valid", "space_point", "space_size"]


def sample_space(family: KernelTemplate, rng: random.Random, k: int) -> list[dict]:
    """What ``rng.sample(list(family.iter_space()), k)`` returns (sample draws by index only)."""
    return [space_point(family, i) for i in rng.sample(range(space_size(family)), k)]


def shuffled_valid(family: KernelTemplate, rng: random.Random, problem: GemmProblem,
                   device: DeviceSpec) -> Iterator[dict]:
    """The valid configs of ``rng.shuffle(list(family.iter_space()))``, in that order, checked
    only as far as the caller reads (shuffle's permutation depends on the length alone)."""
    order = list(range(space_size(family)))
    rng.shuffle(order)
    for i in order:
        config = space_point(family, i)
        if family.check(config, problem, device) is None:
            yield config
