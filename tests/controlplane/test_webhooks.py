"""Webhooks end to end: the API over a real Postgres, the control plane's own worker, and
a real HTTP receiver on 127.0.0.1 that answers what each test scripts (500 then 200,
always 500, or never). Each delivery is signed with the secret shown once at creation,
retried with backoff until it succeeds or is given up, and every attempt is visible; a
tenant never sees, nor receives, another's."""
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from decimal import Decimal

import pytest
import pytest_asyncio

from controlplane.cli.main import main
from controlplane.webhooks.deliveries import Claimed
from controlplane.budgets.alerts import BudgetAlert
from controlplane.webhooks.events import BUDGET_THRESHOLD
from controlplane.webhooks.sender import Sender
from controlplane.webhooks.signing import verify
from tests.controlplane.conftest import make_settings, running_control_plane
from tests.controlplane.support.webhook_receiver import WAIT_S, serving_receiver

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.timeout(300)]
@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def receiver():
    async with serving_receiver() as receiver:
        yield receiver


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def plane(db_url, s3_server, tmp_path_factory):
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-webhooks"),
                             webhook_poll_s=0.02, webhook_retry_base_s=0.05,
                             webhook_max_attempts=3, webhook_timeout_s=2.0,
                             webhook_allow_private_targets=True)
    async with running_control_plane(settings) as plane:
        yield plane


async def register(client, url: str, types=("budget.threshold",), **more) -> dict:
    created = await client.post("/v1/webhooks", json={"url": url, "event_types": list(types),
                                                      **more})
    assert created.status_code == 201, created.text
    return created.json()


async def settled(client, endpoint_id: str) -> list[dict]:
    """The endpoint's deliveries once none is pending (each attempt recorded)."""
    async def done() -> list[dict]:
        while True:
            listed = (await client.get(f"/v1/webhooks/{endpoint_id}/deliveries")).json()["data"]
            if listed and all(d["status"] != "pending" for d in listed):
                return listed
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(done(), WAIT_S)


def threshold(tenant_id: str, budget: str) -> BudgetAlert:
    now = datetime(2027, 6, 1, tzinfo=timezone.utc)
    return BudgetAlert(tenant_id, budget, "tenant", tenant_id, now, "soft", Decimal("100.00"),
                       Decimal("80.5"), now)


