"""pool.weights.prefetch: which revisions get a prefetch now (pure: no clock, no S3, no pool)."""
from pool.weights.prefetch import PrefetchView, PrefetchTarget, due, to_prefetch

MODEL = ("s3://models/a/",)


def view(revision_id="r1", wanted=True, scale_ups=0, last=None, running=False, uris=MODEL) -> PrefetchView:
    return PrefetchView(revision_id, wanted, PrefetchTarget(uris, scale_ups), last, running)


def test_a_new_revision_with_prefetch_is_due_and_one_without_is_not():
    assert to_prefetch([view("r1"), view("r2", wanted=False), view("r3")]) == ["r1", "r3"]


def test_one_prefetch_per_revision_at_a_time():
    assert not due(view(running=True))
    assert not due(view(running=True, scale_ups=3, last=PrefetchTarget(MODEL, 0)))


def test_a_prefetch_is_tried_once_per_target_even_when_it_failed():
    assert not due(view(last=PrefetchTarget(MODEL, 0)))


def test_each_scale_up_prefetches_again():
    assert due(view(scale_ups=1, last=PrefetchTarget(MODEL, 0)))
    assert not due(view(scale_ups=1, last=PrefetchTarget(MODEL, 1)))


def test_changed_weights_prefetch_again():
    draft = (*MODEL, "s3://models/draft/")
    assert due(view(uris=draft, last=PrefetchTarget(MODEL, 0)))


def test_a_revision_no_longer_wanted_is_never_due():
    assert not due(view(wanted=False, scale_ups=5, last=PrefetchTarget(MODEL, 0)))
    assert to_prefetch([]) == []


def test_predicted_due_from_lead_before_the_window_until_its_end():
    from pool.keep_alive import IdleWindow
    from pool.weights.prefetch import predicted_due
    window = IdleWindow(prewarm_s=500.0, until_s=700.0)
    assert [predicted_due(window, t, 60.0) for t in (100.0, 439.9, 440.0, 699.0, 700.0)] == \
        [False, False, True, True, False]
    assert not predicted_due(None, 450.0, 60.0) and not predicted_due(window, None, 60.0)
