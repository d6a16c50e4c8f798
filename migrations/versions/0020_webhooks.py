"""Signed webhooks: webhook_endpoints, webhook_events, webhook_deliveries, webhook_attempts

Endpoints a tenant registers for its own events or the operator for any tenant's (or,
with no tenant, every event); each holds its signing secret sealed. An event is written
once per dedupe key, with one delivery per endpoint that matched it; a worker claims due
deliveries (the partial index on next_attempt_at), records each attempt, and retries
with backoff until the delivery succeeds or is given up (controlplane.webhooks).

Revision ID: 0020
Revises: 0019
Create Date: 2027-06-10
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None


def upgrade() -> None:
    _endpoints()
    op.create_table(
        'webhook_events',
        sa.Column('id', sa.Text(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=True),
        sa.Column('type', sa.Text(), nullable=False),
        sa.Column('payload', postgresql.JSONB(), nullable=False),
        sa.Column('dedupe_key', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('dedupe_key'))
    op.create_index('ix_webhook_events_tenant_id', 'webhook_events', ['tenant_id'])
    _deliveries()
    op.create_table(
        'webhook_attempts',
        sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('delivery_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('number', sa.Integer(), nullable=False),
        sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('duration_ms', sa.Float(), nullable=False),
        sa.Column('status_code', sa.Integer(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(['delivery_id'], ['webhook_deliveries.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('uq_webhook_attempts_delivery_number', 'webhook_attempts',
                    ['delivery_id', 'number'], unique=True)


def _endpoints() -> None:
    op.create_table(
        'webhook_endpoints',
        sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=True),
        sa.Column('operator', sa.Boolean(), nullable=False),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('event_types', sa.ARRAY(sa.Text()), nullable=False),
        sa.Column('enabled', sa.Boolean(), nullable=False),
        sa.Column('description', sa.Text(), nullable=True),
        sa.Column('secret_sealed', sa.LargeBinary(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint('operator OR tenant_id IS NOT NULL', name='ck_webhook_endpoints_owner'),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_webhook_endpoints_tenant_id', 'webhook_endpoints', ['tenant_id'])


def _deliveries() -> None:
    op.create_table(
        'webhook_deliveries',
        sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('event_id', sa.Text(), nullable=False),
        sa.Column('endpoint_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('status', sa.Text(), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('claim_id', sa.Uuid(as_uuid=False), nullable=True),
        sa.Column('last_status_code', sa.Integer(), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'succeeded', 'failed')",
                           name='ck_webhook_deliveries_status'),
        sa.CheckConstraint("(status = 'pending') = (next_attempt_at IS NOT NULL)",
                           name='ck_webhook_deliveries_due'),
        sa.ForeignKeyConstraint(['event_id'], ['webhook_events.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['endpoint_id'], ['webhook_endpoints.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('uq_webhook_deliveries_event_endpoint', 'webhook_deliveries',
                    ['event_id', 'endpoint_id'], unique=True)
    op.create_index('ix_webhook_deliveries_due', 'webhook_deliveries', ['next_attempt_at'],
                    postgresql_where=sa.text("status = 'pending'"))
    op.create_index('ix_webhook_deliveries_endpoint', 'webhook_deliveries',
                    ['endpoint_id', 'created_at'])


def downgrade() -> None:
    for table in ('webhook_attempts', 'webhook_deliveries', 'webhook_events', 'webhook_endpoints'):
        op.drop_table(table)
