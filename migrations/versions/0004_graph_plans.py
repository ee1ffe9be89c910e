"""graph_plans, best_verifications, and a verdict on best_configs.

Why: kernel v4 serves every prefix of a captured CUDA graph with one config, so an engine needs,
per batch bucket, the one config best over the prefix range it replays and what it costs at each
prefix bucket (its regret): graph_plans holds those, keyed by the range and the prefix weights'
digest, with when and on what they were measured. `tuner configs verify` re-times stored bests
against the heuristic after a driver, CUDA or clock change: every verification is kept in
best_verifications (nothing is deleted), and best_configs.verdict marks the row's latest one, so
the sidecar stops serving a row that no longer wins; storing the row again (a re-tune) clears it.
A downgrade drops the plans, the history and the marks; the best configs themselves stay.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _key() -> list[sa.Column]:
    return [
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("kernel_id", sa.Integer, sa.ForeignKey("kernels.id"), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("H", sa.Integer, nullable=False),
        sa.Column("q_len", sa.Integer, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "graph_plans",
        *_key(),
        sa.Column("batch_bucket", sa.Integer, nullable=False),
        sa.Column("bucket_lo", sa.Integer, nullable=False),
        sa.Column("bucket_hi", sa.Integer, nullable=False),
        sa.Column("weights_digest", sa.String(64), nullable=False),
        sa.Column("weights", sa.JSON, nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("expected_us", sa.Float, nullable=False),
        sa.Column("per_bucket", sa.JSON, nullable=False),
        sa.Column("finalists", sa.JSON, nullable=False),
        sa.Column("batch", sa.Integer, nullable=False),
        sa.Column("spread", sa.String(16), nullable=False),
        sa.Column("rounds", sa.Integer, nullable=False),
        sa.Column("measured_by", sa.Text, nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint(
            "device_id",
            "kernel_id",
            "dtype",
            "H",
            "q_len",
            "batch_bucket",
            "bucket_lo",
            "bucket_hi",
            "weights_digest",
            name="uq_graph_plan_key",
        ),
    )
    op.create_table(
        "best_verifications",
        *_key(),
        sa.Column("bucket", sa.Integer, nullable=False),
        sa.Column("batch_bucket", sa.Integer, nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("stored_us", sa.Float, nullable=True),
        sa.Column("measured_us", sa.Float, nullable=True),
        sa.Column("measured_p10_us", sa.Float, nullable=True),
        sa.Column("measured_p90_us", sa.Float, nullable=True),
        sa.Column("heuristic_params", sa.JSON, nullable=False),
        sa.Column("heuristic_us", sa.Float, nullable=True),
        sa.Column("heuristic_p10_us", sa.Float, nullable=True),
        sa.Column("heuristic_p90_us", sa.Float, nullable=True),
        sa.Column("noise", sa.Float, nullable=True),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("measured_by", sa.Text, nullable=False),
        sa.Column("verified_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_best_verifications_device_id", "best_verifications", ["device_id"])
    with op.batch_alter_table("best_configs") as t:
        t.add_column(sa.Column("verdict", sa.String(16), nullable=True))
        t.add_column(sa.Column("verified_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("best_configs") as t:
        t.drop_column("verified_at")
        t.drop_column("verdict")
    op.drop_index("ix_best_verifications_device_id", table_name="best_verifications")
    op.drop_table("best_verifications")
    op.drop_table("graph_plans")
