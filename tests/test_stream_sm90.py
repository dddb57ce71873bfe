"""stream_sm90 (the bulk-copy decode family) on the CPU: its rules, launch geometry, seeds, and
real sm_90a compiles (no spills, HMMA and TMA loads present, every knob reaching the cubin or
the launch)."""
from __future__ import annotations


from family_checks import (  # noqa: F401
    assert_compiles_clean, assert_every_knob_reaches_the_cubin_or_the_launch, pool, valid_sample)
from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates import get_family

STREAM = get_family("stream_sm90")
BASE = {"BN": 32, "MTILES": 1, "BK": 256, "STAGES": 4, "WARPS": 4, "CK": 1, "WN": 1}
DECODE = [GemmProblem(m, n, k) for m in (1, 2, 4, 8, 16, 32, 48, 64)
          for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))]

SHAPES = [GemmProblem(1, 4096, 4096), GemmProblem(16, 4096, 14336), GemmProblem(32, 6144, 4096),
          GemmProblem(64, 4096, 4096)]


def check(config: dict, m: int, n: int = 4096, k: int = 4096) -> str | None:
    return STREAM.check({**BASE, **config}, GemmProblem(m, n, k), H200)


def test_mtiles_must_hold_m_and_no_more_than_twice_what_it_needs():
    assert check({"MTILES": 2}, 16) is None and check({"MTILES": 2}, 5) is None
    assert "holds M <= 16 rows" in check({"MTILES": 2}, 17)
    assert "more than twice" in check({"MTILES": 4}, 8)
    assert check({"MTILES": 4}, 32) is None


def test_the_register_rule_takes_the_cap_ptxas_gives_the_block_size():
    # 64 x 64 rows of accumulators (BN 64, MTILES 8): ~240 registers; ptxas caps a block of
    # 9 warps (sized as 12) at 168 and spills it, one of 5 warps (sized as 8) at 255 and does not
    wide = {"BN": 64, "MTILES": 8, "BK": 128, "STAGES": 4, "CK": 2}
    nine = {**wide, "WARPS": 8, "STAGES": 2}  # 2 stages: its 8 warps' partials fit beside them
    assert "register estimate 240/thread" in check(nine, 64)
    assert "168 a CTA of 288 threads" in check(nine, 64)
    assert check({**wide, "WARPS": 4}, 64) is None
    assert check({**wide, "MTILES": 6, "WARPS": 4}, 48) is None
    # WN warps split the rows: each holds BN/WN rows' accumulators, so BN 128 fits at WN 4
    tile = {**wide, "BN": 128, "WARPS": 2, "STAGES": 2, "CK": 4}
    assert "register estimate 400/thread (BN/WN/16" in check(tile, 64)
    assert check({**tile, "WN": 2}, 64) is None


def test_wn_must_divide_the_warps_and_the_rows_in_whole_mma_tiles():
    assert "WN=4 does not divide the WARPS=2" in check({"WARPS": 2, "WN": 4, "BN": 64}, 1)
    assert "BN=48 does not split into WN=2 slices" in check({"BN": 48, "WN": 2}, 1)
    assert check({"BN": 96, "WN": 2}, 1) is None


def test_work_rules_name_the_knob_and_the_shape():
    assert "past N=8" in check({"BN": 32}, 1, n=8)
    assert check({"BN": 16, "BK": 128, "WARPS": 1}, 1, n=8, k=8) is None
    # K=4096, BK=512: 8 stages; a cluster of 16 ranks leaves half of them without work
    assert "without work" in check({"BK": 512, "CK": 16}, 1)
    assert check({"BK": 256, "CK": 16}, 1) is None


def test_shared_memory_is_the_ring_the_partials_the_barriers_and_the_alignment_slack():
    config = {**BASE, "STAGES": 6, "MTILES": 2}
    ring = 6 * (32 + 16) * 2 * 256
    assert STREAM.smem_bytes(config) == ring + 4 * 16 * 36 * 4 + 6 * 16 + 1024
    big = {**BASE, "BN": 64, "MTILES": 4, "BK": 512, "STAGES": 8}
    assert "shared memory" in check(big, 32)
    # one partial tile per K slot: WARPS/WN of them
    split = {**config, "BN": 64, "WN": 2}
    assert STREAM.smem_bytes(split) == (6 * (64 + 16) * 2 * 256 + 2 * 16 * 68 * 4 + 6 * 16
                                        + 1024)


def test_launch_geometry_follows_the_config():
    p = GemmProblem(16, 4104, 4096)
    config = {**BASE, "MTILES": 2, "CK": 4, "WARPS": 8}
    launch = STREAM.launch(config, p, H200)
    assert launch.grid == (129 * 4, 1, 1) and launch.cluster == (4, 1, 1)
    assert launch.block == (9 * 32, 1, 1) and launch.workspace_bytes == 0
    assert launch.smem_bytes == STREAM.smem_bytes(config)
    maps = STREAM.tensor_map_specs(config, p)
    assert maps["a"] == {"dims": (4096, 16), "strides": (8192,), "box": (64, 16), "swizzle": 128}
    assert maps["b"] == {"dims": (4096, 4104), "strides": (8192,), "box": (64, 32), "swizzle": 128}


def test_every_decode_shape_gets_valid_seeds():
    for p in DECODE:
        seeds = [c for c in STREAM.seed_configs() if STREAM.check(c, p, H200) is None]
        assert len(seeds) >= 2, p


def test_name_expression_orders_the_template_arguments_as_the_kernel():
    # WN follows GATED (its C++ default 1): at WN 1 the names are those of the kernels before it
    assert STREAM.name_expression(BASE, "fp16") == "gemm_stream_sm90<1, 32, 1, 256, 4, 4, 1>"
    assert STREAM.name_expression({**BASE, "WN": 2}, "fp16") \
        == "gemm_stream_sm90<1, 32, 1, 256, 4, 4, 1, 0, 2>"
    assert STREAM.name_expression({**BASE, "WN": 2}, "fp16", "silu") \
        == "gemm_stream_sm90<1, 32, 1, 256, 4, 4, 1, 1, 2>"
    assert STREAM.template_args(BASE, "fp16") == ["1", "32", "1", "256", "4", "4", "1", "0", "1"]


def test_valid_configs_compile_without_spills_with_tma_loads_and_tensor_cores(pool):
    configs = valid_sample(STREAM, 6, 3, SHAPES) + [
        {**BASE, "CK": 16, "WARPS": 8, "BK": 128, "MTILES": 4, "BN": 64, "STAGES": 2},
        {**BASE, "CK": 2, "WARPS": 4, "BK": 128, "MTILES": 8, "BN": 64, "STAGES": 4},  # 218 regs
        # wide tiles split over warps: 4 slices of 32 rows; 2 slices of 48 (254 regs), CK 3
        {**BASE, "CK": 4, "WARPS": 4, "WN": 4, "BK": 128, "MTILES": 8, "BN": 128, "STAGES": 3},
        {**BASE, "CK": 3, "WARPS": 4, "WN": 2, "BK": 128, "MTILES": 8, "BN": 96, "STAGES": 3},
    ]
    assert_compiles_clean(STREAM, configs, pool, "UTMALDG")


def test_every_knob_changes_the_cubin_or_the_launch(pool):
    problem = GemmProblem(16, 4096, 4096)
    base = {**BASE, "MTILES": 2, "CK": 2}
    assert_every_knob_reaches_the_cubin_or_the_launch(STREAM, base, problem, pool)
