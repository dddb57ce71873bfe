"""Sibling layers served by one GEMM: ``tunefw.patch(model, fuse=True)``.

The members of a sibling group (tunefw/study/siblings.py: q/k/v, gate/up, ...) keep their
parameters, but their weights (and biases) become views of one buffer, stacked in call order.
The first member's call runs one ``tunefw.Linear`` over the whole buffer (N = the members' N
added: the table's fused entry) and returns its own columns; a later member called with the very
same tensor (same object, not written since) returns its columns of that output, a view whose
rows are strided by the fused N. Anything else (another input, grad to record, torch.compile
tracing, weights moved or re-assigned since) runs the member as a plain ``tunefw.Linear``:
fusion changes how a result is computed, never which. During CUDA-graph capture the group's
GEMM is captured like any other call; its buffer is only rebuilt outside a capture.
"""
from __future__ import annotations

import torch

from tunefw.runtime import guard as guard_module
from tunefw.runtime.ops import Linear, _is_compiling, gated


def _version(x: torch.Tensor) -> int | None:
    """x's in-place write counter (inference tensors keep none)."""
    return None if x.is_inference() else x._version


class FusedLinear(Linear):
    """A tunefw.Linear that is a member of a sibling group (see the module docstring)."""

    _group: "Group | None" = None  # None in a copy: the group names the original's modules
    _index: int = 0  # the member's place in the group: 0 computes the group's GEMM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        group = self._group
        y = group.serve(self._index, x) if group is not None else None
        return y if y is not None else Linear.forward(self, x)

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without its group (which names the original's modules): the
        copy's members run alone."""
        state = super().__getstate__()
        state.pop("_group", None)
        state.pop("_index", None)
        return state


def _fusable(x: torch.Tensor, params: list) -> bool:
    """Whether a fused GEMM may serve: not while torch.compile traces, nor where grad is recorded."""
    if _is_compiling():
        return False
    return not (torch.is_grad_enabled() and (x.requires_grad or any(
        p is not None and p.requires_grad for p in params)))


class Group:
    """The members of one sibling group, their shared weight buffer and the last group output."""

    def __init__(self, members: list[Linear]) -> None:
        self.members = members
        self.widths = [m.out_features for m in members]
        self.offsets = [sum(self.widths[:i]) for i in range(len(members))]
        self.linear: Linear | None = None  # the group's GEMM, over the stacked buffer
        self.pointers: list[int] = []  # each member's weight and bias address when stacked
        self.last: tuple | None = None  # (input, its version, output, members yet to take it)
        for i, member in enumerate(members):
            member.__class__ = FusedLinear
            member._group, member._index = self, i
        self.stack()

    def _addresses(self) -> list[int]:
        return [t.data_ptr() for m in self.members
                for t in (m._parameters["weight"], m._parameters["bias"]) if t is not None]

    def stack(self) -> None:
        """Copy the members' weights (and biases) into one buffer and make them views of it."""
        linear = Linear.__new__(Linear)
        torch.nn.Module.__init__(linear)
        linear.in_features, linear.out_features = self.members[0].in_features, sum(self.widths)
        for attr in ("weight", "bias"):
            parts = [m._parameters[attr] for m in self.members]
            if parts[0] is None:
                linear.register_parameter(attr, None)
                continue
            with torch.no_grad():
                buffer = torch.cat([p.detach() for p in parts])
            for part, offset, width in zip(parts, self.offsets, self.widths):
                part.data = buffer.narrow(0, offset, width)
            linear.register_parameter(attr, torch.nn.Parameter(buffer, requires_grad=False))
        self.linear, self.pointers, self.last = linear, self._addresses(), None

    def unstack(self) -> None:
        """Give every member a weight (and bias) of its own again; the group is gone after."""
        for member in self.members:
            for attr in ("weight", "bias"):
                p = member._parameters[attr]
                if p is not None:
                    p.data = p.data.clone()
            member.__dict__.pop("_group", None)
            member.__dict__.pop("_index", None)
        self.linear, self.last = None, None

    def _fusable(self, x: torch.Tensor) -> bool:
        return _fusable(x, [p for m in self.members for p in m._parameters.values()])

    def current(self, x: torch.Tensor) -> Linear | None:
        """The group's GEMM over a buffer the members' weights still are views of (stacked
        again if they were moved, cast or re-assigned since), or None during a capture then."""
        if self._addresses() != self.pointers:
            if x.is_cuda and guard_module.capturing():
                return None
            self.stack()
        return self.linear

    def serve(self, index: int, x: torch.Tensor) -> torch.Tensor | None:
        """Member ``index``'s output from the group's GEMM, or None: the member runs alone."""
        if not self._fusable(x):
            return None
        if index == 0:
            linear = self.current(x)
            if linear is None:
                return None
            y = Linear.forward(linear, x)  # no Module.__call__: no hooks on a hidden module
            self.last = (x, _version(x), y, len(self.members) - 1)
            return y.narrow(-1, 0, self.widths[0])
        last = self.last
        if last is None or last[0] is not x or last[1] != _version(x):
            return None
        self.last = None if last[3] <= 1 else (*last[:3], last[3] - 1)  # the last taker frees it
        return last[2].narrow(-1, self.offsets[index], self.widths[index])


def gated_forward(mlp: torch.nn.Module, leaves: tuple[str, ...], x: torch.Tensor) -> torch.Tensor:
    """A SwiGLU MLP's forward as down(gated(x, [Wg; Wu])) (tunefw.patch(model, gated=True); the
    leaf names of its gate, up and down layers, or of gate_up and down): gate and up are a Group
    whose buffer is the gated GEMM's weight, or gate_up's weight is; the MLP's own forward where
    they cannot serve (Group._fusable's rule)."""
    *inputs, down = (getattr(mlp, leaf) for leaf in leaves)
    if len(inputs) == 1:
        weight = inputs[0]._parameters["weight"]
        weight = weight if _fusable(x, [weight]) else None
    else:
        group = inputs[0]._group
        linear = group.current(x) if group is not None and group._fusable(x) else None
        weight = None if linear is None else linear._parameters["weight"]
    if weight is None:
        return type(mlp).forward(mlp, x)
    return down(gated(x, weight, "silu"))
