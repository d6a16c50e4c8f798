"""The kind of GPU a replica held: replica_lifetimes.gpu_kind

The pool's events that carry slot ids now name their slots' kind (pool.api.ReplicaEvent.
gpu_kind: `cuda` or `cpu`, as the node's inventory reports it), and the lifetime keeps
it, so the platform's own cost of the GPU time can be priced per kind (the operator's
cost book, migration 0018). Rows written before this migration keep NULL: their kind
is unknown, and the cost book's default prices them.

Revision ID: 0017
Revises: 0016
Create Date: 2027-06-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('replica_lifetimes', sa.Column('gpu_kind', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('replica_lifetimes', 'gpu_kind')
