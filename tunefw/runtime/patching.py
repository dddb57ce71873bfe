"""Serve a model's linear layers by tunefw: ``tunefw.patch(model)`` and ``tunefw.unpatch(model)``.

(Named ``patching`` so that importing it never shadows the function ``tunefw.patch``.)

``patch`` turns every eligible ``nn.Linear`` into a ``tunefw.Linear`` in place, by changing the
module's class: the module object, its parameters (weight, bias, dtype, device,
requires_grad), its hooks and buffers and therefore its state_dict keys stay what they were,
and a module registered under two names (tied) is patched once. Eligible: a module whose type is
exactly ``nn.Linear`` (a subclass has its own forward: quantized and adapter layers are left
alone), with a bf16 or fp16 weight, N and K multiples of 8, whose forward is not replaced on the
instance, and that ``include`` / ``exclude`` (glob patterns on module names) allow.
``unpatch`` turns every ``tunefw.Linear`` back into a plain ``nn.Linear``, same parameters.
``fuse=True`` also groups sibling layers that take the same input (q/k/v by default:
tunefw/study/siblings.py) so that each group runs as one GEMM (tunefw/runtime/fusion.py).
``gated=True`` serves each SwiGLU MLP (tunefw/study/siblings.py's gated_mlps, whose own forward
a probe finds computing down(silu(gate(x)) * up(x))) as down(tunefw.gated(x, [Wg; Wu])): gate
and up become views of one buffer (a Phi-3 gate_up_proj is one already), the MLP's forward is
set on the instance (unpatch removes it).
"""
from __future__ import annotations

import fnmatch
import functools
from dataclasses import dataclass, field, replace
from typing import Iterable

import torch

from tunefw.problem import DTYPES
from tunefw.runtime.fusion import FusedLinear, Group, gated_forward
from tunefw.runtime.ops import Linear, set_dispatch
from tunefw.study.siblings import GatedMLP, gated_mlps, sibling_groups

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


@dataclass
class PatchReport:
    """Which layers ``patch`` swapped, which were already tunefw's, and why the others were not."""

    swapped: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # module name -> reason
    fused: list[str] = field(default_factory=list)  # 'parent.q_proj+k_proj+v_proj': one GEMM each
    gated: list[str] = field(default_factory=list)  # MLPs whose gate and up run as one gated GEMM
    ungated: dict[str, str] = field(default_factory=dict)  # MLP name -> why it was not gated

    def __str__(self) -> str:
        lines = [f"tunefw.patch: {len(self.swapped)} layer(s) swapped, {len(self.already)} already "
                 f"tunefw.Linear, {len(self.skipped)} skipped, {len(self.fused)} sibling group(s) fused"
                 + (f", {len(self.gated)} MLP(s) gated" if self.gated or self.ungated else "")]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        lines += [f"  not gated {name}: {why}" for name, why in self.ungated.items()]
        return "\n".join(lines)


def _patterns(value: str | Iterable[str] | None) -> list[str] | None:
    if value is None:
        return None
    return [value] if isinstance(value, str) else list(value)


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def why_not(module: torch.nn.Module) -> str | None:
    """Why ``module`` cannot be served as a tunefw.Linear, or None when it can."""
    if type(module) is not torch.nn.Linear:
        return f"{type(module).__name__} is a subclass of nn.Linear with its own forward"
    if "forward" in vars(module):
        return "its forward is replaced on the instance (a hook wraps it)"
    dtype = module.weight.dtype
    if _DTYPES.get(dtype) not in DTYPES:
        return f"dtype {str(dtype).removeprefix('torch.')} (tunefw kernels are bf16 or fp16)"
    bad = [f"{f}={v}" for f, v in (("N", module.out_features), ("K", module.in_features)) if v % 8]
    if bad:
        return f"{' and '.join(bad)} not a multiple of 8"
    return None


def patch(model: torch.nn.Module, dispatcher=None, *, include: str | Iterable[str] | None = None,
          exclude: str | Iterable[str] | None = None,
          fuse: bool | Iterable[Iterable[str]] = False, gated: bool = False) -> PatchReport:
    """Swap every eligible nn.Linear of ``model`` for tunefw.Linear in place; see the module doc.

    ``dispatcher``: a Dispatcher, a DispatchTable or a dispatch.json path made the process-wide
    one (tunefw::gemm serves one table per process); None keeps the current one.
    ``include`` / ``exclude``: glob patterns on module names (``"*.mlp.*"``, ``"lm_head"``).
    ``fuse``: True (the sibling sets of tunefw/study/siblings.py) or sets of leaf names, e.g.
    ``[("q_proj", "k_proj", "v_proj")]``: each group of swapped siblings runs as one GEMM.
    ``gated``: each SwiGLU MLP whose gate and up were swapped runs them as one gated GEMM.
    """
    if dispatcher is not None:
        set_dispatch(dispatcher)
    include_p, exclude_p = _patterns(include), _patterns(exclude)
    report = PatchReport()
    mlps = _probed(model, report) if gated else []  # before the swap: the probe runs stock layers
    seen: set[int] = set()
    for name, module in model.named_modules():  # a module registered twice is visited once
        if not isinstance(module, torch.nn.Linear) or id(module) in seen:
            continue
        seen.add(id(module))
        if type(module) in (Linear, FusedLinear):
            report.already.append(name)
            continue
        if include_p is not None and not _matches(name, include_p):
            report.skipped[name] = "not included"
            continue
        if exclude_p and _matches(name, exclude_p):
            report.skipped[name] = "excluded"
            continue
        reason = why_not(module)
        if reason:
            report.skipped[name] = reason
            continue
        module.__class__ = Linear  # same object: parameters, hooks, state_dict keys unchanged
        report.swapped.append(name)
    for mlp in mlps:  # gated before the siblings: gate and up are then taken
        _gate(model, mlp, report)
    if fuse:
        report.fused = _fuse(model, fuse)
    return report


