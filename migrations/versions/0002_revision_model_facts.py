"""revisions keep the model's context length and vocabulary size

The gateway checks a request against the model at the edge (token ids inside
the vocabulary, a chat's default max_tokens from the context length) without
waking a replica. Both are read from config.json at deploy; revisions made
before this migration keep NULL (the gateway then falls back as
controlplane.gateway.llm documents).

Revision ID: 0002
Revises: 0001
Create Date: 2027-01-15
"""
from alembic import op
import sqlalchemy as sa

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('revisions', sa.Column('context_length', sa.Integer(), nullable=True))
    op.add_column('revisions', sa.Column('vocab_size', sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column('revisions', 'vocab_size')
    op.drop_column('revisions', 'context_length')
