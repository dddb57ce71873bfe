"""A knob owns itself: its values, Optuna encoding, C++ tokens and help come from its Param, and
a config is checked against those declarations (types included) before anything uses it."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil

import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from conftest import REPO, invoke_cli
from tunefw.cuda.compiler import compile_kernel, undeclared_includes
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.runtime import dispatch
from tunefw.templates import FAMILIES, get_family
from tunefw.templates.base import TEMPLATE_DIR, Param

MMA, WGMMA = get_family("mma_sm80"), get_family("wgmma_sm90")


def test_a_plain_declaration_still_reads_positionally():
    p = Param("X", (4, 2, 3), "help text")
    assert (p.name, p.values, p.help, p.cpp, p.encoding) == ("X", (4, 2, 3), "help text", None, "auto")


def test_arithmetic_ranges_are_int_distributions_of_the_real_values():
    assert Param("S", (4, 2, 3, 5, 6), "").distribution() == IntDistribution(2, 6, step=1)
    assert Param("N", (256, 64, 128, 192), "").distribution() == IntDistribution(64, 256, step=64)
    assert Param("F", (1, 0), "").distribution() == IntDistribution(0, 1, step=1)


def test_other_values_are_categorical_over_the_values_in_declared_order():
    assert Param("BM", (128, 32, 64, 256), "").distribution() == CategoricalDistribution([128, 32, 64, 256])
    assert Param("E", ("tma", "direct"), "", cpp={"tma": "1", "direct": "0"}).distribution() == \
        CategoricalDistribution(["tma", "direct"])
    forced = Param("S", (2, 3, 4), "", encoding="categorical")
    assert forced.distribution() == CategoricalDistribution([2, 3, 4])


@pytest.mark.parametrize("kwargs, message", [
    (dict(values=(1, 2, 4), encoding="int"), "arithmetic range"),
    (dict(values=(1, 2, 2)), "repeated"),
    (dict(values=(1, "a")), "all ints or all strings"),
    (dict(values=(True, False)), "all ints or all strings"),
    (dict(values=("a", "b"), cpp={"a": "0"}), "cpp must map exactly"),
    (dict(values=(1, 2), encoding="log"), "encoding"),
    (dict(values=(1, 2), after_gate=True), "after_gate needs the absent value"),
])
def test_a_bad_declaration_is_refused_where_it_is_written(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Param("X", help="", **kwargs)


def test_cpp_tokens_come_from_the_declaration():
    sched = dict((p.name, p) for p in WGMMA.params)["SCHEDULE"]
    assert [sched.cpp_arg(v) for v in sched.values] == ["0", "1"]
    args = WGMMA.template_args({**WGMMA.default_config(), "EPILOGUE": "tma_overlap"}, "fp16")
    assert args[0] == "1" and args[-2] == "2" and args[-1] == "0"  # EPILOGUE, then SWAP_AB
    with pytest.raises(ValueError, match="declare cpp="):
        Param("R", ("m", "n"), "").cpp_arg("m")


@pytest.mark.parametrize("value, kind", [(True, "bool"), (1.0, "float"), ("128", "str"),
                                         (None, "NoneType")])
def test_ints_are_ints(value, kind):
    config = {**MMA.default_config(), "BM": value}
    reason = MMA.space_reason(config)
    assert reason == f"BM={value!r} is a {kind}, expected an int"
    assert MMA.check(config, GemmProblem(4096, 4096, 4096), H200) == reason
    with pytest.raises(UserError, match="^BM="):
        MMA.name_expression(config, "bf16")


def test_strings_are_strings_and_undeclared_values_are_named():
    assert WGMMA.space_reason({**WGMMA.default_config(), "SCHEDULE": 0}) == \
        "SCHEDULE=0 is a int, expected a string"
    assert WGMMA.space_reason({**WGMMA.default_config(), "BM": 96}) == "BM=96 not in [128, 64, 256]"


def test_a_mistyped_config_is_refused_before_a_compile(tmp_path):
    with pytest.raises(UserError, match="STAGES=4.0 is a float"):
        compile_kernel(MMA, {**MMA.default_config(), "STAGES": 4.0}, "bf16", "sm_80",
                       cache_dir=tmp_path)
    assert not any(tmp_path.rglob("*.cubin"))


def test_a_mistyped_dispatch_entry_is_refused_at_load(tmp_path):
    entry = {"M": 128, "N": 128, "K": 128, "dtype": "bf16", "layout": "TN", "family": "mma_sm80",
             "config": {**MMA.default_config(), "SPLIT_K": True}, "tflops": 1.0,
             "cublas_tflops": 1.0, "trial_id": 1}
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"schema_version": 1, "simulated": True, "fingerprint": {},
                                "entries": [entry]}))
    with pytest.raises(UserError, match=r"entries\[0\].config: SPLIT_K=True: expected an integer"):
        dispatch.load(path)


def test_the_space_hash_follows_the_encoding(monkeypatch):
    # The hash before knobs carried their encoding: a study stored then is refused on resume.
    old = hashlib.sha256(json.dumps([[p.name, list(p.values)] for p in MMA.params]).encode())
    assert MMA.space_hash() != old.hexdigest()[:16]
    before = MMA.space_hash()
    params = tuple(dataclasses.replace(p, encoding="categorical") if p.name == "STAGES" else p
                   for p in MMA.params)
    monkeypatch.setattr(type(MMA), "params", params)
    assert MMA.space_hash() != before


# ---- one source hash per family -------------------------------------------------------------
@pytest.fixture
def sources(tmp_path):
    root = tmp_path / "kernel_templates"
    shutil.copytree(TEMPLATE_DIR, root)
    return root


def _edit(path):
    path.write_text(path.read_text() + "\n// edited\n")


def test_each_family_declares_every_file_its_template_includes():
    for family in FAMILIES.values():
        assert undeclared_includes(family, TEMPLATE_DIR) == [], family.family


def test_another_familys_files_leave_a_source_hash_alone(sources):
    before = {name: f.source_hash(sources) for name, f in FAMILIES.items()}
    assert before["wgmma_sm90"] == WGMMA.source_hash()  # the copy hashes as the original
    _edit(sources / "mma_sm80.cuh")
    _edit(sources / "include" / "tunefw" / "sm80.cuh")
    assert WGMMA.source_hash(sources) == before["wgmma_sm90"]
    assert MMA.source_hash(sources) != before["mma_sm80"]


def test_a_familys_own_header_changes_its_hash(sources):
    before = WGMMA.source_hash(sources)
    _edit(sources / "include" / "tunefw" / "sm90.cuh")
    assert WGMMA.source_hash(sources) != before
    assert MMA.source_hash(sources) == MMA.source_hash()


def test_the_cubin_cache_key_is_the_family_source_hash(sources, tmp_path):
    from tunefw.cuda.compiler import prepare_compile

    def key(template, root):
        return prepare_compile(template, template.default_config(), "bf16", "sm_90a", root,
                        tmp_path / "cache", 60).key

    wgmma_key, mma_key = key(WGMMA, sources), key(MMA, sources)
    _edit(sources / "mma_sm80.cuh")
    assert key(WGMMA, sources) == wgmma_key and key(MMA, sources) != mma_key
    _edit(sources / "include" / "tunefw" / "sm90.cuh")
    assert key(WGMMA, sources) != wgmma_key


def test_an_undeclared_include_is_refused_at_compile(sources, tmp_path, monkeypatch):
    (sources / "extra.cuh").write_text("#pragma once\n")
    source = sources / "mma_sm80.cuh"
    source.write_text('#include "extra.cuh"\n' + source.read_text())
    with pytest.raises(UserError, match="mma_sm80.cuh includes extra.cuh, not declared"):
        compile_kernel(MMA, MMA.default_config(), "bf16", "sm_80", source_dir=sources,
                       cache_dir=tmp_path / "cache")


# ---- the listing ---------------------------------------------------------------------------
def test_the_cli_lists_a_familys_knobs_from_the_declaration():
    shown = invoke_cli("family", "wgmma_sm90", env={"COLUMNS": "250"})
    assert shown.returncode == 0, shown.stderr
    lines = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines()
             if line.startswith("│") and line.split("│")[1].strip()}
    assert set(lines) == set(WGMMA.param_names)
    assert "int 8..256 step 8" in lines["BN"]
    assert "cooperative=0, pingpong=1" in lines["SCHEDULE"]
    assert "tile rows per CTA (of M; of N under SWAP_AB)" in lines["BM"]


def test_the_family_listings_as_json_hold_the_declared_values():
    listed = json.loads(invoke_cli("family", "--json").stdout)
    assert [f["name"] for f in listed] == sorted(FAMILIES)
    assert listed[-1] == {"name": "wgmma_sm90", "kernel": WGMMA.kernel, "source": WGMMA.source,
                          "min_cc": 90, "knobs": list(WGMMA.param_names)}
    knobs = {k["name"]: k for k in json.loads(invoke_cli("family", "wgmma_sm90",
                                                         "--json").stdout)["knobs"]}
    schedule = WGMMA.params[WGMMA.param_names.index("SCHEDULE")]
    assert knobs["SCHEDULE"]["values"] == list(schedule.values) == ["cooperative", "pingpong"]
    assert knobs["SCHEDULE"]["cpp"] == {"cooperative": "0", "pingpong": "1"}
    assert knobs["BN"]["optuna"] == "int 8..256 step 8" and knobs["BN"]["cpp"] is None
    assert knobs["BM"]["default"] == WGMMA.default_config()["BM"]


def test_a_mistyped_entry_is_refused_before_a_header_is_written():
    from tunefw.export.table import render
    from tunefw.runtime.dispatch import DispatchEntry, DispatchTable

    entry = DispatchEntry(4096, 4096, 4096, "bf16", "TN", "wgmma_sm90",
                          {**WGMMA.default_config(), "CLUSTER_M": 2.0}, 700.0, 690.0, 1)
    table = DispatchTable(simulated=True, fingerprint={"name": "SIMULATED NVIDIA H200", "cc": 90},
                          entries=[entry])
    with pytest.raises(UserError, match=r"entries\[0\]\.config: CLUSTER_M=2.0 is a float, expected an int$"):
        render(table, "cpp")


def test_a_knob_added_later_reads_old_configs_as_its_absent_value(tmp_path):
    """Tables and trials written before wgmma_sm90 had SWAP_AB keep loading, as SWAP_AB=0 (the
    kernel they were measured with); a config missing a knob without such a value is refused."""
    old = {k: v for k, v in WGMMA.default_config().items() if k != "SWAP_AB"}
    assert WGMMA.upgrade(old) == {**old, "SWAP_AB": 0} and WGMMA.space_reason(old) is not None
    assert WGMMA.upgrade({**old, "SWAP_AB": 1})["SWAP_AB"] == 1
    assert WGMMA.as_written_before(WGMMA.default_config()) == old  # what the simulator hashes
    assert WGMMA.as_written_before({**old, "SWAP_AB": 1})["SWAP_AB"] == 1
    rows_sm90 = FAMILIES["rows_sm90"]
    partial = {k: v for k, v in rows_sm90.default_config().items() if k != "RS"}
    assert rows_sm90.upgrade(partial) == partial
    with pytest.raises(ValueError, match="absent=2 is not one of"):
        Param("X", (0, 1), absent=2)
    table = dispatch.load(REPO / "benchmarks" / "results" / "dispatch_wgmma_sm90_r4_h200.json")
    assert all(e.config["SWAP_AB"] == 0 for e in table.entries if e.family == "wgmma_sm90")
