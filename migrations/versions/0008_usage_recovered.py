"""Usage rows billed after a control-plane restart: usage_events.recovered

A call cut by the control plane's own death (SIGKILL, the OOM killer) is billed at the
next start from the call journal (controlplane.billing.call_journal) for what its client was
delivered, and its row is marked `recovered`, so `thawpool admin reconcile` can tell the
replica's few tokens served after the last delivery from drift. Rows written before
this migration are false.

Revision ID: 0008
Revises: 0007
Create Date: 2027-03-27
"""
from alembic import op
import sqlalchemy as sa

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('usage_events',
                  sa.Column('recovered', sa.Boolean(), nullable=False, server_default=sa.text('false')))


def downgrade() -> None:
    op.drop_column('usage_events', 'recovered')
