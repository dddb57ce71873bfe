"""One throwaway Ray head for a test session: launches join it with `--address` instead of each
starting (and shutting down) a Ray of its own, which cost seconds a launch on two cores."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

HEAD_GPUS = 4  # the most any launch on the head asks for (one more proves a launch did not join)
READY = "block forever"  # what `ray start --block` logs once its node is up


@dataclass
class RayHead:
    """A running head: the address launches join, the environment they need, its process."""

    address: str
    gpus: int
    env: dict[str, str] = field(default_factory=lambda: {"RAY_AUTH_MODE": "disabled"})
    process: subprocess.Popen | None = None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_ray_head(log: Path, gpus: int = HEAD_GPUS, timeout_s: float = 180) -> RayHead:
    """`ray start --head --block` in a process group of its own (so stopping it stops exactly
    it, not every Ray on the machine as `ray stop` would), returned once its node is up."""
    port = free_port()
    head = RayHead(f"127.0.0.1:{port}", gpus)
    with open(log, "w") as out:
        head.process = subprocess.Popen(
            ["ray", "start", "--head", "--block", f"--port={port}", f"--num-gpus={gpus}",
             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
             # its own agent port: two heads (pytest-xdist workers) both wanted the default
             f"--dashboard-agent-listen-port={free_port()}"],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, **head.env),
            start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if READY in log.read_text(errors="replace"):
            return head
        if head.process.poll() is not None:
            break
        time.sleep(0.2)
    stop_ray_head(head)
    raise AssertionError(f"the Ray head did not come up: {log.read_text(errors='replace')[-2000:]}")


def stop_ray_head(head: RayHead) -> None:
    """Kill the head's process group at once: SIGTERM makes a head drain for 30 s first, and
    nothing of a test's throwaway head is worth keeping."""
    try:
        os.killpg(head.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    head.process.wait(timeout=60)
