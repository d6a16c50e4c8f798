"""Egress a tenant's function servers are granted: tenant_quotas.egress

A sandboxed function server reaches nothing (pool/sandbox.py) unless the operator
grants its tenant hosts: a JSON list of "host:port" the pool's egress proxy
(pool/egress.py) opens for it; NULL keeps the default (none).

Revision ID: 0014
Revises: 0013
Create Date: 2027-05-05
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('tenant_quotas', sa.Column('egress', postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column('tenant_quotas', 'egress')
