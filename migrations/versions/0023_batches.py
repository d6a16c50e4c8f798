"""The OpenAI Batch API: batch_files, batches, batch_lines

`batch_files` holds the metadata of a tenant's files (bytes in the models bucket under
its own prefix); `batches` one row per batch; `batch_lines` one row per request of a
batch, with its status, attempts and its line of the output or error file, so a
control plane killed mid-batch loses nothing and runs no line twice. The price book
gains a `tier` (interactive, the rows so far; or batch): a batch line is priced from the
batch rows, else from the interactive ones times the settings' discount.

Revision ID: 0023
Revises: 0022
Create Date: 2027-07-01
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0023'
down_revision = '0022'
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column('prices', sa.Column('tier', sa.Text(), nullable=False,
                                      server_default=sa.text("'interactive'")))
    op.create_check_constraint('ck_prices_tier', 'prices', "tier IN ('interactive', 'batch')")
    op.drop_index('uq_prices_scope_effective_from', table_name='prices')
    op.create_index('uq_prices_scope_effective_from', 'prices',
                    ['tenant_id', 'deployment_id', 'adapter_id', 'tier', 'effective_from'],
                    unique=True, postgresql_nulls_not_distinct=True)
    op.create_table(
        'batch_files',
        sa.Column('id', sa.Text(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('purpose', sa.Text(), nullable=False),
        sa.Column('filename', sa.Text(), nullable=False),
        sa.Column('bytes', sa.BigInteger(), nullable=False),
        sa.Column('object_key', sa.Text(), nullable=False),
        sa.Column('created_at', TZ, nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_batch_files_tenant_created', 'batch_files', ['tenant_id', 'created_at'])
    op.create_table(
        'batches',
        sa.Column('id', sa.Text(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('api_key_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('endpoint', sa.Text(), nullable=False),
        sa.Column('input_file_id', sa.Text(), nullable=False),
        sa.Column('completion_window', sa.Text(), nullable=False),
        sa.Column('status', sa.Text(), nullable=False),
        sa.Column('metadata', postgresql.JSONB(), nullable=True),
        sa.Column('output_file_id', sa.Text(), nullable=True),
        sa.Column('error_file_id', sa.Text(), nullable=True),
        sa.Column('total', sa.Integer(), nullable=False),
        sa.Column('created_at', TZ, nullable=False),
        sa.Column('expires_at', TZ, nullable=False),
        sa.Column('finalizing_at', TZ, nullable=True),
        sa.Column('completed_at', TZ, nullable=True),
        sa.Column('expired_at', TZ, nullable=True),
        sa.Column('cancelling_at', TZ, nullable=True),
        sa.Column('cancelled_at', TZ, nullable=True),
        sa.CheckConstraint("status IN ('in_progress', 'finalizing', 'completed', 'failed', "
                           "'expired', 'cancelling', 'cancelled')", name='ck_batches_status'),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_batches_tenant_created', 'batches', ['tenant_id', 'created_at'])
    op.create_index('ix_batches_open', 'batches', ['status'], postgresql_where=sa.text(
        "status IN ('in_progress', 'finalizing', 'cancelling')"))
    op.create_table(
        'batch_lines',
        sa.Column('batch_id', sa.Text(), nullable=False),
        sa.Column('line', sa.Integer(), nullable=False),
        sa.Column('custom_id', sa.Text(), nullable=True),
        sa.Column('model', sa.Text(), nullable=True),
        sa.Column('body', sa.Text(), nullable=True),
        sa.Column('status', sa.Text(), nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('not_before', TZ, nullable=True),
        sa.Column('result', sa.Text(), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'running', 'succeeded', 'failed', 'expired', "
                           "'cancelled')", name='ck_batch_lines_status'),
        sa.ForeignKeyConstraint(['batch_id'], ['batches.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('batch_id', 'line'))
    op.create_index('ix_batch_lines_pending', 'batch_lines', ['batch_id', 'model'],
                    postgresql_where=sa.text("status = 'pending'"))


def downgrade() -> None:
    op.drop_index('ix_batch_lines_pending', table_name='batch_lines')
    op.drop_table('batch_lines')
    op.drop_index('ix_batches_open', table_name='batches')
    op.drop_index('ix_batches_tenant_created', table_name='batches')
    op.drop_table('batches')
    op.drop_index('ix_batch_files_tenant_created', table_name='batch_files')
    op.drop_table('batch_files')
    op.execute("DELETE FROM prices WHERE tier = 'batch'")
    op.drop_index('uq_prices_scope_effective_from', table_name='prices')
    op.create_index('uq_prices_scope_effective_from', 'prices',
                    ['tenant_id', 'deployment_id', 'adapter_id', 'effective_from'],
                    unique=True, postgresql_nulls_not_distinct=True)
    op.drop_constraint('ck_prices_tier', 'prices', type_='check')
    op.drop_column('prices', 'tier')
