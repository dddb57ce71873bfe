"""Gated problems (gate="silu": C = silu(A Bg^T) * (A Bu^T), B = [Bg; Bu]) on the CPU: the
problem's fields, which families compute them and with which configs, their launch geometry and
tensor maps, the fp32 reference and the stock baseline, real sm_90a compiles, the dispatch
table's gate (never serving a plain GEMM) and a simulated sweep from study file to export."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import yaml

from conftest import db_rows, invoke_cli, launch_on
from family_checks import pool  # noqa: F401
from tunefw.cuda.compiler import sass_check, sass_opcodes
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.evaluate import method
from tunefw.export.table import render
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable, load
from tunefw.runtime.rules import table_rule
from tunefw.templates import FAMILIES, get_family

STREAM, WGMMA = get_family("stream_sm90"), get_family("wgmma_sm90")
STREAM_CFG = {"BN": 48, "MTILES": 2, "BK": 256, "STAGES": 3, "WARPS": 4, "CK": 1, "WN": 1}
WGMMA_CFG = {**WGMMA.default_config(), "CLUSTER_M": 1, "SCHEDULE": "pingpong", "BN": 192,
             "GROUP": 16}
MLP = GemmProblem(16, 14336, 4096, gate="silu")  # Llama-3-8B's gate/up at 16 tokens


def test_a_gated_problem_reads_twice_the_weight_and_keeps_its_gate_in_key_and_dict():
    plain = GemmProblem(16, 14336, 4096)
    assert MLP.weight_rows == 2 * 14336 and plain.weight_rows == 14336
    assert MLP.flops == 2 * plain.flops
    assert MLP.min_bytes == 2 * (16 * 4096 + 2 * 14336 * 4096 + 16 * 14336)
    assert MLP.key() == "16x14336x4096:bf16:TN:silu" and plain.key() == "16x14336x4096:bf16:TN"
    assert MLP.as_dict()["gate"] == "silu" and "gate" not in plain.as_dict()
    assert GemmProblem(**MLP.as_dict()) == MLP and GemmProblem(**plain.as_dict()) == plain
    assert MLP.tile_out_cols(192) == 96 and plain.tile_out_cols(192) == 192


def test_an_unknown_gate_names_the_field_and_the_choices():
    with pytest.raises(UserError) as exc:
        GemmProblem(16, 64, 64, gate="gelu")
    assert "gate='gelu'" in str(exc.value) and "none, silu" in str(exc.value)


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"stream_sm90", "wgmma_sm90"}))
def test_families_without_a_gated_epilogue_refuse_gated_problems(family):
    template = get_family(family)
    reason = template.check(template.default_config(), MLP, H200)
    assert reason and "no gated epilogue" in reason
    with pytest.raises(UserError, match="gate 'silu'"):
        template.name_expression(template.default_config(), "bf16", "silu")


def test_the_gate_is_the_last_template_argument_and_plain_names_are_unchanged():
    assert (STREAM.name_expression(STREAM_CFG, "bf16")
            == "gemm_stream_sm90<0, 48, 2, 256, 3, 4, 1>")
    assert (STREAM.name_expression(STREAM_CFG, "bf16", "silu")
            == "gemm_stream_sm90<0, 48, 2, 256, 3, 4, 1, 1>")
    plain = WGMMA.name_expression(WGMMA_CFG, "bf16")
    assert WGMMA.name_expression(WGMMA_CFG, "bf16", "silu") == plain[:-1] + ", 1>"


def test_stream_gated_ctas_write_half_their_weight_rows_and_map_all_2n_rows():
    assert STREAM.check(STREAM_CFG, MLP, H200) is None
    plain = GemmProblem(16, 14336, 4096)
    assert STREAM.launch(STREAM_CFG, MLP, H200).grid[0] == -(-14336 // 24)
    assert STREAM.launch(STREAM_CFG, plain, H200).grid[0] == -(-14336 // 48)
    b = STREAM.tensor_map_specs(STREAM_CFG, MLP)["b"]
    assert b["dims"] == (4096, 2 * 14336) and b["box"] == (64, 24)


def test_wgmma_gated_tiles_are_half_as_wide_and_refuse_multicast_swap_and_odd_widths():
    assert WGMMA.check(WGMMA_CFG, MLP, H200) is None
    assert WGMMA.tile_counts(WGMMA_CFG, GemmProblem(2048, 14336, 4096, gate="silu")) == (16, 150)
    specs = WGMMA.tensor_map_specs(WGMMA_CFG, MLP)
    assert specs["b"]["dims"] == (4096, 2 * 14336) and specs["b"]["box"] == (64, 96)
    assert specs["c"]["dims"] == (14336, 16) and specs["c"]["box"] == (32, 64)
    for change, word in (({"CLUSTER_M": 2}, "CLUSTER_M=1"),
                         ({"SWAP_AB": 1, "EPILOGUE": "direct"}, "SWAP_AB=0"),
                         ({"BN": 96}, "BN=96")):
        reason = WGMMA.check({**WGMMA_CFG, **change}, MLP, H200)
        assert reason and word in reason, change
    assert WGMMA.check({**WGMMA_CFG, "BN": 96, "EPILOGUE": "direct"}, MLP, H200) is None


def test_split_k_workspace_counts_the_gated_tiles():
    config = {**WGMMA_CFG, "SPLIT_K": 2, "BN": 128, "BM": 64}
    problem = GemmProblem(64, 4096, 4096, gate="silu")
    tiles = 1 * (4096 // 64)
    assert WGMMA.workspace_bytes(config, problem) == 4 * (64 + tiles * 2 * 64 * 128)


def test_reference_and_stock_compute_silu_of_the_gate_times_the_up_projection():
    a, b = method.make_inputs(5, 2 * 24, 40, "bf16", seed=3)
    ref = method.reference(a, b, "silu")
    g, u = a.float() @ b[:24].float().T, a.float() @ b[24:].float().T
    assert torch.allclose(ref, g * torch.sigmoid(g) * u)
    assert torch.equal(method.reference(a, b), a.float() @ b.float().T)
    out = torch.empty(5, 24, dtype=torch.bfloat16)
    method.stock(a, b, "silu", out)
    assert method.verify(out, ref, "bf16").ok
    swapped = torch.nn.functional.silu(u) * g  # gate and up exchanged: a wrong answer
    assert not method.verify(swapped.bfloat16(), ref, "bf16").ok


def test_gated_kernels_compile_clean_and_differ_from_the_plain_ones(pool):  # noqa: F811
    wide = {**STREAM_CFG, "BN": 128, "MTILES": 8, "BK": 128, "WN": 4, "CK": 4}  # sliced warps
    for family, config, op in ((STREAM, STREAM_CFG, "HMMA"), (STREAM, wide, "HMMA"),
                               (WGMMA, WGMMA_CFG, "HGMMA"),
                               (WGMMA, {**WGMMA_CFG, "SPLIT_K": 2, "BM": 64, "BN": 128,
                                        "STAGES": 8, "EPILOGUE": "direct"}, "HGMMA")):
        gated = pool.submit(family, config, "bf16", "sm_90a", gate="silu").result()
        plain = pool.submit(family, config, "bf16", "sm_90a").result()
        assert gated.ok and plain.ok, gated.log[:500]
        assert gated.spill_bytes == 0 and sass_check(gated.cubin, require_op=op) is None
        assert "UTMALDG" in {o.split(".", 1)[0] for o in sass_opcodes(gated.cubin)}
        assert gated.cubin != plain.cubin and gated.lowered_name != plain.lowered_name


def _table(*entries: DispatchEntry) -> DispatchTable:
    return DispatchTable(False, {"name": "NVIDIA H200", "cc": 90}, list(entries))


GATED_ENTRY = DispatchEntry(16, 14336, 4096, "bf16", "TN", "stream_sm90", STREAM_CFG, 60.0, 50.0,
                            7, label="l.gate_up", gate="silu")


def test_a_gated_entry_never_serves_a_plain_gemm_of_its_shape_and_vice_versa():
    table = _table(GATED_ENTRY)
    assert table_rule(table, GemmProblem(16, 14336, 4096), H200)[1] is None
    assert table_rule(table, GemmProblem(32, 14336, 4096), H200)[1] is None
    assert table_rule(table, MLP, H200)[:2] == ("exact", GATED_ENTRY)
    plain = replace(GATED_ENTRY, gate="none", trial_id=8)
    both = _table(GATED_ENTRY, plain)
    assert table_rule(both, GemmProblem(16, 14336, 4096), H200)[1] == plain
    assert table_rule(both, replace(MLP, M=8), H200)[:2] == ("bucket", GATED_ENTRY)


def test_calibration_evidence_of_a_plain_entry_never_decides_a_gated_donor_of_its_shape():
    from tunefw.runtime.dispatch import Evidence
    from tunefw.runtime.rules import decide
    plain = replace(GATED_ENTRY, gate="none", trial_id=8)
    losses = [Evidence(m, 14336, 4096, "bf16", "TN", "bucket", (16, 14336, 4096), 50.0, 100.0)
              for m in (4, 12)]  # the plain entry lost at M = 4 and 12
    table = replace(_table(GATED_ENTRY, plain), evidence=losses)
    assert decide(table, GemmProblem(8, 14336, 4096), H200).path == "cublas"
    gated = decide(table, replace(MLP, M=8), H200)
    assert (gated.path, gated.entry) == ("bucket", GATED_ENTRY)


def test_dispatch_json_and_the_header_keep_the_gate(tmp_path):
    plain = replace(GATED_ENTRY, gate="none", trial_id=8, label="l.other")
    path = tmp_path / "d.json"
    path.write_text(render(_table(GATED_ENTRY, plain), "json"))
    raw = json.loads(path.read_text())["entries"]
    assert raw[0]["gate"] == "silu" and "gate" not in raw[1]
    assert load(path).entries == [GATED_ENTRY, plain]
    header = render(_table(GATED_ENTRY, plain), "cpp")  # the header serves both (test_export_cpp)
    assert "kNumEntries = 2;" in header
    assert "Gate::silu, \"gemm_stream_sm90<0, 48, 2, 256, 3, 4, 1, 1>\", 9," in header
    # the header's knob prelude reads WN after GATED, where template_args put it
    assert "const int64_t CK = e.args[6];" in header and "const int64_t WN = e.args[8];" in header


@pytest.mark.slow
def test_a_gated_study_sweeps_stores_and_exports_its_gate(db_url, tmp_path, ray_head):
    study = tmp_path / "g.yaml"
    study.write_text(yaml.safe_dump({
        "trials": 4, "families": ["stream_sm90", "wgmma_sm90"], "sim": {"trial_seconds": 0.02},
        "problems": [{"shape": "16x1024x512", "gate": "silu", "label": "mlp"}, "16x1024x512"]}))
    assert invoke_cli("study", "create", "g", "--from", str(study), db=db_url).returncode == 0
    assert launch_on(ray_head, "g", "--gpus", "2", "--backend", "sim", db=db_url).returncode == 0
    assert sorted(db_rows(db_url, "SELECT key, gate FROM tunefw_problem")) == [
        ("16x1024x512:bf16:TN", "none"), ("16x1024x512:bf16:TN:silu", "silu")]
    out = tmp_path / "d.json"
    assert invoke_cli("export", str(out), "--study", "g", "--min-ratio", "0",
                      db=db_url).returncode == 0
    entries = json.loads(out.read_text())["entries"]
    assert sorted(e.get("gate", "none") for e in entries) == ["none", "silu"]
    assert all(e["family"] in ("stream_sm90", "wgmma_sm90") for e in entries)


def test_a_shape_on_the_command_line_may_carry_its_gate(tmp_path, db_url):
    from conftest import invoke_cli
    from tunefw.export.calibrate import read_shapes
    from tunefw.problem import parse_shape
    assert parse_shape("16x14336x4096:silu") == MLP and parse_shape(" 16x14336x4096 ").gate == "none"
    with pytest.raises(UserError, match="gate='gelu'"):
        parse_shape("16x14336x4096:gelu")
    made = invoke_cli("study", "create", "g", "--shape", "16x14336x4096:silu", "--shape",
                      "16x14336x4096", db=db_url)
    assert made.returncode == 0, made.stderr
    assert db_rows(db_url, "SELECT M, N, K, gate FROM tunefw_problem ORDER BY id") == [
        (16, 14336, 4096, "silu"), (16, 14336, 4096, "none")]
    table = tmp_path / "t.json"
    table.write_text(render(_table(GATED_ENTRY), "json"))
    shown = invoke_cli("dispatch", "explain", str(table), "8x14336x4096:silu", "8x14336x4096")
    assert shown.stdout.splitlines()[0].startswith("8x14336x4096 bf16 gate silu: bucket: ")
    assert shown.stdout.splitlines()[1].endswith("no bf16 kernel entry [preview for NVIDIA H200, "
                                                 "the table's device]")
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("8x14336x4096:silu\n")
    with pytest.raises(UserError, match="calibration times plain GEMMs"):
        read_shapes(shapes)
