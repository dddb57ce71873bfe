"""Where tunefw.Linear's host time goes inside a model: a Hugging Face Llama (random weights,
--layers deep) patched from the committed model table, stock and patched steps alternating as in
benchmarks/hf_llama_h200.py, with host timers (no syncs) around nn.Linear.forward (stock),
tunefw.Linear.forward (patched), each kernel launch (Plan.__call__) and each argument-cache miss
in it (Plan.args: the CUtensorMaps encoded again), per layer shape. Eager prefill 512 ran 0.934x
stock with 64 wgmma_sm90 calls a step (hf_llama_h200.json): 34 us of host time each, if they
are the cause; the microbenchmark, which reuses one input, has that call cheaper than nn.Linear.

    source benchmarks/device_setup.sh && python3 benchmarks/plan_cache_h200.py --commit SHA

Writes $OUT/plan_cache_h200.json (else benchmarks/results/) and prints one line per case.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tarfile
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402

import tunefw  # noqa: E402
from hf_llama_steps import LLAMA3_8B, TINY, Decode, Prefill, build_model, twin  # noqa: E402
from tunefw.runtime import ops  # noqa: E402
from tunefw.runtime import plan as plan_module  # noqa: E402


class Tally:
    """Host time and calls per (what, shape) of the functions it wraps."""

    def __init__(self) -> None:
        self.data: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])

    def wrap(self, owner: type, name: str, what: str, shape) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            cell = self.data[(what, shape(*args))]
            cell[0] += 1
            cell[1] += time.perf_counter() - t0
            return out

        setattr(owner, name, timed)

    def rows(self, steps: int) -> list[dict]:
        return [{"what": w, "shape": s, "calls_per_step": n / steps, "us_each": 1e6 * t / max(1, n)}
                for (w, s), (n, t) in sorted(self.data.items())]


def _linear_shape(module, x) -> str:
    return f"{x.numel() // x.shape[-1]}x{module.out_features}x{module.in_features}"


def _plan_shape(plan, *args) -> str:
    return plan.problem.key()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=Path, default=REPO / "benchmarks/state/hf_llama3_8b_state.tar.gz")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--commit", default=os.environ.get("TUNEFW_COMMIT"))
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="a tiny model on the CPU (F.linear everywhere), to check the script")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    work = Path("/tmp/plan_cache")
    with tarfile.open(args.state) as f:
        f.extractall(work)
    table = next(work.rglob("dispatch.json"))
    cubins = next(p for p in work.rglob("cubins") if p.is_dir())
    tally = Tally()
    tally.wrap(torch.nn.Linear, "forward", "nn.Linear.forward", _linear_shape)
    tally.wrap(ops.Linear, "forward", "tunefw.Linear.forward", _linear_shape)
    tally.wrap(plan_module.Plan, "__call__", "Plan.__call__", _plan_shape)
    tally.wrap(plan_module.Plan, "args", "Plan.args (miss)", _plan_shape)
    dev = torch.device("cpu" if smoke else "cuda")
    stock = build_model(dict(TINY if smoke else LLAMA3_8B), 2 if smoke else args.layers, dev)
    patched = twin(stock)
    tunefw.patch(patched, tunefw.Dispatcher(table, cubin_dir=cubins))
    tokens, batch, past = (16, 3, 8) if smoke else (512, 16, 512)
    cases = {f"prefill {tokens}": lambda m: Prefill(m, tokens, torch.Generator().manual_seed(1)),
             f"decode b={batch}": lambda m: Decode(m, stock, batch, past, torch.Generator().manual_seed(2))}
    sync = torch.cuda.synchronize if not smoke else (lambda: None)
    report = {"script": "benchmarks/plan_cache_h200.py", "commit": args.commit,
              "gpu": "CPU smoke (not a result)" if smoke else torch.cuda.get_device_name(),
              "layers": args.layers, "steps": args.steps,
              "cases": []}
    with torch.no_grad():
        for label, make in cases.items():
            s_step, p_step = make(stock), make(patched)
            for _ in range(3):
                s_step(), p_step()
            sync()
            tally.data.clear()
            for _ in range(args.steps):
                s_step(), p_step()
            sync()
            report["cases"].append({"case": label, "rows": tally.rows(args.steps)})
            for row in report["cases"][-1]["rows"]:
                print(label, json.dumps(row), flush=True)
    name = "plan_cache_cpu_smoke.json" if smoke else "plan_cache_h200.json"
    out = Path("/tmp" if smoke else os.environ.get("OUT") or REPO / "benchmarks" / "results") / name
    out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
