"""The cold start's load apart from its download: replica_lifetimes.loading_at

The pool's `loading` event (the weights are in the node's cache; the runtime process
starts and loads them) is recorded as `loading_at`, so the console's cold-start
waterfall shows download (placed_at to loading_at) and load (loading_at to ready_at)
as two stages. Rows written before this migration keep NULL: their download and load
stay one stage.

Revision ID: 0007
Revises: 0006
Create Date: 2027-03-20
"""
from alembic import op
import sqlalchemy as sa

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('replica_lifetimes',
                  sa.Column('loading_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column('replica_lifetimes', 'loading_at')
