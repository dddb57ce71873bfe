"""The tunefw::gemm op and tunefw.Linear's paths (CPU): compile, autograd, the eager fast path."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tunefw
from tunefw.runtime import ops


class Recording:
    """A dispatcher that records its calls and returns a + 1 @ b.T (so a call is visible);
    with ``cublas`` set, its plans route every shape to cuBLAS."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.resolved: list[tuple] = []
        self.cublas = False

    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        self.calls.append((tuple(a.shape), tuple(b.shape), a.device.type))
        return torch.matmul(a, b.t()) + 1

    def plan(self, a: torch.Tensor, b: torch.Tensor, lead=None) -> torch.Tensor:
        """A plan as tunefw.Linear calls it: ``a`` as given, C shaped ``lead`` + (N,)."""
        self.calls.append((tuple(a.shape), tuple(b.shape), a.device.type, lead))
        c = torch.matmul(a.reshape(-1, a.shape[-1]), b.t()) + 1
        return c if lead is None else c.reshape(*lead, b.shape[0])

    def plan_for(self, a: torch.Tensor, b: torch.Tensor):
        self.resolved.append(tuple(a.shape))
        return None if self.cublas else self.plan

    def known_plan(self, x: torch.Tensor, b: torch.Tensor):
        return False  # nothing cached: every call resolves (plan_for sees the 2-D shape)


@pytest.fixture
def python_path(monkeypatch):
    """The compiled call path off (as TUNEFW_FASTPATH=0 leaves it): the Python memo serves."""
    from tunefw.runtime import fastpath
    monkeypatch.setattr(fastpath, "_state", {"module": None, "tried": True})


@pytest.fixture
def recording():
    saved = dict(ops._state)
    fake = Recording()
    ops._state.update(dispatcher=fake, env_read=True)
    yield fake
    ops._state.clear()
    ops._state.update(saved)


def test_op_is_a_plain_library_op_with_fake_and_autograd(recording):
    ops._state["dispatcher"] = None
    op = torch.ops.tunefw.gemm.default
    assert str(op._schema) == "tunefw::gemm(Tensor a, Tensor b) -> Tensor"
    torch.library.opcheck(op, (torch.randn(5, 16, requires_grad=True), torch.randn(24, 16, requires_grad=True)))


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_op_under_compile_appears_in_the_graph_and_matches(recording, backend):
    seen = []

    def capture(gm, example_inputs):
        seen.extend(n.target for n in gm.graph.nodes)
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    a, b = torch.randn(6, 32), torch.randn(16, 32)
    compiled = torch.compile(lambda a, b: tunefw.gemm(a, b) * 2, backend=capture, fullgraph=True)
    assert torch.equal(compiled(a, b), (torch.matmul(a, b.t()) + 1) * 2)  # the dispatcher served it
    assert torch.ops.tunefw.gemm.default in seen
    torch._dynamo.reset()


