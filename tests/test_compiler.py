"""The compiler: NVRTC cubins, the content-addressed cache, timeouts, errors and SASS checks."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from faults.fault_family import FAULT_DIR, BrokenTemplate, FaultFamily, HangingCompileTemplate
from tunefw.cuda import compiler
from tunefw.cuda.compiler import CompilePool, compile_kernel, sass_check
from tunefw.errors import UserError
from tunefw.outcome import Status

FAULT = FaultFamily()


def _compile(config: dict, cache: Path, arch: str = "sm_90a", **kw) -> compiler.CompileResult:
    return compile_kernel(FAULT, config, "bf16", arch, cache_dir=cache, source_dir=FAULT_DIR, **kw)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_kernel_compiles_to_a_cubin_with_its_resources(tmp_path: Path, arch: str) -> None:
    result = _compile({"fault": "none"}, tmp_path, arch)
    assert result.status == Status.OK, result.log
    assert result.cubin[:4] == b"\x7fELF"
    assert result.lowered_name == "_Z10fault_gemmILi0ELi0EEvPKtS1_PtPiiii"
    assert 0 < result.regs <= 255
    assert (result.smem, result.spill_bytes, result.cached) == (0, 0, False)
    assert f"for '{arch}'" in result.log


def test_second_compile_is_a_cache_hit_without_a_worker(tmp_path: Path, monkeypatch) -> None:
    first = _compile({"fault": "wrong_result"}, tmp_path)

    def no_worker(*args, **kwargs):
        raise AssertionError("a cache hit must not start a compiler process")

    monkeypatch.setattr(compiler, "Worker", no_worker)
    second = _compile({"fault": "wrong_result"}, tmp_path)
    assert second.cached and not first.cached
    assert (second.cubin, second.lowered_name, second.regs, second.key) == (
        first.cubin, first.lowered_name, first.regs, first.key)


def test_cache_entry_is_a_cubin_and_its_metadata(tmp_path: Path) -> None:
    result = _compile({"fault": "none"}, tmp_path, "sm_80")
    folder = tmp_path / result.key[:2]
    assert sorted(p.name for p in folder.iterdir()) == [f"{result.key}.cubin", f"{result.key}.json"]
    assert (folder / f"{result.key}.cubin").read_bytes() == result.cubin


def test_cache_dir_defaults_to_the_environment(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEFW_CACHE_DIR", str(tmp_path / "env-cache"))
    result = compile_kernel(FAULT, {"fault": "unwritten"}, "fp16", "sm_80", source_dir=FAULT_DIR)
    assert result.ok
    assert (tmp_path / "env-cache" / result.key[:2] / f"{result.key}.cubin").is_file()


def test_cache_key_changes_when_a_header_changes(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(FAULT_DIR, source, ignore=shutil.ignore_patterns("__pycache__"))
    before = compile_kernel(FAULT, {"fault": "none"}, "bf16", "sm_80", cache_dir=tmp_path / "c",
                            source_dir=source)
    header = source / "include" / "faults" / "convert.cuh"
    header.write_text(header.read_text() + "\n// edited\n")
    after = compile_kernel(FAULT, {"fault": "none"}, "bf16", "sm_80", cache_dir=tmp_path / "c",
                           source_dir=source)
    assert before.ok and after.ok
    assert after.key != before.key and not after.cached


def test_key_depends_on_arch_and_name_expression(tmp_path: Path) -> None:
    keys = {_compile(cfg, tmp_path, arch).key
            for cfg in ({"fault": "none"}, {"fault": "unwritten"}) for arch in ("sm_90", "sm_90a")}
    assert len(keys) == 4


def test_broken_template_is_a_compile_error_with_its_log(tmp_path: Path) -> None:
    result = compile_kernel(BrokenTemplate(), {"x": 1}, "bf16", "sm_80", cache_dir=tmp_path,
                            source_dir=FAULT_DIR)
    assert result.status == Status.COMPILE_ERROR and result.cubin is None
    assert 'identifier "undeclared_identifier" is undefined' in result.log
    again = compile_kernel(BrokenTemplate(), {"x": 1}, "bf16", "sm_80", cache_dir=tmp_path,
                           source_dir=FAULT_DIR)
    assert again.cached and again.status == Status.COMPILE_ERROR and again.log == result.log


def test_endless_compile_times_out_and_the_pool_keeps_working(tmp_path: Path) -> None:
    with CompilePool(1, cache_dir=tmp_path, source_dir=FAULT_DIR, timeout_s=60) as pool:
        hung = pool.submit(HangingCompileTemplate(), {"x": 30}, "bf16", "sm_80", timeout_s=1.5)
        after = pool.submit(FAULT, {"fault": "oob_write"}, "bf16", "sm_80")
        assert hung.result().status == Status.COMPILE_TIMEOUT
        assert "exceeded 1.5 s" in hung.result().log
        assert after.result().status == Status.OK
    retry = compile_kernel(HangingCompileTemplate(), {"x": 30}, "bf16", "sm_80", cache_dir=tmp_path,
                           source_dir=FAULT_DIR, timeout_s=1.0)
    assert retry.status == Status.COMPILE_TIMEOUT and not retry.cached  # timeouts are not cached


def test_pool_compiles_in_parallel_and_shares_identical_requests(tmp_path: Path) -> None:
    with CompilePool(2, cache_dir=tmp_path, source_dir=FAULT_DIR) as pool:
        futures = [pool.submit(FAULT, {"fault": f}, "bf16", "sm_80")
                   for f in ("none", "wrong_result", "unwritten", "splitk_dirty", "too_much_smem")]
        twin = pool.submit(FAULT, {"fault": "too_much_smem"}, "bf16", "sm_80")
        results = [f.result() for f in futures]
    assert all(r.ok for r in results)
    assert len({r.lowered_name for r in results}) == 5
    assert twin.result() is results[-1]


def test_bad_arch_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="arch 'hopper'"):
        _compile({"fault": "none"}, tmp_path, "hopper")


def test_sass_check_flags_the_spilling_kernel(tmp_path: Path) -> None:
    spill = _compile({"fault": "spill"}, tmp_path)
    clean = _compile({"fault": "none"}, tmp_path)
    assert spill.spill_bytes > 0 and spill.regs <= 32
    assert "LDL/STL" in sass_check(spill.cubin, require_hgmma=False)
    assert sass_check(clean.cubin, require_hgmma=False) is None
    assert "no HGMMA" in sass_check(clean.cubin, require_hgmma=True)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_nvcc_fallback_builds_the_same_kernel(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TUNEFW_COMPILER", "nvcc")
    compiler.compiler_info.cache_clear()
    try:
        result = _compile({"fault": "spill"}, tmp_path)
    finally:
        compiler.compiler_info.cache_clear()
    assert result.status == Status.OK, result.log
    assert result.lowered_name == "_Z10fault_gemmILi6ELi0EEvPKtS1_PtPiiii"
    assert result.spill_bytes > 0
    assert "LDL/STL" in sass_check(result.cubin, require_hgmma=False)
