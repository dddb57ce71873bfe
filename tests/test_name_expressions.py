"""Name expressions (and so the compiled kernels) are pinned to the exact strings the families
produced before their template arguments were derived from the parameter declarations."""
from __future__ import annotations

import re

import pytest

from tunefw.templates import FAMILIES, get_family
from tunefw.templates.base import TEMPLATE_DIR

PINNED = [
    # mma_sm80
    ('mma_sm80', {"BM": 128, "BN": 128, "BK": 32, "WM": 64, "WN": 64, "STAGES": 4, "SWIZZLE": 1, "DBUF": 1, "RASTER": 0, "GROUP": 8, "SPLIT_K": 1, "EPILOGUE": 0}, 'bf16',
     'gemm_mma_sm80<0, 128, 128, 32, 64, 64, 4, 1, 1, 0, 8, 1, 0>'),
    ('mma_sm80', {"BM": 128, "BN": 256, "BK": 32, "WM": 64, "WN": 64, "STAGES": 4, "SWIZZLE": 1, "DBUF": 1, "RASTER": 0, "GROUP": 8, "SPLIT_K": 1, "EPILOGUE": 1}, 'bf16',
     'gemm_mma_sm80<0, 128, 256, 32, 64, 64, 4, 1, 1, 0, 8, 1, 1>'),
    ('mma_sm80', {"BM": 128, "BN": 256, "BK": 32, "WM": 64, "WN": 64, "STAGES": 3, "SWIZZLE": 1, "DBUF": 1, "RASTER": 0, "GROUP": 8, "SPLIT_K": 1, "EPILOGUE": 0}, 'fp16',
     'gemm_mma_sm80<1, 128, 256, 32, 64, 64, 3, 1, 1, 0, 8, 1, 0>'),
    ('mma_sm80', {"BM": 32, "BN": 128, "BK": 64, "WM": 64, "WN": 16, "STAGES": 2, "SWIZZLE": 1, "DBUF": 1, "RASTER": 0, "GROUP": 4, "SPLIT_K": 2, "EPILOGUE": 0}, 'bf16',
     'gemm_mma_sm80<0, 32, 128, 64, 64, 16, 2, 1, 1, 0, 4, 2, 0>'),
    ('mma_sm80', {"BM": 64, "BN": 256, "BK": 64, "WM": 32, "WN": 32, "STAGES": 5, "SWIZZLE": 0, "DBUF": 0, "RASTER": 0, "GROUP": 1, "SPLIT_K": 4, "EPILOGUE": 1}, 'bf16',
     'gemm_mma_sm80<0, 64, 256, 64, 32, 32, 5, 0, 0, 0, 1, 4, 1>'),
    ('mma_sm80', {"BM": 32, "BN": 64, "BK": 64, "WM": 128, "WN": 16, "STAGES": 6, "SWIZZLE": 0, "DBUF": 0, "RASTER": 1, "GROUP": 8, "SPLIT_K": 8, "EPILOGUE": 1}, 'fp16',
     'gemm_mma_sm80<1, 32, 64, 64, 128, 16, 6, 0, 0, 1, 8, 8, 1>'),
    ('mma_sm80', {"BM": 256, "BN": 64, "BK": 64, "WM": 128, "WN": 128, "STAGES": 4, "SWIZZLE": 0, "DBUF": 1, "RASTER": 0, "GROUP": 1, "SPLIT_K": 16, "EPILOGUE": 0}, 'bf16',
     'gemm_mma_sm80<0, 256, 64, 64, 128, 128, 4, 0, 1, 0, 1, 16, 0>'),
    ('mma_sm80', {"BM": 128, "BN": 64, "BK": 64, "WM": 128, "WN": 16, "STAGES": 4, "SWIZZLE": 1, "DBUF": 0, "RASTER": 0, "GROUP": 8, "SPLIT_K": 8, "EPILOGUE": 1}, 'bf16',
     'gemm_mma_sm80<0, 128, 64, 64, 128, 16, 4, 1, 0, 0, 8, 8, 1>'),
    # wgmma_sm90
    ('wgmma_sm90', {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "SWIZZLE": 128, "CLUSTER_M": 2, "CLUSTER_N": 1, "SCHEDULE": "cooperative", "PERSISTENT": 1, "RASTER": "m", "GROUP": 8, "SPLIT_K": 1, "EPILOGUE": "tma"}, 'bf16',
     'gemm_wgmma_sm90<0, 128, 256, 64, 4, 128, 2, 1, 0, 1, 0, 8, 1, 1>'),
    ('wgmma_sm90', {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "SWIZZLE": 128, "CLUSTER_M": 1, "CLUSTER_N": 1, "SCHEDULE": "cooperative", "PERSISTENT": 1, "RASTER": "m", "GROUP": 4, "SPLIT_K": 1, "EPILOGUE": "tma_overlap"}, 'bf16',
     'gemm_wgmma_sm90<0, 128, 256, 64, 4, 128, 1, 1, 0, 1, 0, 4, 1, 2>'),
    ('wgmma_sm90', {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "SWIZZLE": 128, "CLUSTER_M": 1, "CLUSTER_N": 1, "SCHEDULE": "cooperative", "PERSISTENT": 1, "RASTER": "m", "GROUP": 16, "SPLIT_K": 1, "EPILOGUE": "tma_overlap"}, 'fp16',
     'gemm_wgmma_sm90<1, 128, 256, 64, 4, 128, 1, 1, 0, 1, 0, 16, 1, 2>'),
    ('wgmma_sm90', {"BM": 128, "BN": 256, "BK": 128, "STAGES": 4, "SWIZZLE": 128, "CLUSTER_M": 2, "CLUSTER_N": 1, "SCHEDULE": "cooperative", "PERSISTENT": 1, "RASTER": "n", "GROUP": 4, "SPLIT_K": 1, "EPILOGUE": "direct"}, 'bf16',
     'gemm_wgmma_sm90<0, 128, 256, 128, 4, 128, 2, 1, 0, 1, 1, 4, 1, 0>'),
    ('wgmma_sm90', {"BM": 64, "BN": 160, "BK": 32, "STAGES": 7, "SWIZZLE": 64, "CLUSTER_M": 1, "CLUSTER_N": 2, "SCHEDULE": "cooperative", "PERSISTENT": 1, "RASTER": "n", "GROUP": 16, "SPLIT_K": 2, "EPILOGUE": "direct"}, 'bf16',
     'gemm_wgmma_sm90<0, 64, 160, 32, 7, 64, 1, 2, 0, 1, 1, 16, 2, 0>'),
    ('wgmma_sm90', {"BM": 256, "BN": 96, "BK": 32, "STAGES": 6, "SWIZZLE": 32, "CLUSTER_M": 1, "CLUSTER_N": 2, "SCHEDULE": "pingpong", "PERSISTENT": 1, "RASTER": "n", "GROUP": 2, "SPLIT_K": 4, "EPILOGUE": "direct"}, 'fp16',
     'gemm_wgmma_sm90<1, 256, 96, 32, 6, 32, 1, 2, 1, 1, 1, 2, 4, 0>'),
    ('wgmma_sm90', {"BM": 256, "BN": 192, "BK": 128, "STAGES": 12, "SWIZZLE": 64, "CLUSTER_M": 2, "CLUSTER_N": 2, "SCHEDULE": "cooperative", "PERSISTENT": 1, "RASTER": "m", "GROUP": 2, "SPLIT_K": 2, "EPILOGUE": "tma_overlap"}, 'bf16',
     'gemm_wgmma_sm90<0, 256, 192, 128, 12, 64, 2, 2, 0, 1, 0, 2, 2, 2>'),
    ('wgmma_sm90', {"BM": 256, "BN": 224, "BK": 128, "STAGES": 4, "SWIZZLE": 64, "CLUSTER_M": 1, "CLUSTER_N": 1, "SCHEDULE": "cooperative", "PERSISTENT": 1, "RASTER": "n", "GROUP": 8, "SPLIT_K": 1, "EPILOGUE": "direct"}, 'bf16',
     'gemm_wgmma_sm90<0, 256, 224, 128, 4, 64, 1, 1, 0, 1, 1, 8, 1, 0>'),
    ('wgmma_sm90', {"BM": 64, "BN": 96, "BK": 64, "STAGES": 10, "SWIZZLE": 128, "CLUSTER_M": 2, "CLUSTER_N": 1, "SCHEDULE": "pingpong", "PERSISTENT": 1, "RASTER": "m", "GROUP": 8, "SPLIT_K": 1, "EPILOGUE": "tma"}, 'bf16',
     'gemm_wgmma_sm90<0, 64, 96, 64, 10, 128, 2, 1, 1, 1, 0, 8, 1, 1>'),
    ('wgmma_sm90', {"BM": 128, "BN": 64, "BK": 64, "STAGES": 2, "SWIZZLE": 128, "CLUSTER_M": 2, "CLUSTER_N": 1, "SCHEDULE": "pingpong", "PERSISTENT": 0, "RASTER": "m", "GROUP": 1, "SPLIT_K": 1, "EPILOGUE": "tma"}, 'bf16',
     'gemm_wgmma_sm90<0, 128, 64, 64, 2, 128, 2, 1, 1, 0, 0, 1, 1, 1>'),
]


