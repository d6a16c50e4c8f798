"""Grammar engines from PyPI side by side on our tokenizer: mask cost per token and schema coverage.

The measurement behind docs/structured-outputs.md (why llguidance). On the real model's
tokenizer (SmolLM2, 49,152 tokens; scripts/real_model.py) each engine that is installed
(`llguidance`, `xgrammar`, `outlines-core`; the two not chosen are not dependencies of
thawpool: `pip install xgrammar outlines-core` to compare) is given a set of JSON schemas,
one per feature; for each it reports whether the schema compiles, the compile time, and
the CPU time to compute the token mask at each step of a valid instance tokenized
with our tokenizer (mask + advance, one request, one thread).

    .venv/bin/python benchmarks/grammar_engines.py
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (feature, schema, a valid instance); INVALID: an instance the engine must refuse
CASES: list[tuple[str, dict[str, Any], Any]] = [
    ("object+required", {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                         "required": ["name", "age"]}, {"name": "Ada Lovelace", "age": 36}),
    ("nested+array", {"type": "object", "properties": {"items": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {
            "type": "string"}}}, "required": ["id", "tags"]}}}, "required": ["items"]},
     {"items": [{"id": 1, "tags": ["a", "b"]}, {"id": 2, "tags": []}]}),
    ("enum", {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
     {"color": "green"}),
    ("integer bounds", {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 250}},
                        "required": ["n"]}, {"n": 117}),
    ("number bounds", {"type": "object", "properties": {"x": {"type": "number", "minimum": -1.5, "maximum": 2.5}},
                       "required": ["x"]}, {"x": 0.25}),
    ("exclusiveMinimum", {"type": "object", "properties": {"x": {"type": "number", "exclusiveMinimum": 0}},
                          "required": ["x"]}, {"x": 3.5}),
    ("minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}, [1, 2, 3]),
    ("string length", {"type": "string", "minLength": 2, "maxLength": 5}, "abcd"),
    ("pattern", {"type": "object", "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                 "required": ["zip"]}, {"zip": "90210"}),
    ("format date-time", {"type": "string", "format": "date-time"}, "2026-12-03T16:12:06Z"),
    ("anyOf", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "x"),
    ("$ref/$defs", {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
                    "type": "object", "properties": {"a": {"$ref": "#/$defs/p"}}, "required": ["a"]}, {"a": {"x": 1}}),
    ("recursive $ref", {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "children": {
        "type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"},
     {"v": 1, "children": [{"v": 2}]}),
    ("additionalProperties", {"type": "object", "additionalProperties": {"type": "integer"}}, {"a": 1, "b": 2}),
    ("const", {"type": "object", "properties": {"k": {"const": "fixed"}}, "required": ["k"]}, {"k": "fixed"}),
    ("any JSON object", {"type": "object"}, {"free": [1, "form", None, True]}),
]


INVALID: dict[str, Any] = {
    "integer bounds": {"n": 251}, "number bounds": {"x": 3.5}, "exclusiveMinimum": {"x": -1},
    "minItems/maxItems": [1, 2, 3, 4, 5], "string length": "abcdefg", "pattern": {"zip": "9021"},
    "enum": {"color": "pink"}, "object+required": {"name": "Ada"}, "const": {"k": "other"},
}


def tokenizer_json() -> tuple[Path, str]:
    from scripts.real_model import smollm2_dir
    folder = smollm2_dir()
    return folder, (folder / "tokenizer.json").read_text()


class Engine:
    """One library: compile(schema) -> state; mask(state) fills a mask; advance(state, token)."""
    name = ""

    def __init__(self, folder: Path, text: str, eos: int, vocab: int):
        import torch
        self.eos = eos
        self.bitmask = torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)
        started = time.perf_counter()
        self.setup(folder, text, vocab)
        self.setup_s = time.perf_counter() - started

    def setup(self, folder: Path, text: str, vocab: int) -> None: ...
    def compile(self, schema: dict[str, Any]) -> Any: ...
    def mask(self, state: Any) -> None: ...
    def advance(self, state: Any, token: int) -> bool: ...

    def allows(self, state: Any, token: int) -> bool:
        self.mask(state)
        return bool((int(self.bitmask[0, token // 32]) >> (token % 32)) & 1)

    def can_stop(self, state: Any) -> bool:
        return self.allows(state, self.eos)


class LLGuidance(Engine):
    name = "llguidance"

    def setup(self, folder: Path, text: str, vocab: int) -> None:
        import llguidance
        self.lib = llguidance
        self.tok = llguidance.LLTokenizer(text, n_vocab=vocab, eos_token=self.eos)

    def compile(self, schema: dict[str, Any]) -> Any:
        grammar = self.lib.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        matcher = self.lib.LLMatcher(self.tok, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def mask(self, state: Any) -> None:
        import llguidance.torch
        llguidance.torch.fill_next_token_bitmask(state, self.bitmask, 0)

    def advance(self, state: Any, token: int) -> bool:
        return bool(state.consume_token(token))


class XGrammar(Engine):
    name = "xgrammar"

    def setup(self, folder: Path, text: str, vocab: int) -> None:
        import xgrammar
        from transformers import PreTrainedTokenizerFast
        self.lib = xgrammar
        hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
        info = xgrammar.TokenizerInfo.from_huggingface(hf, vocab_size=vocab, stop_token_ids=[self.eos])
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)

    def compile(self, schema: dict[str, Any]) -> Any:
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                     separators=(",", ":"))
        return self.lib.GrammarMatcher(compiled)

    def mask(self, state: Any) -> None:
        state.fill_next_token_bitmask(self.bitmask, 0)

    def advance(self, state: Any, token: int) -> bool:
        return bool(state.accept_token(token))


class OutlinesCore(Engine):
    name = "outlines-core"

    def setup(self, folder: Path, text: str, vocab: int) -> None:
        import outlines_core
        from tokenizers import Tokenizer
        self.lib = outlines_core
        tok = Tokenizer.from_str(text)
        tokens: dict[str, list[int]] = {}
        for token_id in range(tok.get_vocab_size()):
            if token_id != self.eos:
                tokens.setdefault(tok.decode([token_id], skip_special_tokens=False), []).append(token_id)
        self.vocabulary = outlines_core.Vocabulary(self.eos, tokens)

    def compile(self, schema: dict[str, Any]) -> Any:
        regex = self.lib.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.lib.Guide(self.lib.Index(regex, self.vocabulary))

    def mask(self, state: Any) -> None:
        state.write_mask_into(self.bitmask.data_ptr(), self.bitmask.numel(), 4)

    def advance(self, state: Any, token: int) -> bool:
        state.advance(token)
        return True


def measure(engine: Engine, encode: Callable[[str], list[int]]) -> list[tuple[str, Optional[float], str]]:
    rows: list[tuple[str, Optional[float], str]] = []
    mask_s: list[float] = []
    for feature, schema, instance in CASES:
        started = time.perf_counter()
        try:
            state = engine.compile(schema)
        except Exception as exc:    # noqa: BLE001 - a refusal is what we measure
            rows.append((feature, None, f"refused: {str(exc).splitlines()[0][:70]}"))
            continue
        compile_s = time.perf_counter() - started
        tokens = encode(json.dumps(instance, separators=(",", ":")))
        ok, steps = True, 0
        for token in tokens:
            t0 = time.perf_counter()
            engine.mask(state)
            mask_s.append(time.perf_counter() - t0)
            steps += 1
            if not engine.advance(state, token):
                ok = False
                break
        verdict = "ok" if ok else f"rejected a valid token at step {steps}"
        if ok and feature in INVALID and _accepts(engine, engine.compile(schema), encode(
                json.dumps(INVALID[feature], separators=(",", ":")))):
            verdict = f"not enforced: accepts {json.dumps(INVALID[feature])}"
        rows.append((feature, compile_s, verdict))
    per_token = statistics.median(mask_s) if mask_s else float("nan")
    mean = statistics.fmean(mask_s) if mask_s else float("nan")
    rows.append(("(mask per token)", None, f"median {per_token * 1e6:.0f} us, mean {mean * 1e6:.0f} us, "
                                           f"p99 {_p99(mask_s) * 1e6:.0f} us over {len(mask_s)} steps"))
    return rows


def _accepts(engine: Engine, state: Any, tokens: list[int]) -> bool:
    """Whether the engine lets every token of an (invalid) instance through."""
    for token in tokens:
        if not engine.allows(state, token) or not engine.advance(state, token):
            return False
    return engine.can_stop(state)


def _p99(values: list[float]) -> float:
    return sorted(values)[int(0.99 * (len(values) - 1))] if values else float("nan")


def main() -> None:
    from tokenizers import Tokenizer
    folder, text = tokenizer_json()
    tok = Tokenizer.from_str(text)
    vocab = tok.get_vocab_size()
    eos = tok.token_to_id("<|im_end|>")

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False).ids

    print(f"tokenizer: {folder.name}, {vocab} tokens")
    for cls in (LLGuidance, XGrammar, OutlinesCore):
        try:
            engine = cls(folder, text, eos, vocab)
        except ImportError as exc:
            print(f"\n{cls.name}: not installed ({exc})")
            continue
        print(f"\n{engine.name}: tokenizer setup {engine.setup_s:.2f} s")
        for feature, compile_s, verdict in measure(engine, encode):
            timing = f"{compile_s * 1e3:8.1f} ms" if compile_s is not None else " " * 11
            print(f"  {feature:22s} {timing}  {verdict}")


if __name__ == "__main__":
    from benchmarks.results import recorded
    with recorded(__file__):
        main()
