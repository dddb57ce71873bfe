"""Sweep figures on the study (trials/s, GPU busy) and retry attempts on trials."""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    with op.batch_alter_table("tunefw_study") as batch:
        batch.add_column(sa.Column("stats", sa.JSON, nullable=True))
    with op.batch_alter_table("tunefw_trial") as batch:
        batch.add_column(sa.Column("attempts", sa.Integer, nullable=False, server_default="1"))
