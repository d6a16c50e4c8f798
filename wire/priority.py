"""A call's scheduling priority: vLLM's convention, one rule for the edge and the replica.

`priority` is an integer on /v1/completions, /v1/chat/completions and /v1/embeddings;
lower runs first (as `vllm serve --scheduling-policy priority`), ties go by arrival.
Two classes are named for the platform: INTERACTIVE_PRIORITY, what a call gets when
nothing says otherwise, and BATCH_PRIORITY, what the Batch API submits its lines at,
so every interactive call outranks every batch line. The control plane narrows what a
key may ask for (controlplane/auth/priorities.py); the replica takes the value as sent.
"""
from __future__ import annotations

from typing import Any, Optional

from wire.errors import ProtocolError

FIELD = "priority"
INTERACTIVE_PRIORITY = 0
BATCH_PRIORITY = 100
# the values any call may carry at all: what a 32-bit signed integer holds
LOWEST = -(2 ** 31)
HIGHEST = 2 ** 31 - 1


def parse_priority(body: dict[str, Any]) -> Optional[int]:
    """The body's `priority`, None when it is absent or null; ProtocolError (400) naming
    the field for anything but an integer in [LOWEST, HIGHEST]."""
    value = body.get(FIELD)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not LOWEST <= value <= HIGHEST:
        raise ProtocolError(f"{FIELD}: must be an integer in [{LOWEST}, {HIGHEST}] "
                            f"(lower runs first)", param=FIELD)
    return value


def replica_priority(asked: Optional[int]) -> int:
    """What a replica runs a call at: the body's priority, INTERACTIVE_PRIORITY without one
    (the control plane always sends the one it resolved for the key)."""
    return INTERACTIVE_PRIORITY if asked is None else asked
