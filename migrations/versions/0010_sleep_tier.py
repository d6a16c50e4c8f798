"""The sleep tier: deployments.sleep_timeout_s, replica_lifetimes.sleeps

A deployment's idle replicas may sleep for `sleep_timeout_s` (0, the default, keeps
today's behaviour: they stop) before they stop: the process and its weights (in host
memory) stay, its GPUs go back to the pool and bill nothing. A lifetime's `sleeps` are
the times its replica fell asleep and woke, in turn (`sleeping`, `waking` events): an
odd count means it sleeps now. Its GPU time is placed_at to its end minus those spans
(controlplane/billing/lifetimes.py).

Revision ID: 0010
Revises: 0009
Create Date: 2027-04-20
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('deployments', sa.Column('sleep_timeout_s', sa.Float(), server_default=sa.text('0'),
                                           nullable=False))
    op.add_column('replica_lifetimes', sa.Column('sleeps', postgresql.ARRAY(sa.DateTime(timezone=True)),
                                                 server_default=sa.text("'{}'"), nullable=False))


def downgrade() -> None:
    op.drop_column('replica_lifetimes', 'sleeps')
    op.drop_column('deployments', 'sleep_timeout_s')
