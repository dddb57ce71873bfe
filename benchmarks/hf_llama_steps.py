"""The model and the steps that benchmarks/hf_llama_h200.py times: a Hugging Face Llama with random
weights, a decode step over a static KV cache and a prefill step, each callable eagerly or as a
captured CUDA graph, and the timers.

A step is idempotent, so it can be replayed any number of times: it takes its inputs from static
buffers (token ids, position ids, a prepared 4-D attention mask, which transformers passes through
as it is) and, for decode, first puts the cache's write position back to the number of past tokens
(transformers 5's StaticCache keeps it in a device tensor and advances it on every update; versions
that take ``cache_position`` get it as a static buffer instead).
"""
from __future__ import annotations

import copy
import gc
import inspect
import math
import statistics
import time
from typing import Callable

import torch

# Llama-3-8B's layer sizes (its vocabulary too); HF's LlamaForCausalLM leaves q/k/v and gate/up
# unfused, so its GEMMs are q/o 4096x4096, k/v 1024x4096, gate/up 14336x4096, down 4096x14336 and
# lm_head 128256x4096.
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rope_theta=500000.0,
                 max_position_embeddings=8192)
TINY = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=1024)


def build_model(sizes: dict, layers: int, device: torch.device, seed: int = 0,
                arch: str = "llama") -> torch.nn.Module:
    """A causal LM of transformers' ``arch`` (a model_type: llama, mistral, qwen2, phi3, ...) of
    ``sizes`` with random weights in bf16 on ``device``, in eval mode (SDPA attention)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(arch, **sizes, num_hidden_layers=layers, attn_implementation="sdpa")
    if (getattr(cfg, "pad_token_id", None) or 0) >= cfg.vocab_size:  # Phi-3's 32000, past TINY's
        cfg.pad_token_id = None
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg)
    return model.to(torch.bfloat16).eval().requires_grad_(False)


def twin(model: torch.nn.Module) -> torch.nn.Module:
    """An independent copy with the same weights (the copy to patch)."""
    return copy.deepcopy(model)


class RoundedLinear(torch.nn.Module):
    """A linear layer computed in float32 from the same bf16 operands and rounded once to bf16:
    a GEMM as exact as bf16 output allows, to tell how far any other correct GEMM (cuBLAS's
    or tunefw's) moves a deep model's logits."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = None if self.bias is None else self.bias.float()
        return torch.nn.functional.linear(x.float(), self.weight.float(), b).to(x.dtype)


def rounded_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the model (same weights) whose every nn.Linear is a RoundedLinear."""
    copy_ = copy.deepcopy(model)
    for name, module in list(copy_.named_modules()):
        for child, sub in list(module.named_children()):
            if type(sub) is torch.nn.Linear:
                setattr(module, child, RoundedLinear(sub))
    return copy_


def _mask(q_pos: torch.Tensor, kv_len: int, batch: int) -> torch.Tensor:
    """(batch, 1, q, kv_len) bool: query at position p sees keys 0..p (True: attend)."""
    keys = torch.arange(kv_len, device=q_pos.device)
    return (keys[None, :] <= q_pos[:, None])[None, None].expand(batch, 1, -1, -1)


def _cache_keyword(model: torch.nn.Module) -> str:
    """The forward's name for the KV cache: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _takes_cache_position(model: torch.nn.Module) -> bool:
    return "cache_position" in inspect.signature(model.model.forward).parameters


class Prefill:
    """One prompt of ``tokens`` through the model without a cache; logits of the last token only
    (``logits_to_keep=1``, as serving does), so lm_head runs at M=1."""

    def __init__(self, model: torch.nn.Module, tokens: int, generator: torch.Generator) -> None:
        dev = next(model.parameters()).device
        self.model = model
        self.ids = torch.randint(model.config.vocab_size, (1, tokens), generator=generator,
                                 device="cpu").to(dev)
        pos = torch.arange(tokens, device=dev)
        self.pos, self.mask = pos[None], _mask(pos, tokens, 1)

    def __call__(self) -> torch.Tensor:
        return self.model(input_ids=self.ids, position_ids=self.pos, attention_mask=self.mask,
                          use_cache=False, logits_to_keep=1).logits


class Decode:
    """One new token for each of ``batch`` sequences over a static cache holding ``past`` tokens.

    The cache is filled by ``filler`` (the stock model, so a stock and a patched step read the
    same keys and values); the step then runs ``model``.
    """

    def __init__(self, model: torch.nn.Module, filler: torch.nn.Module, batch: int, past: int,
                 generator: torch.Generator) -> None:
        from transformers import StaticCache

        dev = next(model.parameters()).device
        vocab = model.config.vocab_size
        self.model, self.past = model, past
        self.cache = StaticCache(config=model.config, max_cache_len=past + 1)
        self.kw = _cache_keyword(model)
        prompt = torch.randint(vocab, (batch, past), generator=generator, device="cpu").to(dev)
        prompt_pos = torch.arange(past, device=dev)
        extra = {"cache_position": prompt_pos} if _takes_cache_position(filler) else {}
        filler(input_ids=prompt, position_ids=prompt_pos[None], use_cache=True, logits_to_keep=1,
               attention_mask=_mask(prompt_pos, past + 1, batch), **{_cache_keyword(filler): self.cache},
               **extra)
        # transformers 5's write position, one 0-d device tensor per layer (absent elsewhere)
        self.counters = [layer.cumulative_length for layer in getattr(self.cache, "layers", ())
                         if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
        self.ids = torch.randint(vocab, (batch, 1), generator=generator, device="cpu").to(dev)
        pos = torch.full((1,), past, device=dev)
        self.pos, self.mask = pos[None], _mask(pos, past + 1, batch)
        self.extra = {"cache_position": pos} if _takes_cache_position(model) else {}

    def __call__(self) -> torch.Tensor:
        for counter in self.counters:
            counter.fill_(self.past)
        return self.model(input_ids=self.ids, position_ids=self.pos, attention_mask=self.mask,
                          use_cache=True, **{self.kw: self.cache}, **self.extra).logits


class Graphed:
    """A step captured as a CUDA graph (after warm-up calls on a side stream, as torch's docs
    do); calling it replays the graph and returns the static output."""

    def __init__(self, step: Callable[[], torch.Tensor], warmup: int = 2) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = step()

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.out


def time_per_call_ms(fn: Callable[[], object], calls: int, cuda: bool) -> tuple[float, float]:
    """Milliseconds per call of ``calls`` back-to-back calls (CUDA events on a GPU, else the
    clock), and the host's milliseconds per call to enqueue them (until the last call returns,
    before waiting for the GPU): where a patched step is slower eagerly, the two say whether the
    host or the GPU pays for it."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host = (time.perf_counter() - t0) * 1e3 / calls
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / calls, host
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    wall = (time.perf_counter() - t0) * 1e3 / calls
    return wall, wall


def interleaved(stock: Callable[[], object], patched: Callable[[], object], rounds: int,
                calls: int, cuda: bool) -> dict:
    """Both timed alternately (the order flips every round), the garbage collector held off so
    a collection lands in neither's rounds: medians, spreads, paired ratios, and the host's
    enqueue time per call (``host_ms``: medians; raw in ``raw_host_ms``)."""
    times: dict[str, list[float]] = {"stock": [], "patched": []}
    hosts: dict[str, list[float]] = {"stock": [], "patched": []}
    gc.collect()
    gc.disable()
    try:
        for r in range(rounds):
            order = (("stock", stock), ("patched", patched))
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                ms, host = time_per_call_ms(fn, calls, cuda)
                times[name].append(ms)
                hosts[name].append(host)
    finally:
        gc.enable()
    ratios = [s / p for s, p in zip(times["stock"], times["patched"])]
    summary = {name: {"median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t)}
               for name, t in times.items()}
    return {**summary, "speedup": {"median": statistics.median(ratios), "min": min(ratios),
                                   "max": max(ratios)},
            "host_ms": {name: statistics.median(h) for name, h in hosts.items()},
            "rounds": rounds, "calls_per_round": calls, "raw_ms": times, "raw_host_ms": hosts}


def host_us(layer: torch.nn.Module, x: torch.Tensor, calls: int, cuda: bool) -> tuple[float, float]:
    """(enqueue, wall) microseconds per call of ``calls`` back-to-back calls with no sync between:
    enqueue is the host's time to return from the calls, wall adds the wait for the GPU."""
    t0 = time.perf_counter()
    for _ in range(calls):
        layer(x)
    t1 = time.perf_counter()
    if cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e6 / calls, (t2 - t0) * 1e6 / calls


def dearer_beyond_noise(pairs: list[list[float]], alpha: float = 0.025) -> bool:
    """Whether the second of each (stock, patched) pair of alternating repeats is dearer beyond
    chance: a one-sided sign test (under no difference each pair is a coin toss; ties count
    against "dearer"). A host this noisy (nn.Linear itself 19-51 us a call across shapes on the
    H200's host) makes a strict comparison of two medians a coin toss per shape."""
    n = len(pairs)
    wins = sum(patched > stock for stock, patched in pairs)
    tail = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2 ** n
    return n > 0 and tail <= alpha


def rel_error(patched: torch.Tensor, stock: torch.Tensor) -> dict:
    """Relative Frobenius error and the largest absolute difference, in fp32."""
    p, s = patched.float(), stock.float()
    return {"rel_err": (torch.linalg.vector_norm(p - s) / torch.linalg.vector_norm(s)).item(),
            "max_abs": (p - s).abs().max().item(), "equal": bool(torch.equal(patched, stock))}
