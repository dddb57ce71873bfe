"""Sibling linear layers that multiply the same input: the GEMMs a model can run as one.

A transformer block projects one hidden state several times (q, k and v; gate and up). Run as
one GEMM of N = the sum of the siblings' N, the weights stream once per call instead of once per
layer and two launches (with their ramp and tail) go away: at decode, where each GEMM is a
bandwidth-bound read of a few tens of MB, that is most of what separate layers lose. Whether it
pays also depends on what reads the outputs (see SIBLING_SETS and MLP_SIBLING_SETS).

Siblings are found by name: the children of one module whose leaf names form one of the sets
below (in that order), all ``nn.Linear`` with the same K, dtype and device, and a bias on all or
none. Names only propose a group; the runtime (tunefw/runtime/fusion.py) serves a sibling from
the group's GEMM only when it is called with the very tensor the first sibling was.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import torch

#: The sibling sets ``fuse=True`` looks for: attention's projections, Llama/Mistral/Qwen's
#: q/k/v and BERT-style query/key/value. Their outputs are split into heads (a view of the
#: fused output's columns costs those ops nothing) and k/v are small GEMMs, launch- and
#: ramp-bound at decode: fused, Llama-3-8B's q/k/v plus RoPE ran 1.24-1.28x faster at M <= 256
#: and 1.14x at 512 on an H100 (benchmarks/results/fused_views_h100.json).
SIBLING_SETS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("query", "key", "value"))

#: Siblings whose outputs meet in an elementwise product (gate/up, Mixtral-style w1/w3): grouped
#: only when asked (``fuse=SIBLING_SETS + MLP_SIBLING_SETS``). Fused, SiLU(gate) * up reads
#: column views strided by the summed N, 1.35-2.1x slower than contiguous outputs, while the
#: GEMM gains 1-3% (two large weights that already stream near the bandwidth): Llama-3-8B's
#: MLP half ran 0.88-1.00x fused (same file), and the fused model lost at prefill.
MLP_SIBLING_SETS: tuple[tuple[str, ...], ...] = (("gate_proj", "up_proj"), ("w1", "w3"))


#: A SwiGLU MLP's (gate, up, down) leaf names: down(silu(gate(x)) * up(x)) runs as
#: down(gated(x, [Wg; Wu])) with ``tunefw.patch(model, gated=True)``: one GEMM whose epilogue
#: forms the product (no strided views, no elementwise launches; tunefw/problem.py's gate).
GATED_MLP_SETS: tuple[tuple[str, str, str], ...] = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))

#: A SwiGLU MLP's (gate_up, down) leaf names where one layer computes gate and up (Phi-3): its
#: weight already is [Wg; Wu] (the output's first half the gate), so it is the gated GEMM's as is.
GATED_STACKED_SETS: tuple[tuple[str, str], ...] = (("gate_up_proj", "down_proj"),)


@dataclass(frozen=True)
class GatedMLP:
    """A module with gate, up and down projections of a SwiGLU MLP (by their names)."""

    name: str  # the MLP module's name ('' for the root)
    leaves: tuple[str, ...]  # gate, up, down; or gate_up, down (GATED_STACKED_SETS)
    N: int  # the intermediate size: gate's and up's out_features, the gated GEMM's N
    K: int  # the hidden size

    @property
    def names(self) -> list[str]:
        """The gate, up and down layers' full module names (gate_up and down when stacked)."""
        return [f"{self.name}.{leaf}" if self.name else leaf for leaf in self.leaves]

    @property
    def stacked(self) -> bool:
        """Whether one layer computes gate and up (its weight is [Wg; Wu] already)."""
        return len(self.leaves) == 2

    @property
    def gate_up(self) -> str:
        """'gate_proj+up_proj' or 'gate_up_proj': the gated layer's name under the MLP."""
        return "+".join(self.leaves[:-1])


def gated_mlps(model: torch.nn.Module) -> list[GatedMLP]:
    """Modules whose children of one GATED_MLP_SETS entry are nn.Linear, gate and up alike (shape,
    dtype, device) without bias (the gated kernels add none), or of one GATED_STACKED_SETS entry
    (gate_up twice as wide as down's K, no bias). Names only propose: tunefw.patch also checks
    that the module's own forward computes down(silu(gate(x)) * up(x))."""
    found = []
    for name, module in model.named_modules():
        children = dict(module.named_children())
        mlp = _stacked(name, children) or _separate(name, children)
        if mlp is not None:
            found.append(mlp)
    return found


