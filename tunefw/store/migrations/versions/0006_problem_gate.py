"""A problem's gate (tunefw/problem.py): "silu" for a gated GEMM, "none" (every older row)."""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("tunefw_problem") as batch:
        batch.add_column(sa.Column("gate", sa.String(8), nullable=False, server_default="none"))