def _probed(model: torch.nn.Module, report: PatchReport) -> list[GatedMLP]:
    """The gated MLP candidates whose own forward computes down(silu(gate(x)) * up(x)) on a
    probe of two random rows (relative error <= 1e-2); the others' reasons in the report."""
    agreeing = []
    for mlp in gated_mlps(model):
        module = model.get_submodule(mlp.name)
        if is_gated(module):  # patched before: nothing to probe or to do
            report.gated.append(mlp.name)
            continue
        *inputs, down = (getattr(module, leaf) for leaf in mlp.leaves)
        w = inputs[0].weight
        if w.is_meta:
            report.ungated[mlp.name] = "weights on the meta device: its forward cannot be probed"
            continue
        gen = torch.Generator(device=w.device).manual_seed(0)
        x = torch.randn(2, mlp.K, generator=gen, device=w.device).to(w.dtype)
        with torch.no_grad():
            own = type(module).forward(module, x).float()
            g, u = (torch.nn.functional.linear(x, inputs[0].weight).chunk(2, -1) if mlp.stacked
                    else (torch.nn.functional.linear(x, p.weight) for p in inputs))
            mine = torch.nn.functional.linear(torch.nn.functional.silu(g) * u, down.weight,
                                              down.bias).float()
        err = float((own - mine).norm() / mine.norm().clamp_min(1e-30))
        if err <= 1e-2:
            agreeing.append(mlp)
        else:
            report.ungated[mlp.name] = (f"its forward is not down(silu(gate(x)) * up(x)) "
                                        f"(a probe differs by {err:.2g})")
    return agreeing


def gated_leaves(module: torch.nn.Module) -> tuple[str, ...] | None:
    """The leaf names (gate, up, down; or gate_up, down) by which tunefw.patch(gated=True) serves
    ``module`` through the gated GEMM, or None where it does not."""
    own = vars(module).get("forward")
    return own.args[1] if isinstance(own, functools.partial) and own.func is gated_forward else None


def is_gated(module: torch.nn.Module) -> bool:
    """Whether ``module`` is an MLP tunefw.patch(gated=True) serves by the gated GEMM."""
    return gated_leaves(module) is not None


def _gate(model: torch.nn.Module, mlp: GatedMLP, report: PatchReport) -> None:
    """Serve one probed MLP by the gated GEMM, where its three layers were all swapped."""
    module = model.get_submodule(mlp.name)
    layers = [getattr(module, leaf) for leaf in mlp.leaves]
    if not all(type(m) is Linear and not m._forward_hooks and not m._forward_pre_hooks
               for m in layers) or "forward" in vars(module):
        report.ungated[mlp.name] = ("its gate, up and down are not all plain swapped layers (or "
                                    "its forward is replaced on the instance)")
        return
    if not mlp.stacked:  # gate and up become views of one [Wg; Wu] buffer
        Group(layers[:2])
    module.forward = functools.partial(gated_forward, module, mlp.leaves)
    report.gated.append(mlp.name)


def _fuse(model: torch.nn.Module, fuse: bool | Iterable[Iterable[str]]) -> list[str]:
    """Group the plain tunefw.Linear siblings of ``model``; the names of the groups made."""
    made = []
    for group in sibling_groups(model, fuse):
        parent = model.get_submodule(group.parent)
        kept = [(leaf, m) for leaf in group.leaves for m in [getattr(parent, leaf)]
                if type(m) is Linear and not m._forward_hooks
                and not m._forward_pre_hooks]  # a hooked member must see its own call
        if len(kept) >= 2:
            Group([m for _, m in kept])
            made.append(replace(group, leaves=tuple(leaf for leaf, _ in kept)).name)
    return made


def unpatch(model: torch.nn.Module) -> list[str]:
    """Turn every tunefw.Linear of ``model`` back into a plain nn.Linear; returns their names."""
    restored = []
    for name, module in model.named_modules():
        if is_gated(module):
            del module.forward  # the class's own forward again
        if type(module) is FusedLinear and "_group" in vars(module):
            module._group.unstack()  # every member of the group gets its own weight again
        if type(module) in (Linear, FusedLinear):
            module.__class__ = torch.nn.Linear
            for memo in ("_cublas", "_fast"):  # tunefw.Linear's routes: a plain module pickles
                module.__dict__.pop(memo, None)
            restored.append(name)
    return restored

