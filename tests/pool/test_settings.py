"""The pool's settings (pool.settings): S3 credentials never reach a repr."""
from __future__ import annotations

from pool.settings import PoolSettings


def test_repr_and_str_of_populated_settings_hold_no_s3_credential():
    settings = PoolSettings.from_env({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID42",
                                      "AWS_SECRET_ACCESS_KEY": "s3-secret-9b1c0d",
                                      "THAWPOOL_S3_ENDPOINT": "http://s3.internal:8333"})
    assert settings.aws_secret_access_key == "s3-secret-9b1c0d"
    for text in (repr(settings), str(settings)):
        assert "http://s3.internal:8333" in text
        assert "AKIAEXAMPLEKEYID42" not in text and "s3-secret-9b1c0d" not in text
