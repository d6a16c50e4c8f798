"""API keys as minted (controlplane.auth.keys): the shape the edge checks before any read."""
import pytest

from controlplane.auth.keys import generate_key, is_key_shaped


def test_every_minted_key_has_the_shape():
    assert all(is_key_shaped(generate_key().secret) for _ in range(200))


@pytest.mark.parametrize("secret", [
    "tp_nothere_secret", "not-a-key", "", "tp_00000000_" + "a" * 42, "tp_00000000_" + "a" * 44,
    "tp_0000000g_" + "a" * 43, "tp_00000000_" + "a" * 42 + "=", "TP_00000000_" + "a" * 43,
    "tp_00000000_" + "a" * 43 + "\n",
])
def test_anything_else_is_not(secret):
    assert not is_key_shaped(secret)
