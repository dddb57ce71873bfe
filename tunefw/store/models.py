"""The tunefw tables (SQLAlchemy 2 ORM). Every table is prefixed ``tunefw_`` so Optuna's own
tables can live in the same database."""
from __future__ import annotations

import json
from datetime import datetime, timezone

from sqlalchemy import (JSON, Boolean, DateTime, Float, ForeignKey, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy.ext.hybrid import hybrid_property
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from tunefw.outcome import cublas_ratio

SCHEMA_VERSION = 1


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Meta(Base):
    """Key/value facts about the database itself (schema_version)."""

    __tablename__ = "tunefw_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class Study(Base):
    __tablename__ = "tunefw_study"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    spec: Mapped[dict] = mapped_column(JSON)  # the normalized study file
    round: Mapped[int] = mapped_column(Integer, default=0)
    # Fixed at the round's first launch: resuming elsewhere or after a space change is refused.
    fingerprint: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    space_hashes: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    backend: Mapped[str | None] = mapped_column(String(16), nullable=True)
    stats: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # trials/s, GPU busy
    problems: Mapped[list["Problem"]] = relationship(
        back_populates="study", cascade="all, delete-orphan", order_by="Problem.id")


class Problem(Base):
    __tablename__ = "tunefw_problem"
    __table_args__ = (UniqueConstraint("study_id", "key"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tunefw_study.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(100))
    M: Mapped[int] = mapped_column(Integer)
    N: Mapped[int] = mapped_column(Integer)
    K: Mapped[int] = mapped_column(Integer)
    dtype: Mapped[str] = mapped_column(String(8))
    layout: Mapped[str] = mapped_column(String(8))
    gate: Mapped[str] = mapped_column(String(8), default="none", server_default="none")
    label: Mapped[str] = mapped_column(String(200), default="")  # e.g. 'llama3_8b.qkv'
    study: Mapped[Study] = relationship(back_populates="problems")


class Trial(Base):
    """One evaluated (or rejected) config of one problem: written once, by the driver."""

    __tablename__ = "tunefw_trial"
    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("tunefw_study.id", ondelete="CASCADE"),
                                          index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("tunefw_problem.id", ondelete="CASCADE"),
                                            index=True)
    round: Mapped[int] = mapped_column(Integer, default=0)
    optuna_trial: Mapped[int | None] = mapped_column(Integer, nullable=True)
    family: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict] = mapped_column(JSON)
    config_key: Mapped[str] = mapped_column(String(64), index=True)  # family + canonical config
    source_hash: Mapped[str] = mapped_column(String(32), default="")
    status: Mapped[str] = mapped_column(String(24), index=True)
    log: Mapped[str] = mapped_column(Text, default="")
    median_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    min_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    iqr_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    rel_err: Mapped[float | None] = mapped_column(Float, nullable=True)
    cublas_tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    fingerprint: Mapped[dict] = mapped_column(JSON, default=dict)
    fingerprint_key: Mapped[str] = mapped_column(String(32), default="", index=True)
    gpu: Mapped[str] = mapped_column(String(128), default="")
    evaluator: Mapped[str] = mapped_column(String(16), default="")
    compile_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # ptxas's figures for the compiled kernel (None where nothing was compiled)
    ptxas_regs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ptxas_smem_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)  # static
    ptxas_spill_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=1)
    reused_from: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the WORKER_LOST row of the attempt before this one (its worker died under it)
    retry_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    @hybrid_property
    def ratio(self) -> float | None:
        """TFLOP/s over the cuBLAS TFLOP/s of the same screen: the search's objective (in SQL,
        NULL where cublas_tflops is)."""
        return cublas_ratio(self.tflops, self.cublas_tflops)

    @ratio.inplace.expression
    @classmethod
    def _ratio_expression(cls):
        return cls.tflops / cls.cublas_tflops

    def config_json(self) -> str:
        return json.dumps(self.config, sort_keys=True)


class Winner(Base):
    """A problem's confirmed best config (re-timed interleaved with cuBLAS)."""

    __tablename__ = "tunefw_winner"
    problem_id: Mapped[int] = mapped_column(
        ForeignKey("tunefw_problem.id", ondelete="CASCADE"), primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("tunefw_trial.id", ondelete="CASCADE"))
    family: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict] = mapped_column(JSON)
    tflops: Mapped[float] = mapped_column(Float)
    cublas_tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    confirmed: Mapped[bool] = mapped_column(Boolean, default=False)
    fingerprint: Mapped[dict] = mapped_column(JSON, default=dict)
    evaluator: Mapped[str] = mapped_column(String(16), default="")


class LaunchLease(Base):
    """The launch running a study now: the study's one row (its key), taken when a launch
    starts, kept fresh by its heartbeat and deleted when it ends (tunefw/store/lease.py)."""

    __tablename__ = "tunefw_launch_lease"
    study_id: Mapped[int] = mapped_column(ForeignKey("tunefw_study.id", ondelete="CASCADE"),
                                          primary_key=True, autoincrement=False)
    token: Mapped[str] = mapped_column(String(32))  # this launch's own id: beats, takeover, release
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    beat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    beats: Mapped[int] = mapped_column(Integer, default=0)
    timeout_s: Mapped[float] = mapped_column(Float)  # stale after this long without a beat
