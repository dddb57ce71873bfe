"""The launch lease: one row per study while a launch runs it (tunefw/store/lease.py)."""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_table(
        "tunefw_launch_lease",
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tunefw_study.id", ondelete="CASCADE"),
                  primary_key=True, autoincrement=False),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("beats", sa.Integer, nullable=False),
        sa.Column("timeout_s", sa.Float, nullable=False),
    )
