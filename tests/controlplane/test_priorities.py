"""The priorities one API key allows (controlplane/auth/priorities.py): pure, no server."""
from __future__ import annotations

import pytest

from controlplane.auth.priorities import KeyPriorities
from controlplane.gateway.openai_wire import upstream_body
from controlplane.store.errors import Forbidden, InvalidField
from wire.priority import BATCH_PRIORITY, HIGHEST, INTERACTIVE_PRIORITY


def test_an_unset_key_runs_interactive_and_may_only_ask_for_less_urgent():
    key = KeyPriorities()
    assert (key.lowest, key.highest, key.default) == (INTERACTIVE_PRIORITY, HIGHEST, INTERACTIVE_PRIORITY)
    assert key.resolve(None) == 0 and key.resolve(BATCH_PRIORITY) == BATCH_PRIORITY
    with pytest.raises(Forbidden) as info:
        key.resolve(-1)
    assert (info.value.field, info.value.code) == ("priority", "priority_not_allowed")


def test_a_batch_key_runs_at_its_default_and_cannot_jump_ahead():
    key = KeyPriorities(priority_min=BATCH_PRIORITY)
    assert key.default == BATCH_PRIORITY and key.resolve(None) == BATCH_PRIORITY
    with pytest.raises(Forbidden):
        key.resolve(INTERACTIVE_PRIORITY)


def test_a_premium_key_may_go_first():
    key = KeyPriorities(priority_min=-10, priority_max=10, priority_default=-1)
    assert key.resolve(None) == -1 and key.resolve(-10) == -10
    with pytest.raises(Forbidden):
        key.resolve(11)


@pytest.mark.parametrize("settings, field", [
    (KeyPriorities(priority_min=5, priority_max=4), "priority_max"),
    (KeyPriorities(priority_max=-1), "priority_max"),
    (KeyPriorities(priority_default=-1), "priority_default"),
    (KeyPriorities(priority_min=0, priority_max=10, priority_default=11), "priority_default"),
    (KeyPriorities(priority_min=-(2 ** 40)), "priority_min"),
])
def test_settings_out_of_order_are_refused_by_name(settings, field):
    with pytest.raises(InvalidField) as info:
        settings.check()
    assert info.value.field == field


def test_the_replica_is_sent_the_resolved_priority():
    assert upstream_body({"model": "m", "prompt": "x"}, priority=BATCH_PRIORITY)["priority"] == BATCH_PRIORITY
    assert upstream_body({"model": "m", "prompt": "x", "priority": 3}, priority=3)["priority"] == 3
