"""`tunefw compile` (run_compile): sampled configs, cache hits, SASS checks, exit codes, bad input."""
from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from conftest import invoke_cli
from faults.fault_family import FAULT_DIR, BrokenTemplate, FaultFamily
from tunefw import templates
from tunefw.cli.compile import run_compile, sample_configs
from tunefw.device import A100, H200
from tunefw.errors import UserError
from tunefw.problem import GemmProblem


def _run(family: str, arch: str, cache: Path, **kw) -> tuple[int, str]:
    out = io.StringIO()
    args = dict(sample=2, seed=0, config_json=None, check_sass=False, cache_dir=cache)
    args.update(kw)
    code = run_compile(family, arch, console=Console(file=out, width=200), **args)
    return code, out.getvalue()


def _config_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if re.match(r"^(ok|COMPILE_\w+|SASS)\s", line)]


@pytest.fixture
def test_families(monkeypatch) -> None:
    monkeypatch.setitem(templates.FAMILIES, "fault", FaultFamily())
    monkeypatch.setitem(templates.FAMILIES, "broken", BrokenTemplate())


@pytest.mark.parametrize("family,arch", [("mma_sm80", "sm_80"), ("wgmma_sm90", "sm_90a")])
def test_sampled_configs_compile_then_hit_the_cache(tmp_path: Path, family: str, arch: str) -> None:
    code, first = _run(family, arch, tmp_path, check_sass=True)
    assert code == 0, first
    code, second = _run(family, arch, tmp_path)
    assert code == 0, second
    first_lines, second_lines = _config_lines(first), _config_lines(second)
    assert len(first_lines) == len(second_lines) == 2
    assert all("compiled" in line for line in first_lines)
    assert all("cached" in line for line in second_lines)
    assert "2 cache hit(s)" in second


def test_check_sass_fails_the_spilling_config(tmp_path: Path, test_families) -> None:
    code, text = _run("fault", "sm_90a", tmp_path, config_json='{"fault": "spill"}',
                      check_sass=True, source_dir=FAULT_DIR)
    assert code == 1
    assert "LDL/STL" in text and "0 ok, 1 failed" in text
    code, text = _run("fault", "sm_80", tmp_path, config_json='{"fault": "none"}',
                      check_sass=True, source_dir=FAULT_DIR)
    assert code == 0 and "1 ok, 0 failed" in text


def test_compile_error_exits_1_and_shows_the_log(tmp_path: Path, test_families) -> None:
    code, text = _run("broken", "sm_80", tmp_path, config_json='{"x": 2}', source_dir=FAULT_DIR)
    assert code == 1
    assert "COMPILE_ERROR" in text and "undeclared_identifier" in text


def test_sampling_is_seeded_and_only_valid(tmp_path: Path) -> None:
    family = templates.get_family("wgmma_sm90")
    problem = GemmProblem(4096, 4096, 4096)
    first = sample_configs(family, problem, H200, 5, seed=3)
    assert first == sample_configs(family, problem, H200, 5, seed=3)
    assert len({str(c) for c in first}) == 5
    assert all(family.check(c, problem, H200) is None for c in first)


@pytest.mark.parametrize("kw,message", [
    (dict(family="nope"), "family 'nope'"),
    (dict(arch="sm_75"), "arch 'sm_75'"),
    (dict(arch="hopper"), "arch 'hopper'"),
    (dict(config_json="{BM: 1"), "--config: not valid JSON"),
    (dict(config_json="[1]"), "--config: expected a JSON object"),
    (dict(config_json='{"BM": 7}'), "--config: "),
    (dict(sample=0), "--sample 0"),
    (dict(family="wgmma_sm90", arch="sm_90"), "no valid wgmma_sm90 config"),
])
def test_bad_input_is_a_one_line_user_error(tmp_path: Path, kw: dict, message: str) -> None:
    args = dict(family="mma_sm80", arch="sm_80")
    args.update(kw)
    with pytest.raises(UserError) as info:
        _run(args.pop("family"), args.pop("arch"), tmp_path, **args)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_dynamic_shared_memory_is_shown_beside_ptxas_figures() -> None:
    """Each compiled config's line: ptxas's registers, static shared memory and spills, and the
    dynamic shared memory its launch asks for on --shape (the family's estimate, marked, where
    the config is not valid for that shape)."""
    family = templates.get_family("mma_sm80")
    config = dict(family.default_config(), SPLIT_K=16, STAGES=3)
    for shape, shown in (("4096x4096x4096", None), ("128x128x128", "(est.)")):
        problem = GemmProblem(*map(int, shape.split("x")))
        result = invoke_cli("compile", "mma_sm80", "--arch", "sm_80", "--config",
                            json.dumps(config), "--shape", shape)
        assert result.returncode == 0, result.stdout + result.stderr
        (line,) = _config_lines(result.stdout)
        figures = re.search(r"regs +(\d+)  static smem +(\d+) B  spill +(\d+) B  "
                            r"dynamic smem +(\d+) B( \(est\.\))?", line)
        assert figures, line
        regs, static, spill, dynamic = map(int, figures.groups()[:4])
        assert regs > 0 and static == 0 and spill == 0
        if shown is None:
            assert dynamic == family.launch(config, problem, A100).smem_bytes == 49152
            assert figures.group(5) is None
        else:
            assert dynamic == family.estimate(config).smem_bytes and figures.group(5) == " (est.)"
