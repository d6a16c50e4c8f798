"""The pool's settings (pool.settings): S3 credentials never reach a repr; the weight
cache defaults to the user's own folder."""
from __future__ import annotations

import tempfile
from pathlib import Path

from pool.settings import PoolSettings


def test_repr_and_str_of_populated_settings_hold_no_s3_credential():
    settings = PoolSettings.from_env({"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEYID42",
                                      "AWS_SECRET_ACCESS_KEY": "s3-secret-9b1c0d",
                                      "THAWPOOL_S3_ENDPOINT": "http://s3.internal:8333"})
    assert settings.aws_secret_access_key == "s3-secret-9b1c0d"
    for text in (repr(settings), str(settings)):
        assert "http://s3.internal:8333" in text
        assert "AKIAEXAMPLEKEYID42" not in text and "s3-secret-9b1c0d" not in text


def test_the_default_cache_is_the_users_own_never_the_shared_temp_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    default = PoolSettings().cache_dir
    assert default == Path.home() / ".cache" / "thawpool" / "pool"
    assert not default.is_relative_to(tempfile.gettempdir())
    assert PoolSettings.from_env({"XDG_CACHE_HOME": str(tmp_path / "xdg")}).cache_dir == \
        tmp_path / "xdg" / "thawpool" / "pool"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for env in ({}, {"XDG_CACHE_HOME": "relative/not/xdg"}):
        assert PoolSettings.from_env(env).cache_dir == tmp_path / "home" / ".cache" / "thawpool" / "pool"
    assert PoolSettings.from_env({"THAWPOOL_CACHE_DIR": "/srv/cache"}).cache_dir == Path("/srv/cache")
