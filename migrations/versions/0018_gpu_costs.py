"""The operator's cost book: gpu_costs

What one GPU-second of a GPU kind (`cuda`, `cpu`: replica_lifetimes.gpu_kind, migration
0017) costs the platform, in effect from `effective_from` on; a row with no kind is the
default, for every kind without a row of its own (and GPU time of unknown kind). The
margin report (GET /v1/billing/margin) costs GPU time by it. Admin only; a tenant never
reads it. One row per kind and time (the default's NULL kind counts as one).

Revision ID: 0018
Revises: 0017
Create Date: 2027-06-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'gpu_costs',
        sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('gpu_kind', sa.Text(), nullable=True),
        sa.Column('per_gpu_second', sa.Numeric(18, 9), nullable=False),
        sa.Column('effective_from', sa.DateTime(timezone=True), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('uq_gpu_costs_kind_effective_from', 'gpu_costs',
                    ['gpu_kind', 'effective_from'], unique=True,
                    postgresql_nulls_not_distinct=True)


def downgrade() -> None:
    op.drop_index('uq_gpu_costs_kind_effective_from', table_name='gpu_costs')
    op.drop_table('gpu_costs')
