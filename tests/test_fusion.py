"""Sibling fusion: ``tunefw.patch(model, fuse=True)`` serves q/k/v and gate/up as one GEMM each
(tunefw/runtime/fusion.py), and ``study create --from-model --fuse`` tunes those GEMMs (CPU)."""
from __future__ import annotations

import pytest
import torch

import tunefw
from tunefw.runtime import ops
from tunefw.runtime.fusion import FusedLinear
from tunefw.study.model_shapes import collect_linears
from tunefw.study.siblings import MLP_SIBLING_SETS, SIBLING_SETS, sibling_groups, sibling_sets

GROUPS = [f"model.layers.{i}.{g}" for i in range(2)
          for g in ("self_attn.q_proj+k_proj+v_proj", "mlp.gate_proj+up_proj")]
EVERY_SET = SIBLING_SETS + MLP_SIBLING_SETS  # gate/up too: fused only when asked


pytestmark = pytest.mark.usefixtures("no_table")


@pytest.fixture
def gemms(monkeypatch):
    """The (N, K) of every GEMM the patched layers run (on CPU each is ops._linear)."""
    calls: list[tuple[int, int]] = []

    def counting(x, w, bias=None):
        calls.append(tuple(w.shape))
        return torch.nn.functional.linear(x, w, bias)

    monkeypatch.setattr(ops, "_linear", counting)
    return calls


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_sibling_groups_are_found_by_name_k_dtype_and_bias():
    bf16 = dict(dtype=torch.bfloat16)
    block = torch.nn.Module()
    block.q_proj, block.k_proj = torch.nn.Linear(16, 32, **bf16), torch.nn.Linear(16, 8, **bf16)
    block.v_proj = torch.nn.Linear(24, 8, **bf16)  # another K: not a sibling
    block.gate_proj, block.up_proj = torch.nn.Linear(16, 8, **bf16), torch.nn.Linear(16, 8, bias=False, **bf16)
    model = torch.nn.ModuleDict({"block": block})
    groups = sibling_groups(model)
    assert [(g.parent, g.leaves, g.widths, g.K, g.N) for g in groups] == [
        ("block", ("q_proj", "k_proj"), (32, 8), 16, 40)]  # gate/up differ in bias: no group
    assert groups[0].names == ["block.q_proj", "block.k_proj"]
    assert sibling_groups(model, [("gate_proj", "k_proj")])[0].leaves == ("gate_proj", "k_proj")
    assert sibling_groups(model, False) == []
    block.up_proj = torch.nn.Linear(16, 8, **bf16)  # now gate/up qualify: grouped only when asked
    assert [g.leaves for g in sibling_groups(model)] == [("q_proj", "k_proj")]
    assert [g.leaves for g in sibling_groups(model, EVERY_SET)] == [("q_proj", "k_proj"), ("gate_proj", "up_proj")]
    # the sets a user passes to patch(fuse=...) are public names
    assert tunefw.SIBLING_SETS + tunefw.MLP_SIBLING_SETS == EVERY_SET
    with pytest.raises(ValueError, match="two or more leaf names"):
        sibling_sets([("q_proj",)])


def test_fused_llama_runs_one_gemm_per_group_with_the_same_logits(llama, gemms):
    ids = torch.randint(0, 256, (2, 7))
    before, keys = _logits(llama, ids), list(llama.state_dict())
    params = dict(llama.named_parameters())
    values = {n: p.detach().clone() for n, p in params.items()}
    report = tunefw.patch(llama, fuse=EVERY_SET)
    assert report.fused == GROUPS and len(report.swapped) == 15
    assert "4 sibling group(s) fused" in str(report)
    attn = llama.model.layers[0].self_attn
    assert type(attn.q_proj) is FusedLinear and type(attn.o_proj) is tunefw.Linear
    # the members keep their parameter objects and values, now views of one stacked buffer
    assert all(p is params[n] for n, p in llama.named_parameters())
    assert all(torch.equal(p, values[n]) for n, p in llama.named_parameters())
    assert list(llama.state_dict()) == keys
    assert attn.k_proj.weight.untyped_storage().data_ptr() == attn.q_proj.weight.untyped_storage().data_ptr()
    gemms.clear()
    torch.testing.assert_close(_logits(llama, ids), before, rtol=0, atol=0)
    # per layer: q+k+v (64+32+32 rows), o, gate+up (2x128), down; then lm_head
    layer = [(128, 64), (64, 64), (256, 64), (64, 128)]
    assert gemms == layer * 2 + [(256, 64)]
    assert tunefw.unpatch(llama) == [n for n in report.swapped]
    assert all(type(llama.get_submodule(n)) is torch.nn.Linear for n in report.swapped)
    assert attn.k_proj.weight.untyped_storage().data_ptr() != attn.q_proj.weight.untyped_storage().data_ptr()
    assert all(p is params[n] and torch.equal(p, values[n]) for n, p in llama.named_parameters())
    assert not hasattr(attn.q_proj, "_group")
    assert torch.equal(_logits(llama, ids), before)


