"""`thawpool deploy` flags into the deployment body (no server: an s3:// model needs no lookup)."""
from controlplane.cli.main import build_parser
from controlplane.cli.deploy import _body

MODEL = "s3://models/m/"


def body_of(*flags: str) -> dict:
    return _body(build_parser().parse_args(["deploy", "d", "--model", MODEL, *flags]), client=None)


def test_prefetch_is_sent_only_when_given():
    assert "scaling" not in body_of()
    assert body_of("--prefetch")["scaling"] == {"prefetch": True}
    assert body_of("--no-prefetch", "--sleep-timeout", "30")["scaling"] == {"sleep_timeout_s": 30.0,
                                                                            "prefetch": False}
