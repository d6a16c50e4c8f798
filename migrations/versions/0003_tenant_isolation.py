"""model sources, the operator's price book, tenant quotas, model uploads (issue 14)

Prices leave the revisions: they were set by tenants in their deploy bodies,
which let a tenant price its own usage at zero. From this migration on, usage is
priced by the operator's book (`prices`): usage rows already written keep the
cost stored on them; GPU-seconds are priced by the book for all time, from the
default row the control plane seeds from its settings at its next start. The
prices tenants had set are dropped, not carried over.

Revision ID: 0003
Revises: 0002
Create Date: 2027-02-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

PRICE_COLUMNS = ('input_per_mtok', 'cached_input_per_mtok', 'output_per_mtok', 'gpu_second')


def _price(name: str) -> sa.Column:
    return sa.Column(name, sa.Numeric(precision=18, scale=9), nullable=False)


def upgrade() -> None:
    op.create_table('model_sources',
    sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('prefix', sa.Text(), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('uq_model_sources_prefix_tenant', 'model_sources', ['prefix', 'tenant_id'], unique=True, postgresql_nulls_not_distinct=True)
    op.create_table('prices',
    sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=True),
    sa.Column('deployment_id', sa.Uuid(as_uuid=False), nullable=True),
    *[_price(name) for name in (*PRICE_COLUMNS, 'per_call')],
    sa.Column('effective_from', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('deployment_id IS NULL OR tenant_id IS NOT NULL', name='ck_prices_deployment_has_tenant'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index('uq_prices_scope_effective_from', 'prices', ['tenant_id', 'deployment_id', 'effective_from'], unique=True, postgresql_nulls_not_distinct=True)
    op.create_table('tenant_quotas',
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('max_gpus', sa.Integer(), nullable=True),
    sa.Column('max_replicas_per_deployment', sa.Integer(), nullable=True),
    sa.Column('max_deployments', sa.Integer(), nullable=True),
    sa.Column('max_queued_requests', sa.Integer(), nullable=True),
    sa.Column('max_upload_bytes', sa.BigInteger(), nullable=True),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('tenant_id')
    )
    op.create_table('model_uploads',
    sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('name', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('total_bytes', sa.BigInteger(), nullable=False),
    sa.Column('files', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_index(op.f('ix_model_uploads_tenant_id'), 'model_uploads', ['tenant_id'], unique=False)
    op.create_index('uq_model_uploads_tenant_name', 'model_uploads', ['tenant_id', 'name'], unique=True, postgresql_where=sa.text("status <> 'deleted'"))
    for name in PRICE_COLUMNS:
        op.drop_column('revisions', name)


def downgrade() -> None:
    for name in PRICE_COLUMNS:
        op.add_column('revisions', sa.Column(name, sa.Numeric(precision=18, scale=9), nullable=False, server_default='0'))
        op.alter_column('revisions', name, server_default=None)
    op.drop_index('uq_model_uploads_tenant_name', table_name='model_uploads', postgresql_where=sa.text("status <> 'deleted'"))
    op.drop_index(op.f('ix_model_uploads_tenant_id'), table_name='model_uploads')
    op.drop_table('model_uploads')
    op.drop_table('tenant_quotas')
    op.drop_index('uq_prices_scope_effective_from', table_name='prices', postgresql_nulls_not_distinct=True)
    op.drop_table('prices')
    op.drop_index('uq_model_sources_prefix_tenant', table_name='model_sources', postgresql_nulls_not_distinct=True)
    op.drop_table('model_sources')
