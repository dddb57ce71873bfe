"""``tunefw.patch(model, fuse=True, gated=True)`` on transformers architectures beside Llama (CPU):
biased q/k/v (Qwen2, OPT), GeGLU MLPs (Gemma: not gated), projections a model fuses itself (Phi-3),
GPT-2's Conv1D blocks (not nn.Linear: only lm_head). Each keeps its logits, and unpatch its keys."""
from __future__ import annotations

import pytest
import torch

import tunefw

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefw[hf]')")
pytestmark = pytest.mark.usefixtures("no_table")

SMALL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)
QKV = [f"model.layers.{i}.self_attn.q_proj+k_proj+v_proj" for i in range(2)]
MLPS = [f"model.layers.{i}.mlp" for i in range(2)]
# architecture -> (config, model class, config kwargs, swapped, fused groups, gated MLPs, not gated)
ARCHS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", SMALL, 15, QKV, MLPS, []),
    "mistral": ("MistralConfig", "MistralForCausalLM", SMALL, 15, QKV, MLPS, []),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(SMALL, head_dim=16), 15, QKV, [], MLPS),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(SMALL, pad_token_id=0), 9, [], MLPS, []),
    "opt": ("OPTConfig", "OPTForCausalLM",
            dict(vocab_size=256, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                 num_attention_heads=4, word_embed_proj_dim=64), 13,
            [f"model.decoder.layers.{i}.self_attn.q_proj+k_proj+v_proj" for i in range(2)], [], []),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", dict(vocab_size=256, n_embd=64, n_layer=2, n_head=4),
             1, [], [], []),
}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_patch_fuses_and_gates_what_each_architecture_has(arch):
    config, cls, kwargs, swapped, fused, gated, ungated = ARCHS[arch]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(getattr(transformers, config)(**kwargs))
    model = model.to(torch.bfloat16).eval()
    ids = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    keys = list(model.state_dict())
    report = tunefw.patch(model, fuse=True, gated=True)
    assert (len(report.swapped), report.fused, report.gated) == (swapped, fused, gated)
    assert sorted(report.ungated) == ungated and report.skipped == {}
    assert all(why.startswith("its forward is not down(silu(gate(x)) * up(x))")
               for why in report.ungated.values())
    assert all(isinstance(model.get_submodule(n), tunefw.Linear) for n in report.swapped)
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert _rel(after, before) < 1e-2  # bf16: fused/gated products round once, not per layer
    assert tunefw.unpatch(model) == report.swapped
    assert list(model.state_dict()) == keys
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)


def _phi3():
    torch.manual_seed(0)
    cfg = transformers.Phi3Config(**dict(SMALL, pad_token_id=0))
    return transformers.Phi3ForCausalLM(cfg).to(torch.bfloat16).eval()


def test_a_phi3_gate_up_proj_is_the_gated_weight_as_it_is(monkeypatch):
    from tunefw.runtime import fusion

    model = _phi3()
    mlp = model.get_submodule(MLPS[0])
    weight = mlp.gate_up_proj.weight
    ids = torch.randint(0, 256, (2, 5))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    assert tunefw.patch(model, gated=True).gated == MLPS
    calls, real = [], fusion.gated
    monkeypatch.setattr(fusion, "gated", lambda x, w, g: calls.append((w, g)) or real(x, w, g))
    with torch.no_grad():
        after = model(input_ids=ids).logits
    assert len(calls) == 2 and calls[0][0] is weight and calls[0][1] == "silu"  # no copy, no stack
    assert _rel(after, before) < 1e-2
    model.requires_grad_(True)
    model(input_ids=ids)  # grad to record: the MLP's own forward, as a sibling group's rule
    assert len(calls) == 2
    tunefw.unpatch(model)
    assert "forward" not in vars(mlp) and mlp.gate_up_proj.weight is weight


def test_a_phi3_study_tunes_its_gate_up_proj_as_one_gated_layer():
    from tunefw.study.model_shapes import collect_linears

    shapes = {(s.N, s.K, s.gate): s.names for s in collect_linears(_phi3(), gated=True)}
    assert shapes[(128, 64, "silu")] == [f"{m}.gate_up_proj" for m in MLPS]
    plain = [n for (_, _, gate), names in shapes.items() if gate == "none" for n in names]
    assert not [n for n in plain if "gate_up" in n]  # not also tuned as a plain GEMM
    assert shapes[(64, 128, "none")] == [f"{m}.down_proj" for m in MLPS]
