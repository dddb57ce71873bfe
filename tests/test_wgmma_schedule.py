"""wgmma_sm90's work scheduler, built from the kernel's own source for the host (nvcc).

A unit the scheduler skips is an unwritten tile, one it gives twice is added twice (split-K) or
raced on; a unit count that disagrees with the units (ping-pong hands the ring over on it) hangs.
None of that needs a GPU to see.
"""
from __future__ import annotations

import shutil
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tunefw.templates.base import TEMPLATE_DIR

SOURCE = Path(__file__).parent / "cuda" / "wgmma_schedule.cu"


@pytest.fixture(scope="module")
def schedule_tool(tmp_path_factory) -> Path:
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc not installed")
    exe = tmp_path_factory.mktemp("schedule") / "wgmma_schedule"
    subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", f"-I{TEMPLATE_DIR / 'include'}",
                    "-o", str(exe), str(SOURCE)], check=True, capture_output=True, text=True)
    return exe


@pytest.mark.parametrize("mode,m_tiles,n_tiles,k_iters,clusters,splits", [
    ("persistent_split4_2x1", 7, 5, 64, 66, 4),   # odd tile rows: a padded cluster row
    ("persistent_split4_2x1", 32, 16, 9, 66, 4),  # uneven splits of 9 k-blocks
    ("persistent_1x2_rn", 5, 9, 3, 4, 1),         # raster along N, ragged band of 3
    ("persistent_1x2_rn", 64, 48, 2, 66, 1),
    ("oneshot_pingpong", 3, 7, 5, 21, 2),         # two work items (splits) per cluster
    ("oneshot_pingpong", 1, 3, 3, 3, 2),
])
def test_every_k_block_of_every_tile_is_done_once(schedule_tool, mode, m_tiles, n_tiles,
                                                  k_iters, clusters, splits):
    out = subprocess.run([str(schedule_tool), mode, str(m_tiles), str(n_tiles), str(k_iters),
                          str(clusters)], check=True, capture_output=True, text=True).stdout
    units, counts = defaultdict(list), {}
    for line in out.splitlines():
        kind, *nums = line.split()
        v = [int(x) for x in nums]
        if kind == "unit":
            units[v[0]].append(tuple(v[1:]))
        else:
            counts[v[0]] = v[1]
    cta_units = Counter((c, tm, tn, kb0) for c, us in units.items() for _, tm, tn, kb0, *_ in us)
    # The announced count (ping-pong hands the ring over on it) is the number of units taken.
    taken = {c: sum(rank == 0 for rank, *_ in us) for c, us in units.items()}
    assert all(taken.get(c, 0) == counts[c] for c in counts)
    blocks = Counter((tm, tn, kb) for us in units.values() for _, tm, tn, kb0, kb1, _ in us
                     if tm < m_tiles and tn < n_tiles for kb in range(kb0, kb1))
    assert blocks == Counter({(tm, tn, kb): 1 for tm in range(m_tiles) for tn in range(n_tiles)
                              for kb in range(k_iters)})
    # Each k-range is one split's, the same in every CTA of a cluster.
    splits_seen = {split for us in units.values() for *_, split in us}
    assert splits_seen == ({-1} if splits == 1 else set(range(splits)))
    assert all(n == 1 for n in cta_units.values())
