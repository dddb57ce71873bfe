"""`tunefw verify` without a GPU: which jobs it plans, its shapes, and its one-line refusals."""
from __future__ import annotations


import pytest

from conftest import invoke_cli
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.export.table import render
from tunefw.measure.verify import EDGE_SHAPES, parse_shapes, plan
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable
from tunefw.templates import get_family

SKINNY = get_family("skinny_sm90")


def test_a_family_sample_is_valid_on_each_edge_shape():
    jobs = plan("skinny_sm90", parse_shapes("edge"), sample=3, seed=1)
    shapes = {(j.problem.M, j.problem.N, j.problem.K) for j in jobs}
    assert shapes == {s for s in EDGE_SHAPES if s[0] <= 64}  # skinny serves M <= 64 only
    assert all(SKINNY.check(j.config, j.problem, H200) is None for j in jobs)
    assert len(jobs) == 3 * len(shapes) and all(j.source == "sample" for j in jobs)


def test_a_table_is_verified_on_its_shapes_and_the_given_ones_it_serves(tmp_path):
    config = {**SKINNY.default_config(), "MTILES": 1, "BN": 16, "CK": 1, "WARPS": 1, "KV": 1}
    entries = [DispatchEntry(1, 4096, 4096, "bf16", "TN", "skinny_sm90", config, 3.0, 2.0, 1),
               DispatchEntry(8, 4096, 4096, "bf16", "TN", "skinny_sm90", config, 1.0, 2.0, 2,
                             route="cublas", reason="0.50x cuBLAS")]
    path = tmp_path / "dispatch.json"
    path.write_text(render(DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, entries), "json"))
    jobs = plan(str(path), parse_shapes("edge"), sample=1, seed=0)
    assert jobs[0].problem == GemmProblem(1, 4096, 4096)
    assert {(j.problem.M, j.problem.N, j.problem.K) for j in jobs[1:]} == {
        s for s in EDGE_SHAPES if SKINNY.check(config, GemmProblem(*s), H200) is None}
    assert all(j.source == "entry 1x4096x4096" for j in jobs)  # the cuBLAS route is not run


def test_shapes_come_from_a_file_or_are_refused(tmp_path):
    f = tmp_path / "shapes.txt"
    f.write_text("# decode\n1x4096x4096\n\n17x24x40  # odd\n")
    assert parse_shapes(str(f)) == [GemmProblem(1, 4096, 4096), GemmProblem(17, 24, 40)]
    with pytest.raises(UserError, match="expected 'edge' or a file"):
        parse_shapes(str(tmp_path / "missing.txt"))
    with pytest.raises(UserError, match="give --shapes"):
        plan("skinny_sm90", [], 1, 0)


def test_verify_without_a_gpu_is_one_line():
    done = invoke_cli("verify", "skinny_sm90", "--shapes", "edge", "--sample", "1")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == ["tunefw: error: tunefw verify needs a CUDA GPU (none is visible)"]
