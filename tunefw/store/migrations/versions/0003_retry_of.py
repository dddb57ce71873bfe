"""A trial row's link to the WORKER_LOST row of the attempt before it (its retry_of)."""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    with op.batch_alter_table("tunefw_trial") as batch:
        batch.add_column(sa.Column("retry_of", sa.Integer, nullable=True))
