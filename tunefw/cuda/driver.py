"""The one CUDA driver layer (cuda.bindings): contexts, device limits and identity, loading a
cubin, launch attributes, launches with or without a cluster, and error classification.

The evaluator (evaluate/cuda.py) and the runtime (runtime/plan.py) both launch through here, so a
kernel is loaded, configured and launched the same way when it is measured and when it serves.
"""
from __future__ import annotations

import math
from typing import Any

from cuda.bindings import driver as cu

from tunefw.device import DeviceSpec, spec_for
from tunefw.outcome import Status
from tunefw.templates.base import Launch

E = cu.CUresult
# Errors a launch can report without breaking the context: the config does not fit the GPU.
RESOURCE_ERRORS = {E.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, E.CUDA_ERROR_INVALID_VALUE,
                   E.CUDA_ERROR_OUT_OF_MEMORY, E.CUDA_ERROR_INVALID_CLUSTER_SIZE,
                   E.CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE}
# Errors loading a cubin that say the image does not suit this GPU.
IMAGE_ERRORS = {E.CUDA_ERROR_NO_BINARY_FOR_GPU, E.CUDA_ERROR_INVALID_IMAGE, E.CUDA_ERROR_INVALID_PTX,
                E.CUDA_ERROR_UNSUPPORTED_PTX_VERSION, E.CUDA_ERROR_NOT_FOUND}
# A thread without the device's context current gets these from a launch; set it and retry.
NO_CONTEXT_ERRORS = {E.CUDA_ERROR_INVALID_CONTEXT, E.CUDA_ERROR_INVALID_HANDLE}


class CudaFailure(Exception):
    """A CUDA driver call failed; ``stage`` is load, setup, launch or run."""

    def __init__(self, code: cu.CUresult, stage: str, what: str) -> None:
        super().__init__(f"{what}: {code.name}")
        self.code, self.stage = code, stage


def classify(failure: CudaFailure) -> tuple[Status, bool]:
    """(status, poisoned) for a failed driver call: only launch-time rejections leave the context sound."""
    if failure.stage in ("setup", "launch") and failure.code in RESOURCE_ERRORS:
        return Status.OUT_OF_RESOURCES, False
    if failure.stage == "load" and failure.code in IMAGE_ERRORS:
        return Status.COMPILE_ERROR, False
    return Status.RUNTIME_CRASH, True


def check(result: tuple, stage: str, what: str) -> Any:
    """Unpack a cuda.bindings (err, value...) tuple, raising CudaFailure on error."""
    err, *values = result
    if err != E.CUDA_SUCCESS:
        raise CudaFailure(err, stage, what)
    return values[0] if len(values) == 1 else (tuple(values) if values else None)


# ---- devices and contexts --------------------------------------------------------------------
def device(index: int) -> Any:
    """The driver's handle of CUDA device ``index`` (cuInit included)."""
    check(cu.cuInit(0), "setup", "cuInit")
    return check(cu.cuDeviceGet(index), "setup", "cuDeviceGet")


def visible_count() -> int:
    """How many CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied), no context made."""
    check(cu.cuInit(0), "setup", "cuInit")
    return check(cu.cuDeviceGetCount(), "setup", "cuDeviceGetCount")


def primary_context(dev: Any) -> Any:
    """The device's primary context (the one torch uses), retained."""
    return check(cu.cuDevicePrimaryCtxRetain(dev), "setup", "cuDevicePrimaryCtxRetain")


def attribute(dev: Any, name: str) -> int:
    """A CU_DEVICE_ATTRIBUTE_<name> of the device."""
    attr = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return check(cu.cuDeviceGetAttribute(attr, dev), "setup", name)


