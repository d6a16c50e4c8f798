"""initial schema

Revision ID: 0001
Revises: (none)
Create Date: 2026-12-02
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('replica_lifetimes',
    sa.Column('replica_id', sa.Text(), nullable=False),
    sa.Column('revision_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('deployment_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('slot_ids', sa.ARRAY(sa.Text()), nullable=False),
    sa.Column('state', sa.Text(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ready_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('stopped_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('replica_id')
    )
    op.create_index(op.f('ix_replica_lifetimes_tenant_id'), 'replica_lifetimes', ['tenant_id'], unique=False)
    op.create_table('tenants',
    sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('usage_events',
    sa.Column('invocation_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('request_id', sa.Text(), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('api_key_id', sa.Uuid(as_uuid=False), nullable=True),
    sa.Column('deployment_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('deployment_name', sa.Text(), nullable=False),
    sa.Column('revision_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('revision_name', sa.Text(), nullable=False),
    sa.Column('model', sa.Text(), nullable=False),
    sa.Column('endpoint', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('cached_tokens', sa.BigInteger(), nullable=False),
    sa.Column('completion_tokens', sa.BigInteger(), nullable=False),
    sa.Column('queue_s', sa.Float(), nullable=True),
    sa.Column('cold_start_s', sa.Float(), nullable=True),
    sa.Column('ttft_s', sa.Float(), nullable=True),
    sa.Column('total_s', sa.Float(), nullable=False),
    sa.Column('cost', sa.Numeric(precision=30, scale=15), nullable=False),
    sa.Column('replica_id', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('invocation_id')
    )
    op.create_index('ix_usage_tenant_started', 'usage_events', ['tenant_id', 'started_at'], unique=False)
    op.create_table('api_keys',
    sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('prefix', sa.Text(), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('scopes', sa.ARRAY(sa.Text()), nullable=False),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('requests_per_min', sa.Integer(), nullable=True),
    sa.Column('tokens_per_min', sa.Integer(), nullable=True),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key_hash'),
    sa.UniqueConstraint('prefix')
    )
    op.create_index(op.f('ix_api_keys_tenant_id'), 'api_keys', ['tenant_id'], unique=False)
    op.create_table('deployments',
    sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('min_replicas', sa.Integer(), nullable=False),
    sa.Column('max_replicas', sa.Integer(), nullable=False),
    sa.Column('target_concurrency', sa.Integer(), nullable=False),
    sa.Column('idle_timeout_s', sa.Float(), nullable=False),
    sa.Column('traffic', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_deployments_tenant_id'), 'deployments', ['tenant_id'], unique=False)
    op.create_index('uq_deployments_tenant_name', 'deployments', ['tenant_id', 'name'], unique=True, postgresql_where=sa.text('deleted_at IS NULL'))
    op.create_table('revisions',
    sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('deployment_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('number', sa.Integer(), nullable=False),
    sa.Column('model_uri', sa.Text(), nullable=False),
    sa.Column('architecture', sa.Text(), nullable=True),
    sa.Column('engine', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('gpu_memory_gb', sa.Float(), nullable=False),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('input_per_mtok', sa.Numeric(precision=18, scale=9), nullable=False),
    sa.Column('cached_input_per_mtok', sa.Numeric(precision=18, scale=9), nullable=False),
    sa.Column('output_per_mtok', sa.Numeric(precision=18, scale=9), nullable=False),
    sa.Column('gpu_second', sa.Numeric(precision=18, scale=9), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('uq_revisions_deployment_number', 'revisions', ['deployment_id', 'number'], unique=True)


def downgrade() -> None:
    op.drop_index('uq_revisions_deployment_number', table_name='revisions')
    op.drop_table('revisions')
    op.drop_index('uq_deployments_tenant_name', table_name='deployments', postgresql_where=sa.text('deleted_at IS NULL'))
    op.drop_index(op.f('ix_deployments_tenant_id'), table_name='deployments')
    op.drop_table('deployments')
    op.drop_index(op.f('ix_api_keys_tenant_id'), table_name='api_keys')
    op.drop_table('api_keys')
    op.drop_index('ix_usage_tenant_started', table_name='usage_events')
    op.drop_table('usage_events')
    op.drop_table('tenants')
    op.drop_index(op.f('ix_replica_lifetimes_tenant_id'), table_name='replica_lifetimes')
    op.drop_table('replica_lifetimes')
