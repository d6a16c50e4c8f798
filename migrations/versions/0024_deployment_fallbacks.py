"""A deployment's fallbacks: deployments.fallbacks

The other deployments of its tenant a call goes to, in order, when the deployment is
cold beyond a wait, rate-limited or failing: a JSON list of {deployment, on,
cold_wait_s} (controlplane.deploy.fallback_spec); empty for every deployment so far.

Revision ID: 0024
Revises: 0023
Create Date: 2027-06-20
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

revision = '0024'
down_revision = '0023'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('deployments', sa.Column('fallbacks', JSONB(), nullable=False,
                                           server_default=sa.text("'[]'::jsonb")))


def downgrade() -> None:
    op.drop_column('deployments', 'fallbacks')
