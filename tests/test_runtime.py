"""The runtime's choices on CPU: routes, explain texts, fallbacks, fingerprints, the torch op."""
import json
import warnings

import pytest
import torch

import tunefw
from tunefw.device import A100, H100, H200
from tunefw.errors import UserError
from tunefw.runtime import ops
from tunefw.runtime.dispatch import load
from tunefw.runtime.dispatcher import Dispatcher
from tunefw.runtime.shipped import read_manifest, ship_cubins
from tunefw.templates import FAMILIES

H200_FP = {"name": "NVIDIA H200", "cc": 90, "sm_count": 132, "uuid": "GPU-x"}


def _entry(M, N, K, family="wgmma_sm90", dtype="bf16", **changes):
    config = dict(FAMILIES[family].default_config(), **changes)
    return {"M": M, "N": N, "K": K, "dtype": dtype, "layout": "TN", "family": family,
            "config": config, "tflops": 500.0, "cublas_tflops": 450.0, "trial_id": M + N}


def _table(tmp_path, entries=None, simulated=False, fingerprint=H200_FP):
    data = {"schema_version": 1, "simulated": simulated, "fingerprint": fingerprint,
            "entries": entries if entries is not None else [
                _entry(4096, 4096, 4096), _entry(128, 6144, 4096, "mma_sm80"),
                _entry(2048, 2048, 2048, dtype="fp16")]}
    path = tmp_path / "dispatch.json"
    path.write_text(json.dumps(data))
    return path


def _no_warnings(fn):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return fn()


def test_exact_nearest_and_cublas_routes(tmp_path):
    d = Dispatcher(_table(tmp_path), gpu=H200)
    exact = _no_warnings(lambda: d.route(4096, 4096, 4096, "bf16"))
    assert (exact.path, exact.entry.family) == ("exact", "wgmma_sm90")
    near = d.route(3000, 4096, 4096, torch.bfloat16)
    assert (near.path, near.entry.M) == ("bucket", 4096)  # same layer, the tuned M above
    far = d.route(3000, 4096, 2048, torch.bfloat16)
    assert (far.path, far.entry.M) == ("nearest", 4096)  # a layer the table has no entry for
    assert d.route(100, 6144, 4096, "bf16").entry.family == "mma_sm80"
    assert d.route(2048, 2048, 2048, "fp16").path == "exact"
    assert d.route(2048, 2048, 2048, torch.float32).path == "cublas"
    assert d.route(64, 100, 64, "bf16").path == "cublas"  # N not a multiple of 8


def test_explain_texts(tmp_path):
    d = Dispatcher(_table(tmp_path), gpu=H200)
    assert d.explain(4096, 4096, 4096, "bf16").startswith(
        "4096x4096x4096 bf16: exact: its own entry (wgmma_sm90, trial 8192, 1.111x cuBLAS); "
        "kernel gemm_wgmma_sm90<0, 128, 256")
    bucket = d.explain(3000, 4096, 4096, "bf16")
    assert bucket.startswith("3000x4096x4096 bf16: bucket: entry 4096x4096x4096, the smallest tuned M above "
                             "3000 valid here (wgmma_sm90, trial 8192); no calibration evidence")
    near = d.explain(3000, 4096, 2048, "bf16")
    assert near.startswith("3000x4096x2048 bf16: nearest: entry 4096x4096x4096, the closest whose config is valid "
                           "here (log distance 0.760) (wgmma_sm90, trial 8192); no calibration evidence")
    assert "compiled on first use" in near
    assert d.explain(64, 64, 64, torch.float32) == (
        "64x64x64 float32: cublas: not a tunable problem: problem dtype='float32': expected one of bf16, fp16")
    assert "N must be a positive multiple of 8" in d.explain(64, 100, 64)


def test_nearest_skips_invalid_configs_and_says_why(tmp_path):
    # a 2x1 cluster of 128-row tiles needs M > 128: for M=64 the wgmma entry cannot run
    d = Dispatcher(_table(tmp_path, [_entry(4096, 4096, 4096)]), gpu=H200)
    text = d.explain(64, 4096, 4096, "bf16")
    assert text.startswith("64x4096x4096 bf16: cublas: no bf16 entry's config is valid for this shape "
                           "(nearest 4096x4096x4096: CLUSTER_M=2: the cluster is taller")
    d2 = Dispatcher(_table(tmp_path, [_entry(4096, 4096, 4096), _entry(8192, 8192, 8192, CLUSTER_M=1)]),
                    gpu=H200)
    route = d2.route(64, 4096, 4096, "bf16")
    assert (route.path, route.entry.M) == ("nearest", 8192)  # farther, but valid
    assert d2.explain(64, 64, 64, "fp16") == "64x64x64 fp16: cublas: the table has no fp16 kernel entry"


