"""Write one small SQLite database per released schema revision: rev<REVISION>.sqlite3 (not .db: the repo ignores those).

Run once when a migration is released (`python3 tests/data/schema/make.py 0003`), commit the
file and never regenerate an old one: each is what that revision's tunefw left on disk, and
tests/test_schema_upgrades.py upgrades a copy of each to head. The schema comes from Alembic at
that revision; the rows (a study of two problems, four trials of several outcomes, a winner;
from 0003 on also a WORKER_LOST row and its retry, from 0005 on a killed launch's lease; 0006
added the problems' gate column, whose default every older row takes) are
written with only the tables and columns the revision has, as its code wrote them (columns a
revision lacks are dropped: from 0004 on the rows keep ptxas's figures of the compiled trials).
"""
from __future__ import annotations

import sqlite3
import sys
from datetime import datetime, timezone
from pathlib import Path

from alembic import command
from sqlalchemy import MetaData, create_engine, insert

from tunefw.store.session import alembic_config

HERE = Path(__file__).resolve().parent
CREATED = datetime(2026, 1, 15, 12, 0, tzinfo=timezone.utc)
FP = {"name": "NVIDIA H200", "cc": 90, "sm_count": 132, "driver": "570.86", "cuda": "12.8",
      "compiler": "nvrtc 12.8", "sm_clock_mhz": 1980, "power_limit_w": 700}
SPEC = {"name": "frozen", "dtype": "bf16", "families": ["mma_sm80", "wgmma_sm90"],
        "sampler": "tpe", "trials": 4, "timeout_s": 60, "seed": 0, "confirm_top": 3,
        "reuse": True, "problems": [
            {"M": 4096, "N": 4096, "K": 4096, "dtype": "bf16", "layout": "TN", "label": ""},
            {"M": 128, "N": 6144, "K": 4096, "dtype": "bf16", "layout": "TN", "label": "qkv"}]}
MMA = {"BM": 128, "BN": 128, "BK": 32, "WM": 64, "WN": 64, "STAGES": 4}
WGMMA = {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "CLUSTER_M": 2}


def rows() -> dict[str, list[dict]]:
    """Every row, by table, with every column any revision has (extra ones are dropped)."""
    trial = {"study_id": 1, "round": 0, "source_hash": "0123456789abcdef", "log": "",
             "fingerprint": FP, "fingerprint_key": "fedcba9876543210", "gpu": "0",
             "evaluator": "cuda", "created_at": CREATED, "attempts": 1, "reused_from": None,
             "median_ms": None, "min_ms": None, "iqr_ms": None, "tflops": None, "rel_err": None,
             "cublas_tflops": None, "compile_s": None, "retry_of": None, "ptxas_regs": None,
             "ptxas_smem_bytes": None, "ptxas_spill_bytes": None}
    return {
        "tunefw_meta": [{"key": "schema_version", "value": "1"}],
        "tunefw_study": [{"id": 1, "name": "frozen", "created_at": CREATED, "spec": SPEC,
                          "round": 0, "fingerprint": FP,
                          "space_hashes": {"mma_sm80": "aaaa", "wgmma_sm90": "bbbb"},
                          "backend": "cuda", "stats": {"trials": 4, "trials_per_s": 3.1}}],
        "tunefw_problem": [
            {"id": 1, "study_id": 1, "key": "4096x4096x4096:bf16:TN", "M": 4096, "N": 4096,
             "K": 4096, "dtype": "bf16", "layout": "TN", "label": ""},
            {"id": 2, "study_id": 1, "key": "128x6144x4096:bf16:TN", "M": 128, "N": 6144,
             "K": 4096, "dtype": "bf16", "layout": "TN", "label": "qkv"}],
        "tunefw_trial": [
            dict(trial, id=1, problem_id=1, optuna_trial=0, family="wgmma_sm90", config=WGMMA,
                 config_key="k-wgmma", status="OK", median_ms=0.2, min_ms=0.19, iqr_ms=0.004,
                 tflops=687.2, rel_err=0.0011, cublas_tflops=701.5, compile_s=3.2, ptxas_regs=168,
                 ptxas_smem_bytes=0, ptxas_spill_bytes=0),
            dict(trial, id=2, problem_id=1, optuna_trial=1, family="mma_sm80", config=MMA,
                 config_key="k-mma", status="WRONG_ANSWER", log="3 rows over their limit",
                 rel_err=0.4, compile_s=1.1, attempts=2, ptxas_regs=122, ptxas_smem_bytes=0,
                 ptxas_spill_bytes=16),
            dict(trial, id=3, problem_id=2, optuna_trial=0, family="mma_sm80",
                 config=dict(MMA, BM=256), config_key="k-invalid", status="INVALID",
                 log="BM=256: tile taller than M", fingerprint={}, fingerprint_key="", gpu="",
                 evaluator=""),
            dict(trial, id=4, problem_id=2, optuna_trial=1, family="mma_sm80", config=MMA,
                 config_key="k-mma", status="OK", median_ms=0.05, min_ms=0.049, iqr_ms=0.001,
                 tflops=128.9, rel_err=0.0009, cublas_tflops=160.2, compile_s=1.0),
            dict(trial, id=5, problem_id=2, optuna_trial=None, family="mma_sm80",
                 config=dict(MMA, STAGES=3), config_key="k-mma3", status="WORKER_LOST",
                 log="attempt 1: WORKER_LOST (worker process died)", since="0003"),
            dict(trial, id=6, problem_id=2, optuna_trial=2, family="mma_sm80",
                 config=dict(MMA, STAGES=3), config_key="k-mma3", status="OK", median_ms=0.06,
                 min_ms=0.059, iqr_ms=0.001, tflops=110.0, rel_err=0.0009,
                 cublas_tflops=160.2, compile_s=1.0, attempts=2, retry_of=5, since="0003")],
        "tunefw_winner": [{"problem_id": 1, "trial_id": 1, "family": "wgmma_sm90",
                           "config": WGMMA, "tflops": 690.0, "cublas_tflops": 700.0,
                           "confirmed": True, "fingerprint": FP, "evaluator": "cuda"}],
        # the lease of a launch killed with -9 (from 0005 on): stale, taken over by the next
        "tunefw_launch_lease": [{"study_id": 1, "token": "0123456789abcdef0123456789abcdef",
                                 "host": "gpu-node-7", "pid": 4242, "started_at": CREATED,
                                 "beat_at": CREATED, "beats": 12, "timeout_s": 60.0,
                                 "since": "0005"}],
    }


def make(revision: str) -> Path:
    path = HERE / f"rev{revision}.sqlite3"
    path.unlink(missing_ok=True)
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        command.upgrade(alembic_config(engine, conn), revision)
        meta = MetaData()
        meta.reflect(conn)
        for table, table_rows in rows().items():
            if table not in meta.tables:  # a table of a later revision
                continue
            columns = set(meta.tables[table].c.keys())
            conn.execute(insert(meta.tables[table]),
                         [{k: v for k, v in r.items() if k in columns} for r in table_rows
                          if r.get("since", revision) <= revision])
    engine.dispose()
    con = sqlite3.connect(path)
    con.execute("VACUUM")
    con.close()
    return path


if __name__ == "__main__":
    for rev in sys.argv[1:]:
        print(make(rev))
