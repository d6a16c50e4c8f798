"""revisions.pinned_objects: the ETag and size of every object a deploy read

A revision is immutable, its model's bytes too: the pool's cold starts refuse
objects whose ETag or size differ from what the deploy read (placement was sized
from those bytes). Revisions made before this migration keep NULL and are not
checked.

Revision ID: 0012
Revises: 0011
Create Date: 2027-05-04
"""
from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('revisions', sa.Column('pinned_objects', postgresql.JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column('revisions', 'pinned_objects')
