"""Shape collection from a model (tunefw.study.model_shapes) and `study create --from-model`."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from conftest import invoke_cli
from tunefw.errors import UserError
from tunefw.study.model_shapes import (M_GRIDS, collect_linears, model_shapes, parse_m_grid,
                                       study_problems)

# The tiny Llama: hidden 256, intermediate 512, 2 layers, 4 heads of 64, 2 KV heads, vocab 1024.
LLAMA = {(256, 256): ("q_proj-o_proj", 4), (128, 256): ("k_proj-v_proj", 4),
         (512, 256): ("gate_proj-up_proj", 4), (256, 512): ("down_proj", 2),
         (1024, 256): ("lm_head", 1)}


@pytest.fixture
def llama_config(tmp_path):
    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefw[hf]')")
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1024)
    cfg.save_pretrained(tmp_path / "llama")
    return tmp_path / "llama" / "config.json"


ENTRY = textwrap.dedent('''
    import torch

    def build():
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(),
                                   torch.nn.Linear(32, 12, bias=False), torch.nn.Linear(64, 32))

    def not_a_model():
        return 42

    def broken():
        raise RuntimeError("no weights here")
''')


@pytest.fixture
def entry_file(tmp_path):
    path = tmp_path / "mymodels.py"
    path.write_text(ENTRY)
    return path


def test_llama_config_gives_its_unfused_layers(llama_config):
    found = model_shapes(llama_config, "decode")
    got = {(s.N, s.K): (s.label, s.count) for s in found.shapes}
    assert got == LLAMA
    assert {s.dtype for s in found.shapes} == {"bf16"} and found.invalid == []
    assert found.shapes[0].patterns() == ["model.layers.*.self_attn.q_proj",
                                          "model.layers.*.self_attn.o_proj"]
    problems = found.problems()
    assert len(problems) == 5 * len(M_GRIDS["decode"])
    assert {(p["M"], p["N"], p["K"], p["dtype"], p["label"]) for p in problems} == {
        (m, n, k, "bf16", label) for (n, k), (label, _) in LLAMA.items() for m in M_GRIDS["decode"]}
    # the model directory names the same model; fp16 is kept as asked
    same = model_shapes(llama_config.parent, [1, 4096], dtype="fp16")
    assert {(p["M"], p["N"], p["K"], p["dtype"]) for p in same.problems()} == {
        (m, n, k, "fp16") for (n, k) in LLAMA for m in (1, 4096)}


def test_the_meta_build_allocates_no_weights(llama_config):
    from tunefw.study.model_shapes import load_model

    model = load_model(llama_config)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_entry_point_reports_invalid_layers(entry_file, monkeypatch):
    found = model_shapes(f"{entry_file}:build", "1,8")
    assert [(s.N, s.K, s.dtype, s.count, s.names) for s in found.shapes] == [
        (32, 64, "float32", 2, ["0", "3"]), (12, 32, "float32", 1, ["2"])]
    assert [s.invalid for s in found.shapes] == [None, "N=12 not a positive multiple of 8"]
    assert found.problems() == [{"M": 1, "N": 32, "K": 64, "dtype": "bf16", "label": "0-3"},
                                {"M": 8, "N": 32, "K": 64, "dtype": "bf16", "label": "0-3"}]
    notes = found.notes()
    assert notes[0] == "N=32 K=64 tuned as bf16 (layers are float32): 2 layer(s): 0, 3"
    assert notes[1] == "skipped 12x32 float32: N=12 not a positive multiple of 8 (1 layer(s): 2)"
    monkeypatch.syspath_prepend(str(entry_file.parent))  # the module:function form
    problems, _ = study_problems("mymodels:build", [2])
    assert problems == [{"M": 2, "N": 32, "K": 64, "dtype": "bf16", "label": "0-3"}]


def test_module_passed_in_python_keeps_its_dtype():
    model = torch.nn.ModuleDict({"up": torch.nn.Linear(16, 48, dtype=torch.float16),
                                 "head": torch.nn.Linear(48, 8, dtype=torch.bfloat16)})
    found = model_shapes(model, [3])
    assert found.problems() == [{"M": 3, "N": 48, "K": 16, "dtype": "fp16", "label": "up"},
                                {"M": 3, "N": 8, "K": 48, "dtype": "bf16", "label": "head"}]
    assert [s.names for s in collect_linears(model)] == [["up"], ["head"]]


@pytest.mark.parametrize("source, message", [
    ("no/such/config.json", "no/such/config.json: no such file or directory"),
    ("no_such_module_xyz:build", "no_such_module_xyz:build: cannot import no_such_module_xyz"),
    ("{entry}:missing", "has no function missing"),
    ("{entry}:not_a_model", "not_a_model() returned int, expected an nn.Module"),
    ("{entry}:broken", "broken() raised RuntimeError: no weights here"),
])
def test_bad_sources_are_one_line_errors(source, message, entry_file):
    with pytest.raises(UserError) as info:
        model_shapes(source.format(entry=entry_file))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_config_and_grid(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(UserError, match="not a transformers config"):
        model_shapes(tmp_path)
    with pytest.raises(UserError, match="--m-grid 'lots'"):
        parse_m_grid("lots")
    with pytest.raises(UserError, match="M=0"):
        parse_m_grid("0,4")
    assert parse_m_grid("16, 1,16") == [1, 16]
    assert parse_m_grid("both") == sorted(M_GRIDS["decode"] + M_GRIDS["prefill"])
    with pytest.raises(UserError, match="no nn.Linear layer tunefw can tune"):
        model_shapes(torch.nn.Linear(12, 12), [1])
    with pytest.raises(UserError, match="has no nn.Linear"):
        model_shapes(torch.nn.ReLU(), [1])


def test_cli_study_create_from_model(db_url, llama_config, entry_file):
    made = invoke_cli("study", "create", "tiny", "--from-model", str(llama_config), "--m-grid",
                      "decode", "--trials", "4", db=db_url)
    assert made.returncode == 0, made.stderr
    assert "N=1024 K=256 tuned as bf16: 1 layer(s): lm_head" in made.stdout
    shown = json.loads(invoke_cli("study", "show", "tiny", "--json", db=db_url).stdout)
    rows = {(p["M"], p["N"], p["K"], p["label"]) for p in shown["problems"]}
    assert rows == {(m, n, k, label) for (n, k), (label, _) in LLAMA.items() for m in M_GRIDS["decode"]}
    bad = invoke_cli("study", "create", "x", "--from-model", f"{entry_file}:nope", db=db_url)
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0
    assert "has no function nope" in bad.stderr


def test_cli_study_create_from_model_fused(db_url, llama_config):
    made = invoke_cli("study", "create", "tinyf", "--from-model", str(llama_config), "--m-grid",
                      "1,16", "--fuse", db=db_url)
    assert made.returncode == 0, made.stderr
    # q+k+v fused is 512 wide, gate's and up's own N here: one problem serves them all
    assert ("N=512 K=256 tuned as bf16: 6 layer(s): model.layers.*.self_attn.q_proj+k_proj+v_proj, "
            "model.layers.*.mlp.gate_proj, model.layers.*.mlp.up_proj") in made.stdout
    shown = json.loads(invoke_cli("study", "show", "tinyf", "--json", db=db_url).stdout)
    rows = {(p["N"], p["K"], p["label"]) for p in shown["problems"] if p["M"] == 16}
    assert rows == {(512, 256, "q_proj_k_proj_v_proj-gate_proj-up_proj"), (256, 256, "o_proj"),
                    (1024, 256, "lm_head"), (256, 512, "down_proj")}
    bad = invoke_cli("study", "create", "y", "--shape", "16x256x256", "--fuse", db=db_url)
    assert bad.returncode != 0 and bad.stderr.strip() == "tunefw: error: study create: --fuse applies to --from-model only"


def test_cli_study_create_from_model_gated(db_url, llama_config):
    made = invoke_cli("study", "create", "tinyg", "--from-model", str(llama_config), "--m-grid",
                      "1,16", "--fuse", "--gated", db=db_url)
    assert made.returncode == 0, made.stderr
    assert ("N=512 K=256 gate silu (weight of 2N rows) tuned as bf16: 2 layer(s): "
            "model.layers.*.mlp.gate_proj+up_proj") in made.stdout
    shown = json.loads(invoke_cli("study", "show", "tinyg", "--json", db=db_url).stdout)
    rows = {(p["N"], p["K"], p["label"], p.get("gate", "none")) for p in shown["problems"] if p["M"] == 16}
    assert rows == {(512, 256, "q_proj_k_proj_v_proj", "none"), (256, 256, "o_proj", "none"),
                    (512, 256, "gate_proj_up_proj", "silu"), (256, 512, "down_proj", "none"),
                    (1024, 256, "lm_head", "none")}
    bad = invoke_cli("study", "create", "z", "--shape", "16x256x256", "--gated", db=db_url)
    assert bad.stderr.strip() == "tunefw: error: study create: --gated applies to --from-model only"