@pytest.mark.parametrize("gpu, table_kw, needle", [
    (A100, {}, "tuned on NVIDIA H200 (cc 90), this GPU is NVIDIA A100-SXM4-80GB (cc 80)"),
    (H100, {}, "this GPU is NVIDIA H100 80GB HBM3 (cc 90)"),
    (H200, {"simulated": True}, "the dispatch table is SIMULATED"),
    (H200, {"fingerprint": {"name": "NVIDIA H200"}}, "tuned on NVIDIA H200 (cc None)"),
])
def test_fingerprint_mismatch_serves_cublas_with_one_warning(tmp_path, gpu, table_kw, needle):
    d = Dispatcher(_table(tmp_path, **table_kw), gpu=gpu)
    with pytest.warns(RuntimeWarning) as caught:
        first = d.explain(4096, 4096, 4096, "bf16")
        d.explain(4096, 4096, 4096, "fp16")
        d.route(128, 6144, 4096, "bf16")
    assert len(caught) == 1
    assert needle in str(caught[0].message) and "every GEMM uses cuBLAS" in str(caught[0].message)
    assert first.startswith("4096x4096x4096 bf16: cublas: ") and needle in first


def test_cpu_tensors_fall_back_to_torch_matmul(tmp_path):
    d = Dispatcher(_table(tmp_path), gpu=H200)
    a = torch.randn(4096 // 32, 256, dtype=torch.bfloat16)
    b = torch.randn(320, 256, dtype=torch.bfloat16)
    assert torch.equal(_no_warnings(lambda: d.gemm(a, b)), torch.matmul(a, b.t()))
    x, w = torch.randn(3, 5, 16), torch.randn(8, 16)  # batched and float32: torch.matmul too
    assert torch.equal(d.gemm(x, w), torch.matmul(x, w.t()))
    assert d.plan_for(a, b) is None
    with pytest.raises(RuntimeError):  # K mismatch: torch's own error
        d.gemm(torch.randn(4, 16), torch.randn(4, 8))


def test_no_cuda_routes_cublas_but_explain_previews_the_tables_device(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    d = Dispatcher(_table(tmp_path))
    assert d.route(4096, 4096, 4096, "bf16").reason == "no CUDA device"
    text = d.explain(4096, 4096, 4096)
    assert text.startswith("4096x4096x4096 bf16: exact: its own entry (wgmma_sm90, trial 8192, 1.111x cuBLAS)")
    assert text.endswith("[preview for NVIDIA H200, the table's device]")


def test_shipped_cubin_directory(tmp_path):
    table = load(_table(tmp_path, [_entry(128, 6144, 4096, "mma_sm80")]))
    manifest = ship_cubins(table, tmp_path / "cubins", "sm_90a", cache_dir=tmp_path / "cache")
    ((name, kernel),) = manifest["kernels"].items()
    assert name.startswith("gemm_mma_sm80<0, 128") and (tmp_path / "cubins" / kernel["file"]).stat().st_size
    assert read_manifest(tmp_path / "cubins")["arch"] == "sm_90a"
    d = Dispatcher(table, cubin_dir=tmp_path / "cubins", gpu=H200)
    assert d.explain(128, 6144, 4096).endswith(f"kernel {name} from {tmp_path / 'cubins'}")
    (tmp_path / "cubins" / "manifest.json").write_text("{}")
    with pytest.raises(UserError, match="manifest.json: expected"):
        Dispatcher(table, cubin_dir=tmp_path / "cubins")


def test_a_shipped_cubin_of_the_measured_source_keeps_an_entry_an_older_tunefw_measured(tmp_path):
    """The table was measured on another mma_sm80 source than this installation's: built here,
    its kernel is unproven; shipped with a cubin the manifest says was built from the measured
    source, it is the measured kernel and serves exactly; a manifest without that record (an
    older one) proves nothing."""
    from dataclasses import replace as replace_entry

    stale = "0123456789abcdef"
    plain = load(_table(tmp_path, [_entry(128, 6144, 4096, "mma_sm80", BK=64)]))
    table = replace_entry(plain, entries=[replace_entry(plain.entries[0], source_hash=stale)])
    assert Dispatcher(table, gpu=H200).explain(128, 6144, 4096).split(": ")[1] == "unproven"
    manifest = ship_cubins(table, tmp_path / "cubins", "sm_90a", cache_dir=tmp_path / "cache")
    ((name, kernel),) = manifest["kernels"].items()
    assert kernel["source_hash"] == FAMILIES["mma_sm80"].source_hash()
    kernel["source_hash"] = stale  # as the tunefw that measured it would have shipped it
    (tmp_path / "cubins" / "manifest.json").write_text(json.dumps(manifest))
    shipped = Dispatcher(table, cubin_dir=tmp_path / "cubins", gpu=H200)
    assert shipped.explain(128, 6144, 4096).split(": ")[1] == "exact"
    del kernel["source_hash"]
    (tmp_path / "cubins" / "manifest.json").write_text(json.dumps(manifest))
    older = Dispatcher(table, cubin_dir=tmp_path / "cubins", gpu=H200)
    assert older.explain(128, 6144, 4096).split(": ")[1] == "unproven"


# ---- torch integration ----------------------------------------------------------------------------
@pytest.fixture
def global_table(tmp_path):
    ops.set_dispatch(_table(tmp_path), gpu=H200)
    yield
    ops.set_dispatch(None)


def test_op_is_registered_and_has_fake_shapes(global_table):
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert hasattr(torch.ops.tunefw, "gemm")
    with FakeTensorMode():
        out = torch.ops.tunefw.gemm(torch.empty(7, 64, dtype=torch.bfloat16),
                                    torch.empty(24, 64, dtype=torch.bfloat16))
        batched = torch.ops.tunefw.gemm(torch.empty(2, 3, 16), torch.empty(8, 16))
    assert (out.shape, out.dtype) == ((7, 24), torch.bfloat16)
    assert batched.shape == (2, 3, 8)
    torch.library.opcheck(torch.ops.tunefw.gemm.default, (torch.randn(8, 16), torch.randn(24, 16)))


def test_op_under_torch_compile_is_one_node_served_by_the_dispatcher(global_table, monkeypatch):
    """torch.compile keeps tunefw::gemm as one op of a single graph (fullgraph, through the fake
    implementation), the compiled call reaches the table's Dispatcher, and C = 2 * A.B^T."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    dispatcher, served = ops.get_dispatcher(), []
    real_gemm = dispatcher.gemm
    monkeypatch.setattr(dispatcher, "gemm",
                        lambda a, b: served.append((tuple(a.shape), tuple(b.shape))) or real_gemm(a, b))
    torch.manual_seed(0)
    a, b = torch.randn(32, 64, dtype=torch.bfloat16), torch.randn(48, 64, dtype=torch.bfloat16)
    compiled = torch.compile(lambda a, b: tunefw.gemm(a, b) * 2, backend=recording_backend,
                             fullgraph=True)
    c = compiled(a, b)
    (graph,) = graphs
    targets = [n.target for n in graph.graph.nodes if n.op == "call_function"]
    assert sum(t in (torch.ops.tunefw.gemm, torch.ops.tunefw.gemm.default) for t in targets) == 1
    assert served == [((32, 64), (48, 64))]
    assert (c.shape, c.dtype) == ((32, 48), torch.bfloat16)
    reference = 2 * (a.double() @ b.double().T)
    torch.testing.assert_close(c.double(), reference, rtol=2e-2, atol=2e-1)


def test_linear_is_a_drop_in_for_nn_linear(global_table):
    torch.manual_seed(0)
    ref = torch.nn.Linear(64, 24)
    mine = tunefw.Linear.from_linear(ref)
    x = torch.randn(2, 5, 64, requires_grad=True)
    y_ref, y = ref(x), mine(x)
    assert torch.allclose(y, y_ref, atol=1e-6)
    (gx,) = torch.autograd.grad(y.sum(), x)
    (gx_ref,) = torch.autograd.grad(y_ref.sum(), x)
    assert torch.allclose(gx, gx_ref, atol=1e-6)
    plain = tunefw.Linear(64, 24, bias=False)
    assert plain(torch.randn(3, 64)).shape == (3, 24)


def test_global_dispatcher_from_env(tmp_path, monkeypatch):
    monkeypatch.setattr(ops, "_state", {"dispatcher": None, "env_read": False})
    monkeypatch.setenv(ops.ENV, str(_table(tmp_path)))
    assert ops.get_dispatcher().table.entries[0].M == 4096
    monkeypatch.setattr(ops, "_state", {"dispatcher": None, "env_read": False})
    monkeypatch.delenv(ops.ENV)
    with pytest.warns(RuntimeWarning, match="no dispatch table set"):
        assert ops.get_dispatcher() is None


def test_route_for_tensors(tmp_path):
    d = Dispatcher(_table(tmp_path), gpu=H200)
    a, b = torch.randn(64, 32), torch.randn(48, 32)
    assert d.route_for(a, b).reason == "not a 2-D CUDA GEMM of one dtype"


def test_kernel_argument_buffer_points_at_the_values():
    import ctypes
    from tunefw.problem import GemmProblem
    from tunefw.runtime.plan import pack

    mma = FAMILIES["mma_sm80"]
    args = mma.kernel_args(mma.default_config(), GemmProblem(64, 128, 256),
                           {"a": 0x1000, "b": 0x2000, "c": 0x3000, "workspace": 0})
    address, _keep = pack(args)
    slots = (ctypes.c_void_p * len(args)).from_address(address)
    pointers = [ctypes.c_void_p.from_address(slots[i]).value or 0 for i in range(4)]
    ints = [ctypes.c_int.from_address(slots[i]).value for i in range(4, 7)]
    assert pointers == [0x1000, 0x2000, 0x3000, 0] and ints == [64, 128, 256]


def test_known_plan_finds_the_plan_of_the_flattened_input_without_a_reshape():
    # tunefw.Linear asks before it reshapes: a cached cuBLAS route (None) skips the reshape
    d = Dispatcher.__new__(Dispatcher)
    w = torch.empty(8, 16, device="meta")
    d._plans = {(torch.Size([6, 16]), w.shape, torch.float32, torch.float32, -1, -1, "none"): None}
    assert d.known_plan(torch.empty(2, 3, 16, device="meta"), w) is None
    assert d.known_plan(torch.empty(6, 16, device="meta"), w) is None
    assert d.known_plan(torch.empty(5, 16, device="meta"), w) is False  # not resolved yet


class _RecordingDriver:
    """cuda.bindings' launch calls, recorded (no GPU): which one a Plan makes, with what config."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def cuLaunchKernel(self, function, *rest):
        self.calls.append(("cuLaunchKernel", rest))
        return (0,)

    def cuLaunchKernelEx(self, config, function, params, extra):
        self.calls.append(("cuLaunchKernelEx", config))
        return (0,)


def _plan(family: str, config: dict, shape: tuple[int, int, int], programmatic: bool):
    from tunefw.problem import GemmProblem
    from tunefw.runtime.dispatch import DispatchEntry
    from tunefw.runtime.plan import Plan

    template = FAMILIES[family]
    problem = GemmProblem(*shape)
    entry = DispatchEntry(M=shape[0], N=shape[1], K=shape[2], dtype="bf16", layout="TN",
                          family=family, config=config, tflops=1.0, cublas_tflops=1.0, trial_id=1)
    launch = template.launch(config, problem, H200)
    assert not launch.workspace_bytes  # no workspace: the plan allocates nothing on a device
    plan = Plan(template, entry, problem, launch, object(), None, torch.device("cuda", 0),
                programmatic=programmatic)
    plan._cu = _RecordingDriver()
    return plan, launch


@pytest.mark.parametrize("programmatic", [True, False])
def test_a_family_that_waits_for_the_kernel_before_it_is_launched_programmatically(programmatic):
    from cuda.bindings import driver as cu

    ids = cu.CUlaunchAttributeID
    stream = FAMILIES["stream_sm90"]
    plan, launch = _plan("stream_sm90", stream.default_config(), (8, 4096, 4096), programmatic)
    plan.launch(0, 0)
    plan.launch(0, 0)
    (kind, _), (kind2, _) = plan._cu.calls
    if not programmatic:  # no cluster, no serialization attribute: the plain launch
        assert kind == kind2 == "cuLaunchKernel"
        return
    config = plan._cu.calls[0][1]
    assert kind == kind2 == "cuLaunchKernelEx" and config is plan._cu.calls[1][1]  # built once
    assert [a.id for a in config.attrs] == (
        [ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION] if launch.cluster == (1, 1, 1)
        else [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
              ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION])
    assert config.attrs[-1].value.programmaticStreamSerializationAllowed == 1
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == launch.grid


def test_a_family_that_does_not_wait_is_never_launched_programmatically():
    mma = FAMILIES["mma_sm80"]
    plan, _ = _plan("mma_sm80", mma.default_config(), (256, 256, 256), programmatic=True)
    plan.launch(0, 0)
    assert not plan.programmatic and plan._cu.calls[0][0] == "cuLaunchKernel"


GLOBAL_ACCESSES = ("tma_load_2d(", "tma_load_2d_multicast(", "bulk_load(", "ld_global",
                   "load_step<", "reduce_store<", "atomicAdd(", "tma_store_2d")


def test_the_families_that_claim_programmatic_launches_wait_before_any_global_access():
    from tunefw.templates.base import TEMPLATE_DIR

    for name, family in FAMILIES.items():
        text = "".join(p.read_text() for p in family.source_paths())
        kernel = (TEMPLATE_DIR / family.source).read_text()
        # launched programmatically, a kernel may start while the kernels before it still run:
        # whatever it reads or writes in global memory before its wait can race with them
        assert family.programmatic_launch == ("pdl_wait()" in kernel), name
        if not family.programmatic_launch:
            continue
        assert "griddepcontrol.wait" in text, name
        body = kernel[kernel.index("__global__"):]
        first = min((body.index(a), a) for a in GLOBAL_ACCESSES if a in body)
        assert body.index("pdl_wait()") < first[0], f"{name}: {first[1]} before pdl_wait()"


@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("1", True),
                                             ("on", True), ("0", False), ("No", False)])
