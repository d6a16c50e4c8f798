"""LoRA adapters: adapters, deployments.shared, usage and prices per adapter

`adapters` holds a tenant's PEFT adapters, each attached to one base deployment (the
tenant's own, or a `shared` one: the operator's catalogue base that every tenant may
call and attach adapters to). An adapter keeps what its attach read (rank, targets,
size) and the ETag and size of its two objects, which every load holds the bytes to.
Usage rows name the adapter a call ran with (NULL: the base) and how long the call
waited for it to be loaded into a warm replica (the cold-adapter stage of the
waterfall; NULL: it was loaded already); a price-book row may
name an adapter (its owner's tenant and the base deployment with it).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('deployments', sa.Column('shared', sa.Boolean(), server_default=sa.text('false'),
                                           nullable=False))
    op.create_table(
        'adapters',
        sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('name', sa.Text(), nullable=False),
        sa.Column('deployment_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('adapter_uri', sa.Text(), nullable=False),
        sa.Column('rank', sa.Integer(), nullable=False),
        sa.Column('target_modules', postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column('weight_bytes', sa.BigInteger(), nullable=False),
        sa.Column('pinned_objects', postgresql.JSONB(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('uq_adapters_tenant_name', 'adapters', ['tenant_id', 'name'], unique=True,
                    postgresql_where=sa.text('deleted_at IS NULL'))
    op.create_index('ix_adapters_deployment', 'adapters', ['deployment_id'])
    op.execute("CREATE TRIGGER adapters_notify AFTER INSERT OR UPDATE OR DELETE ON adapters "
               "FOR EACH ROW EXECUTE FUNCTION thawpool_notify_change('id')")
    op.add_column('usage_events', sa.Column('adapter_id', sa.Uuid(as_uuid=False), nullable=True))
    op.add_column('usage_events', sa.Column('adapter_name', sa.Text(), nullable=True))
    op.add_column('usage_events', sa.Column('adapter_load_s', sa.Float(), nullable=True))
    op.add_column('prices', sa.Column('adapter_id', sa.Uuid(as_uuid=False), nullable=True))
    op.create_foreign_key('fk_prices_adapter', 'prices', 'adapters', ['adapter_id'], ['id'],
                          ondelete='CASCADE')
    op.create_check_constraint('ck_prices_adapter_has_deployment', 'prices',
                               'adapter_id IS NULL OR deployment_id IS NOT NULL')
    op.drop_index('uq_prices_scope_effective_from', table_name='prices')
    op.create_index('uq_prices_scope_effective_from', 'prices',
                    ['tenant_id', 'deployment_id', 'adapter_id', 'effective_from'], unique=True,
                    postgresql_nulls_not_distinct=True)


def downgrade() -> None:
    op.drop_index('uq_prices_scope_effective_from', table_name='prices')
    op.execute("DELETE FROM prices WHERE adapter_id IS NOT NULL")
    op.create_index('uq_prices_scope_effective_from', 'prices',
                    ['tenant_id', 'deployment_id', 'effective_from'], unique=True,
                    postgresql_nulls_not_distinct=True)
    op.drop_constraint('ck_prices_adapter_has_deployment', 'prices')
    op.drop_constraint('fk_prices_adapter', 'prices')
    op.drop_column('prices', 'adapter_id')
    op.drop_column('usage_events', 'adapter_load_s')
    op.drop_column('usage_events', 'adapter_name')
    op.drop_column('usage_events', 'adapter_id')
    op.execute("DROP TRIGGER adapters_notify ON adapters")
    op.drop_table('adapters')
    op.drop_column('deployments', 'shared')
