"""Length-prefixed pickle frames over a pipe: how the driver talks to its helper processes
(compiler workers, the sampler host); and the PYTHONPATH those (and Ray's workers) start with.

These helpers are started with subprocess (start_new_session), not multiprocessing: each must
own a process group from its first instruction, so that a kill at a compile's deadline takes
nvcc's children with it and a terminal's Ctrl-C reaches the driver alone; a multiprocessing
child starts in the caller's group (and spawns 60 ms slower: 0.18 against 0.11 s here), and
multiprocessing.connection's Pipe joins only the children multiprocessing starts. The GPU
worker of `tunefw verify` (evaluate/isolated.py), which needs neither, is a Pipe with poll()."""
from __future__ import annotations

import os
import pickle
import struct
from pathlib import Path
from typing import Any


def helper_pythonpath() -> str:
    """PYTHONPATH for a process the driver starts: the folder holding this tunefw package first
    (a helper imports the driver's tunefw, not another one installed), then the driver's own."""
    root = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)


def send(stream, obj: Any) -> None:
    """Write one object as an 8-byte little-endian length and its pickle, then flush."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def recv(stream) -> Any:
    """Read one object written by send(); None when the stream ended."""
    header = stream.read(8)
    if len(header) < 8:
        return None
    return pickle.loads(stream.read(struct.unpack("<Q", header)[0]))
