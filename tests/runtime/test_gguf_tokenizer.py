"""The tokenizer rebuilt from a GGUF's vocabulary encodes and decodes like the one the
GGUF was made from: byte-level BPE with each pre-tokenizer family llama.cpp names
(gpt-2, smollm, llama-bpe, qwen2), and a SentencePiece Llama vocabulary (checked against
transformers' conversion of the .model file; decoding also against sentencepiece)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from runtime.gguf.tokenizer import build_tokenizer
from runtime.gguf.importer import read_file_header
from tests.support.gguf_files import write_bpe_vocab, write_spm_vocab, write_vocab_only

CORPUS = [
    "The year 2024 had 366 days; π ≈ 3.14159, 1,000,000 and 0x1F; call 555-0123 at 10:45.",
    "naïve café résumé — déjà vu; Grüße aus München; ¿Qué tal? ça va.",
    "日本語のテキストと中文文本, 한국어 텍스트, ภาษาไทย",
    "Русский текст и ελληνικά, עברית, العربية, हिन्दी",
    "emoji 🙂🚀👍🏽 and a combining e\u0301 next to é",
    "def reverse(s: str) -> str:\n    return s[::-1]  # slicing\n\n\tif x >= 10 and y != 3:\n\t\tpass\n",
    "   leading and trailing spaces   \n\n\nthree new lines\r\nCRLF   \t tabs",
    "I'm sure you're right, they'll see we've it's HE'S SHE'LL",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>hmm</think>ok<|endoftext|>",
    "x=1;y=22;z=333;w=4444 ** 55555 // 666666",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
USER_DEFINED = "<think>"


def training_text() -> list[str]:
    """Python's own sources and docs plus a little of every script above (not the corpus)."""
    import json as stdlib_json
    import textwrap

    lines = []
    for module in (stdlib_json, textwrap):
        for path in sorted(Path(module.__file__).parent.glob("*.py"))[:6]:
            lines += path.read_text(encoding="utf-8").splitlines()
    lines += ["Le café est très bon. Die Straße ist lang. 東京は日本の首都です。北京是中国的首都。",
              "Москва — столица России. Αθήνα είναι η πρωτεύουσα. 서울은 한국의 수도입니다.",
              "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols !@#$%^&*() [] {} <> 🙂"] * 20
    return lines


def _bpe(pre: str):
    """A byte-level BPE trained with the pre-tokenizer (and normalizer) `pre` names in HF."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from runtime.gguf.tokenizer import byte_level_pre_tokenizer
    from spec.gguf_model import PRE_TOKENIZERS

    family = PRE_TOKENIZERS[pre]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = byte_level_pre_tokenizer(family)
    if family.nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer=trainer)
    tok.add_tokens([AddedToken(USER_DEFINED, normalized=False, special=False)])
    if family.ignore_merges:
        data = json.loads(tok.to_str())
        data["model"]["ignore_merges"] = True
        tok = Tokenizer.from_str(json.dumps(data))
    return tok


def _rebuilt(path: Path):
    return build_tokenizer(read_file_header(path).metadata)


def _assert_same_ids(ours, theirs, add_special_tokens: bool = False) -> None:
    for text in CORPUS + ["\n".join(CORPUS)]:
        expected = theirs.encode(text, add_special_tokens=add_special_tokens).ids
        assert ours.encode(text, add_special_tokens=add_special_tokens).ids == expected, text


@pytest.mark.parametrize("pre", ["default", "smollm", "llama-bpe", "qwen2"])
def test_byte_level_bpe_round_trips_like_its_source(pre, tmp_path):
    source = _bpe(pre)
    path = tmp_path / "vocab.gguf"
    write_vocab_only(path, lambda w: write_bpe_vocab(w, source, pre, bos="<|im_start|>", eos="<|im_end|>",
                                                     chat_template="{{ messages }}"))
    ours, config = _rebuilt(path)
    _assert_same_ids(ours, source)
    for text in CORPUS:
        ids = source.encode(text, add_special_tokens=False).ids
        assert ours.decode(ids, skip_special_tokens=False) == source.decode(ids, skip_special_tokens=False)
        if pre != "qwen2":                   # NFC turns e + U+0301 into é
            assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.get_vocab_size() == source.get_vocab_size()
    assert ours.encode("<|im_end|>" + USER_DEFINED).tokens == ["<|im_end|>", USER_DEFINED]
    assert (config["bos_token"], config["eos_token"], config["add_bos_token"]) == ("<|im_start|>", "<|im_end|>", False)
    assert config["chat_template"] == "{{ messages }}"


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    """A SentencePiece BPE model trained the way Llama's was (byte fallback, split digits,
    identity normalization, a dummy prefix), with one user-defined symbol."""
    import sentencepiece

    folder = tmp_path_factory.mktemp("spm")
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(training_text()), model_writer=model, vocab_size=800, model_type="bpe",
        byte_fallback=True, split_digits=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, allow_whitespace_only_pieces=True,
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, user_defined_symbols=[USER_DEFINED],
        minloglevel=2)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return folder


def test_sentencepiece_vocabulary_round_trips_like_its_source(spm_model, tmp_path):
    import sentencepiece
    import transformers

    path = tmp_path / "vocab.gguf"
    write_vocab_only(path, lambda w: write_spm_vocab(w, spm_model / "tokenizer.model", (USER_DEFINED,)))
    ours, config = _rebuilt(path)
    hf = transformers.LlamaTokenizer.from_pretrained(str(spm_model), add_bos_token=True)  # as Llama 2 says
    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_model / "tokenizer.model"))
    for text in CORPUS + ["\n".join(CORPUS)]:
        for specials in (True, False):
            assert ours.encode(text, add_special_tokens=specials).ids == hf(
                text, add_special_tokens=specials)["input_ids"], (text, specials)
        ids = sp.encode(text)               # (its merges differ from HF's on runs of spaces)
        assert ours.decode(ids) == sp.decode(ids) == hf.decode(ids), text
    assert ours.encode("hi").tokens[0] == "<s>"                    # llama adds BOS
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