def device_spec(dev: Any, name: str, cc: int) -> DeviceSpec:
    """The limits the driver reports for the device, on the known spec of its name."""
    return spec_for(name, cc, attribute(dev, "MULTIPROCESSOR_COUNT"),
                    attribute(dev, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
                    attribute(dev, "MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
                    attribute(dev, "L2_CACHE_SIZE"))


def local_spec(index: int = 0) -> DeviceSpec:
    """The limits of CUDA device ``index`` read without creating a context (what a launch
    expects its local workers to report)."""
    dev = device(index)
    raw = check(cu.cuDeviceGetName(256, dev), "setup", "cuDeviceGetName")
    cc = (10 * attribute(dev, "COMPUTE_CAPABILITY_MAJOR")
          + attribute(dev, "COMPUTE_CAPABILITY_MINOR"))
    return device_spec(dev, raw.split(b"\0")[0].decode(), cc)


def device_uuid(dev: Any) -> str:
    """GPU-xxxxxxxx-xxxx-... as nvidia-smi prints it."""
    h = bytes(check(cu.cuDeviceGetUuid(dev), "setup", "cuDeviceGetUuid").bytes).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def driver_api_version() -> str:
    version = check(cu.cuDriverGetVersion(), "setup", "cuDriverGetVersion")
    return f"{version // 1000}.{version % 1000 // 10}"


def function_address(name: bytes) -> int | None:
    """A driver function's address as CUDA 12 defines it (cuLaunchKernel's: 0 is the legacy
    default stream), for a caller that launches without Python between (runtime/fastpath.py),
    or None where there is no driver to ask (a CPU machine) or it does not know the name."""
    try:
        err, address, _ = cu.cuGetProcAddress(
            name, 12000, cu.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT)
    except Exception:  # the driver library cannot be loaded
        return None
    return int(address) if err == E.CUDA_SUCCESS and int(address) else None


# ---- kernels ------------------------------------------------------------------------------------
def load(cubin: bytes, lowered_name: str) -> tuple[Any, Any]:
    """(module, function) of a kernel in a cubin."""
    module = check(cu.cuModuleLoadData(cubin), "load", "cuModuleLoadData")
    function = check(cu.cuModuleGetFunction(module, lowered_name.encode()), "load",
                     f"cuModuleGetFunction({lowered_name})")
    return module, function


def unload(module: Any) -> None:
    cu.cuModuleUnload(module)


def module_global(module: Any, name: str) -> tuple[int, int]:
    """(device address, bytes) of a loaded module's ``extern "C" __device__`` variable."""
    ptr, size = check(cu.cuModuleGetGlobal(module, name.encode()), "load", f"global {name}")
    return int(ptr), int(size)


def zero_device(ptr: int, nbytes: int) -> None:
    """Set ``nbytes`` of device memory at ``ptr`` to zero (synchronous)."""
    check(cu.cuMemsetD8(ptr, 0, nbytes), "run", f"clear {nbytes} bytes")


def read_device(ptr: int, nbytes: int) -> bytes:
    """``nbytes`` of device memory at ``ptr``, copied to the host (synchronous)."""
    out = bytearray(nbytes)
    check(cu.cuMemcpyDtoH(out, ptr, nbytes), "run", f"read {nbytes} bytes")
    return bytes(out)


def configure(function: Any, launch: Launch) -> None:
    """Set what a launch of this geometry needs: its dynamic shared memory and, for clusters of
    more than 8 CTAs, the non-portable cluster size."""
    attr = cu.CUfunction_attribute
    check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                launch.smem_bytes), "setup",
          f"dynamic shared memory of {launch.smem_bytes} bytes")
    if math.prod(launch.cluster) > 8:
        check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
              "setup", f"cluster of {math.prod(launch.cluster)} CTAs")


def launch_config(launch: Launch, stream: int, programmatic: bool = False) -> Any:
    """The CUlaunchConfig of a launch on ``stream`` (build once, reuse per stream): its cluster
    and, with ``programmatic``, programmatic stream serialization (the kernel may start while
    the one before it on the stream finishes; it must wait for it itself: griddepcontrol.wait)."""
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = launch.grid
    config.blockDimX, config.blockDimY, config.blockDimZ = launch.block
    config.sharedMemBytes, config.hStream = launch.smem_bytes, cu.CUstream(stream)
    attrs = []
    if launch.cluster != (1, 1, 1):
        cluster = cu.CUlaunchAttribute()
        cluster.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        dim = cluster.value.clusterDim
        dim.x, dim.y, dim.z = launch.cluster
        attrs.append(cluster)
    if programmatic:
        serial = cu.CUlaunchAttribute()
        serial.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        serial.value.programmaticStreamSerializationAllowed = 1
        attrs.append(serial)
    config.attrs, config.numAttrs = attrs, len(attrs)
    return config


def launch_raw(function: Any, launch: Launch, params: Any, stream: int,
               config: Any = None) -> cu.CUresult:
    """One launch on ``stream``: cuLaunchKernelEx with ``config``, else for a cluster with one
    built now, else cuLaunchKernel; the driver's result code."""
    if launch.cluster == (1, 1, 1) and config is None:
        (err,) = cu.cuLaunchKernel(function, *launch.grid, *launch.block, launch.smem_bytes,
                                   stream, params, 0)
    else:
        (err,) = cu.cuLaunchKernelEx(config or launch_config(launch, stream), function, params, 0)
    return err


def launch_checked(function: Any, launch: Launch, params: Any, stream: int) -> None:
    """One launch on ``stream`` (launch_raw), CudaFailure if the driver refuses it."""
    err = launch_raw(function, launch, params, stream)
    if err != E.CUDA_SUCCESS:
        raise CudaFailure(err, "launch", describe(launch))


def describe(launch: Launch) -> str:
    return (f"launch grid {launch.grid} block {launch.block} cluster {launch.cluster} "
            f"smem {launch.smem_bytes}")


def stream_state(stream: int) -> cu.CUresult:
    """CUDA_SUCCESS when the stream is idle, CUDA_ERROR_NOT_READY while busy, else its error."""
    (err,) = cu.cuStreamQuery(cu.CUstream(stream))
    return err


def set_current(context: Any) -> None:
    check(cu.cuCtxSetCurrent(context), "setup", "cuCtxSetCurrent")
