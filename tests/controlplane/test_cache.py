"""The in-memory copy the hot path reads, as plain data: no database, no clock."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from controlplane.lookups.cache import Cache
from controlplane.store.tables import Deployment, Price, Revision
from controlplane.billing.pricing import Pricing
from controlplane.quotas import Quota
from controlplane.store.snapshot import KeyEntry, CacheSnapshot
from controlplane.store.tenants import Principal

UTC = timezone.utc
NOW = datetime(2026, 6, 1, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def key(key_id="k1", revoked=False, expires_at=None, tenant="t1") -> KeyEntry:
    principal = Principal(key_id, "tp_00000000", tenant, "acme", frozenset({"invoke"}), None, None)
    return KeyEntry(key_id, f"hash-{key_id}", principal, revoked, expires_at)


def deployed(deployment_id="d1", name="chat", tenant="t1", traffic=None):
    deployment = Deployment(id=deployment_id, tenant_id=tenant, name=name,
                            traffic=traffic or {"r1": 100})
    return deployment, [Revision(id=f"{deployment_id}-r1", deployment_id=deployment_id, number=1)]


def price(per_mtok: str, since=EPOCH, tenant=None, deployment=None, adapter=None,
          tier="interactive") -> Price:
    return Price(tenant_id=tenant, deployment_id=deployment, adapter_id=adapter,
                 effective_from=since, tier=tier,
                 input_per_mtok=Decimal(per_mtok), cached_input_per_mtok=Decimal(0),
                 output_per_mtok=Decimal(0), gpu_second=Decimal(0), per_call=Decimal(0))


def test_keys_are_found_by_hash_and_refused_once_revoked_or_expired():
    cache = Cache()
    cache.replace(CacheSnapshot([key(), key("k2", expires_at=NOW)], [], {}, []))
    assert cache.key("hash-k1").principal_at(NOW).tenant_id == "t1"
    assert cache.key("hash-k2").principal_at(NOW - timedelta(seconds=1)) is not None
    assert cache.key("hash-k2").principal_at(NOW) is None, "expired: known, and refused"
    cache.put_key(key(revoked=True))
    assert cache.key("hash-k1").principal_at(NOW) is None, "revoked: refused from memory"
    cache.drop_key("k1")
    assert cache.key("hash-k1") is None and cache.key("hash-missing") is None


def test_every_change_moves_the_generation():
    cache = Cache()
    seen = [cache.generation]
    for change in (lambda: cache.replace(CacheSnapshot([], [], {}, [])), lambda: cache.put_key(key()),
                   lambda: cache.drop_key("k1"), lambda: cache.put_deployment(deployed()),
                   lambda: cache.drop_deployment("d1"), lambda: cache.set_quota("t1", None),
                   lambda: cache.set_prices([])):
        change()
        assert cache.generation > seen[-1]
        seen.append(cache.generation)


def test_a_deleted_deployment_goes_and_its_name_may_be_taken_again():
    cache = Cache()
    cache.replace(CacheSnapshot([], [deployed()], {}, []))
    assert cache.deployment("t1", "chat")[0].id == "d1"
    assert cache.deployment("t2", "chat") is None, "names are per tenant"
    cache.put_deployment(deployed("d2"))                  # deleted, then made again
    cache.drop_deployment("d1")                           # the old one's notice comes late
    assert cache.deployment("t1", "chat")[0].id == "d2"
    cache.put_deployment(deployed("d2", traffic={"r1": 50, "r2": 50}))
    assert cache.deployment("t1", "chat")[0].traffic == {"r1": 50, "r2": 50}
    cache.drop_deployment("d2")
    assert cache.deployment("t1", "chat") is None


def test_the_price_in_effect_is_the_most_specific_row_of_the_caller():
    cache = Cache()
    cache.set_prices([price("1"), price("2", tenant="t1"), price("9", tenant="t2"),
                      price("3", tenant="t1", deployment="d1", since=NOW),
                      price("4", since=NOW + timedelta(days=1))])
    assert cache.pricing("t1", "d1", NOW - timedelta(seconds=1)).input_per_mtok == 2, "the plan"
    assert cache.pricing("t1", "d1", NOW).input_per_mtok == 3, "the override, from its time on"
    assert cache.pricing("t1", "d2", NOW).input_per_mtok == 2
    assert cache.pricing("t3", "d3", NOW).input_per_mtok == 1, "the default, never t2's plan"
    assert cache.pricing("t3", "d3", NOW + timedelta(days=2)).input_per_mtok == 4
    assert Cache().pricing("t1", "d1", NOW) == Pricing(), "an empty book prices nothing"


def test_batch_rows_price_batch_lines_only_and_by_the_same_scopes():
    cache = Cache()
    cache.set_prices([price("10"), price("1", tier="batch"), price("20", tenant="t1"),
                      price("2", tenant="t1", deployment="d1", tier="batch")])
    assert cache.pricing("t1", "d1", NOW).input_per_mtok == 20, "interactive: never a batch row"
    assert cache.tier_pricing("t1", "d1", NOW, None, "batch").input_per_mtok == 2
    assert cache.tier_pricing("t1", "d2", NOW, None, "batch").input_per_mtok == 1, "the default batch row"
    only_interactive = Cache()
    only_interactive.set_prices([price("10")])
    assert only_interactive.tier_pricing("t1", "d1", NOW, None, "batch") is None


def test_an_adapter_is_priced_by_its_row_else_as_its_base():
    cache = Cache()
    cache.set_prices([price("1"), price("2", tenant="t1"),
                      price("3", tenant="t1", deployment="d1"),
                      price("5", tenant="t1", deployment="d1", adapter="a1", since=NOW),
                      price("6", tenant="t1", deployment="d1", adapter="a2")])
    assert cache.pricing("t1", "d1", NOW, "a1").input_per_mtok == 5, "the adapter's row"
    assert cache.pricing("t1", "d1", NOW - timedelta(seconds=1), "a1").input_per_mtok == 3, \
        "before its row: the base's price"
    assert cache.pricing("t1", "d1", NOW, "a3").input_per_mtok == 3, "no row: the base's price"
    assert cache.pricing("t1", "d1", NOW).input_per_mtok == 3, "the base model: never an adapter's"
    assert cache.pricing("t1", "d2", NOW, "a1").input_per_mtok == 2, "a row prices its base only"


def test_a_shared_base_is_priced_by_its_owners_override_and_never_by_its_owners_plan():
    """Tenant op owns the shared base d-shared (an override) and d-bare (none); t1 calls both
    with adapters of its own. op's plan and op's adapter rows never price t1's calls."""
    cache = Cache()
    cache.set_prices([price("1"), price("8", tenant="op"), price("2", tenant="t1"),
                      price("3", tenant="op", deployment="d-shared"),
                      price("9", tenant="op", deployment="d-shared", adapter="op-a"),
                      price("4", tenant="t1", deployment="d-shared", adapter="t1-a")])
    assert cache.pricing("t1", "d-shared", NOW).input_per_mtok == 3, "the owner's override"
    assert cache.pricing("t1", "d-shared", NOW, "t1-b").input_per_mtok == 3
    assert cache.pricing("t1", "d-shared", NOW, "t1-a").input_per_mtok == 4, "its adapter's row"
    assert cache.pricing("t1", "d-bare", NOW, "t1-b").input_per_mtok == 2, "its plan, not op's"
    assert cache.pricing("t2", "d-bare", NOW).input_per_mtok == 1, "the default, not op's plan"
    assert cache.pricing("op", "d-bare", NOW).input_per_mtok == 8
    cache.set_prices([price("1")])
    assert cache.pricing("t1", "d-shared", NOW, "t1-a").input_per_mtok == 1, "a new book: recomputed"


