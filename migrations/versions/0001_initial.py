"""Initial schema: devices, kernels, tuning_studies, tuning_trials, best_configs.

Our study/trial tables carry a tuning_ prefix: Optuna's RDB storage, which may share the
database, owns tables named studies and trials.

Why: the tuner needs a durable home for every measurement (including failed ones, with the
reason) and the API a table of best configs keyed by (device, kernel, dtype, H, q_len, bucket).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("compute_capability", sa.String(16), nullable=False),
        sa.Column("sm_count", sa.Integer, nullable=False),
        sa.Column("max_smem_optin", sa.Integer, nullable=False),
        sa.Column("smem_per_sm", sa.Integer, nullable=False),
        sa.Column("regs_per_sm", sa.Integer, nullable=False),
        sa.Column("regs_per_block", sa.Integer, nullable=False),
        sa.Column("max_threads_per_block", sa.Integer, nullable=False),
        sa.Column("l2_bytes", sa.Integer, nullable=False),
        sa.Column("driver_version", sa.String(32)),
        sa.Column("cuda_version", sa.String(32)),
        sa.Column("copy_bw_gbps", sa.Float),
        sa.Column("recorded_at", TS, nullable=False),
    )
    op.create_table(
        "kernels",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("source_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
    )
    op.create_table(
        "tuning_studies",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("workload_key", sa.String(400), nullable=False, unique=True),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("kernel_id", sa.Integer, sa.ForeignKey("kernels.id"), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("H", sa.Integer, nullable=False),
        sa.Column("q_len", sa.Integer, nullable=False),
        sa.Column("bucket", sa.Integer, nullable=False),
        sa.Column("prefix", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("sampler", sa.String(16), nullable=False),
        sa.Column("seed", sa.Integer),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS),
        sa.Column("n_trials", sa.Integer, nullable=False),
        sa.Column("n_ok", sa.Integer, nullable=False),
        sa.Column("n_invalid", sa.Integer, nullable=False),
        sa.Column("n_failed", sa.Integer, nullable=False),
    )
    op.create_table(
        "tuning_trials",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tuning_studies.id", ondelete="CASCADE"), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("median_us", sa.Float),
        sa.Column("p10_us", sa.Float),
        sa.Column("p90_us", sa.Float),
        sa.Column("samples", sa.JSON),
        sa.Column("rel_error", sa.Float),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_index("ix_tuning_trials_study_id", "tuning_trials", ["study_id"])
    op.create_table(
        "best_configs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("device_id", sa.Integer, sa.ForeignKey("devices.id"), nullable=False),
        sa.Column("kernel_id", sa.Integer, sa.ForeignKey("kernels.id"), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("H", sa.Integer, nullable=False),
        sa.Column("q_len", sa.Integer, nullable=False),
        sa.Column("bucket", sa.Integer, nullable=False),
        sa.Column("nsplit", sa.Integer, nullable=False),
        sa.Column("ht", sa.Integer, nullable=False),
        sa.Column("tk", sa.Integer, nullable=False),
        sa.Column("block", sa.Integer, nullable=False),
        sa.Column("extra", sa.JSON, nullable=False),
        sa.Column("median_us", sa.Float),
        sa.Column("p10_us", sa.Float),
        sa.Column("p90_us", sa.Float),
        sa.Column("default_us", sa.Float),
        sa.Column("speedup", sa.Float),
        sa.Column("study_id", sa.Integer, sa.ForeignKey("tuning_studies.id", ondelete="SET NULL")),
        sa.Column("tuned_at", TS, nullable=False),
        sa.UniqueConstraint("device_id", "kernel_id", "dtype", "H", "q_len", "bucket", name="uq_best_key"),
    )


def downgrade() -> None:
    op.drop_table("best_configs")
    op.drop_index("ix_tuning_trials_study_id", table_name="tuning_trials")
    op.drop_table("tuning_trials")
    op.drop_table("tuning_studies")
    op.drop_table("kernels")
    op.drop_table("devices")
