"""Asynchronous function calls kept in Postgres: function_calls

0006 gave function calls their usage columns (items, gpu_seconds on usage_events); the
calls made with `/invoke?async=true` were kept in the control plane's memory and lost
at a restart. Each is now a row: written `running` when accepted, finished with the
status and JSON body its client reads back (`body`: JSON text, ASCII-escaped, so any
answer is stored as it was), deleted after `function_call_retention_s`. Rows still
`running` when a control plane starts were cut by the restart and are marked failed.

Revision ID: 0009
Revises: 0008
Create Date: 2027-04-02
"""
from alembic import op
import sqlalchemy as sa

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('function_calls',
    sa.Column('id', sa.Text(), nullable=False),
    sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
    sa.Column('deployment_name', sa.Text(), nullable=False),
    sa.Column('status', sa.Text(), nullable=False),
    sa.Column('http_status', sa.Integer(), nullable=True),
    sa.Column('body', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("status IN ('running', 'succeeded', 'failed')", name='ck_function_calls_status'),
    sa.CheckConstraint("(status = 'running') = (finished_at IS NULL)", name='ck_function_calls_finished'),
    sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    # the sweep deletes by finished_at; a start finds the running rows (NULL) by it too
    op.create_index('ix_function_calls_finished_at', 'function_calls', ['finished_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_function_calls_finished_at', table_name='function_calls')
    op.drop_table('function_calls')
