"""batch_bucket: the batch-size bucket (verify_tuner.batches) joins the key of studies and best configs;
studies get an owner and a heartbeat, so tuner processes on several GPUs or hosts share out the
keys of one job (verify_tuner.jobs.claims).

Why: an inference server verifies B requests in one launch and the grid is B x H/HT x NSPLIT
blocks, so the best NSPLIT at B=32 is not the one at B=1. Every existing row was tuned with one
request per launch and becomes batch bucket 0 (B=1); the unique key of best_configs gains the
column. A downgrade keeps every B=1 row and drops the rows of other batch buckets (the older
schema cannot tell them from B=1 rows).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

OLD_KEY = ["device_id", "kernel_id", "dtype", "H", "q_len", "bucket"]


def upgrade() -> None:
    with op.batch_alter_table("tuning_studies") as t:
        t.add_column(sa.Column("batch_bucket", sa.Integer, nullable=False, server_default="0"))
        t.add_column(sa.Column("owner", sa.String(200), nullable=True))
        t.add_column(sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("best_configs") as t:
        t.add_column(sa.Column("batch_bucket", sa.Integer, nullable=False, server_default="0"))
        t.drop_constraint("uq_best_key", type_="unique")
        t.create_unique_constraint("uq_best_key", [*OLD_KEY, "batch_bucket"])


def downgrade() -> None:
    op.execute("DELETE FROM best_configs WHERE batch_bucket <> 0")
    with op.batch_alter_table("best_configs") as t:
        t.drop_constraint("uq_best_key", type_="unique")
        t.create_unique_constraint("uq_best_key", OLD_KEY)
        t.drop_column("batch_bucket")
    with op.batch_alter_table("tuning_studies") as t:
        t.drop_column("heartbeat_at")
        t.drop_column("owner")
        t.drop_column("batch_bucket")
