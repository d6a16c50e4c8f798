"""What priority one API key's calls run at: the range it may ask for and its default.

A key carries `priority_min` (the most urgent it may ask for: the smallest number, as
priorities go lower-first, wire/priority.py), `priority_max` (the least urgent) and
`priority_default` (what a call that names none runs at). Unset, a key may ask for
anything from INTERACTIVE_PRIORITY down the line (so no tenant jumps ahead of the
platform's interactive class unless the operator lets its key) and runs at
INTERACTIVE_PRIORITY. A call outside its key's range is refused with 403 naming
`priority` before any replica is acquired. Pure: no database, no HTTP.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from controlplane.store.errors import Forbidden, InvalidField
from wire.priority import HIGHEST, INTERACTIVE_PRIORITY, LOWEST

FIELDS = ("priority_min", "priority_max", "priority_default")


@dataclass(frozen=True)
class KeyPriorities:
    priority_min: Optional[int] = None         # None: INTERACTIVE_PRIORITY
    priority_max: Optional[int] = None         # None: wire.priority.HIGHEST
    priority_default: Optional[int] = None     # None: INTERACTIVE_PRIORITY, within the range

    @property
    def lowest(self) -> int:
        return INTERACTIVE_PRIORITY if self.priority_min is None else self.priority_min

    @property
    def highest(self) -> int:
        return HIGHEST if self.priority_max is None else self.priority_max

    @property
    def default(self) -> int:
        if self.priority_default is not None:
            return self.priority_default
        return min(max(INTERACTIVE_PRIORITY, self.lowest), self.highest)

    def check(self) -> None:
        """InvalidField naming the first setting out of [LOWEST, HIGHEST] or out of order."""
        for name in FIELDS:
            value = getattr(self, name)
            if value is not None and not LOWEST <= value <= HIGHEST:
                raise InvalidField(name, f"must be an integer in [{LOWEST}, {HIGHEST}]")
        if self.lowest > self.highest:
            raise InvalidField("priority_max" if self.priority_max is not None else "priority_min",
                               f"the range [{self.lowest}, {self.highest}] is empty (priority_min "
                               f"defaults to {INTERACTIVE_PRIORITY})")
        if not self.lowest <= self.default <= self.highest:
            raise InvalidField("priority_default", f"{self.default} is outside the key's range "
                                                   f"[{self.lowest}, {self.highest}]")

    def resolve(self, asked: Optional[int]) -> int:
        """The priority a call runs at: what it asked for, or the key's default; Forbidden
        (403) naming `priority` when the key may not ask for that."""
        if asked is None:
            return self.default
        if not self.lowest <= asked <= self.highest:
            raise Forbidden("priority", f"this key may ask for a priority in [{self.lowest}, "
                                        f"{self.highest}] (lower runs first), not {asked}",
                            code="priority_not_allowed")
        return asked

    def view(self) -> dict[str, Any]:
        """The key's settings as stored (null: the platform's default) and in effect."""
        return {"priority_min": self.priority_min, "priority_max": self.priority_max,
                "priority_default": self.priority_default,
                "priority_range": [self.lowest, self.highest], "priority_effective_default": self.default}