def test_quota_overrides_apply_over_the_default():
    cache, default = Cache(), Quota(max_gpus=8, tokens_per_min=1000)
    cache.set_quota("t1", {"max_gpus": None, "tokens_per_min": 50})
    assert cache.quota("t1", default) == Quota(max_gpus=8, tokens_per_min=50)
    assert cache.quota("t2", default) == default
    cache.set_quota("t1", None)
    assert cache.quota("t1", default) == default


def test_the_listeners_dsn_is_the_database_url_as_asyncpg_reads_it():
    from controlplane.lookups.listener import libpq_dsn

    assert libpq_dsn("postgresql+asyncpg://u:p%40ss@db:5432/thawpool?ssl=require") == \
        "postgresql://u:p%40ss@db:5432/thawpool?sslmode=require"
    assert libpq_dsn("postgresql+asyncpg://postgres:@/postgres?host=/tmp/x") == \
        "postgresql://postgres:@/postgres?host=%2Ftmp%2Fx"


def test_an_unknown_key_is_unknown_until_its_time_or_until_it_is_put():
    cache = Cache()
    cache.mark_unknown("hash-k1", now=100.0, until=105.0)
    assert cache.is_unknown("hash-k1", 104.9) and not cache.is_unknown("hash-k1", 105.0)
    assert not cache.is_unknown("hash-k2", 100.0)
    cache.put_key(key())                        # created since: known at once
    assert not cache.is_unknown("hash-k1", 101.0) and cache.key("hash-k1") is not None


