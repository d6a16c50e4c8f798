"""Asynchronous calls in flight per tenant: tenant_quotas.max_async_calls

A tenant's calls made with `/invoke?async=true` run in the control plane until they end;
their number in flight is capped per tenant (the settings default, an admin's override
here; NULL keeps the default), so one tenant's flood cannot take every slot.

Revision ID: 0013
Revises: 0012
Create Date: 2027-05-04
"""
from alembic import op
import sqlalchemy as sa

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tenant_quotas', sa.Column('max_async_calls', sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column('tenant_quotas', 'max_async_calls')
