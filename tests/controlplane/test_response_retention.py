"""controlplane.gateway.response_retention: when a stored response expires and when the
sweep goes on, with no clock and no database."""
from datetime import datetime, timedelta, timezone

from controlplane.gateway.response_retention import Retention

NOW = datetime(2027, 7, 1, 12, tzinfo=timezone.utc)


def test_the_cutoff_is_the_retention_before_now():
    assert Retention(keep_s=3600).cutoff(NOW) == NOW - timedelta(hours=1)
    assert Retention(keep_s=0).cutoff(NOW) == NOW      # kept not at all: everything made by now expired


def test_a_full_batch_sweeps_again_a_short_one_stops():
    retention = Retention(keep_s=60, batch=3)
    assert [retention.sweep_again(n) for n in (0, 2, 3, 4)] == [False, False, True, True]
