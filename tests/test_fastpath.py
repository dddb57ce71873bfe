"""The compiled call path (tunefw/runtime/fastpath.cpp), built for real on the CPU: a kernel's
launch through a stand-in for cuLaunchKernel, a layer's route map, and tunefw.Linear over both."""
from __future__ import annotations

import ctypes
import pickle

import pytest
import torch
import torch.nn.functional as F

import tunefw
from tunefw.runtime import fastpath, ops

# CUresult cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, stream, void** params, void** extra)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
# CUresult cuLaunchKernelEx(const CUlaunchConfig* config, f, void** params, void** extra)
LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)
FUNCTION, GRID, BLOCK, SMEM = 0xF00D, (3, 2, 1), (384, 1, 1), 123456
PLAIN = (1, 1, 1)


class Attribute(ctypes.Structure):  # CUlaunchAttribute
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


class Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [("dims", ctypes.c_uint * 7), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(Attribute)), ("num_attrs", ctypes.c_uint)]


@pytest.fixture(scope="module")
def mod():
    built = fastpath.module()
    assert built is not None, "the compiled call path did not build"
    return built


class Driver:
    """A stand-in for cuLaunchKernel: records each launch, writes ``nbytes`` of 0x3F at C (the
    third pointer of the argument buffer) and answers ``result`` (a CUresult)."""

    def __init__(self, mod) -> None:
        self.launches: list[tuple] = []
        self.nbytes, self.result = 0, 0
        self.clusters: list[tuple] = []  # the cluster shape of each cuLaunchKernelEx launch
        self._fn, self._fn_ex = LAUNCH(self._launch), LAUNCH_EX(self._launch_ex)
        mod.set_launchers(ctypes.cast(self._fn, ctypes.c_void_p).value,
                          ctypes.cast(self._fn_ex, ctypes.c_void_p).value)

    def _launch_ex(self, config, function, params, extra):
        config = Config.from_address(config)
        attrs = [config.attrs[i] for i in range(config.num_attrs)]
        assert [a.id for a in attrs] == [4]  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        self.clusters.append(tuple(attrs[0].value[:3]))
        d = config.dims
        return self._launch(function, *d, config.stream, params, extra)

    def _launch(self, function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        a, b, c = (ctypes.cast(params[i], ctypes.POINTER(ctypes.c_void_p))[0] for i in range(3))
        self.launches.append((function, (gx, gy, gz), (bx, by, bz), smem, stream,
                              ctypes.cast(params, ctypes.c_void_p).value, (a, b, c)))
        if self.result == 0 and c:
            ctypes.memset(c, 0x3F, self.nbytes)
        return self.result


class Builder:
    """A plan's argument builder: three pointer slots (a, b, c), counted per triple."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, a: int, b: int, c: int):
        self.calls.append((a, b, c))
        slots = [ctypes.c_void_p(p) for p in (a, b, c)]
        array = (ctypes.c_void_p * 3)(*(ctypes.addressof(s) for s in slots))
        return ctypes.addressof(array), (array, *slots)


@pytest.fixture
def driver(mod, monkeypatch):
    d = Driver(mod)
    yield d
    mod.set_launchers(0, 0)


def kernel(mod, M=6, N=8, K=16, dtype=torch.bfloat16, builder=None, cluster=PLAIN, rows=None):
    return mod.Kernel(FUNCTION, GRID, BLOCK, cluster, SMEM, (M, N, K, rows or N), -1, dtype,
                      builder or Builder())


def test_a_kernel_launches_once_per_call_with_its_geometry_and_cached_arguments(mod, driver):
    builder = Builder()
    k = kernel(mod, builder=builder)
    a, b = torch.randn(2, 3, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    driver.nbytes = 6 * 8 * 2
    outs = [fastpath.launch(k, a, b) for _ in range(3)]
    assert [tuple(c.shape) for c in outs] == [(2, 3, 8)] * 3  # C in a's leading shape
    written = torch.tensor([0x3F3F], dtype=torch.int16).view(torch.bfloat16)
    assert all(c.dtype == torch.bfloat16 and torch.equal(c, written.expand(2, 3, 8)) for c in outs)
    assert [launch[:5] for launch in driver.launches] == [(FUNCTION, GRID, BLOCK, SMEM, None)] * 3
    triples = [(a.data_ptr(), b.data_ptr(), c.data_ptr()) for c in outs]
    assert [launch[6] for launch in driver.launches] == triples  # the operands' own addresses
    assert builder.calls == list(dict.fromkeys(triples))  # built once per distinct triple
    assert k.arg_sets == len(set(triples))


def test_a_gated_kernel_reads_a_weight_of_2n_rows_and_writes_n_columns(mod, driver):
    k = kernel(mod, rows=16)  # C = silu(A Bg^T) * (A Bu^T): B = [Bg; Bu], 2 x 8 rows
    a = torch.randn(6, 16, dtype=torch.bfloat16)
    assert fastpath.launch(k, a, torch.randn(8, 16, dtype=torch.bfloat16)) is None  # N rows only
    driver.nbytes = 6 * 8 * 2
    c = fastpath.launch(k, a, torch.randn(16, 16, dtype=torch.bfloat16))
    assert c.shape == (6, 8) and len(driver.launches) == 1


def test_a_triple_met_before_launches_with_its_cached_buffer(mod, driver):
    # meta tensors have no storage: every call's (a, b, c) addresses are the same triple
    builder = Builder()
    k = kernel(mod, builder=builder)
    a = torch.empty(6, 16, dtype=torch.bfloat16, device="meta")
    b = torch.empty(8, 16, dtype=torch.bfloat16, device="meta")
    assert all(fastpath.launch(k, a, b).shape == (6, 8) for _ in range(3))
    assert len(builder.calls) == 1 and k.arg_sets == 1  # built once
    assert len({launch[5] for launch in driver.launches}) == 1 and len(driver.launches) == 3


def test_a_kernel_declines_what_it_cannot_read(mod, driver):
    k = kernel(mod)
    a, b = torch.randn(6, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    flat = torch.randn(6 * 16 + 8, dtype=torch.bfloat16)
    assert fastpath.launch(k, flat[1:97].view(6, 16), b) is None  # 2 bytes off 16-byte alignment
    assert fastpath.launch(k, torch.randn(16, 6, dtype=torch.bfloat16).t(), b) is None  # not contiguous
    assert fastpath.launch(k, a.half(), b.half()) is None  # another dtype
    assert fastpath.launch(k, torch.randn(5, 16, dtype=torch.bfloat16), b) is None  # other rows than its M
    assert fastpath.launch(k, a, torch.randn(9, 16, dtype=torch.bfloat16)) is None  # other N
    assert driver.launches == []
    driver.result = 201  # CUDA_ERROR_INVALID_CONTEXT: the Python launch retries its own way
    assert fastpath.launch(k, a, b) is None and len(driver.launches) == 1


def test_a_cluster_kernel_launches_by_cuLaunchKernelEx_with_its_cluster(mod, driver):
    k = kernel(mod, cluster=(2, 1, 1))
    a, b = torch.randn(6, 16, dtype=torch.bfloat16), torch.randn(8, 16, dtype=torch.bfloat16)
    driver.nbytes = 6 * 8 * 2
    c = fastpath.launch(k, a, b)
    assert driver.clusters == [(2, 1, 1)]
    assert driver.launches[0][:5] == (FUNCTION, GRID, BLOCK, SMEM, None)
    assert driver.launches[0][6] == (a.data_ptr(), b.data_ptr(), c.data_ptr())
    assert torch.equal(c.view(torch.int16), torch.full((6, 8), 0x3F3F, dtype=torch.int16))
    fastpath.launch(kernel(mod), a, b)  # a plain kernel: cuLaunchKernel, no cluster attribute
    assert driver.clusters == [(2, 1, 1)] and len(driver.launches) == 2


def test_without_a_launcher_a_kernel_launches_nothing(mod):
    mod.set_launchers(0, 0)
    assert not mod.has_launchers()
    assert fastpath.launch(kernel(mod), torch.randn(6, 16, dtype=torch.bfloat16),
                           torch.randn(8, 16, dtype=torch.bfloat16)) is None


def test_a_cublas_route_is_f_linear_bit_for_bit_and_only_for_its_shape(mod):
    routes = fastpath.routes()
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 24, dtype=torch.bfloat16)
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        assert fastpath.route(routes, x, layer.weight, layer.bias) is None  # no route yet
        routes.set_cublas(x)
        assert len(routes) == 1
        y = fastpath.route(routes, x, layer.weight, layer.bias)
        assert torch.equal(y, F.linear(x, layer.weight, layer.bias))
        assert torch.equal(fastpath.route(routes, x, layer.weight, None), F.linear(x, layer.weight))
        assert fastpath.route(routes, x[0], layer.weight, layer.bias) is None  # another shape
        assert fastpath.route(routes, x.float(), layer.weight.float(), None) is None  # another dtype


def test_route_takes_a_route_map_and_exactly_four_arguments(mod):
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    with pytest.raises(TypeError, match="4 arguments"):
        fastpath.route(fastpath.routes(), x, w)
    with pytest.raises(RuntimeError):
        fastpath.route(object(), x, w, None)  # not a route map: an exception, not a crash
    with pytest.raises(TypeError, match="two tensors"):
        fastpath.launch(kernel(mod), x, "w")


def test_routes_decline_grad_subclasses_and_modes(mod):
    from torch.overrides import TorchFunctionMode
    from torch.utils.flop_counter import FlopCounterMode

    routes = fastpath.routes()
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    routes.set_cublas(x)
    assert fastpath.route(routes, x, layer.weight, None) is None  # the weight records grad
    with torch.no_grad():
        assert fastpath.route(routes, x, layer.weight, None) is not None
        class Sub(torch.Tensor):
            pass
        assert fastpath.route(routes, x.as_subclass(Sub), layer.weight, None) is None  # a subclass
        with FlopCounterMode(display=False):
            assert fastpath.route(routes, x, layer.weight, None) is None
        with TorchFunctionMode():
            assert fastpath.route(routes, x, layer.weight, None) is None


class CublasDispatcher:
    """A dispatcher that routes every shape to cuBLAS; ``known_plan`` answers None (settled)
    once the shape was resolved; it counts how often it is asked."""

    def __init__(self) -> None:
        self.asked, self.resolved = 0, set()

    def plan_for(self, a, b):
        self.resolved.add(tuple(a.shape))

    def known_plan(self, x, b):
        self.asked += 1
        return None if (x.numel() // b.shape[1], b.shape[1]) in self.resolved else False


def test_routes_belong_to_the_table_they_were_settled_under(mod, serve):
    routes = fastpath.routes()
    x, w = torch.randn(4, 16), torch.randn(8, 16)
    first, second = CublasDispatcher(), CublasDispatcher()
    with torch.no_grad():
        serve(first)
        routes.set_cublas(x)
        assert fastpath.route(routes, x, w, None) is not None
        serve(second)  # another table: none of the first's routes, Python decides
        assert fastpath.route(routes, x, w, None) is None and len(routes) == 0
        ops.set_dispatch(None)
        assert fastpath.route(routes, x, w, None) is None
        serve(first)  # back: its routes serve again, nothing to re-learn
        assert fastpath.route(routes, x, w, None) is not None and len(routes) == 1
        for _ in range(4):  # a layer keeps four tables' routes: the oldest goes
            serve(CublasDispatcher())
            routes.set_cublas(x)
        serve(first)
        assert fastpath.route(routes, x, w, None) is None


class KernelDispatcher:
    """A dispatcher whose one plan carries a compiled kernel: ``known_plan`` answers it once the
    shape was resolved; the Python plan itself counts its calls."""

    def __init__(self, fast) -> None:
        self.fast, self.python_calls, self.resolved = fast, 0, set()

    def __call__(self, a, b, lead=None):
        self.python_calls += 1
        c = torch.empty(*(lead if lead is not None else a.shape[:-1]), b.shape[0], device=a.device)
        return c.zero_()

    def plan_for(self, a, b):
        self.resolved.add(tuple(a.shape))
        return self

    def known_plan(self, x, b):
        return self if (x.numel() // b.shape[1], b.shape[1]) in self.resolved else False


@pytest.fixture
def serve():
    """serve(dispatcher): make it the process-wide one for the test; the saved state after."""
    def make(dispatcher) -> None:  # as set_dispatch does it, for stand-ins of a Dispatcher too
        ops._state.update(dispatcher=dispatcher, env_read=True)
        fastpath.serve(dispatcher)

    saved = dict(ops._state)
    yield make
    ops._state.clear()
    ops._state.update(saved)
    fastpath.serve(saved["dispatcher"])


def four_calls(layer) -> list[tuple]:
    """Four eager calls on a meta input (meta stands in for CUDA: the CPU shortcut skips it)."""
    x = torch.empty(2, 3, 16, device="meta")
    with torch.no_grad():
        return [tuple(layer(x).shape) for _ in range(4)]


def test_linear_serves_a_settled_kernel_route_in_one_compiled_call(mod, driver, serve):
    k = kernel(mod, dtype=torch.float32)
    plan = KernelDispatcher(k)
    serve(plan)
    layer = tunefw.Linear(16, 8, device="meta")
    assert four_calls(layer) == [(2, 3, 8)] * 4
    # resolved, settled (remembered): the plan's calls; then the compiled kernel's alone
    assert plan.python_calls == 2 and len(driver.launches) == 2
    assert len(layer._fast) == 1
    assert pickle.loads(pickle.dumps(layer))._fast is None  # routes stay in this process
    model = torch.nn.Sequential(layer)
    assert tunefw.unpatch(model) == ["0"] and "_fast" not in model[0].__dict__


def test_linear_serves_a_settled_cublas_route_without_python(mod, monkeypatch, serve):
    linear_calls = []
    monkeypatch.setattr(ops, "_linear", lambda x, w, b: linear_calls.append(x.shape) or
                        torch.empty(*x.shape[:-1], w.shape[0], device=x.device))
    dispatcher = CublasDispatcher()
    serve(dispatcher)
    layer = tunefw.Linear(16, 8, device="meta")
    assert four_calls(layer) == [(2, 3, 8)] * 4
    # resolved, settled (remembered), then at::linear from C++: no Python lookup, no F.linear
    assert (dispatcher.asked, len(linear_calls), len(layer._fast)) == (2, 2, 1)
    assert layer._cublas is None  # the Python memo is for when the compiled path is off


def test_setting_a_table_builds_the_compiled_path_once(monkeypatch):
    built = []
    monkeypatch.setattr(fastpath, "_state", {"module": None, "tried": False, "serial": 0})
    monkeypatch.setattr(fastpath, "_build", lambda: built.append(1))
    fastpath.serve(None)  # no table: nothing to build for
    assert built == []
    fastpath.serve(CublasDispatcher())  # set-up time, not the first settled call
    fastpath.serve(CublasDispatcher())
    assert built == [1]


def test_the_compiled_path_is_off_by_environment_and_after_a_failed_build(monkeypatch, tmp_path):
    monkeypatch.setattr(fastpath, "_state", {"module": None, "tried": False})
    monkeypatch.setenv("TUNEFW_FASTPATH", "0")
    assert fastpath.module() is None and fastpath.routes() is None
    monkeypatch.setattr(fastpath, "_state", {"module": None, "tried": False})
    monkeypatch.delenv("TUNEFW_FASTPATH")
    broken = tmp_path / "fastpath.cpp"
    broken.write_text("#error not C++ tunefw can build\n")
    monkeypatch.setattr(fastpath, "SOURCE", broken)
    monkeypatch.setenv("TUNEFW_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.warns(RuntimeWarning, match="compiled call path could not be built"):
        assert fastpath.module() is None
    assert fastpath.module() is None  # tried once: no second build, no second warning
