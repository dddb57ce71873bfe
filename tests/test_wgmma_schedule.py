"""wgmma_sm90's work scheduler, built from the kernel's own source for the host (nvcc).

A unit the scheduler skips is an unwritten tile; one it gives twice is added twice; a stream-K
piece stored in one slot and read from another sums garbage. None of that needs a GPU to see.
"""
from __future__ import annotations

import shutil
import subprocess
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tunefw.device import H200
from tunefw.problem import GemmProblem
from tunefw.templates.base import TEMPLATE_DIR
from tunefw.templates.wgmma_sm90 import WgmmaSm90

T = WgmmaSm90()
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


def schedule(tool: Path, mode: str, tiles: int, k_iters: int, clusters: int):
    """Units per cluster (t, kb0, kb1, piece), announced counts, and stream-K reads (t -> [(c, slot)])."""
    out = subprocess.run([str(tool), mode, str(tiles), str(k_iters), str(clusters)], check=True,
                         capture_output=True, text=True).stdout
    units, counts, reads = defaultdict(list), {}, defaultdict(list)
    for line in out.splitlines():
        kind, *nums = line.split()
        v = [int(x) for x in nums]
        if kind == "unit":
            units[v[0]].append(tuple(v[1:]))
        elif kind == "count":
            counts[v[0]] = v[1]
        else:
            reads[v[0]].append((v[1], v[2]))
    return units, counts, reads


def covered_once(units, tiles: int, k_iters: int) -> bool:
    blocks = Counter((t, kb) for us in units.values() for t, kb0, kb1, _ in us for kb in range(kb0, kb1))
    return blocks == Counter({(t, kb): 1 for t in range(tiles) for kb in range(k_iters)})


# (tiles, k-blocks per tile, clusters): 4096^3 and 2048x4096x14336 in 128x256 tiles on 132 SMs,
# small-M shapes with fewer tiles than SMs, whole waves, fewer k-blocks than clusters, 2-CTA
# clusters, one tile.
SHAPES = [(512, 64, 132), (256, 224, 132), (32, 224, 132), (64, 64, 132), (264, 10, 132),
          (3, 2, 132), (1, 1, 132), (7, 5, 66), (9600, 64, 132), (133, 3, 132)]


@pytest.mark.parametrize("tiles,k_iters,clusters", SHAPES)
def test_stream_k_covers_every_k_block_once_and_reads_what_was_written(
        schedule_tool, tiles, k_iters, clusters):
    units, counts, reads = schedule(schedule_tool, "streamk", tiles, k_iters, clusters)
    assert covered_once(units, tiles, k_iters)
    assert all(counts[c] == len(units[c]) for c in range(clusters))
    sk_tiles = tiles % clusters
    # Partial pieces only on the stream-K tiles, before any whole tile of that cluster; the
    # k-blocks of the stream-K tiles are shared out within one block of equal.
    for c, us in units.items():
        partial = [u for u in us if u[3] >= 0]
        assert all(t < sk_tiles for t, *_ in partial)
        sk_units = [u for u in us if u[0] < sk_tiles]
        assert us[:len(sk_units)] == sk_units
        assert [u[3] for u in partial] in ([], [0], [1], [0, 1])
    if sk_tiles:
        per_cluster = [sum(kb1 - kb0 for t, kb0, kb1, _ in units[c] if t < sk_tiles)
                       for c in range(clusters)]
        assert max(per_cluster) - min(per_cluster) <= 1
    # The reducer of each cut tile reads exactly the slots its pieces were written to.
    written = defaultdict(list)
    for c, us in units.items():
        for t, kb0, kb1, piece in us:
            if piece >= 0:
                written[t].append((c, piece))
    for t in range(sk_tiles):
        if len(reads[t]) > 1:
            assert sorted(written[t]) == reads[t]
        else:
            assert written[t] == []  # one cluster did the whole tile: no partials


@pytest.mark.parametrize("mode,tiles,k_iters,clusters", [
    ("persistent_split4", 100, 64, 132), ("persistent_split4", 512, 9, 66),
    ("oneshot_pingpong", 11, 8, 6), ("oneshot_pingpong", 12, 3, 6)])
def test_split_k_and_one_shot_grids_cover_every_k_block_once(schedule_tool, mode, tiles, k_iters,
                                                             clusters):
    units, counts, _ = schedule(schedule_tool, mode, tiles, k_iters, clusters)
    assert covered_once(units, tiles, k_iters)
    assert all(counts.get(c, 0) == len(units[c]) for c in range(clusters))


def test_stream_k_launches_every_cluster_with_two_partial_slots_per_cta():
    c = dict(T.default_config(), STREAM_K=1)  # 2x1 clusters, 128x256 tiles
    problem = GemmProblem(4096, 4096, 4096)
    assert T.check(c, problem, H200) is None
    launch = T.launch(c, problem, H200)
    assert launch.grid == (132, 1, 1) and launch.cluster == (2, 1, 1)
    tiles = 32 * 16
    assert launch.workspace_bytes == 4 * (tiles + 2 * 132 * 128 * 256)
    # Fewer tiles than SMs still fills the machine: 16x4096 in 64x128 tiles is 32 tiles.
    small = dict(c, SCHEDULE="pingpong", BM=64, BN=128, CLUSTER_M=1, STAGES=6)
    assert T.check(small, GemmProblem(16, 4096, 14336), H200) is None
    assert T.launch(small, GemmProblem(16, 4096, 14336), H200).grid == (132, 1, 1)
