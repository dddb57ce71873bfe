"""The gated GEMM at run time (CPU): ``tunefw.gated``, the Dispatcher's gated routes and
``tunefw.patch(model, gated=True)`` serving a SwiGLU MLP as down(gated(x, [Wg; Wu]))."""
from __future__ import annotations

import pytest
import torch

import tunefw
from tunefw.errors import UserError
from tunefw.evaluate import method
from tunefw.runtime import fusion
from tunefw.runtime.dispatch import DispatchEntry, DispatchTable
from tunefw.runtime.dispatcher import Dispatcher
from tunefw.study.siblings import gated_mlps
from tunefw.templates import get_family

MLPS = ["model.layers.0.mlp", "model.layers.1.mlp"]
STREAM = {"BN": 48, "MTILES": 2, "BK": 256, "STAGES": 3, "WARPS": 4, "CK": 1, "WN": 1}

pytestmark = pytest.mark.usefixtures("no_table")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("lead", [(6,), (2, 3)])
def test_gated_is_silu_of_the_first_half_times_the_second_in_x_leading_shape(lead):
    x = torch.randn(*lead, 64, dtype=torch.bfloat16)
    w = torch.randn(80, 64, dtype=torch.bfloat16)
    y = tunefw.gated(x, w)
    assert y.shape == (*lead, 40) and y.dtype == torch.bfloat16
    assert _rel(y.reshape(-1, 40), method.reference(x.reshape(-1, 64), w, "silu")) < 1e-2


def test_gated_records_grad_through_the_stock_form():
    x = torch.randn(4, 32, requires_grad=True)
    w = torch.randn(16, 32, requires_grad=True)
    tunefw.gated(x, w).sum().backward()
    x2, w2 = x.detach().requires_grad_(), w.detach().requires_grad_()
    (torch.nn.functional.silu(x2 @ w2[:8].T) * (x2 @ w2[8:].T)).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


@pytest.mark.parametrize("gate", ["none", "gelu"])
def test_gated_refuses_a_gate_it_has_not_in_one_line(gate):
    with pytest.raises(UserError) as exc:
        tunefw.gated(torch.ones(2, 8), torch.ones(16, 8), gate)
    assert str(exc.value) == f"tunefw.gated: gate={gate!r}: expected one of silu"


@pytest.mark.parametrize("shape", [(15, 8), (16, 4), (16,)])
def test_gated_refuses_a_weight_that_is_not_two_stacked_halves_of_x_width(shape):
    with pytest.raises(UserError) as exc:
        tunefw.gated(torch.ones(2, 8), torch.ones(*shape))
    assert str(exc.value) == (f"tunefw.gated: w of shape {shape}: expected [Wg; Wu] of 2N x 8 "
                              "(x's last dimension)")


def _table() -> DispatchTable:
    """A gated and a plain entry of one shape (the stream family serves both)."""
    fp = {"name": "NVIDIA H200", "cc": 90}
    src = get_family("stream_sm90").source_hash()
    common = dict(family="stream_sm90", config=STREAM, dtype="bf16", layout="TN", tflops=10.0,
                  cublas_tflops=8.0, trial_id=1, source_hash=src)
    return DispatchTable(False, fp, [DispatchEntry(M=16, N=14336, K=4096, gate="silu", **common),
                                     DispatchEntry(M=16, N=28672, K=4096, **common)])


def test_the_dispatcher_routes_a_gated_shape_to_its_own_gate_only():
    from tunefw.device import H200
    d = Dispatcher(_table(), gpu=H200, guard=False, verify=False)
    gated = d.route(16, 14336, 4096, "bf16", gate="silu")
    assert gated.path == "exact" and gated.entry.gate == "silu"
    assert "gemm_stream_sm90<0, 48, 2, 256, 3, 4, 1, 1>" in gated.reason  # its gated kernel
    plain = d.route(16, 14336, 4096, "bf16")  # the plain GEMM of that shape: never the gated kernel
    assert plain.entry is None or plain.entry.gate == "none"
    assert d.route(16, 28672, 4096, "bf16").entry.gate == "none"
    assert d.explain(16, 14336, 4096, gate="silu").startswith("16x14336x4096 bf16 gate silu: exact:")
    assert d.preview(16, 14336, 4096, gate="silu").entry.gate == "silu"


