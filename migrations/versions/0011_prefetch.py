"""Prefetch: deployments.prefetch

A deployment with `prefetch` has the pool pull its revisions' weights into the node
cache when they are deployed and on each scale-up, before a request needs them; false,
the default, keeps today's behaviour (weights are pulled by a replica's cold start).

Revision ID: 0011
Revises: 0010
Create Date: 2027-04-27
"""
from alembic import op
import sqlalchemy as sa

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('deployments', sa.Column('prefetch', sa.Boolean(), server_default=sa.text('false'),
                                           nullable=False))


def downgrade() -> None:
    op.drop_column('deployments', 'prefetch')
