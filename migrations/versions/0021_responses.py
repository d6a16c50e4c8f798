"""Stored responses of the OpenAI Responses API: stored_responses

One row per response made with `store` (the default): its tenant, the deployment it
called, the chat messages its turn answered (`conversation`: earlier turns and its
input, so `previous_response_id` continues from one read) and the response object,
both as JSON text. Deleted by the tenant (DELETE /v1/responses/{id}) or by the sweep
once `response_retention_s` has passed since `created_at`.

Revision ID: 0021
Revises: 0020
Create Date: 2027-07-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0021'
down_revision = '0020'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'stored_responses',
        sa.Column('id', sa.Text(), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('model', sa.Text(), nullable=False),
        sa.Column('conversation', sa.Text(), nullable=False),
        sa.Column('response', sa.Text(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['tenant_id'], ['tenants.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'))
    op.create_index('ix_stored_responses_created_at', 'stored_responses', ['created_at'])


def downgrade() -> None:
    op.drop_index('ix_stored_responses_created_at', table_name='stored_responses')
    op.drop_table('stored_responses')