async def test_the_secret_is_shown_once_and_signs_the_test_ping(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-ping"))
    endpoint = await register(tenant, f"{receiver.base_url}/ping")
    secret = endpoint["secret"]
    assert secret.startswith("whsec_")
    shown = [(await tenant.get(f"/v1/webhooks/{endpoint['id']}")).text,
             (await tenant.get("/v1/webhooks")).text]
    assert not any(secret in text for text in shown)
    ping = await tenant.post(f"/v1/webhooks/{endpoint['id']}/test")
    assert ping.status_code == 202, ping.text
    [got] = await receiver.wait_for("/ping", 1)
    assert verify(secret, got.headers["thawpool-signature"], got.body, tolerance_s=60)
    assert got.headers["thawpool-event-id"] == ping.json()["event_id"]
    assert got.headers["thawpool-event-type"] == "webhook.test"
    [delivery] = await settled(tenant, endpoint["id"])
    assert (delivery["id"], delivery["status"], delivery["attempts"]) == (
        ping.json()["delivery_id"], "succeeded", 1)


async def test_a_failing_receiver_gets_the_same_event_again_until_it_answers(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-retry"))
    endpoint = await register(tenant, f"{receiver.base_url}/flaky")
    receiver.script["/flaky"] = [500, 503]
    alert = threshold(endpoint["tenant_id"], "b-retry")
    published = await plane.app.state.webhooks.publish(endpoint["tenant_id"], BUDGET_THRESHOLD,
                                                       alert.payload(), alert.dedupe_key)
    got = await receiver.wait_for("/flaky", 3)
    assert {r.body for r in got} == {got[0].body}             # the same bytes every time
    assert {r.headers["thawpool-event-id"] for r in got} == {published.event_id}
    for each in got:
        verify(endpoint["secret"], each.headers["thawpool-signature"], each.body, 60)
    [delivery] = await settled(tenant, endpoint["id"])
    assert (delivery["status"], delivery["attempts"], delivery["last_status_code"]) == (
        "succeeded", 3, 200)
    assert [a["status_code"] for a in delivery["attempt_log"]] == [500, 503, 200]
    assert all(a["duration_ms"] >= 0 for a in delivery["attempt_log"])


async def test_a_receiver_that_never_succeeds_is_given_up_after_max_attempts(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-down"))
    endpoint = await register(tenant, f"{receiver.base_url}/down")
    receiver.script["/down"] = [500] * 10
    alert = threshold(endpoint["tenant_id"], "b-down")
    await plane.app.state.webhooks.publish(endpoint["tenant_id"], BUDGET_THRESHOLD,
                                           alert.payload(), alert.dedupe_key)
    [delivery] = await settled(tenant, endpoint["id"])
    assert (delivery["status"], delivery["attempts"], delivery["next_attempt_at"]) == (
        "failed", 3, None)
    assert len(receiver.at("/down")) == 3


async def test_a_silent_receiver_is_cut_off_by_the_timeout(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-silent"))
    endpoint = await register(tenant, f"{receiver.base_url}/silent")
    receiver.hang.add("/silent")
    assert (await tenant.post(f"/v1/webhooks/{endpoint['id']}/test")).status_code == 202
    assert (await plane.admin.get("/healthz")).status_code == 200     # the API answers meanwhile
    [delivery] = await settled(tenant, endpoint["id"])
    assert delivery["status"] == "failed"
    assert [a["status_code"] for a in delivery["attempt_log"]] == [None] * 3
    assert all("Timeout" in a["error"] for a in delivery["attempt_log"])


async def test_two_control_planes_on_one_database_deliver_each_event_once(
        plane, receiver, db_url, s3_server, tmp_path_factory):
    """Both workers poll the same table; SKIP LOCKED and the claim split the events.
    They share the secrets key, as every control plane on one database must."""
    key_file = plane.app.state.settings.data_dir / "secrets-key"
    settings = make_settings(db_url, s3_server, tmp_path_factory.mktemp("cp-webhooks-2"),
                             webhook_poll_s=0.01, webhook_allow_private_targets=True,
                             secrets_key=key_file.read_text().strip())
    tenant = plane.client(await plane.tenant_key("wh-two"))
    endpoint = await register(tenant, f"{receiver.base_url}/two")
    async with running_control_plane(settings, catalogue=None):
        published = [await plane.app.state.webhooks.publish(
            endpoint["tenant_id"], BUDGET_THRESHOLD, {"n": n}, f"two-planes-{n}")
            for n in range(30)]
        got = await receiver.wait_for("/two", 30)
        listed = await settled(tenant, endpoint["id"])
    assert sorted(r.headers["thawpool-event-id"] for r in got) == sorted(
        p.event_id for p in published)
    assert [(d["status"], d["attempts"]) for d in listed] == [("succeeded", 1)] * 30


async def test_one_dedupe_key_is_delivered_once(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-once"))
    endpoint = await register(tenant, f"{receiver.base_url}/once")
    alert = threshold(endpoint["tenant_id"], "b-once")
    results = [await plane.app.state.webhooks.publish(endpoint["tenant_id"], BUDGET_THRESHOLD,
                                                      alert.payload(), alert.dedupe_key)
               for _ in range(3)]
    assert [r.new for r in results] == [True, False, False]
    assert len(await settled(tenant, endpoint["id"])) == 1


async def test_a_tenant_neither_sees_nor_receives_another_tenants_webhooks(plane, receiver):
    a = plane.client(await plane.tenant_key("wh-iso-a"))
    b = plane.client(await plane.tenant_key("wh-iso-b"))
    mine = await register(a, f"{receiver.base_url}/iso-a")
    theirs = await register(b, f"{receiver.base_url}/iso-b")
    watched = await register(plane.admin, f"{receiver.base_url}/iso-operator",
                             tenant="wh-iso-a")              # the operator's, for a's events
    assert watched["operator"] and watched["tenant_id"] == mine["tenant_id"]
    alert = threshold(mine["tenant_id"], "b-iso")
    await plane.app.state.webhooks.publish(mine["tenant_id"], BUDGET_THRESHOLD,
                                           alert.payload(), alert.dedupe_key)
    await receiver.wait_for("/iso-a", 1)
    await receiver.wait_for("/iso-operator", 1)
    # deliveries are written when the event is published: none is b's, now or later
    assert (await b.get(f"/v1/webhooks/{theirs['id']}/deliveries")).json()["data"] == []
    assert [e["id"] for e in (await a.get("/v1/webhooks")).json()["data"]] == [mine["id"]]
    assert [e["id"] for e in (await b.get("/v1/webhooks")).json()["data"]] == [theirs["id"]]
    for other in (mine["id"], watched["id"]):
        refused = [await b.get(f"/v1/webhooks/{other}"),
                   await b.get(f"/v1/webhooks/{other}/deliveries"),
                   await b.post(f"/v1/webhooks/{other}/test"),
                   await b.delete(f"/v1/webhooks/{other}")]
        assert [r.status_code for r in refused] == [404] * 4
    assert (await a.get(f"/v1/webhooks/{watched['id']}")).status_code == 404
    listed = (await plane.admin.get("/v1/webhooks", params={"tenant": "wh-iso-a"})).json()
    assert {e["id"] for e in listed["data"]} == {mine["id"], watched["id"]}


async def test_only_the_operator_names_a_tenant(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-forbidden"))
    refused = await tenant.post("/v1/webhooks", json={
        "url": f"{receiver.base_url}/x", "event_types": ["*"], "tenant": "wh-iso-b"})
    assert (refused.status_code, refused.json()["error"]["param"]) == (403, "tenant")
    listing = await tenant.get("/v1/webhooks", params={"tenant": "wh-iso-b"})
    assert listing.status_code == 403


async def test_deleting_an_endpoint_stops_its_deliveries(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-delete"))
    endpoint = await register(tenant, f"{receiver.base_url}/gone")
    assert (await tenant.delete(f"/v1/webhooks/{endpoint['id']}")).status_code == 204
    assert (await tenant.get(f"/v1/webhooks/{endpoint['id']}")).status_code == 404
    alert = threshold(endpoint["tenant_id"], "b-gone")
    published = await plane.app.state.webhooks.publish(endpoint["tenant_id"], BUDGET_THRESHOLD,
                                                       alert.payload(), alert.dedupe_key)
    assert published.deliveries == 0


@pytest.mark.parametrize("body, param", [
    ({"event_types": ["*"]}, "url"),
    ({"url": "ftp://example.com/", "event_types": ["*"]}, "url"),
    ({"url": "https://example.com/", "event_types": []}, "event_types"),
    ({"url": "https://example.com/", "event_types": ["budget.spent"]}, "event_types"),
    ({"url": "https://example.com/", "event_types": ["*"], "enabled": "yes"}, "enabled"),
    ({"url": "https://example.com/", "event_types": ["*"], "secret": "mine"}, "secret"),
])
async def test_a_bad_endpoint_is_refused_naming_its_field(plane, body, param):
    tenant = plane.client(await plane.tenant_key("wh-bad"))
    refused = await tenant.post("/v1/webhooks", json=body)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == param


async def test_a_tenants_endpoint_may_not_reach_loopback_unless_allowed(receiver):
    """The settings' default: a tenant's URL on the control plane's own network is refused
    before any connection; the operator's own endpoint may reach it."""
    def claimed(operator: bool) -> Claimed:
        return Claimed("d", "c", 1, "evt_1", "webhook.test", datetime.now(timezone.utc), b"{}",
                       f"{receiver.base_url}/private", "e", b"", operator)

    async with Sender(timeout_s=5.0, allow_private_targets=False) as sender:
        refused = await sender.send(claimed(operator=False), "whsec_x")
        assert refused.status_code is None and "blocked address 127.0.0.1" in refused.error
        assert receiver.at("/private") == []
        assert (await sender.send(claimed(operator=True), "whsec_x")).status_code == 200
    assert len(receiver.at("/private")) == 1


async def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_the_cli_registers_pings_lists_and_deletes(plane, receiver, capsys):
    auth = ["--url", plane.base_url, "--key", await plane.tenant_key("wh-cli"), "--json"]
    code, out, _ = await run_cli(capsys, "webhooks", "create", f"{receiver.base_url}/cli",
                                 "--events", "budget.threshold", *auth)
    assert code == 0
    made = json.loads(out)
    assert made["url"] == f"{receiver.base_url}/cli"
    code, out, _ = await run_cli(capsys, "webhooks", "test", made["id"], *auth)
    assert code == 0
    [got] = await receiver.wait_for("/cli", 1)
    assert verify(made["secret"], got.headers["thawpool-signature"], got.body, 60)
    await settled(plane.client(auth[3]), made["id"])
    code, out, _ = await run_cli(capsys, "webhooks", "deliveries", made["id"], *auth)
    assert code == 0 and [d["status"] for d in json.loads(out)] == ["succeeded"]
    code, out, _ = await run_cli(capsys, "webhooks", "ls", *auth)
    assert code == 0 and [e["id"] for e in json.loads(out)] == [made["id"]]
    assert made["secret"] not in out
    code, out, _ = await run_cli(capsys, "webhooks", "disable", made["id"], *auth)
    assert code == 0 and json.loads(out)["enabled"] is False
    code, out, _ = await run_cli(capsys, "webhooks", "enable", made["id"], *auth)
    assert code == 0 and json.loads(out)["enabled"] is True
    code, _, _ = await run_cli(capsys, "webhooks", "rm", made["id"], *auth)
    assert code == 0
    code, _, err = await run_cli(capsys, "webhooks", "get", made["id"], *auth)
    assert code == 1 and "404" in err
    code, _, err = await run_cli(capsys, "webhooks", "create", "ftp://x/", *auth)
    assert code == 1 and "url" in err


async def test_a_tenant_holds_at_most_max_endpoints(plane, receiver):
    from controlplane.webhooks.endpoints import MAX_ENDPOINTS

    tenant = plane.client(await plane.tenant_key("wh-many"))
    for n in range(MAX_ENDPOINTS):
        await register(tenant, f"{receiver.base_url}/many-{n}")
    refused = await tenant.post("/v1/webhooks", json={"url": f"{receiver.base_url}/one-more",
                                                      "event_types": ["*"]})
    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "quota_exceeded")
    other = plane.client(await plane.tenant_key("wh-many-other"))    # a count of its own
    await register(other, f"{receiver.base_url}/other-1")


async def test_publishing_an_unknown_event_type_is_a_bug_caught_at_once(plane):
    with pytest.raises(ValueError, match="budget.spent"):
        await plane.app.state.webhooks.publish(None, "budget.spent", {}, "unknown-type")


async def test_an_endpoint_is_changed_disabled_and_enabled_again(plane, receiver):
    tenant = plane.client(await plane.tenant_key("wh-patch"))
    other = plane.client(await plane.tenant_key("wh-patch-other"))
    endpoint = await register(tenant, f"{receiver.base_url}/patch-old")
    changed = await tenant.patch(f"/v1/webhooks/{endpoint['id']}", json={
        "enabled": False, "url": f"{receiver.base_url}/patch-new", "description": "ops"})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["enabled"], changed.json()["url"], changed.json()["description"]) == (
        False, f"{receiver.base_url}/patch-new", "ops")
    ping = await tenant.post(f"/v1/webhooks/{endpoint['id']}/test")
    assert (ping.status_code, ping.json()["error"]["code"]) == (409, "webhook_disabled")
    alert = threshold(endpoint["tenant_id"], "b-patch")
    assert (await plane.app.state.webhooks.publish(endpoint["tenant_id"], BUDGET_THRESHOLD,
                                                   alert.payload(), alert.dedupe_key)).deliveries == 0
    assert (await tenant.patch(f"/v1/webhooks/{endpoint['id']}",
                               json={"enabled": True})).json()["enabled"] is True
    assert (await tenant.post(f"/v1/webhooks/{endpoint['id']}/test")).status_code == 202
    [got] = await receiver.wait_for("/patch-new", 1)
    verify(endpoint["secret"], got.headers["thawpool-signature"], got.body, 60)  # same secret
    assert receiver.at("/patch-old") == []
    refused = await other.patch(f"/v1/webhooks/{endpoint['id']}", json={"enabled": False})
    assert refused.status_code == 404


@pytest.mark.parametrize("body, param", [
    ({"url": "ftp://example.com/"}, "url"), ({"event_types": ["nope"]}, "event_types"),
    ({"enabled": 1}, "enabled"), ({"tenant": "wh-iso-b"}, "tenant"), ({"secret": "x"}, "secret"),
])
async def test_a_bad_change_is_refused_naming_its_field(plane, receiver, body, param):
    tenant = plane.client(await plane.tenant_key("wh-patch-bad"))
    endpoint = await register(tenant, f"{receiver.base_url}/patch-bad")
    refused = await tenant.patch(f"/v1/webhooks/{endpoint['id']}", json=body)
    assert (refused.status_code, refused.json()["error"]["param"]) == (422, param), refused.text
