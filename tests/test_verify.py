"""`tunefw verify` without a GPU: which jobs it plans, its shapes, a file of more families, and its
one-line refusals; on a GPU, each fault kernel's verdict."""
from __future__ import annotations


import pytest

from conftest import _has_gpu, invoke_cli
from faults.fault_family import EXPECTED, FAULT_DIR, FAULTS
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.export.table import render
from tunefw.measure.verify import (EDGE_SHAPES, compile_all, parse_shapes, plan, result_row,
                                   run_verify)
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable
from tunefw.templates import get_family
from tunefw.templates.family_module import load_family_module

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


FAULT_FILE = FAULT_DIR / "fault_family.py"


def test_a_family_file_adds_its_families_with_their_sources_beside_it():
    extra = load_family_module(FAULT_FILE)
    assert sorted(extra.families) == ["broken", "compile_hang", "fault"]
    assert extra.source_dir("fault") == FAULT_DIR and extra.source_dir("skinny_sm90") is None
    assert extra.get("skinny_sm90") is SKINNY and "wgmma_sm90" in extra.all_families()
    jobs = plan("fault", [GemmProblem(1024, 1024, 1024)], sample=len(FAULTS), seed=0,
                families=extra)
    assert sorted(j.config["fault"] for j in jobs) == sorted(FAULTS)  # every fault, once
    assert set(EXPECTED) == set(FAULTS)


@pytest.mark.parametrize("text, error", [
    (None, "expected a Python file"),
    ("raise ValueError('no GPU here\\nsecond line')",
     "cannot import it (ValueError: no GPU here)"),
    ("X = 1", "expected FAMILIES, a list of KernelTemplate instances"),
    ("FAMILIES = ['fault']", "expected FAMILIES, a list of KernelTemplate instances"),
    ("from tunefw.templates import get_family\nFAMILIES = [get_family('skinny_sm90')]",
     "family 'skinny_sm90' is one of tunefw's own")])
def test_a_family_file_that_cannot_serve_is_one_line(tmp_path, text, error):
    path = tmp_path / ("families.py" if text is not None else "families.txt")
    path.write_text(text or "")
    with pytest.raises(UserError) as caught:
        load_family_module(path)
    assert str(caught.value) == f"--families {path.resolve()}: {error}"


@pytest.mark.skipif(_has_gpu(), reason="what happens without a GPU")
def test_verify_names_a_family_of_a_family_file_only_with_it(tmp_path):
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("64x64x64\n")
    done = invoke_cli("verify", "fault", "--shapes", str(shapes))
    assert done.stderr.strip() == "tunefw: error: fault: cannot read (No such file or directory)"
    done = invoke_cli("verify", "fault", "--families", str(FAULT_FILE), "--shapes", str(shapes))
    # planned from the file's family, then refused for want of a GPU
    assert done.stderr.strip() == "tunefw: error: tunefw verify needs a CUDA GPU (none is visible)"


@pytest.mark.gpu
def test_each_fault_kernel_ends_as_expected_under_verify():
    extra = load_family_module(FAULT_FILE)
    jobs = plan("fault", [GemmProblem(1024, 1024, 1024)], sample=len(FAULTS), seed=0,
                families=extra)
    result = run_verify(jobs, timeout_s=5.0, families=extra)
    assert {r["config"]["fault"]: r["status"] for r in result["rows"]} == EXPECTED


def test_every_distinct_kernel_is_compiled_once_ahead_of_the_worker(tmp_path):
    extra = load_family_module(FAULT_FILE)
    shapes = [GemmProblem(64, 64, 64), GemmProblem(17, 24, 40)]
    jobs = plan("fault", shapes, sample=2, seed=0, families=extra)
    jobs += plan("fault", [GemmProblem(64, 64, 64, "fp16")], sample=1, seed=0, families=extra)
    compiled = compile_all(jobs, "sm_80", str(tmp_path), families=extra)
    fault = extra.get("fault")
    assert sorted(compiled) == sorted({f"fault {fault.name_expression(j.config, j.problem.dtype)}"
                                       for j in jobs})
    assert all(r.ok and not r.cached for r in compiled.values())
    again = compile_all(jobs, "sm_80", str(tmp_path), families=extra)  # what the worker finds
    assert all(r.cached for r in again.values())


def test_a_timed_row_carries_the_screen_and_its_ratio():
    job = plan("skinny_sm90", [GemmProblem(1, 4096, 4096)], sample=1, seed=0)[0]
    outcome = {"status": "OK", "log": "screened 10 launches", "rel_err": 1e-3, "tflops": 30.0,
               "cublas_tflops": 24.0, "median_ms": 0.0011, "min_ms": 0.001, "iqr_ms": 1e-5,
               "cublas_median_ms": 0.0014}
    row = result_row(job, outcome, timed=True)
    assert row["ratio"] == 1.25 and row["tflops"] == 30.0 and row["M"] == 1
    assert "ratio" not in result_row(job, outcome)
    assert result_row(job, {"status": "WRONG_ANSWER", "log": None}, timed=True)["ratio"] is None
