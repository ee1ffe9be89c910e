"""graph_plans: a plan set of up to K prefix ranges per batch bucket, one row a range.

Why: one config per captured graph cost B=1 up to 1.46x at P=1218 (1.79x at P=0): short prefixes
want smaller blocks, long ones the default. An engine now captures one graph per (batch size,
prefix range), so `tuner study graph-plan` chooses up to K configs and the breakpoints between them
from one side-by-side measurement. The ranges chosen together are a set: served together, never
mixed with another set's. The set keeps the key a plan had (the table, the batch bucket, the range
measured in bucket_lo..bucket_hi, the weights' digest); each of its rows adds its own range
(range_lo..range_hi) and the unique key gains range_lo. Each row also says how the set was chosen
(max_graphs, min_saving) and the set's expected time with 1, 2, ... graphs (by_count).

Every existing plan becomes a set of one range spanning its measured range, chosen with
max_graphs 1 (by_count unknown: null). A downgrade drops the sets of more than one range, whose
rows the older schema would serve as whole-range plans, and keeps the sets of one.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SET_KEY = [
    "device_id",
    "kernel_id",
    "kv_dtype",
    "H",
    "q_len",
    "batch_bucket",
    "bucket_lo",
    "bucket_hi",
    "weights_digest",
]


def upgrade() -> None:
    with op.batch_alter_table("graph_plans") as t:
        t.add_column(sa.Column("range_lo", sa.Integer, nullable=True))
        t.add_column(sa.Column("range_hi", sa.Integer, nullable=True))
        t.add_column(sa.Column("max_graphs", sa.Integer, nullable=False, server_default="1"))
        t.add_column(sa.Column("min_saving", sa.Float, nullable=False, server_default="0"))
        t.add_column(sa.Column("by_count", sa.JSON, nullable=True))
    op.execute("UPDATE graph_plans SET range_lo = bucket_lo, range_hi = bucket_hi")
    with op.batch_alter_table("graph_plans") as t:
        t.alter_column("range_lo", existing_type=sa.Integer, nullable=False)
        t.alter_column("range_hi", existing_type=sa.Integer, nullable=False)
        t.drop_constraint("uq_graph_plan_key", type_="unique")
        t.create_unique_constraint("uq_graph_plan_key", [*SET_KEY, "range_lo"])


def downgrade() -> None:
    # every row of a set of several ranges covers less than the set's measured range
    op.execute("DELETE FROM graph_plans WHERE range_lo <> bucket_lo OR range_hi <> bucket_hi")
    with op.batch_alter_table("graph_plans") as t:
        t.drop_constraint("uq_graph_plan_key", type_="unique")
        t.create_unique_constraint("uq_graph_plan_key", SET_KEY)
        t.drop_column("by_count")
        t.drop_column("min_saving")
        t.drop_column("max_graphs")
        t.drop_column("range_hi")
        t.drop_column("range_lo")
