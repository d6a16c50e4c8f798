"""revisions.weights: the format a revision's weights are served in

What the deploy read of a quantized checkpoint: its format, the quantized types it
keeps and their counts, and the tensors of other types that load widened to floats
(a GGUF's IQ or Q2_K/Q3_K matrices), shown with the revision. NULL for float
checkpoints and for revisions made before this migration.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('revisions', sa.Column('weights', postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column('revisions', 'weights')
