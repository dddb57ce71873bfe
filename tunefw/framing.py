"""Length-prefixed pickle frames over a pipe: how the driver talks to its helper processes
(compiler workers, the sampler host)."""
from __future__ import annotations

import pickle
import struct
from typing import Any


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