def test_programmatic_launches_follow_the_environment(tmp_path, monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("TUNEFW_PDL", raising=False)
    else:
        monkeypatch.setenv("TUNEFW_PDL", value)
    assert Dispatcher(_table(tmp_path), gpu=H200).programmatic is expected
    assert Dispatcher(_table(tmp_path), gpu=H200, programmatic=False).programmatic is False
    assert Dispatcher(_table(tmp_path), gpu=H200, programmatic=True).programmatic is True


def test_a_shipped_cubin_launches_programmatically_only_if_its_manifest_says_it_waits(tmp_path):
    table = load(_table(tmp_path, [_entry(8, 4096, 4096, "stream_sm90")]))
    manifest = ship_cubins(table, tmp_path / "cubins", "sm_90a", cache_dir=tmp_path / "cache")
    ((name, kernel),) = manifest["kernels"].items()
    assert kernel["programmatic"] is True
    d = Dispatcher(table, cubin_dir=tmp_path / "cubins", gpu=H200)
    assert d._kernel(table.entries[0], "sm_90a")[3] is True
    # a directory shipped before the kernels waited: the same name, no such key
    del manifest["kernels"][name]["programmatic"]
    (tmp_path / "cubins" / "manifest.json").write_text(json.dumps(manifest))
    old = Dispatcher(table, cubin_dir=tmp_path / "cubins", gpu=H200)
    assert old._kernel(table.entries[0], "sm_90a")[3] is False
    # compiled here from the family's source: as the family declares
    fresh = Dispatcher(table, gpu=H200, cache_dir=tmp_path / "cache")
    assert fresh._kernel(table.entries[0], "sm_90a")[3] is True


def test_a_plan_launched_plainly_keeps_its_cluster_and_drops_the_serialization():
    from cuda.bindings import driver as cu

    ids = cu.CUlaunchAttributeID
    wg = FAMILIES["wgmma_sm90"]
    config = dict(wg.default_config(), CLUSTER_M=2)
    plan, launch = _plan("wgmma_sm90", config, (4096, 4096, 4096), programmatic=True)
    assert launch.cluster != (1, 1, 1) and plan.programmatic
    plan.launch(0, 0, programmatic=False)
    plan.launch(0, 0)
    (kind, plain), (kind2, serial) = plan._cu.calls
    assert kind == kind2 == "cuLaunchKernelEx"
    assert [a.id for a in plain.attrs] == [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION]
    assert [a.id for a in serial.attrs] == [ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                                            ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