@pytest.mark.parametrize("family,config,dtype,expected", PINNED,
                         ids=[f"{f}-{i}" for i, (f, *_) in enumerate(PINNED)])
def test_name_expression_is_pinned(family: str, config: dict, dtype: str, expected: str) -> None:
    fam = get_family(family)
    # A knob declared since the pin (Param.absent, appended last) reads the pinned config as
    # its old value: one more template argument, the kernel otherwise the same expression.
    # (one declared after GATED, Param.after_gate, is left out at its absent value: its default)
    added = [p.cpp_arg(p.absent) for p in fam.params
             if p.absent is not None and not p.after_gate and p.name not in config]
    expected = expected[:-1] + "".join(f", {a}" for a in added) + ">"
    assert fam.name_expression(fam.upgrade(config), dtype) == expected



LATE = sorted(f for f in FAMILIES if any(p.after_gate for p in get_family(f).params))


@pytest.mark.parametrize("family", LATE)
def test_knobs_after_gated_follow_it_in_the_kernel_with_their_absent_value_as_default(family):
    """name_expression() drops a trailing knob at its absent value: the kernel must declare it
    after GATED with exactly that default, or the dropped argument would mean something else."""
    fam = get_family(family)
    late = [f"int {p.name} = {p.cpp_arg(p.absent)}" for p in fam.params if p.after_gate]
    signature = re.search(rf"template\s*<([^>]*)>\s*__global__[^;{{]*?\b{fam.kernel}\s*\(",
                          (TEMPLATE_DIR / fam.source).read_text())
    declared = [" ".join(a.split()) for a in signature.group(1).split(",")]
    assert declared[-len(late) - 1:] == ["int GATED = 0"] + late
    assert len(declared) == len(fam.template_args(fam.default_config(), "bf16"))


def test_stream_sm90_declares_a_knob_after_gated():
    assert "stream_sm90" in LATE  # the test above checks a real kernel
