"""`priority` on a call (wire/priority.py): one rule for the edge and the replica."""
from __future__ import annotations

import pytest

from wire.embeddings import parse_embedding_request
from wire.errors import ProtocolError
from wire.priority import BATCH_PRIORITY, HIGHEST, INTERACTIVE_PRIORITY, LOWEST, replica_priority
from wire.requests import parse_request

BODIES = {"completions": {"prompt": "hi"},
          "chat/completions": {"messages": [{"role": "user", "content": "hi"}]},
          "embeddings": {"input": "hi"}}


@pytest.mark.parametrize("endpoint", list(BODIES))
@pytest.mark.parametrize("given, parsed", [(None, None), (0, 0), (-3, -3), (BATCH_PRIORITY, BATCH_PRIORITY),
                                           (LOWEST, LOWEST), (HIGHEST, HIGHEST)])
def test_every_endpoint_reads_priority(endpoint, given, parsed):
    body = {**BODIES[endpoint], **({} if given is None else {"priority": given})}
    assert parse_request(endpoint, body).priority == parsed


@pytest.mark.parametrize("endpoint", list(BODIES))
@pytest.mark.parametrize("bad", ["1", 1.5, True, HIGHEST + 1, LOWEST - 1, [0], {"p": 1}])
def test_anything_but_an_integer_in_range_is_refused_by_name(endpoint, bad):
    with pytest.raises(ProtocolError) as info:
        parse_request(endpoint, {**BODIES[endpoint], "priority": bad})
    assert (info.value.status, info.value.param) == (400, "priority")
    assert info.value.message.startswith("priority:")


def test_the_embedding_request_keeps_it():
    assert parse_embedding_request({"input": "x", "priority": 7}).priority == 7


def test_a_replica_runs_a_call_without_one_as_interactive():
    assert replica_priority(None) == INTERACTIVE_PRIORITY == 0
    assert replica_priority(BATCH_PRIORITY) == BATCH_PRIORITY > INTERACTIVE_PRIORITY
