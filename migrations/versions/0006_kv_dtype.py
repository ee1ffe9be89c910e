"""kv_dtype: the KV cache's element format, under that name, in the key of every keyed table.

Why: the kernel is gaining fp8 caches (verify_tuner.kernels.formats): a config tuned on a bf16 cache
is not the one for an e4m3 cache, which has half the bytes a token and another shared-memory
footprint, so the cache's format is part of every key. The tables had the field already as
`dtype`, always 'bf16', a name that did not say which tensor's type it is (q and o stay bf16): it
is renamed, and every row stored before keeps 'bf16', which new columns default to. Study names
carried the value already and do not change, so existing studies resume. A downgrade drops the
rows of other formats (the older schema reads every row as bf16), their studies' trials first.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TABLES = ("tuning_studies", "best_configs", "graph_plans", "best_verifications")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as t:
            t.alter_column(
                "dtype",
                new_column_name="kv_dtype",
                existing_type=sa.String(16),
                existing_nullable=False,
                server_default="bf16",
            )


def downgrade() -> None:
    # migrations run without SQLite's foreign keys (a table is altered by copying it): the trials and
    # references of the studies that go are removed by hand, as ON DELETE would have removed them
    other = "(SELECT id FROM tuning_studies WHERE kv_dtype <> 'bf16')"
    op.execute(f"DELETE FROM tuning_trials WHERE study_id IN {other}")
    op.execute(f"UPDATE best_configs SET study_id = NULL WHERE study_id IN {other}")
    for table in TABLES:
        op.execute(f"DELETE FROM {table} WHERE kv_dtype <> 'bf16'")
        with op.batch_alter_table(table) as t:
            t.alter_column(
                "kv_dtype",
                new_column_name="dtype",
                existing_type=sa.String(16),
                existing_nullable=False,
                server_default=None,
            )
