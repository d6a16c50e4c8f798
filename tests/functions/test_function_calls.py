"""The async call store, over a clock passed in: retention, tenants, a bound."""
import pytest

from controlplane.function_calls import CallStoreFull, FunctionCalls


def test_a_call_is_its_tenants_until_its_retention_after_it_ends():
    calls = FunctionCalls(retention_s=60.0)
    call = calls.start("acme", "sentiment", now=0.0)
    assert calls.get("acme", call.id, now=1.0).view()["status"] == "running"
    assert calls.get("other", call.id, now=1.0) is None               # another tenant: not found
    calls.finish(call.id, 200, {"output": {"label": "positive"}}, now=10.0)
    done = calls.get("acme", call.id, now=69.9).view()
    assert (done["status"], done["http_status"], done["output"]) == ("succeeded", 200, {"label": "positive"})
    assert calls.get("acme", call.id, now=70.0) is None                # retention over


def test_a_running_call_never_expires_and_failures_say_so():
    calls = FunctionCalls(retention_s=1.0)
    running = calls.start("acme", "f", now=0.0)
    failed = calls.start("acme", "f", now=0.0)
    calls.finish(failed.id, 500, {"error": {"code": "function_error"}}, now=0.5)
    assert calls.get("acme", running.id, now=1e6) is not None
    assert calls.get("acme", failed.id, now=1.0) is None
    assert running.view()["status"] == "running"


def test_the_store_is_bounded():
    calls = FunctionCalls(retention_s=60.0, max_calls=2)
    first = calls.start("acme", "f", now=0.0)
    calls.start("acme", "f", now=0.0)
    with pytest.raises(CallStoreFull):
        calls.start("acme", "f", now=1.0)
    calls.finish(first.id, 200, {"output": {}}, now=1.0)
    calls.start("acme", "f", now=61.0)                                  # the finished one aged out
