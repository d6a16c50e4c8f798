"""Spend budgets: budgets, budget_periods, budget_reservations, budget_alerts

A budget is a money limit on a tenant, one of its API keys or one of its deployments,
per calendar period (`day`, `month`, or `none`: one period for ever) in an IANA time
zone, with an optional soft threshold (a fraction of the limit, or an amount).

budget_periods holds each period's billed `spent` and the worst-case `reserved` of the
calls admitted and not yet metered; admission checks spent + reserved + the call's
worst case against the limit under the period row's lock, so several control planes on
one database agree. A call's reservation (one row per budget it counts against) names
the period it was made in, is settled into that period by the transaction that writes
its usage row, and carries a deadline after which it stops holding money back
(`expired`) but still tells the settlement where the call belongs. budget_alerts records
each threshold crossed, once per budget, period and kind.

A change of a budget notifies 'budgets:<tenant id>' on the lookups' channel (0004's
function), so every control plane knows within a second which tenants have budgets and
skips the budget read for the others.

Revision ID: 0019
Revises: 0018
Create Date: 2027-07-01
"""
from alembic import op
import sqlalchemy as sa

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None

MONEY = sa.Numeric(30, 15)


def upgrade() -> None:
    op.create_table(
        'budgets',
        sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), sa.ForeignKey('tenants.id', ondelete='CASCADE'), nullable=False),
        sa.Column('scope', sa.Text(), nullable=False),
        sa.Column('scope_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('limit_amount', MONEY, nullable=False),
        sa.Column('period', sa.Text(), nullable=False),
        sa.Column('time_zone', sa.Text(), nullable=False, server_default='UTC'),
        sa.Column('soft_fraction', sa.Numeric(6, 5), nullable=True),
        sa.Column('soft_amount', MONEY, nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('scope', 'scope_id', name='uq_budgets_scope'),
        sa.CheckConstraint("scope IN ('tenant', 'key', 'deployment')", name='ck_budgets_scope'),
        sa.CheckConstraint("period IN ('day', 'month', 'none')", name='ck_budgets_period'),
        sa.CheckConstraint('limit_amount >= 0', name='ck_budgets_limit'))
    op.create_index('ix_budgets_tenant', 'budgets', ['tenant_id'])
    op.execute("CREATE TRIGGER budgets_notify AFTER INSERT OR UPDATE OR DELETE ON budgets "
               "FOR EACH ROW EXECUTE FUNCTION thawpool_notify_change('tenant_id')")
    op.create_table(
        'budget_periods',
        sa.Column('budget_id', sa.Uuid(as_uuid=False), sa.ForeignKey('budgets.id', ondelete='CASCADE'), nullable=False),
        sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('period_end', sa.DateTime(timezone=True), nullable=True),
        sa.Column('spent', MONEY, nullable=False, server_default='0'),
        sa.Column('reserved', MONEY, nullable=False, server_default='0'),
        sa.PrimaryKeyConstraint('budget_id', 'period_start'))
    op.create_table(
        'budget_reservations',
        sa.Column('invocation_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('budget_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('amount', MONEY, nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expired', sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.PrimaryKeyConstraint('invocation_id', 'budget_id'),
        sa.ForeignKeyConstraint(['budget_id', 'period_start'],
                                ['budget_periods.budget_id', 'budget_periods.period_start'],
                                ondelete='CASCADE'))
    op.create_index('ix_budget_reservations_live', 'budget_reservations', ['expires_at'],
                    postgresql_where=sa.text('NOT expired'))
    op.create_table(
        'budget_alerts',
        sa.Column('id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('budget_id', sa.Uuid(as_uuid=False), sa.ForeignKey('budgets.id', ondelete='CASCADE'), nullable=False),
        sa.Column('tenant_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('scope', sa.Text(), nullable=False),
        sa.Column('scope_id', sa.Uuid(as_uuid=False), nullable=False),
        sa.Column('period_start', sa.DateTime(timezone=True), nullable=False),
        sa.Column('kind', sa.Text(), nullable=False),
        sa.Column('limit_amount', MONEY, nullable=False),
        sa.Column('spent', MONEY, nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('budget_id', 'period_start', 'kind', name='uq_budget_alerts_once'),
        sa.CheckConstraint("kind IN ('soft', 'hard')", name='ck_budget_alerts_kind'))
    op.create_index('ix_budget_alerts_tenant', 'budget_alerts', ['tenant_id', 'created_at'])


def downgrade() -> None:
    op.drop_index('ix_budget_alerts_tenant', table_name='budget_alerts')
    op.drop_table('budget_alerts')
    op.drop_index('ix_budget_reservations_live', table_name='budget_reservations')
    op.drop_table('budget_reservations')
    op.drop_table('budget_periods')
    op.execute("DROP TRIGGER budgets_notify ON budgets")
    op.drop_index('ix_budgets_tenant', table_name='budgets')
    op.drop_table('budgets')
