"""Reading a kernel's machine code out of a cubin (ELF), to compare builds without names."""
import struct


def kernel_text(cubin: bytes, lowered: str) -> bytes:
    """Bytes of the kernel's .text section in an ELF cubin (the code, without names)."""
    assert cubin[:4] == b"\x7fELF"
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = []
    for i in range(shnum):
        name, _t, _f, _a, off, size = struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
        sections.append((name, off, size))
    _, stroff, _ = sections[shstrndx]
    for name, off, size in sections:
        end = cubin.index(b"\x00", stroff + name)
        if cubin[stroff + name:end].decode() == f".text.{lowered}":
            return cubin[off:off + size]
    raise AssertionError(f".text.{lowered} not in cubin")
