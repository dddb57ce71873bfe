"""The Hugging Face Llama with its SwiGLU MLPs gated (``tunefw.patch(model, fuse=True,
gated=True)``) against stock, on one table: the q/k/v-fused model's table (session 27's
hf_llama3_8b_qkv state: its dispatch.json and the cubins it shipped, so every plain entry runs
the very kernel it measured) with the gated entries of the gated_h200 sweep
(benchmarks/gated_h200.py's database) added, their cubins shipped beside.

    source benchmarks/device_setup.sh && python3 benchmarks/hf_gated_h200.py --gated-db GATED.db

Then benchmarks/hf_llama_h200.py runs on the merged table with --fuse --gated and writes
$OUT/hf_llama_gated_h200.json (its own table and acceptance lines last).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from gpu_result import out_path  # noqa: E402
from tunefw.runtime.dispatch import DispatchTable, load  # noqa: E402
from tunefw.runtime.shipped import MANIFEST, read_manifest, ship_cubins  # noqa: E402

STATE = REPO / "benchmarks" / "state" / "hf_llama3_8b_qkv_state.tar.gz"


def merged(plain: DispatchTable, gated: DispatchTable) -> DispatchTable:
    """``plain``'s entries and evidence with ``gated``'s gated entries added (one GPU model)."""
    if (plain.fingerprint.get("name"), plain.fingerprint.get("cc")) != \
            (gated.fingerprint.get("name"), gated.fingerprint.get("cc")):
        raise SystemExit(f"tables of two GPUs: {plain.fingerprint} and {gated.fingerprint}")
    return replace(plain, entries=plain.entries + [e for e in gated.entries if e.gate != "none"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gated-db", required=True, help="gated_h200.py's state database")
    ap.add_argument("--work", type=Path, default=Path("/tmp/hf_gated"))
    ap.add_argument("--budget-s", type=float, default=300.0)
    args, rest = ap.parse_known_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(STATE) as tar:
        tar.extractall(work / "qkv", filter="data")
    gated_json = work / "gated.json"
    subprocess.run([sys.executable, "-m", "tunefw", "--db", f"sqlite:///{Path(args.gated_db).resolve()}",
                    "export", str(gated_json), "--study", "gated_h200"], check=True)
    gated = load(gated_json)
    table = merged(load(work / "qkv" / "dispatch.json"), gated)
    cubins = work / "qkv" / "cubins"
    manifest = read_manifest(cubins)
    shipped = ship_cubins(gated, work / "gated_cubins", manifest["arch"])
    for name, kernel in shipped["kernels"].items():  # the plain kernels keep their recorded source
        (cubins / kernel["file"]).write_bytes((work / "gated_cubins" / kernel["file"]).read_bytes())
        manifest["kernels"].setdefault(name, kernel)
    (cubins / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    path = work / "dispatch_gated.json"
    path.write_text(json.dumps(table.as_dict(), indent=1) + "\n")
    print(f"merged table: {len(table.entries)} entries "
          f"({sum(e.gate != 'none' for e in table.entries)} gated) -> {path}", flush=True)
    out = out_path("hf_llama_gated_h200.json")
    return subprocess.call([sys.executable, str(REPO / "benchmarks" / "hf_llama_h200.py"),
                            "--table", str(path), "--cubins", str(cubins), "--fuse", "--gated",
                            "--budget-s", str(args.budget_s), "--out", str(out), *rest])


if __name__ == "__main__":
    raise SystemExit(main())
