"""What a webhook endpoint may name, checked with no server: its URL, its event types,
and (for a tenant's endpoint) the addresses its host resolves to."""
import pytest

from controlplane.store.errors import InvalidField
from controlplane.webhooks.endpoints import check_event_types, check_url
from controlplane.webhooks.targets import refusal


@pytest.mark.parametrize("url", ["https://hooks.example.com/thawpool",
                                 "http://127.0.0.1:8081/hook?x=1"])
def test_http_and_https_urls_pass(url):
    assert check_url(url) == url


@pytest.mark.parametrize("url, why", [
    ("ftp://example.com/", "http"), ("file:///etc/passwd", "http"), ("https:///path", "host"),
    ("example.com/hook", "http"), ("https://user:pw@example.com/", "credentials"),
    ("https://example.com:99999/", "port"), (7, "string"), ("https://x/\x00", "NUL"),
])
def test_other_urls_are_refused_naming_the_field(url, why):
    with pytest.raises(InvalidField, match=why) as refused:
        check_url(url)
    assert refused.value.field == "url"


def test_event_types_are_known_names_or_every_type():
    assert check_event_types(["budget.threshold", "budget.threshold"]) == ["budget.threshold"]
    assert check_event_types(["*"]) == ["*"]


@pytest.mark.parametrize("types", [[], "budget.threshold", ["budget.thresholds"],
                                   ["webhook.test"], [1]])
def test_unknown_or_empty_event_types_are_refused(types):
    with pytest.raises(InvalidField) as refused:
        check_event_types(types)
    assert refused.value.field == "event_types"


@pytest.mark.parametrize("addresses", [["127.0.0.1"], ["10.0.0.8"], ["169.254.169.254"],
                                       ["::1"], ["fe80::1%eth0"], ["93.184.216.34", "192.168.1.1"],
                                       ["224.0.0.1"], []])
def test_a_tenant_endpoint_may_not_reach_private_addresses(addresses):
    assert refusal(addresses) is not None


def test_public_addresses_pass():
    assert refusal(["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"]) is None


def test_the_webhook_settings_come_from_the_environment_once():
    from controlplane.settings import Settings
    from controlplane.webhooks.backoff import RetryPolicy

    settings = Settings.from_env({"THAWPOOL_WEBHOOK_ALLOW_PRIVATE_TARGETS": "true",
                                  "THAWPOOL_WEBHOOK_MAX_ATTEMPTS": "4",
                                  "THAWPOOL_WEBHOOK_RETRY_BASE_S": "0.5"})
    assert settings.webhook_allow_private_targets is True
    assert settings.webhook_retry_policy == RetryPolicy(0.5, 3600.0, 4, 259_200.0)
    assert Settings.from_env({}).webhook_allow_private_targets is False
    with pytest.raises(ValueError, match="true or false"):
        Settings.from_env({"THAWPOOL_WEBHOOK_ALLOW_PRIVATE_TARGETS": "maybe"})
