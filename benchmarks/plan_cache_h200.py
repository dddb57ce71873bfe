"""How often tunefw.Linear's launch path misses its argument cache inside a model, and what a miss
costs: a Hugging Face Llama (random weights, --layers deep) patched from the committed model table,
stock and patched steps alternating as in benchmarks/hf_llama_h200.py; every kernel launch
(Plan.__call__, host time) and every Plan.args call in it (a miss: the CUtensorMaps encoded
again) is counted and timed. Eager prefill 512 ran 0.934x stock with 64 wgmma_sm90 calls a step
(hf_llama_h200.json): 34 us of host time each, if they are the cause.

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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

import torch  # noqa: E402

import tunefw  # noqa: E402
from hf_llama_steps import LLAMA3_8B, Decode, Prefill, build_model, twin  # noqa: E402
from tunefw.runtime import plan as plan_module  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--state", type=Path, default=REPO / "benchmarks/state/hf_llama3_8b_state.tar.gz")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--commit", default=os.environ.get("TUNEFW_COMMIT"))
    args = ap.parse_args()
    work = Path("/tmp/plan_cache")
    with tarfile.open(args.state) as f:
        f.extractall(work)
    table = next(work.rglob("dispatch.json"))
    cubins = next(p for p in work.rglob("cubins") if p.is_dir())
    stats = {"calls": 0, "call_s": 0.0, "misses": 0, "miss_s": 0.0}
    call, miss = plan_module.Plan.__call__, plan_module.Plan.args

    def counted_call(self, *a, **k):
        t0 = time.perf_counter()
        out = call(self, *a, **k)
        stats["calls"] += 1
        stats["call_s"] += time.perf_counter() - t0
        return out

    def timed_miss(self, *a):
        t0 = time.perf_counter()
        out = miss(self, *a)
        stats["misses"] += 1
        stats["miss_s"] += time.perf_counter() - t0
        return out

    plan_module.Plan.__call__, plan_module.Plan.args = counted_call, timed_miss
    dev = torch.device("cuda")
    stock = build_model(dict(LLAMA3_8B), args.layers, dev)
    patched = twin(stock)
    tunefw.patch(patched, tunefw.Dispatcher(table, cubin_dir=cubins))
    rows = []
    with torch.no_grad():
        for label, make in (("prefill 512", lambda m: Prefill(m, 512, torch.Generator().manual_seed(512))),
                            ("decode b=16", lambda m: Decode(m, stock, 16, 512, torch.Generator().manual_seed(16)))):
            s_step, p_step = make(stock), make(patched)
            for _ in range(3):
                s_step(), p_step()
            torch.cuda.synchronize()
            stats.update(calls=0, call_s=0.0, misses=0, miss_s=0.0)
            for _ in range(args.steps):
                s_step(), p_step()
            torch.cuda.synchronize()
            row = {"case": label, "steps": args.steps, **stats,
                   "call_us_each": 1e6 * stats["call_s"] / max(1, stats["calls"]),
                   "miss_us_each": 1e6 * stats["miss_s"] / max(1, stats["misses"])}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(os.environ.get("OUT") or REPO / "benchmarks" / "results") / "plan_cache_h200.json"
    out.write_text(json.dumps({"script": "benchmarks/plan_cache_h200.py", "commit": args.commit,
                               "gpu": torch.cuda.get_device_name(), "layers": args.layers,
                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
