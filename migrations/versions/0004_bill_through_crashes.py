"""GPU time from placement to the last heartbeat, tenant-wide rate limits, cache invalidation

replica_lifetimes gains `placed_at` (the first event that carried slot ids: the
replica holds its GPUs) and `last_seen_at` (the latest event or heartbeat that saw
it). A lifetime is billed from placed_at to stopped_at or, while no stop was
recorded, only up to last_seen_at, never to now(). `served_prompt_tokens` and
`served_completion_tokens` keep the replica's own counters of what it served (its
heartbeats and its stop event), for reconciling them with the billed usage rows. Rows written before this
migration keep the bill they had: a closed row is placed at its started_at when it
held slots; an open row is last seen at its ready (or start) time, so the next
heartbeat continues it if its replica is alive and closes it there if not.

tenant_quotas gains `requests_per_min` and `tokens_per_min`: limits over all of a
tenant's keys (NULL: the settings default).

Every write to what the control plane caches in memory (keys, deployments,
revisions, prices, quotas) sends NOTIFY thawpool_cache '<table>:<id>' at commit,
so every control plane drops its stale copy within a second.

Revision ID: 0004
Revises: 0003
Create Date: 2027-03-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

CHANNEL = 'thawpool_cache'
# table -> the column whose value names what changed (a revision names its deployment)
NOTIFYING = {'api_keys': 'id', 'deployments': 'id', 'revisions': 'deployment_id',
             'prices': 'id', 'tenant_quotas': 'tenant_id'}

NOTIFY_FUNCTION = f"""
CREATE FUNCTION thawpool_notify_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('{CHANNEL}', TG_TABLE_NAME || ':' ||
    coalesce(to_jsonb(NEW) ->> TG_ARGV[0], to_jsonb(OLD) ->> TG_ARGV[0], ''));
  RETURN NULL;
END $$
"""


def upgrade() -> None:
    op.add_column('replica_lifetimes', sa.Column('placed_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('replica_lifetimes', sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=True))
    op.add_column('replica_lifetimes', sa.Column('served_prompt_tokens', sa.BigInteger(), nullable=True))
    op.add_column('replica_lifetimes', sa.Column('served_completion_tokens', sa.BigInteger(), nullable=True))
    op.execute("UPDATE replica_lifetimes SET placed_at = started_at WHERE cardinality(slot_ids) > 0")
    op.execute("UPDATE replica_lifetimes SET last_seen_at = coalesce(stopped_at, ready_at, started_at)")
    op.create_index('ix_replica_lifetimes_open', 'replica_lifetimes', ['replica_id'], unique=False,
                    postgresql_where=sa.text('stopped_at IS NULL'))
    op.add_column('tenant_quotas', sa.Column('requests_per_min', sa.Integer(), nullable=True))
    op.add_column('tenant_quotas', sa.Column('tokens_per_min', sa.Integer(), nullable=True))
    op.execute(NOTIFY_FUNCTION)
    for table, column in NOTIFYING.items():
        op.execute(f"CREATE TRIGGER {table}_notify AFTER INSERT OR UPDATE OR DELETE ON {table} "
                   f"FOR EACH ROW EXECUTE FUNCTION thawpool_notify_change('{column}')")


def downgrade() -> None:
    for table in NOTIFYING:
        op.execute(f"DROP TRIGGER {table}_notify ON {table}")
    op.execute("DROP FUNCTION thawpool_notify_change()")
    op.drop_column('tenant_quotas', 'tokens_per_min')
    op.drop_column('tenant_quotas', 'requests_per_min')
    op.drop_index('ix_replica_lifetimes_open', table_name='replica_lifetimes',
                  postgresql_where=sa.text('stopped_at IS NULL'))
    op.drop_column('replica_lifetimes', 'served_completion_tokens')
    op.drop_column('replica_lifetimes', 'served_prompt_tokens')
    op.drop_column('replica_lifetimes', 'last_seen_at')
    op.drop_column('replica_lifetimes', 'placed_at')
