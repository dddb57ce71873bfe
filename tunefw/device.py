"""What a kernel family's checks need to know about a GPU, and the known ones by name."""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DeviceSpec:
    """Hardware limits that decide whether a config can run (not how fast)."""

    name: str
    cc: int  # compute capability as major*10+minor, e.g. 90
    sm_count: int
    smem_per_block_optin: int  # bytes a block may ask for after the opt-in attribute
    smem_per_sm: int
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_threads_per_block: int = 1024
    l2_bytes: int = 50 * 2**20
    peak_tflops_bf16: float = 990.0  # dense tensor-core rate (datasheet), for the simulator
    mem_bandwidth_gbs: float = 4800.0  # datasheet HBM bandwidth
    stream_read_gbs: float = 0.0  # a >= 4 GB streaming read measured on one (0: not measured)
    arch_suffix: str = ""  # "a" where the arch-specific features (wgmma, setmaxnreg) are present

    @property
    def arch(self) -> str:
        """The compile target, e.g. 'sm_90a' on Hopper, 'sm_80' on Ampere."""
        return f"sm_{self.cc}{self.arch_suffix}"

    def as_dict(self) -> dict:
        return asdict(self)


H200 = DeviceSpec(
    name="NVIDIA H200", cc=90, sm_count=132, smem_per_block_optin=232448, smem_per_sm=233472,
    l2_bytes=60 * 2**20, peak_tflops_bf16=989.0, mem_bandwidth_gbs=4800.0, arch_suffix="a",
    stream_read_gbs=4226.0,  # benchmarks/results/decode_h200.json (2026-12-01)
)
H100 = DeviceSpec(
    name="NVIDIA H100 80GB HBM3", cc=90, sm_count=132, smem_per_block_optin=232448,
    smem_per_sm=233472, l2_bytes=50 * 2**20, peak_tflops_bf16=989.0, mem_bandwidth_gbs=3350.0,
    arch_suffix="a",
)
A100 = DeviceSpec(
    name="NVIDIA A100-SXM4-80GB", cc=80, sm_count=108, smem_per_block_optin=166912,
    smem_per_sm=167936, l2_bytes=40 * 2**20, peak_tflops_bf16=312.0, mem_bandwidth_gbs=2039.0,
)
KNOWN_DEVICES = {d.name: d for d in (H200, H100, A100)}
SIM_DEVICE = H200  # what the SIMULATED device models (here: a launch names it before Ray starts)


def spec_for(name: str, cc: int, sm_count: int, smem_optin: int, smem_per_sm: int,
             l2_bytes: int) -> DeviceSpec:
    """A spec for a live GPU: the known entry's rates where we have them, its real limits always."""
    base = KNOWN_DEVICES.get(name)
    return DeviceSpec(
        name=name, cc=cc, sm_count=sm_count, smem_per_block_optin=smem_optin,
        smem_per_sm=smem_per_sm, l2_bytes=l2_bytes,
        peak_tflops_bf16=base.peak_tflops_bf16 if base else 0.0,
        mem_bandwidth_gbs=base.mem_bandwidth_gbs if base else 0.0,
        stream_read_gbs=base.stream_read_gbs if base else 0.0,
        arch_suffix="a" if cc == 90 else "",
    )