def test_the_dispatcher_serves_cpu_operands_in_the_stock_form():
    from tunefw.device import H200
    d = Dispatcher(_table(), gpu=H200, guard=False, verify=False)
    a, b = torch.randn(3, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    out = torch.empty(3, 24, dtype=torch.bfloat16)
    method.stock(a, b, "silu", out)
    assert torch.equal(d.gated(a, b), out)


def test_gated_mlps_are_found_by_names_shapes_and_no_bias(llama):
    found = gated_mlps(llama)
    assert [(m.name, m.leaves, m.N, m.K) for m in found] == [
        (name, ("gate_proj", "up_proj", "down_proj"), 128, 64) for name in MLPS]
    assert found[0].names == [f"{MLPS[0]}.{leaf}" for leaf in ("gate_proj", "up_proj", "down_proj")]
    block = torch.nn.Module()
    block.gate_proj, block.down_proj = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)
    block.up_proj = torch.nn.Linear(16, 32)  # biases: the gated kernels add none
    assert gated_mlps(block) == []


def test_patch_gated_serves_each_mlp_by_one_gated_gemm_and_unpatch_restores_it(llama, monkeypatch):
    ids = torch.randint(0, 256, (2, 5))
    before = _logits(llama, ids)
    report = tunefw.patch(llama, gated=True)
    assert report.gated == MLPS and report.ungated == {} and "2 MLP(s) gated" in str(report)
    again = tunefw.patch(llama, gated=True)  # patching twice changes nothing
    assert again.gated == MLPS and again.ungated == {} and again.swapped == []
    mlp = llama.get_submodule(MLPS[0])
    gate, up = mlp.gate_proj.weight, mlp.up_proj.weight  # views of one [Wg; Wu] buffer
    assert up.data_ptr() == gate.data_ptr() + gate.numel() * gate.element_size()
    calls = []
    real = fusion.gated

    def spy(x, w, g):
        calls.append((tuple(x.shape), w.data_ptr(), tuple(w.shape), g))
        return real(x, w, g)

    monkeypatch.setattr(fusion, "gated", spy)
    after = _logits(llama, ids)
    assert calls[0] == ((2, 5, 64), gate.data_ptr(), (256, 64), "silu") and len(calls) == 2
    assert _rel(after, before) < 1e-2  # one rounding of the product instead of three
    assert tunefw.unpatch(llama)[:3] == ["model.layers.0.self_attn.q_proj",
                                         "model.layers.0.self_attn.k_proj",
                                         "model.layers.0.self_attn.v_proj"]
    assert "forward" not in vars(mlp) and mlp.up_proj.weight.data_ptr() != gate.data_ptr() + gate.numel() * 2
    calls.clear()
    assert torch.equal(_logits(llama, ids), before) and calls == []


def test_an_mlp_whose_forward_is_not_swiglu_is_not_gated(llama):
    class GeluMLP(torch.nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj

        def forward(self, x):  # GELU instead of SiLU: the names match, the function does not
            return self.down_proj(torch.nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))

    layer = llama.model.layers[1]
    layer.mlp = GeluMLP(layer.mlp)
    report = tunefw.patch(llama, gated=True)
    assert report.gated == [MLPS[0]]
    assert report.ungated[MLPS[1]].startswith("its forward is not down(silu(gate(x)) * up(x))")
    assert "forward" not in vars(layer.mlp)


def test_gated_takes_gate_and_up_before_sibling_fusion_asks_for_them(llama):
    report = tunefw.patch(llama, fuse=tunefw.SIBLING_SETS + tunefw.MLP_SIBLING_SETS, gated=True)
    assert report.gated == MLPS
    assert report.fused == [f"model.layers.{i}.self_attn.q_proj+k_proj+v_proj" for i in range(2)]


def test_a_gated_model_under_compile_runs_the_mlp_in_its_own_form(llama):
    ids = torch.randint(0, 256, (1, 5))
    before = _logits(llama, ids)
    tunefw.patch(llama, gated=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    with torch.no_grad():
        out = torch.compile(llama, backend=backend)(input_ids=ids).logits
    gemms = [n for g in graphs for n in g.graph.nodes if n.target is torch.ops.tunefw.gemm.default]
    assert len(gemms) == 2 * 7 + 1  # each layer's seven GEMMs and lm_head's: the MLP's own form
    torch.testing.assert_close(out, before, rtol=2e-2, atol=2e-2)
