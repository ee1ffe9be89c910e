"""data_version: one counter every write of best configs or devices bumps in its own transaction.

Why: the sidecar decides whether its cached tables are current from a cheap stamp. The old stamp,
(count, max tuned_at, max id), did not change when an import replaced a row with an older
tuned_at while another key held the newest one, so the sidecar served the replaced config
indefinitely. A counter bumped in the same transaction as the write changes on every write.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    table = op.create_table(
        "data_version",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("version", sa.BigInteger, nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "version": 0}])


def downgrade() -> None:
    op.drop_table("data_version")
