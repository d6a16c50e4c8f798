"""Function calls in usage rows: items and GPU seconds

A function invocation (POST /v1/functions/{name}/invoke) is one usage row like a
model's, with no tokens: `items` is how many inputs it carried and `gpu_seconds`
its share of the GPU time of the batches that computed them (each batch's predict
seconds times the replica's GPUs, split evenly over the batch's items). Both are
NULL on a model's rows. A deployment's kind needs no column: a revision of a
function has architecture 'thawpool-function' (what the deploy read from S3).

Revision ID: 0006
Revises: 0005
Create Date: 2027-03-15
"""
from alembic import op
import sqlalchemy as sa

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('usage_events', sa.Column('items', sa.BigInteger(), nullable=True))
    op.add_column('usage_events', sa.Column('gpu_seconds', sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column('usage_events', 'gpu_seconds')
    op.drop_column('usage_events', 'items')
