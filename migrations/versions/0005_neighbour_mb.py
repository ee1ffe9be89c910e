"""neighbour_mb: how a stored time was measured, on best configs, graph plans, verifications and studies.

Why: the tuner can now time each launch followed by a GEMM that streams N MB of weights (the rest
of an engine's layer, which leaves the kernel's instruction and data caches cold), its own time
subtracted, where it timed launches back to back before. The two conditions rank configs alike but
give different times (a short-prefix config 0.64x the default cold, 0.68x back to back), so every
stored time says which it is: 0 is back to back, what every existing row was. A study under one
condition is not resumed under the other (its workload key carries the size). A downgrade drops
the rows measured cold, which the older schema would read as back to back.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

TABLES = ("best_configs", "graph_plans", "best_verifications", "tuning_studies")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as t:
            t.add_column(sa.Column("neighbour_mb", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    # migrations run without SQLite's foreign keys (a table is altered by copying it), so the cold
    # studies' trials and references go first, by hand, as ON DELETE would have taken them
    cold = "(SELECT id FROM tuning_studies WHERE neighbour_mb <> 0)"
    op.execute(f"DELETE FROM tuning_trials WHERE study_id IN {cold}")
    op.execute(f"UPDATE best_configs SET study_id = NULL WHERE study_id IN {cold}")
    for table in TABLES:
        op.execute(f"DELETE FROM {table} WHERE neighbour_mb <> 0")
        with op.batch_alter_table(table) as t:
            t.drop_column("neighbour_mb")
