"""GPU time of replica lifetimes as pure arithmetic: what is held, cut by window and day,
priced piece by piece."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from controlplane.billing.lifetimes import (GpuUse, Lifetime, Window, clipped, gpu_by_key, gpu_by_share,
                                            held, split, utc_days)
from controlplane.billing.pricing import PriceRow, PriceScope, Pricing

UTC = timezone.utc
T0 = datetime(2026, 3, 1, 23, 0, tzinfo=UTC)
WIDE = Window(datetime(2026, 1, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def life(placed=None, stopped=None, seen=None, gpus=1, label="d") -> Lifetime:
    return Lifetime("dep", gpus, placed, stopped, seen, label)


def test_a_lifetime_is_held_from_placement_to_its_stop_or_its_last_sighting():
    assert held(life()) is None, "never placed: never billed, however long it waited"
    assert held(life(placed=at(20), stopped=at(30), seen=at(29))) == (at(20), at(30))
    assert held(life(placed=at(20), seen=at(25))) == (at(20), at(25)), "open: to last seen"
    assert held(life(placed=at(20))) == (at(20), at(20)), "open, never seen since: nothing"
    assert held(life(placed=at(20), stopped=at(10))) == (at(20), at(20))


def test_spans_are_clipped_to_the_window():
    window = Window(at(0), at(60))
    assert clipped((at(-10), at(10)), window) == (at(0), at(10))
    assert clipped((at(50), at(70)), window) == (at(50), at(60))
    assert clipped((at(60), at(70)), window) is None
    assert clipped((at(5), at(5)), window) is None


def test_spans_are_cut_at_utc_midnight():
    other_zone = timezone(timedelta(hours=2))
    assert utc_days((at(0).astimezone(other_zone), at(90))) == [
        ("2026-03-01", (at(0), at(60))), ("2026-03-02", (at(60), at(90)))]
    assert utc_days((at(0), at(0))) == []
    three = utc_days((at(30), at(30 + 48 * 60)))
    assert [day for day, _ in three] == ["2026-03-01", "2026-03-02", "2026-03-03"]
    assert sum((end - start for _, (start, end) in three), timedelta()) == timedelta(hours=48)


PRICES = [PriceRow(PriceScope.DEFAULT, datetime(2020, 1, 1, tzinfo=UTC), Pricing(gpu_second=Decimal("0.01"))),
          PriceRow(PriceScope.DEPLOYMENT, at(70), Pricing(gpu_second=Decimal("0.03")))]


def test_gpu_time_is_summed_per_label_and_priced_where_the_price_changed():
    lifetimes = [life(placed=at(0), stopped=at(10), gpus=2, label="a"),       # 1200 s
                 life(placed=at(50), seen=at(80), label="a"),                 # 1200 s + 600 s dearer
                 life(placed=at(5), stopped=at(6), label="b"),                # 60 s
                 life(label="b")]                                             # never placed
    rows = gpu_by_key(lifetimes, {"dep": PRICES}, WIDE, by_day=False)
    assert rows == {"a": GpuUse(Decimal(3000), Decimal(12) + Decimal(12) + Decimal(18)),
                    "b": GpuUse(Decimal(60), Decimal("0.6"))}


def test_by_day_a_lifetime_lands_on_each_day_it_held_gpus():
    rows = gpu_by_key([life(placed=at(30), stopped=at(90))], {"dep": PRICES}, WIDE, by_day=True)
    assert rows == {"2026-03-01": GpuUse(Decimal(1800), Decimal(18)),
                    "2026-03-02": GpuUse(Decimal(1800), Decimal(6) + Decimal(36))}
    assert sum(rows.values(), GpuUse()).seconds == 3600


def test_only_the_window_is_billed():
    rows = gpu_by_key([life(placed=at(0), stopped=at(120))], {"dep": PRICES},
                      Window(at(30), at(60)), by_day=False)
    assert rows == {"d": GpuUse(Decimal(1800), Decimal(18))}


def test_a_sleeping_replica_bills_only_its_awake_spans():
    from controlplane.billing.lifetimes import billed

    def asleep(*marks, stopped=None, seen=None):
        return Lifetime("dep", 2, at(0), stopped, seen, "d", tuple(at(m) for m in marks))
    assert billed(asleep(10, 30, stopped=at(50))) == [(at(0), at(10)), (at(30), at(50))]
    assert billed(asleep(10, seen=at(10))) == [(at(0), at(10))], "asleep now: nothing since"
    assert billed(asleep(10, stopped=at(90))) == [(at(0), at(10))], "stopped in its sleep"
    assert billed(asleep(10, 30, 40, 41, 60, stopped=at(100))) == [
        (at(0), at(10)), (at(30), at(40)), (at(41), at(60))]
    assert billed(asleep(stopped=at(5))) == [(at(0), at(5))], "no sleep: the held span"
    assert billed(Lifetime("dep", 1, None, None, None)) == []
    use = gpu_by_key([asleep(10, 30, stopped=at(90))], {"dep": PRICES}, WIDE, by_day=True)
    assert use["2026-03-01"].seconds == 2 * 10 * 60 + 2 * 30 * 60       # 23:00..23:10, 23:30..24:00
    assert use["2026-03-02"].seconds == 2 * 30 * 60                     # 00:00..00:30
    assert sum(u.seconds for u in gpu_by_key([asleep(10, 30, stopped=at(50))], {"dep": PRICES},
                                             Window(at(5), at(35)), by_day=False).values()) == 2 * 10 * 60


def test_a_split_adds_up_exactly_and_the_largest_share_takes_what_rounding_left():
    """1 µs-quantum seconds and 1e-15 money cut three ways by tokens 1:1:1 and 2:1:0."""
    use = GpuUse(Decimal("0.000100"), Decimal("0.000000000000100"))
    thirds = split(use, {"b": 1, "a": 1, "c": 1}, "base")
    assert thirds == {"a": GpuUse(Decimal("0.000033"), Decimal("0.000000000000033")),
                      "b": GpuUse(Decimal("0.000033"), Decimal("0.000000000000033")),
                      "c": GpuUse(Decimal("0.000034"), Decimal("0.000000000000034"))}, \
        "a tie for the largest goes to the last key by name, never by dict order"
    assert sum(thirds.values(), GpuUse()) == use
    two = split(GpuUse(Decimal("600.000001"), Decimal("0.6")), {"x": 2, "y": 1, "z": 0}, "base")
    assert two == {"x": GpuUse(Decimal("400.000001"), Decimal("0.4")),
                   "y": GpuUse(Decimal("200.000000"), Decimal("0.2"))}, "no weight, no share"
    assert split(use, {}, "base") == {"base": use}
    assert split(use, {"a": 0}, "base") == {"base": use}, "tokens nowhere: the base keeps it"


def test_gpu_time_is_shared_out_per_replica_and_an_idle_replica_keeps_its_label():
    used = Lifetime("dep", 2, at(0), at(10), None, "own", replica_id="r1")     # 1200 s
    idle = Lifetime("dep", 1, at(0), at(1), None, "own", replica_id="r2")      # 60 s
    elsewhere = Lifetime("dep", 1, at(-60), at(-50), None, "own", replica_id="r3")  # outside
    window = Window(at(0), at(60))
    rows = gpu_by_share([used, idle, elsewhere], {"dep": PRICES}, window,
                        {"r1": {"own": 1, "own:fr": 3}, "r3": {"own:de": 5}})
    assert rows == {"own": GpuUse(Decimal(300 + 60), Decimal(3) + Decimal("0.6")),
                    "own:fr": GpuUse(Decimal(900), Decimal(9))}
    whole = gpu_by_key([used, idle, elsewhere], {"dep": PRICES}, window, by_day=False)
    assert sum(rows.values(), GpuUse()) == whole["own"], "the same total as by deployment"
