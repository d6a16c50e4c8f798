"""Profiles: where a command finds its server and key (no server needed)."""
from __future__ import annotations

import pytest

from controlplane.cli.profiles import DEFAULT_URL, ProfileError, ProfileStore, resolve


def test_profiles_are_private_and_the_newest_login_is_current(tmp_path):
    env = {"THAWPOOL_CONFIG_DIR": str(tmp_path / "cfg")}
    store = ProfileStore(env)
    store.save("a", "http://a:1/", "tp_a")
    store.save("b", "http://b:2", "tp_b")
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert store.path.parent.stat().st_mode & 0o777 == 0o700
    assert resolve(env) == resolve(env, profile="b")
    assert (resolve(env).url, resolve(env).key, resolve(env).name) == ("http://b:2", "tp_b", "b")
    assert resolve(env, profile="a").url == "http://a:1"
    assert store.remove("b") and resolve(env).name == "a"


def test_flags_beat_the_environment_which_beats_the_profile(tmp_path):
    env = {"THAWPOOL_CONFIG_DIR": str(tmp_path)}
    ProfileStore(env).save("p", "http://profile:1", "tp_profile")
    with_env = {**env, "THAWPOOL_URL": "http://env:2", "THAWPOOL_API_KEY": "tp_env"}
    assert (resolve(with_env).url, resolve(with_env).key) == ("http://env:2", "tp_env")
    flagged = resolve(with_env, url="http://flag:3", key="tp_flag")
    assert (flagged.url, flagged.key) == ("http://flag:3", "tp_flag")
    assert resolve({**env, "THAWPOOL_PROFILE": "p"}).key == "tp_profile"


def test_no_profile_means_the_local_default_and_a_named_missing_one_is_an_error(tmp_path):
    env = {"THAWPOOL_CONFIG_DIR": str(tmp_path)}
    assert (resolve(env).url, resolve(env).key) == (DEFAULT_URL, None)
    with pytest.raises(ProfileError, match="no profile 'ghost'"):
        resolve(env, profile="ghost")
    with pytest.raises(ProfileError, match="no profile 'ghost'"):
        resolve({**env, "THAWPOOL_PROFILE": "ghost"})


def test_a_profiles_key_stays_out_of_its_repr(tmp_path):
    env = {"THAWPOOL_CONFIG_DIR": str(tmp_path)}
    ProfileStore(env).save("p", "http://profile:1", "tp_0badc0de_secret-part-of-the-key")
    profile = resolve(env)
    assert profile.key == "tp_0badc0de_secret-part-of-the-key"
    assert "secret-part" not in repr(profile) and "http://profile:1" in repr(profile)
