"""tunefw.patch / tunefw.unpatch on a tiny transformers Llama and on hand-built modules (CPU)."""
from __future__ import annotations

import pytest
import torch

import tunefw
from tunefw.runtime import ops
from tunefw.runtime.patching import PatchReport

LAYER = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]
NAMES = [f"model.layers.{i}.{n}" for i in range(2) for n in LAYER] + ["lm_head"]


pytestmark = pytest.mark.usefixtures("no_table")


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_patch_and_unpatch_keep_logits_parameters_and_keys(llama):
    ids = torch.randint(0, 256, (2, 7))
    before, keys = _logits(llama, ids), list(llama.state_dict())
    params = {n: p for n, p in llama.named_parameters()}
    report = tunefw.patch(llama)
    assert isinstance(report, PatchReport)
    assert report.swapped == NAMES and report.skipped == {} and report.already == []
    assert all(type(llama.get_submodule(n)) is tunefw.Linear for n in NAMES)
    assert list(llama.state_dict()) == keys
    assert all(p is params[n] and p.requires_grad for n, p in llama.named_parameters())
    assert torch.equal(_logits(llama, ids), before)  # on CPU the layers are F.linear, like nn.Linear
    again = tunefw.patch(llama)  # patching twice is a no-op
    assert again.swapped == [] and again.already == NAMES
    assert tunefw.unpatch(llama) == NAMES
    assert all(type(llama.get_submodule(n)) is torch.nn.Linear for n in NAMES)
    assert list(llama.state_dict()) == keys
    assert all(p is params[n] for n, p in llama.named_parameters())
    assert torch.equal(_logits(llama, ids), before)
    assert tunefw.unpatch(llama) == []


def test_a_patched_checkpoint_loads_into_a_stock_model(llama):
    stock = {k: v.clone() for k, v in llama.state_dict().items()}
    tunefw.patch(llama)
    for p in llama.parameters():
        p.data.zero_()
    llama.load_state_dict(stock)
    assert all(torch.equal(v, stock[k]) for k, v in llama.state_dict().items())


def test_patched_llama_under_compile_runs_every_layer_through_the_op(llama):
    tunefw.patch(llama, exclude="lm_head")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ids = torch.randint(0, 256, (1, 5))
    compiled = torch.compile(llama, backend=backend)
    with torch.no_grad():
        out = compiled(input_ids=ids).logits
    calls = [n for g in graphs for n in g.graph.nodes if n.target is torch.ops.tunefw.gemm.default]
    assert len(calls) == len(NAMES) - 1
    tunefw.unpatch(llama)
    torch.testing.assert_close(out, _logits(llama, ids), rtol=2e-2, atol=2e-2)


class _Subclass(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) * 2


def test_report_says_why_layers_were_not_swapped():
    bf16 = dict(dtype=torch.bfloat16)
    model = torch.nn.ModuleDict({
        "ok": torch.nn.Linear(16, 32, **bf16), "fp32": torch.nn.Linear(16, 32),
        "odd": torch.nn.Linear(16, 12, **bf16), "sub": _Subclass(16, 32, **bf16),
        "head": torch.nn.Linear(32, 64, **bf16), "mine": tunefw.Linear(16, 32, **bf16)})
    model["shared"] = model["ok"]  # one module under two names
    report = tunefw.patch(model, exclude=["head"])
    assert report.swapped == ["ok"] and report.already == ["mine"]
    assert report.skipped == {
        "fp32": "dtype float32 (tunefw kernels are bf16 or fp16)",
        "odd": "N=12 not a multiple of 8",
        "sub": "_Subclass is a subclass of nn.Linear with its own forward",
        "head": "excluded"}
    assert model["shared"] is model["ok"] and type(model["ok"]) is tunefw.Linear
    assert "1 layer(s) swapped, 1 already tunefw.Linear, 4 skipped" in str(report)
    tunefw.unpatch(model)
    only = tunefw.patch(model, include="h*")
    assert only.swapped == ["head"] and only.skipped["ok"] == "not included"


def test_patch_with_a_dispatcher_makes_it_the_process_one(tmp_path):
    from tunefw.errors import UserError
    from tunefw.runtime.dispatcher import Dispatcher

    model = torch.nn.Sequential(torch.nn.Linear(8, 8, dtype=torch.float16))
    with pytest.raises(UserError, match="cannot read"):  # a bad table: refused, nothing patched
        tunefw.patch(model, dispatcher=tmp_path / "missing.json")
    assert type(model[0]) is torch.nn.Linear and ops.get_dispatcher() is None
    disp = Dispatcher.__new__(Dispatcher)  # any Dispatcher instance is taken as it is
    assert tunefw.patch(model, dispatcher=disp).swapped == ["0"]
    assert ops.get_dispatcher() is disp
