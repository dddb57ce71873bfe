"""Initial schema: studies, problems, trials, winners, meta."""
import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "tunefw_meta",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_table(
        "tunefw_study",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("fingerprint", sa.JSON, nullable=True),
        sa.Column("space_hashes", sa.JSON, nullable=True),
        sa.Column("backend", sa.String(16), nullable=True),
    )
    op.create_table(
        "tunefw_problem",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tunefw_study.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("key", sa.String(100), nullable=False),
        sa.Column("M", sa.Integer, nullable=False),
        sa.Column("N", sa.Integer, nullable=False),
        sa.Column("K", sa.Integer, nullable=False),
        sa.Column("dtype", sa.String(8), nullable=False),
        sa.Column("layout", sa.String(8), nullable=False),
        sa.Column("label", sa.String(200), nullable=False),
        sa.UniqueConstraint("study_id", "key"),
    )
    op.create_table(
        "tunefw_trial",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tunefw_study.id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("problem_id", sa.Integer,
                  sa.ForeignKey("tunefw_problem.id", ondelete="CASCADE"), nullable=False,
                  index=True),
        sa.Column("round", sa.Integer, nullable=False),
        sa.Column("optuna_trial", sa.Integer, nullable=True),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("config_key", sa.String(64), nullable=False, index=True),
        sa.Column("source_hash", sa.String(32), nullable=False),
        sa.Column("status", sa.String(24), nullable=False, index=True),
        sa.Column("log", sa.Text, nullable=False),
        sa.Column("median_ms", sa.Float, nullable=True),
        sa.Column("min_ms", sa.Float, nullable=True),
        sa.Column("iqr_ms", sa.Float, nullable=True),
        sa.Column("tflops", sa.Float, nullable=True),
        sa.Column("rel_err", sa.Float, nullable=True),
        sa.Column("cublas_tflops", sa.Float, nullable=True),
        sa.Column("fingerprint", sa.JSON, nullable=False),
        sa.Column("fingerprint_key", sa.String(32), nullable=False, index=True),
        sa.Column("gpu", sa.String(128), nullable=False),
        sa.Column("evaluator", sa.String(16), nullable=False),
        sa.Column("compile_s", sa.Float, nullable=True),
        sa.Column("reused_from", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "tunefw_winner",
        sa.Column("problem_id", sa.Integer,
                  sa.ForeignKey("tunefw_problem.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("tunefw_trial.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("family", sa.String(32), nullable=False),
        sa.Column("config", sa.JSON, nullable=False),
        sa.Column("tflops", sa.Float, nullable=False),
        sa.Column("cublas_tflops", sa.Float, nullable=True),
        sa.Column("confirmed", sa.Boolean, nullable=False),
        sa.Column("fingerprint", sa.JSON, nullable=False),
        sa.Column("evaluator", sa.String(16), nullable=False),
    )
