"""A model source on a tenant's own bucket, read with its own credentials

model_sources gains the S3 endpoint, region and access key id an admin gave with
the grant, and the secret access key sealed (AES-GCM under the control plane's
secrets key, never stored or returned in the clear). A grant without them is read
with the platform's own credentials, as before.

Revision ID: 0005
Revises: 0004
Create Date: 2027-04-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None

COLUMNS = ('endpoint_url', 'region', 'access_key_id')


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column('model_sources', sa.Column(name, sa.Text(), nullable=True))
    op.add_column('model_sources', sa.Column('secret_sealed', sa.LargeBinary(), nullable=True))
    op.create_check_constraint('ck_model_sources_credentials_whole', 'model_sources',
                               '(access_key_id IS NULL) = (secret_sealed IS NULL)')


def downgrade() -> None:
    op.drop_constraint('ck_model_sources_credentials_whole', 'model_sources', type_='check')
    op.drop_column('model_sources', 'secret_sealed')
    for name in reversed(COLUMNS):
        op.drop_column('model_sources', name)
