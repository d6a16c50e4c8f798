"""spec.gguf's header reader refuses a header too big to hold before reading or allocating
it: what a count or length declares is checked against the header cap first."""
import struct
import time

import pytest

from spec import gguf
from spec.gguf import GGUFError, Truncated, parse_header

TEN_GB = 10 << 30


def header_start(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


def string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def array_entry(key: str, item_type: int, count: int) -> bytes:
    return string(key) + struct.pack("<IIQ", 9, item_type, count)


HOSTILE = {
    # a 10 GB array of u8 in the metadata, in a file that is big enough to hold it
    "10 GB u8 array": header_start(0, 1) + array_entry("tokenizer.ggml.scores", 0, TEN_GB),
    # a billion strings: 8 bytes of length each at least
    "1e9 strings": header_start(0, 1) + array_entry("tokenizer.ggml.tokens", 8, 10**9),
    # a metadata key 10 GB long
    "10 GB key": header_start(0, 1) + struct.pack("<Q", TEN_GB),
    # ten million tensors: under MAX_COUNT, but 320 MB of tensor infos at the least
    "1e7 tensors": header_start(10**7, 0),
    "1e9 tensors": header_start(10**9, 0),
    "1e7 metadata entries": header_start(0, 10**7),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_header_declaring_more_than_the_cap_is_refused_at_once(name):
    started = time.monotonic()
    with pytest.raises(GGUFError) as caught:
        parse_header(HOSTILE[name], file_size=2 * TEN_GB)
    assert not isinstance(caught.value, Truncated)          # not "read more and call again"
    assert time.monotonic() - started < 0.5
    assert str(gguf.HEADER_MAX_BYTES) in str(caught.value) or "plausible" in str(caught.value)


def test_a_buffer_short_of_a_header_under_the_cap_asks_for_more():
    data = header_start(0, 1) + array_entry("tokenizer.ggml.scores", 0, 1000)
    with pytest.raises(Truncated) as caught:
        parse_header(data, file_size=2 * TEN_GB)
    assert caught.value.needed == len(data) + 1000


def test_the_cap_holds_without_a_file_size(monkeypatch):
    monkeypatch.setattr(gguf, "HEADER_MAX_BYTES", 4096)
    data = header_start(0, 1) + array_entry("tokenizer.ggml.scores", 0, 5000) + bytes(5000)
    with pytest.raises(GGUFError, match="4096-byte header") as caught:
        parse_header(data)
    assert not isinstance(caught.value, Truncated)
