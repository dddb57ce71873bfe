"""Checks shared by the per-family CPU tests: a compile pool, a sample of valid configs, clean
compiles, and that every declared knob reaches the cubin or the launch geometry."""
from __future__ import annotations

import random

import pytest

from tunefw.cuda.compiler import CompilePool, sass_check, sass_opcodes
from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates.base import KernelTemplate


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Two compile workers with a cache of their own for the module."""
    with CompilePool(2, cache_dir=tmp_path_factory.mktemp("cubins")) as pool:
        yield pool


def valid_sample(family: KernelTemplate, n: int, seed: int,
                 shapes: list[GemmProblem]) -> list[dict]:
    """Up to n random configs of the space that are valid for at least one of the shapes."""
    rng = random.Random(seed)
    space = list(family.iter_space())
    rng.shuffle(space)
    return [c for c in space if any(family.check(c, p, H200) is None for p in shapes)][:n]


def assert_every_knob_reaches_the_cubin_or_the_launch(family: KernelTemplate, base: dict,
                                                      problem: GemmProblem,
                                                      pool: CompilePool) -> None:
    """For each knob, a valid other value changes the compiled kernel or how it is launched."""
    base_cubin = pool.submit(family, base, "bf16", "sm_90a").result().cubin
    base_launch = family.launch(base, problem, H200)
    for p in family.params:
        other = next(v for v in p.values if v != base[p.name]
                     and family.check({**base, p.name: v}, problem, H200) is None)
        config = {**base, p.name: other}
        cubin = pool.submit(family, config, "bf16", "sm_90a").result().cubin
        assert cubin != base_cubin or family.launch(config, problem, H200) != base_launch, p.name


def assert_compiles_clean(family: KernelTemplate, configs: list[dict], pool: CompilePool,
                          load_op: str) -> None:
    """Each config compiles for sm_90a without spills, with HMMA and the family's load op."""
    results = [pool.submit(family, c, "bf16", "sm_90a") for c in configs]
    for config, future in zip(configs, results):
        r = future.result()
        assert r.ok, (config, r.log[:500])
        assert r.spill_bytes == 0 and sass_check(r.cubin, require_op="HMMA") is None, config
        assert load_op in {op.split(".", 1)[0] for op in sass_opcodes(r.cubin)}, config
