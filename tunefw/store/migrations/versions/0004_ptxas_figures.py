"""What ptxas said about each trial's kernel: registers per thread, static shared memory and
spill bytes (NULL where nothing was compiled: the simulated device, a replay, an INVALID row)."""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    with op.batch_alter_table("tunefw_trial") as batch:
        batch.add_column(sa.Column("ptxas_regs", sa.Integer, nullable=True))
        batch.add_column(sa.Column("ptxas_smem_bytes", sa.Integer, nullable=True))
        batch.add_column(sa.Column("ptxas_spill_bytes", sa.Integer, nullable=True))
