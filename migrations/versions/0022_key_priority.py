"""Priorities per API key: api_keys.priority_min, priority_max, priority_default

The range of priorities (wire/priority.py: lower runs first) a key's calls may ask for,
and the one a call that names none runs at (controlplane/auth/priorities.py). NULL keeps
the platform's default: from the interactive class (0) down, at 0. Keys made before
this migration keep NULL, so they behave as they did.

Revision ID: 0022
Revises: 0021
Create Date: 2027-06-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0022'
down_revision = '0021'
branch_labels = None
depends_on = None

COLUMNS = ('priority_min', 'priority_max', 'priority_default')


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column('api_keys', sa.Column(name, sa.Integer(), nullable=True))


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column('api_keys', name)
