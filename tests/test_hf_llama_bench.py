"""benchmarks/hf_llama_h200.py's steps on CPU: the decode step over the static cache computes what
a full forward computes and can be replayed (a captured graph replays it), and the route counts."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefw[hf]')")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import hf_llama_h200 as bench  # noqa: E402
from hf_llama_steps import TINY, Decode, Prefill, build_model, twin  # noqa: E402

import tunefw  # noqa: E402
from tunefw.runtime import ops  # noqa: E402

VOCAB = TINY["vocab_size"]


@pytest.fixture(scope="module")
def model():
    # fp32 and a wide init: attention is sharp, so a wrong position or mask shows in the logits
    return build_model({**TINY, "initializer_range": 0.2}, 2, torch.device("cpu")).float()


def _rel(x, ref):
    return (torch.linalg.vector_norm(x - ref) / torch.linalg.vector_norm(ref)).item()


def test_decode_step_matches_a_full_forward_and_replays_identically(model):
    with torch.no_grad():
        step = Decode(model, model, 2, 8, torch.Generator().manual_seed(3))
        first, second = step(), step()
        gen = torch.Generator().manual_seed(3)  # the prompt, then the new token, as Decode draws them
        prompt = torch.randint(VOCAB, (2, 8), generator=gen)
        token = torch.randint(VOCAB, (2, 1), generator=gen)
        ref = model(input_ids=torch.cat([prompt, token], 1), use_cache=False).logits[:, -1:]
    assert torch.equal(step.ids, token) and first.shape == (2, 1, VOCAB)
    assert _rel(first, ref) < 1e-4
    assert torch.equal(first, second)  # the write position was put back: same slot, same result
    assert [int(c) for c in step.counters] == [9, 9]
    with torch.no_grad():
        step.pos.fill_(9)  # a wrong position is visible (the test can tell)
        assert _rel(step(), ref) > 0.1


def test_prefill_step_gives_the_last_tokens_logits(model):
    with torch.no_grad():
        step = Prefill(model, 12, torch.Generator().manual_seed(5))
        ref = model(input_ids=step.ids, use_cache=False).logits[:, -1:]
        got = step()
    assert got.shape == (1, 1, VOCAB) and _rel(got, ref) < 1e-4


def _patched_routes(model, **how):
    """A bf16 twin of ``model`` patched ``how`` with the decode table: the twin, the patch's
    report, the route counts of a 6-token prefill and the dispatcher (the process's restored)."""
    saved = dict(ops._state)
    try:
        patched = twin(model).to(torch.bfloat16)
        dispatcher = tunefw.Dispatcher(REPO / "benchmarks/results/dispatch_decode_h200.json")
        report = tunefw.patch(patched, dispatcher, **how)
        with torch.no_grad():
            got = bench.routes(Prefill(patched, 6, torch.Generator().manual_seed(1)), patched, dispatcher)
    finally:
        ops._state.clear()
        ops._state.update(saved)
    return patched, report, got, dispatcher


def test_route_counts_name_every_gemm_of_a_step(model):
    _, report, got, dispatcher = _patched_routes(model)
    assert len(report.swapped) == 15
    per = got["per_shape"]
    assert {k: v["calls"] for k, v in per.items()} == {
        "6x256x256": 4, "6x128x256": 4, "6x512x256": 4, "6x256x512": 2, "1x1024x256": 1}
    assert sum(got["calls_by_path"].values()) == sum(got["calls_by_family"].values()) == 15
    for key, v in per.items():  # the table's own answer for each shape, on its GPU
        M, N, K = map(int, key.split("x"))
        route = dispatcher.preview(M, N, K)
        assert (v["path"], v["family"]) == (route.path, route.entry.family if route.entry else "cublas")


def test_route_counts_of_a_fused_patch_count_each_groups_gemm_once(model):
    patched, report, got, _ = _patched_routes(model, fuse=True)
    assert len(report.fused) == 2
    # per layer q+k+v (256+128+128) one GEMM: k and v ride along (gate and up: 512 wide too)
    assert {k: v["calls"] for k, v in got["per_shape"].items()} == {
        "6x512x256": 6, "6x256x256": 2, "6x256x512": 2, "1x1024x256": 1}
    assert got["members_served_by_their_group"] == 4
    # the host-cost calls: one layer of each shape not in a group, each distinct group whole
    assert bench.call_units(model, patched) == [
        (256, 256, ["model.layers.0.self_attn.o_proj"]), (512, 256, ["model.layers.0.mlp.gate_proj"]),
        (256, 512, ["model.layers.0.mlp.down_proj"]), (1024, 256, ["lm_head"]),
        (512, 256, [f"model.layers.0.self_attn.{x}_proj" for x in "qkv"])]


def test_route_counts_of_a_gated_patch_count_each_mlps_gated_gemm(model):
    patched, report, got, _ = _patched_routes(model, gated=True)
    assert len(report.gated) == 2
    per = got["per_shape"]  # gate and up run no GEMM of their own: the MLP's gated one instead
    assert {k: v["calls"] for k, v in per.items()} == {
        "6x256x256": 4, "6x128x256": 4, "6x512x256:silu": 2, "6x256x512": 2, "1x1024x256": 1}
    assert per["6x512x256:silu"]["family"] == "stock"  # the table has no gated entry
    assert bench.call_units(model, patched) == [  # a gated MLP is one call: the whole MLP
        (256, 256, ["model.layers.0.self_attn.q_proj"]), (128, 256, ["model.layers.0.self_attn.k_proj"]),
        (256, 512, ["model.layers.0.mlp.down_proj"]), (1024, 256, ["lm_head"]),
        (512, 256, ["model.layers.0.mlp"])]


def test_route_counts_of_a_gated_phi3_count_its_gate_up_proj_as_the_gated_gemm():
    phi3 = build_model({**TINY, "initializer_range": 0.2}, 2, torch.device("cpu"), arch="phi3").float()
    patched, report, got, _ = _patched_routes(phi3, gated=True)
    assert type(phi3).__name__ == "Phi3ForCausalLM" and len(report.gated) == 2
    per = got["per_shape"]  # q/k/v one layer of 512 (Phi-3's own); gate_up no plain GEMM
    assert {k: v["calls"] for k, v in per.items()} == {
        "6x512x256": 2, "6x256x256": 2, "6x512x256:silu": 2, "6x256x512": 2, "1x1024x256": 1}
    assert bench.call_units(phi3, patched) == [
        (256, 256, ["model.layers.0.self_attn.o_proj"]),  # Phi3Attention registers o_proj first
        (512, 256, ["model.layers.0.self_attn.qkv_proj"]),
        (1024, 256, ["lm_head"]),  # gate_up_proj's shape too: the gated MLP runs it, not a call
        (256, 512, ["model.layers.0.mlp.down_proj"]), (512, 256, ["model.layers.0.mlp"])]


def test_rounds_hold_the_same_work_at_any_depth_and_host_cost_covers_every_case_input():
    assert [bench.calls_per_round("decode", 1, n) for n in (2, 8, 32)] == [20, 5, 1]
    assert [bench.calls_per_round("prefill", 512, n) for n in (2, 32)] == [8, 1]
    assert bench.host_inputs(False) == [(1, 1), (16, 1), (64, 1), (1, 512), (1, 2048)]


def test_interleaved_rounds_keep_each_sides_host_time_beside_its_time(monkeypatch):
    """On a CPU the host's time is the time; each side's step runs ``calls`` times a round,
    and the paired ratio and host medians come from the same rounds (a fake clock: each
    stock call takes 2 ms, each patched call 1 ms)."""
    import hf_llama_steps

    clock = [0.0]
    monkeypatch.setattr(hf_llama_steps.time, "perf_counter", lambda: clock[0])
    ran = {"stock": 0, "patched": 0}

    def step(name: str, seconds: float):
        def run() -> None:
            ran[name] += 1
            clock[0] += seconds
        return run

    got = hf_llama_steps.interleaved(step("stock", 0.002), step("patched", 0.001), rounds=4,
                                     calls=3, cuda=False)
    assert ran == {"stock": 12, "patched": 12}
    assert got["raw_host_ms"] == got["raw_ms"] and len(got["raw_ms"]["patched"]) == 4
    assert got["host_ms"] == pytest.approx({"stock": 2.0, "patched": 1.0})
    assert got["speedup"]["median"] == pytest.approx(2.0)


def test_the_rounded_twin_is_each_linear_in_float32_rounded_once(model):
    from hf_llama_steps import RoundedLinear, rounded_twin

    bf16 = twin(model).to(torch.bfloat16)
    exact = rounded_twin(bf16)
    linears = [m for m in exact.modules() if isinstance(m, torch.nn.Linear)]
    assert linears == [] and sum(isinstance(m, RoundedLinear) for m in exact.modules()) == 15
    x = torch.randn(3, TINY["hidden_size"], generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    q = exact.model.layers[0].self_attn.q_proj
    y = q(x)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, torch.nn.functional.linear(x.float(), q.weight.float()).to(torch.bfloat16))
    exact_y = x.double() @ q.weight.double().t()  # within a bf16 unit of the exact product
    assert ((y.double() - exact_y).abs() <= exact_y.abs() * 2.0 ** -8 + 1e-30).all()


def _case(name, eager, graph=None, err=1e-3):
    case = {"case": name, "eager": {"speedup": {"median": eager}, "logits": {"rel_err": err},
                                    "logits_vs_rounded": {"stock": {"rel_err": 0.02},
                                                          "patched": {"rel_err": 0.03}}}}
    if graph is not None:
        case["graph"] = {"speedup": {"median": graph}, "logits": {"rel_err": err}}
    return case


def test_the_summary_judges_each_bar_and_names_what_misses_it():
    report = {"cases": [_case("decode b=1", 1.05, 1.12), _case("decode b=16", 0.99, 1.09, 0.02),
                        _case("prefill 512", 1.00, 1.03), {"case": "prefill 2048",
                                                           "eager": {"skipped": "time budget"}}],
              "host_cost": {"1x8x8": {"nn.Linear": {"enqueue_us": 20.0},
                                      "tunefw.Linear": {"enqueue_us": 15.0}},
                            "64x8x8": {"nn.Linear": {"enqueue_us": 20.0},
                                       "tunefw.Linear": {"enqueue_us": 22.0}}}}
    s = bench.summarize(report)
    assert (s["eager_never_slower"]["ok"], s["eager_never_slower"]["below"]) == (False, ["decode b=16"])
    assert s["eager_never_slower"]["copy_vs_stock"] == {}  # no A/A run: nothing beside the bar
    report["cases"][1]["eager_aa"] = {"speedup": {"median": 1.02}}
    assert bench.summarize(report)["eager_never_slower"]["copy_vs_stock"] == {"decode b=16": 1.02}
    assert (s["graph_decode"]["ok"], s["graph_decode"]["below"]) == (False, ["decode b=16"])
    assert s["graph_prefill"]["ok"] and s["graph_prefill"]["cases"] == {"prefill 512": 1.03}
    assert not s["logits"]["ok"] and s["logits"]["rel_err"]["decode b=16 graph"] == 0.02
    assert s["logits"]["vs_rounded_twin"]["decode b=1"] == {"stock": 0.02, "patched": 0.03}
    assert (s["host_cost"]["ok"], s["host_cost"]["dearer"]) == (False, ["64x8x8"])
    assert s["all"] is False
    # with each repeat's pair recorded, a median that is dearer by chance is not a verdict
    noisy = [[20.0, 22.0], [21.0, 19.0], [19.5, 20.5], [22.0, 21.0], [20.0, 20.5]] * 3
    report["host_cost"]["64x8x8"]["enqueue_pairs_us"] = noisy
    s = bench.summarize(report)
    assert s["host_cost"]["dearer"] == [] and s["host_cost"]["dearer_by_median"] == ["64x8x8"]
    report["host_cost"]["64x8x8"]["enqueue_pairs_us"] = [[20.0, 20.4]] * 12 + [[20.0, 19.9]] * 3
    assert bench.summarize(report)["host_cost"]["dearer"] == ["64x8x8"]
    # with the check at the depth the bar is judged there, the deep errors kept beside
    report["logits_at_depth"] = {
        "layers": 2, "rel_err": {"decode b=1": 0.004, "decode b=16": 0.006},
        "vs_rounded_twin": {"decode b=1": {"stock": 0.003, "patched": 0.004}}}
    logits = bench.summarize(report)["logits"]
    assert logits["ok"] and logits["judged_at_layers"] == 2
    assert logits["rel_err"] == {"decode b=1": 0.004, "decode b=16": 0.006}
    assert logits["deep_rel_err"]["decode b=16 graph"] == 0.02
    assert logits["deep_vs_rounded_twin"]["decode b=1"] == {"stock": 0.02, "patched": 0.03}
    report["logits_at_depth"]["rel_err"]["prefill 512"] = 0.011
    assert not bench.summarize(report)["logits"]["ok"]
