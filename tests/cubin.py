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


def sass_instructions(cubin: bytes) -> list[str]:
    """Every SASS instruction's full mnemonic with its modifiers and shape, e.g.
    'HGMMA.64x256x16.F32.BF16' (tunefw.cuda.compiler.sass_opcodes stops at the lower-case 'x')."""
    import re
    import subprocess
    import tempfile

    from tunefw.cuda.compiler import cuobjdump_path

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        proc = subprocess.run([cuobjdump_path(), "-sass", f.name], capture_output=True,
                              text=True, timeout=120, check=True)
    return re.findall(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)",
                      proc.stdout, re.MULTILINE)