def test_op_gradients_match_f_linear(recording):
    ops._state["dispatcher"] = None  # torch.matmul values, so F.linear is the reference
    torch.manual_seed(0)
    a = torch.randn(2, 3, 16, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
    out = tunefw.gemm(a, b)
    ga, gb = torch.autograd.grad((out * out).sum(), (a, b))
    ref = F.linear(a, b)
    ra, rb = torch.autograd.grad((ref * ref).sum(), (a, b))
    assert torch.allclose(out, ref) and torch.allclose(ga, ra) and torch.allclose(gb, rb)
    assert torch.autograd.gradcheck(tunefw.gemm, (a[:1, :2], b[:3]))


def test_compiled_linear_backward_matches_f_linear(recording):
    ops._state["dispatcher"] = None
    torch.manual_seed(0)
    ref = torch.nn.Linear(16, 8, dtype=torch.float64)
    mine = tunefw.Linear.from_linear(ref)
    x = torch.randn(4, 16, dtype=torch.float64, requires_grad=True)
    y = torch.compile(mine, backend="aot_eager")(x)
    gx, gw, gb = torch.autograd.grad(y.square().sum(), (x, ref.weight, ref.bias))
    y_ref = ref(x)
    rx, rw, rb = torch.autograd.grad(y_ref.square().sum(), (x, ref.weight, ref.bias))
    assert torch.allclose(y, y_ref) and torch.allclose(gx, rx)
    assert torch.allclose(gw, rw) and torch.allclose(gb, rb)
    torch._dynamo.reset()


def test_eager_cpu_linear_is_f_linear_and_skips_the_dispatcher(recording):
    torch.manual_seed(0)
    ref = torch.nn.Linear(16, 8, dtype=torch.bfloat16)
    mine = tunefw.Linear.from_linear(ref)
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    assert torch.equal(mine(x), ref(x)) and recording.calls == []
    with torch.no_grad():
        assert torch.equal(tunefw.gemm(x[0], ref.weight), torch.matmul(x[0], ref.weight.t()) + 1)
    assert recording.calls == [((5, 16), (8, 16), "cpu")]  # tunefw.gemm itself asks the dispatcher


def test_non_cpu_linear_goes_straight_to_the_dispatcher_without_grad(recording):
    # The meta device stands in for CUDA: not CPU, so the dispatcher path; nothing computes.
    mine = tunefw.Linear(16, 8, device="meta")
    x = torch.empty(2, 3, 16, device="meta")
    with torch.no_grad():
        y = mine(x)
    assert (y.shape, y.device.type) == ((2, 3, 8), "meta")
    assert recording.resolved == [(6, 16)]  # the route is resolved on the flattened rows
    # one kernel call on x as it is, C made in x's leading shape: no reshape either side
    assert recording.calls == [((2, 3, 16), (8, 16), "meta", (2, 3))]
    with torch.no_grad():
        assert mine(x[0]).shape == (3, 8) and mine(x[0, 0]).shape == (8,)
    assert recording.calls[1:] == [((3, 16), (8, 16), "meta", None), ((16,), (8, 16), "meta", ())]
    y = mine(x)  # the weight requires grad: the op (its Meta kernel), not the dispatcher
    assert y.shape == (2, 3, 8) and y.requires_grad and len(recording.calls) == 3


def test_a_cublas_route_is_nn_linears_own_call_with_the_bias_fused(recording, monkeypatch):
    recording.cublas = True
    linear_calls = []
    monkeypatch.setattr(ops, "_linear", lambda x, w, b: linear_calls.append((x.shape, b)) or
                        torch.empty(*x.shape[:-1], w.shape[0], device=x.device))
    mine = tunefw.Linear(16, 8, device="meta")
    x = torch.empty(2, 3, 16, device="meta")
    with torch.no_grad():
        y = mine(x)
    assert y.shape == (2, 3, 8) and recording.calls == []  # no kernel, no separate bias add
    assert linear_calls == [((2, 3, 16), mine.bias)]  # the 3-D input as given, bias and all
    assert recording.resolved == [(6, 16)]  # the route was resolved on the flattened shape


def test_dispatch_modes_and_fake_tensors_take_the_op(recording):
    from torch.utils.flop_counter import FlopCounterMode

    mine = tunefw.Linear(16, 8, bias=False)
    x = torch.randn(4, 16)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        y = mine(x)
    assert torch.equal(y, torch.matmul(x, mine.weight.t()) + 1)  # served by the dispatcher, via the op
    assert recording.calls == [((4, 16), (8, 16), "cpu")]
    # The mode saw the tunefw::gemm op (no flop formula: 0), not the dispatcher's own matmul
    # (which a direct call would have shown it: 2*4*8*16 flops).
    assert counter.get_total_flops() == 0


def test_linear_compiled_with_dynamic_shapes_traces_once_for_every_m(recording):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    mine = tunefw.Linear(16, 8, bias=False)
    compiled = torch.compile(mine, backend=backend, dynamic=True)
    with torch.no_grad():
        for m in (3, 5, 9):
            x = torch.randn(2, m, 16)
            assert torch.equal(compiled(x), torch.matmul(x, mine.weight.t()) + 1)  # the dispatcher's
    assert len(graphs) == 1  # the fake kernel gave a symbolic M: no recompile per M
    assert recording.calls == [((2 * m, 16), (8, 16), "cpu") for m in (3, 5, 9)]
    torch._dynamo.reset()


class Settled(Recording):
    """A dispatcher whose plans are cached after the first call: known_plan then answers None
    (cuBLAS) without resolving again; it counts how often it is asked."""

    def __init__(self) -> None:
        super().__init__()
        self.cublas, self.asked, self.cached = True, 0, set()

    def plan_for(self, a, b):
        self.cached.add(tuple(a.shape))
        return super().plan_for(a, b)

    def known_plan(self, x, b):
        self.asked += 1
        return None if (x.numel() // b.shape[1], b.shape[1]) in self.cached else False


def test_a_settled_cublas_shape_is_f_linear_after_one_lookup_in_any_mode(recording, monkeypatch,
                                                                       python_path):
    settled = Settled()
    ops._state["dispatcher"] = settled
    linear_calls = []
    monkeypatch.setattr(ops, "_linear", lambda x, w, b: linear_calls.append(x.shape) or
                        torch.empty(*x.shape[:-1], w.shape[0], device=x.device))
    mine = tunefw.Linear(16, 8, device="meta")
    x = torch.empty(2, 3, 16, device="meta")
    with torch.no_grad():
        for _ in range(4):
            mine(x)
    # resolved once, found settled once (remembered then), the last two straight to F.linear
    assert (settled.resolved, settled.asked, len(linear_calls)) == ([(6, 16)], 2, 4)
    assert mine._cublas[1] == {(torch.Size([2, 3, 16]), torch.float32)}
    y = mine(x)  # with grad to record: still cuBLAS's F.linear, which autograd knows
    assert settled.asked == 2 and len(linear_calls) == 5 and y.shape == (2, 3, 8)
    with torch.no_grad():
        mine(torch.empty(2, 3, 16, device="meta", dtype=torch.float16))  # another dtype: asked
        assert settled.asked == 3
        other = Settled()
        ops._state["dispatcher"] = other  # another table: its own routes, asked again
        mine(x)
        assert other.resolved == [(6, 16)]
    import copy
    import pickle
    assert copy.deepcopy(mine)._cublas is None and pickle.loads(pickle.dumps(mine))._cublas is None


def test_unpatch_drops_the_memo_so_the_plain_module_pickles(python_path):
    import pickle

    model = torch.nn.Sequential(torch.nn.Linear(16, 8, dtype=torch.bfloat16))
    assert tunefw.patch(model).swapped == ["0"]
    layer, dispatcher = model[0], Settled()
    layer._remember(dispatcher, torch.empty(4, 16), None)
    assert layer._cublas[0]() is dispatcher
    assert tunefw.unpatch(model) == ["0"] and "_cublas" not in model[0].__dict__
    assert type(pickle.loads(pickle.dumps(model))[0]) is torch.nn.Linear


@pytest.mark.parametrize("bias", [True, False])
def test_from_linear_registers_weight_and_bias_as_nn_linear_does(bias):
    ref = torch.nn.Linear(16, 8, bias=bias)
    mine = tunefw.Linear.from_linear(ref)
    # forward reads both from _parameters: a bias-free layer keeps a None entry, as nn.Linear
    assert list(mine._parameters) == list(ref._parameters) == ["weight", "bias"]
    assert mine._parameters["weight"] is ref.weight and mine._parameters["bias"] is ref.bias
    assert "bias" not in mine.__dict__ and list(mine.state_dict()) == list(ref.state_dict())