def _qkv(**kw) -> torch.nn.Module:
    torch.manual_seed(1)
    block = torch.nn.Module()
    for leaf, n in (("q_proj", 32), ("k_proj", 16), ("v_proj", 16)):
        setattr(block, leaf, torch.nn.Linear(16, n, dtype=torch.bfloat16, **kw))
    return block


def _separate(block, x):
    return [torch.nn.functional.linear(x, m.weight, m.bias) for m in (block.q_proj, block.k_proj, block.v_proj)]


def test_a_member_serves_from_the_group_only_on_the_leaders_very_input(gemms):
    block = _qkv(bias=True)
    tunefw.patch(block, fuse=True)
    x = torch.randn(3, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        q = block.q_proj(x)
        k = block.k_proj(x)  # the same tensor: a view of the group's output, no GEMM
        assert gemms == [(64, 16)] and k.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
        v = block.v_proj(x.clone())  # an equal but other tensor: its own GEMM
        assert gemms == [(64, 16), (16, 16)]
        want = _separate(block, x)
        assert all(torch.equal(got, w) for got, w in zip((q, k, v), want))  # biases stacked too
        block.q_proj(x)
        x.mul_(2)  # written after the leader's call: the follower runs alone on the new values
        assert torch.equal(block.k_proj(x), _separate(block, x)[1]) and gemms[-1] == (16, 16)


def test_a_deep_copy_of_a_fused_model_runs_its_members_alone(gemms):
    import copy

    block = _qkv(bias=False)
    tunefw.patch(block, fuse=True)
    twin = copy.deepcopy(block)
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        got = [twin.q_proj(x), twin.k_proj(x), twin.v_proj(x)]
    assert gemms == [(32, 16), (16, 16), (16, 16)]
    assert all(torch.equal(g, w) for g, w in zip(got, _separate(block, x)))


def test_recording_grad_runs_every_member_alone():
    block = _qkv(bias=False)
    tunefw.patch(block, fuse=True)
    x = torch.randn(2, 16, dtype=torch.bfloat16, requires_grad=True)
    q, k = block.q_proj(x), block.k_proj(x)
    (q.float().sum() + k.float().sum()).backward()
    assert block.q_proj.weight.grad is not None and block.k_proj.weight.grad is not None
    torch.testing.assert_close(block.k_proj.weight.grad, x.detach().sum(0).expand(16, 16).to(torch.bfloat16))


def test_weights_cast_or_loaded_after_patching_are_served_as_they_are_now(gemms):
    block = _qkv(bias=True)
    tunefw.patch(block, fuse=True)
    fresh = {k: torch.randn_like(v) for k, v in block.state_dict().items()}
    block.load_state_dict(fresh)  # copied into the views: the stacked buffer sees it
    x = torch.randn(2, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(block.q_proj(x), _separate(block, x)[0])
        block.half()  # new tensors for every parameter: the group stacks them again
        xh = x.half()
        got = [block.q_proj(xh), block.k_proj(xh), block.v_proj(xh)]
    assert all(torch.equal(g, w) for g, w in zip(got, _separate(block, xh)))
    assert gemms[-2:] == [(64, 16), (64, 16)] and got[0].dtype == torch.float16


def test_fused_shapes_are_what_a_fused_study_tunes(llama):
    plain = [(s.N, s.K, s.label) for s in collect_linears(llama)]
    fused = [(s.N, s.K, s.label, s.patterns()) for s in collect_linears(llama, fuse=EVERY_SET)]
    assert plain == [(64, 64, "q_proj-o_proj"), (32, 64, "k_proj-v_proj"), (128, 64, "gate_proj-up_proj"),
                     (64, 128, "down_proj"), (256, 64, "lm_head")]
    assert fused == [(128, 64, "q_proj_k_proj_v_proj", ["model.layers.*.self_attn.q_proj+k_proj+v_proj"]),
                     (64, 64, "o_proj", ["model.layers.*.self_attn.o_proj"]),
                     # gate+up is lm_head's shape here: one problem serves both
                     (256, 64, "gate_proj_up_proj-lm_head", ["model.layers.*.mlp.gate_proj+up_proj", "lm_head"]),
                     (64, 128, "down_proj", ["model.layers.*.mlp.down_proj"])]
    attention = [(s.N, s.K, s.label) for s in collect_linears(llama, fuse=True)]
    assert attention == [(128, 64, "q_proj_k_proj_v_proj-gate_proj-up_proj"), (64, 64, "o_proj"),
                         (64, 128, "down_proj"), (256, 64, "lm_head")]


def test_under_compile_every_member_is_its_own_op_call(llama):
    tunefw.patch(llama, fuse=True, exclude="lm_head")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    ids = torch.randint(0, 256, (1, 5))
    with torch.no_grad():
        out = torch.compile(llama, backend=backend)(input_ids=ids).logits
    calls = [n for g in graphs for n in g.graph.nodes if n.target is torch.ops.tunefw.gemm.default]
    assert len(calls) == 14  # traced, a group is its members: fusion is an eager/graph-replay path
    tunefw.unpatch(llama)
    torch.testing.assert_close(out, _logits(llama, ids), rtol=2e-2, atol=2e-2)