def _stacked(name: str, children: dict) -> GatedMLP | None:
    for leaves in GATED_STACKED_SETS:
        gate_up, down = (children.get(leaf) for leaf in leaves)
        if isinstance(gate_up, torch.nn.Linear) and isinstance(down, torch.nn.Linear) \
                and gate_up.bias is None and down.in_features * 2 == gate_up.out_features:
            return GatedMLP(name, leaves, down.in_features, gate_up.in_features)
    return None


def _separate(name: str, children: dict) -> GatedMLP | None:
    for leaves in GATED_MLP_SETS:
        layers = [children.get(leaf) for leaf in leaves]
        if not all(isinstance(m, torch.nn.Linear) for m in layers):
            continue
        gate, up, down = layers
        if gate.weight.shape == up.weight.shape and gate.bias is None and up.bias is None \
                and gate.weight.dtype == up.weight.dtype and gate.weight.device == up.weight.device \
                and down.in_features == gate.out_features:
            return GatedMLP(name, leaves, gate.out_features, gate.in_features)
    return None


@dataclass(frozen=True)
class SiblingGroup:
    """Sibling layers of one parent, in call order: the first computes the group's GEMM."""

    parent: str  # the parent module's name ('' for the root)
    leaves: tuple[str, ...]  # the members' attribute names under the parent
    widths: tuple[int, ...]  # each member's N (out_features)
    K: int

    @property
    def names(self) -> list[str]:
        """The members' full module names."""
        return [f"{self.parent}.{leaf}" if self.parent else leaf for leaf in self.leaves]

    @property
    def N(self) -> int:
        """The fused GEMM's N: the members' N added."""
        return sum(self.widths)

    @property
    def leaf(self) -> str:
        """'q_proj+k_proj+v_proj': the fused layer's name under its parent."""
        return "+".join(self.leaves)

    @property
    def name(self) -> str:
        """The fused layer's full name, 'model.layers.0.self_attn.q_proj+k_proj+v_proj'."""
        return f"{self.parent}.{self.leaf}" if self.parent else self.leaf


def sibling_sets(fuse: bool | Iterable[Iterable[str]]) -> tuple[tuple[str, ...], ...]:
    """``fuse`` as sets of leaf names: True -> SIBLING_SETS, False -> none, else the sets given."""
    if fuse is True:
        return SIBLING_SETS
    if fuse is False or fuse is None:
        return ()
    sets = tuple(tuple(s) for s in fuse)
    for s in sets:
        if len(s) < 2 or not all(isinstance(leaf, str) and leaf for leaf in s):
            raise ValueError(f"fuse: {s!r}: expected two or more leaf names, e.g. ('q_proj', 'k_proj')")
    return sets


def sibling_groups(model: torch.nn.Module, fuse: bool | Iterable[Iterable[str]] = True) -> list[SiblingGroup]:
    """The sibling groups of ``model`` (see the module docstring), in module order; a layer is
    in one group at most, and a set of which fewer than two members qualify gives none."""
    sets = sibling_sets(fuse)
    groups: list[SiblingGroup] = []
    taken: set[int] = set()
    for parent_name, parent in model.named_modules():
        children = dict(parent.named_children())
        for leaves in sets:
            members = [(leaf, children[leaf]) for leaf in leaves if leaf in children
                       and isinstance(children[leaf], torch.nn.Linear) and id(children[leaf]) not in taken]
            if len(members) < 2:
                continue
            first = members[0][1]
            same = [(leaf, m) for leaf, m in members
                    if m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
                    and m.weight.device == first.weight.device
                    and (m.bias is None) == (first.bias is None)]
            if len(same) < 2:
                continue
            taken.update(id(m) for _, m in same)
            groups.append(SiblingGroup(parent_name, tuple(leaf for leaf, _ in same),
                                       tuple(m.out_features for _, m in same), first.in_features))
    return groups
