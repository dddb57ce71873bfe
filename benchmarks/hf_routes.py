"""Which GEMMs a patched Hugging Face model runs, and by which route: benchmarks/hf_llama_h200.py's
route counts (each GEMM of a step, a fused group's once, a gated MLP's under its gated shape) and
its host-cost call units (one call per distinct layer, group or gated MLP)."""
from __future__ import annotations

from collections import Counter

import torch

import tunefw
from tunefw.runtime.patching import gated_leaves, is_gated


def linear_shapes(model: torch.nn.Module) -> dict[tuple[int, int], list[str]]:
    """(N, K) -> the names of the model's linear layers of that shape."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            shapes.setdefault((m.out_features, m.in_features), []).append(name)
    return shapes


def gated_mlps(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The MLPs tunefw.patch(gated=True) serves by one gated GEMM (their forward is its own)."""
    return {name: m for name, m in model.named_modules() if is_gated(m)}


def gated_nk(mlp: torch.nn.Module) -> tuple[int, int]:
    """A gated MLP's gated GEMM (N, K): its down layer's (in, out), whatever its leaves' names
    (gate_proj/up_proj, w1/w3, Phi-3's gate_up_proj: the last of the leaves patch set is down)."""
    down = getattr(mlp, gated_leaves(mlp)[-1])
    return down.in_features, down.out_features


def routes(step, model: torch.nn.Module, dispatcher) -> dict:
    """Run ``step`` once eagerly, recording each GEMM the tunefw layers run; per GEMM shape: the
    calls and the route the dispatcher gives those very operands (on CPU: its preview for the
    table's GPU). A fused group's GEMM counts once, under its summed N; a member served from it
    runs none (``from_group``); a gated MLP's GEMM counts under 'MxNxK:silu'."""
    seen: Counter = Counter()
    served: dict[str, dict] = {}
    from_group: Counter = Counter()

    def hook(module, inputs):
        group = getattr(module, "_group", None)
        if group is not None and module._index:
            last = group.last
            if last is not None and last[0] is inputs[0]:
                from_group[type(module).__name__] += 1
                return
        elif group is not None:
            module = group.linear  # the leader runs the group's GEMM
        x = inputs[0].reshape(-1, inputs[0].shape[-1])
        key = f"{x.shape[0]}x{module.out_features}x{module.in_features}"
        seen[key] += 1
        if key not in served:
            r = (dispatcher.route_for(x, module.weight) if x.is_cuda
                 else dispatcher.preview(x.shape[0], module.out_features, module.in_features, x.dtype))
            served[key] = _served(r)

    def gated_hook(mlp, inputs):
        x = inputs[0].reshape(-1, inputs[0].shape[-1])
        shape = (x.shape[0], *gated_nk(mlp))
        key = "{}x{}x{}:silu".format(*shape)
        seen[key] += 1
        if key not in served:
            r = (dispatcher.route(*shape, x.dtype, x.get_device(), gate="silu") if x.is_cuda
                 else dispatcher.preview(*shape, x.dtype, gate="silu"))
            served[key] = _served(r, ":silu")
    handles = [m.register_forward_pre_hook(hook) for m in model.modules()
               if isinstance(m, tunefw.Linear)]
    handles += [m.register_forward_pre_hook(gated_hook) for m in gated_mlps(model).values()]
    try:
        step()
    finally:
        for h in handles:
            h.remove()
    per_shape = {k: {"calls": n, **served[k]} for k, n in seen.items()}
    return {"per_shape": per_shape, "calls_by_path": _count(per_shape, "path"),
            "calls_by_family": _count(per_shape, "family"),
            "members_served_by_their_group": sum(from_group.values())}


def _served(r, gated: str = "") -> dict:
    """A route as the route counts record it (``gated``: ':silu'; its fallback is the stock
    form, not one cuBLAS GEMM)."""
    e = r.entry
    return {"path": r.path, "rule": r.rule,
            "family": e.family if e is not None else "stock" if gated else "cublas",
            "entry": f"{e.M}x{e.N}x{e.K}{gated}" if e is not None else None, "reason": r.reason}


def _count(per_shape: dict, field: str) -> dict[str, int]:
    counts: Counter = Counter()
    for v in per_shape.values():
        counts[v[field]] += v["calls"]
    return dict(counts)


def call_units(stock: torch.nn.Module, patched: torch.nn.Module) -> list[tuple[int, int, list[str]]]:
    """(N, K, layers) per host-cost call on one input: one layer of each (N, K), or, where the
    patched model fuses siblings, each distinct group's layers in call order under their summed
    N (its first member alone runs the group's GEMM: not one layer's call). A gated MLP's gate
    and up are no call of their own: the MLP is (its gated GEMM, SiLU and product, down), one
    per distinct shape under the gated GEMM's N, against the stock MLP's five calls."""
    names = {id(m): n for n, m in patched.named_modules()}
    mlps = gated_mlps(patched)
    gate_ups = {name: [getattr(m, leaf) for leaf in gated_leaves(m)[:-1]] for name, m in mlps.items()}
    gated = {id(layers[0]._group) for layers in gate_ups.values()  # not timed here
             if getattr(layers[0], "_group", None) is not None}
    groups = {id(m._group): [names[id(x)] for x in m._group.members]
              for m in patched.modules() if getattr(m, "_group", None) is not None}
    grouped = {n for g in groups.values() for n in g} | {  # and a gate_up the gated GEMM runs
        names[id(layer)] for layers in gate_ups.values() for layer in layers}
    groups = {k: g for k, g in groups.items() if k not in gated}
    units = [(n, k, alone[:1]) for (n, k), layers in linear_shapes(stock).items()
             for alone in [[x for x in layers if x not in grouped]] if alone]
    seen = set()
    for g in groups.values():
        layers = [stock.get_submodule(x) for x in g]
        key = (tuple(x.rsplit(".", 1)[-1] for x in g), tuple(m.out_features for m in layers),
               layers[0].in_features)
        if key not in seen:
            seen.add(key)
            units.append((sum(key[1]), key[2], g))
    by_shape: dict[tuple[int, int], str] = {}
    for name, mlp in mlps.items():
        by_shape.setdefault(gated_nk(mlp), name)
    return units + [(n, k, [name]) for (n, k), name in by_shape.items()]
