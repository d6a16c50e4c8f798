"""ParsedTokenizers (runtime/serve/parsed_tokenizers.py): a tokenizer parsed ahead is handed
to the load when its files are the same, parsed again when they changed, and only a few
are kept. Real tokenizer files of the tiny model, parsed by the real Tokenizer; the parse
is wrapped only to count what was parsed."""
from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from runtime.core.tokenizer import Tokenizer
from runtime.serve.parsed_tokenizers import ParsedTokenizers


class CountedParse:
    def __init__(self) -> None:
        self.parsed: list[str] = []

    def __call__(self, model_dir: str) -> Tokenizer:
        self.parsed.append(Path(model_dir).name)
        return Tokenizer(model_dir)


@pytest.fixture
def folders(tiny_model, tmp_path) -> list[str]:
    """Five folders with the tiny model's tokenizer files, each its own copy."""
    made = []
    for name in "abcde":
        folder = tmp_path / name
        folder.mkdir()
        for file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tiny_model / file, folder / file)
        made.append(str(folder))
    return made


async def settled(cache: ParsedTokenizers, count: int) -> None:
    while len(cache.prepared()) < count:
        await asyncio.sleep(0.01)


def test_a_parse_ahead_is_taken_by_the_load(folders):
    async def run() -> None:
        parse = CountedParse()
        cache = ParsedTokenizers(parse=parse)
        cache.prepare((folders[0], folders[1]))
        await settled(cache, 2)
        assert parse.parsed == ["a", "b"]             # the most likely first
        assert cache.prepared() == (folders[0], folders[1])
        tokenizer, _ = await cache.take(folders[0])
        assert parse.parsed == ["a", "b"]             # nothing parsed at the load
        assert tokenizer.encode("hello world") == Tokenizer(folders[0]).encode("hello world")
        assert cache.prepared() == ()                 # one model in a replica's life: the rest go
    asyncio.run(run())


def test_a_load_waits_for_the_parse_under_way_and_parses_nothing_twice(folders):
    async def run() -> None:
        parse = CountedParse()
        cache = ParsedTokenizers(parse=parse)
        cache.prepare((folders[0],))
        await cache.take(folders[0])                  # at once: the parse is under way
        assert parse.parsed == ["a"]
    asyncio.run(run())


def test_a_changed_file_is_parsed_again(folders):
    async def run() -> None:
        parse = CountedParse()
        cache = ParsedTokenizers(parse=parse)
        cache.prepare((folders[0],))
        await settled(cache, 1)
        config = Path(folders[0]) / "tokenizer_config.json"
        config.write_text(config.read_text() + " ")           # another size: other files
        await cache.take(folders[0])
        assert parse.parsed == ["a", "a"]
        cache.prepare((folders[1],))
        await settled(cache, 1)
        tokenizer_json = Path(folders[1]) / "tokenizer.json"
        st = tokenizer_json.stat()
        os.utime(tokenizer_json, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))   # touched
        await cache.take(folders[1])
        assert parse.parsed == ["a", "a", "b", "b"]
        cache.prepare((folders[2],))
        await settled(cache, 1)
        (Path(folders[2]) / "tokenizer.json").rename(Path(folders[2]) / "gone.json")
        with pytest.raises(ValueError, match="no tokenizer.json"):   # the load says why
            await cache.take(folders[2])
    asyncio.run(run())


def test_a_failed_parse_ahead_is_parsed_again_at_the_load(folders):
    async def run() -> None:
        cache = ParsedTokenizers()
        broken = Path(folders[0]) / "tokenizer.json"
        text = broken.read_text()
        broken.write_text("{")
        cache.prepare((folders[0],))
        await cache.settled()
        assert cache.prepared() == ()                 # failed: not offered
        broken.write_text(text)                       # fixed since (another size)
        tokenizer, _ = await cache.take(folders[0])
        assert tokenizer.vocab_size == Tokenizer(folders[0]).vocab_size
    asyncio.run(run())


def test_only_a_few_are_kept_the_least_likely_dropped_first(folders):
    async def run() -> None:
        parse = CountedParse()
        cache = ParsedTokenizers(capacity=3, parse=parse)
        cache.prepare((folders[0], folders[1], folders[2]))
        await settled(cache, 3)
        cache.prepare((folders[3], folders[1]))       # told again: d and b most likely now
        await settled(cache, 3)
        assert cache.prepared() == (folders[3], folders[1], folders[0])
        assert parse.parsed == ["a", "b", "c", "d"]   # b kept, not parsed again
        await cache.take(folders[2])                  # dropped: parsed at the load
        assert parse.parsed == ["a", "b", "c", "d", "c"]
    asyncio.run(run())


def test_a_folder_without_a_tokenizer_is_not_parsed_ahead(folders, tmp_path):
    async def run() -> None:
        parse = CountedParse()
        cache = ParsedTokenizers(parse=parse)
        cache.prepare((str(tmp_path / "nowhere"), folders[0]))
        await cache.settled()
        assert parse.parsed == ["a"] and cache.prepared() == (folders[0],)
        cache.close()
    asyncio.run(run())
