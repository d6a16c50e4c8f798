"""The control plane's settings (controlplane.settings): secrets never reach a repr."""
from __future__ import annotations

from controlplane.settings import Settings

SECRETS = {
    "THAWPOOL_DATABASE_URL": "postgresql+asyncpg://thawpool:pg-pass-7f3a@db.internal:5432/thawpool",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID42",
    "AWS_SECRET_ACCESS_KEY": "s3-secret-9b1c0d",
    "THAWPOOL_SECRETS_KEY": "c2VhbGluZy1rZXktMzItYnl0ZXMtbG9uZy1leGFtcGxlIQ==",
    "THAWPOOL_METRICS_TOKEN": "metrics-token-5e6f",
}


def test_repr_and_str_of_populated_settings_hold_no_secret():
    settings = Settings.from_env({**SECRETS, "THAWPOOL_S3_ENDPOINT": "http://s3.internal:8333"})
    assert settings.aws_secret_access_key == SECRETS["AWS_SECRET_ACCESS_KEY"]   # read, all of them
    for text in (repr(settings), str(settings)):
        assert "http://s3.internal:8333" in text          # the rest is still there
        leaked = [v for v in (*SECRETS.values(), "pg-pass-7f3a") if v in text]
        assert leaked == []


def test_the_gpu_cost_is_read_from_the_environment_and_zero_when_unset():
    from decimal import Decimal

    assert Settings.from_env({}).gpu_cost_per_second == 0
    read = Settings.from_env({"THAWPOOL_GPU_COST_PER_SECOND": "0.00042"})
    assert read.gpu_cost_per_second == Decimal("0.00042")