def test_unknown_keys_are_held_up_to_a_cap_the_expired_and_oldest_going_first():
    from controlplane.lookups.cache import MAX_UNKNOWN_KEYS

    cache = Cache()
    cache.mark_unknown("early", now=0.0, until=5.0)
    cache.mark_unknown("late", now=4.0, until=9.0)
    cache.mark_unknown("later", now=6.0, until=11.0)
    assert list(cache.unknown_keys) == ["late", "later"], "the expired one went"
    for i in range(MAX_UNKNOWN_KEYS):
        cache.mark_unknown(f"flood-{i}", now=7.0, until=12.0)
    assert len(cache.unknown_keys) == MAX_UNKNOWN_KEYS
    assert "late" not in cache.unknown_keys and "later" not in cache.unknown_keys
    assert cache.is_unknown(f"flood-{MAX_UNKNOWN_KEYS - 1}", 7.0)


def adapter_row(adapter_id="a1", name="tuned", tenant="t1", deployment="d1"):
    from controlplane.store.tables import Adapter
    return Adapter(id=adapter_id, tenant_id=tenant, name=name, deployment_id=deployment)


def test_shared_bases_and_adapters_are_found_and_leave_when_dropped():
    cache = Cache()
    base = deployed("d1", name="llama", tenant="op")
    base[0].shared = True
    cache.replace(CacheSnapshot([], [base, deployed("d2")], {}, [], [adapter_row(deployment="d1")]))
    assert cache.shared_deployment("llama") is base
    assert cache.shared_deployment("chat") is None, "a tenant's own deployment is not shared"
    assert cache.deployment_by_id("d1") is base
    assert cache.adapter("t1", "tuned").id == "a1"
    assert cache.adapter("t2", "tuned") is None, "adapter names are per tenant"
    unshared = deployed("d1", name="llama", tenant="op")
    unshared[0].shared = False
    cache.put_deployment(unshared)
    assert cache.shared_deployment("llama") is None
    cache.put_adapter(adapter_row("a2"))          # deleted, then made again
    cache.drop_adapter("a1")                      # the old one's notice comes late
    assert cache.adapter("t1", "tuned").id == "a2"
    cache.drop_adapter("a2")
    assert cache.adapter("t1", "tuned") is None


def test_a_resolved_adapter_is_only_its_owners_and_on_its_base():
    from controlplane.lookups.model_names import ModelName, Resolved
    assert ModelName.parse("llama:tuned") == ModelName("llama", "tuned")
    assert ModelName.parse("llama") == ModelName("llama")
    shared, private = deployed("d1", "llama", "op"), deployed("d2", "chat", "t2")
    shared[0].shared, private[0].shared = True, False
    mine = adapter_row(tenant="t1", deployment="d1")
    assert Resolved(*shared, mine).visible_to("t1")
    assert not Resolved(*shared, mine).visible_to("t2"), "another tenant's adapter on a shared base"
    assert Resolved(*shared).visible_to("t2")
    assert not Resolved(*private).visible_to("t1")
    assert not Resolved(*private, adapter_row(tenant="t2", deployment="d9")).visible_to("t2"), \
        "an adapter named with a base it is not attached to"
