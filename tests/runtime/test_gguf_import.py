"""GGUF import: a GGUF written by the `gguf` package from a random Hugging Face model, for
each quant type, imports to a folder whose greedy output through our engine, its weights
kept quantized and run by the engine's kernels, equals transformers' on the dequantized
weights; imported with dequantize=True the folder holds exactly those weights. A corrupt or
unsupported file is refused with an error that names the field or tensor."""
from __future__ import annotations

import json
import random
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from runtime import LLM, SamplingParams
from runtime.gguf.importer import import_gguf
from tests.runtime.conftest import hf_greedy
from tests.support.gguf_files import QTYPES, write_model_gguf
from spec.gguf import GGUFError

NEW_TOKENS = 16
# K-quants quantize rows in blocks of 256: every matmul's input width is a multiple of it
K_SPEC = dict(arch="llama", hidden_size=256, intermediate_size=512, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=384, tie_word_embeddings=False)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def _expected_folder(source: Path, weights: dict[str, np.ndarray], out: Path) -> Path:
    """The source model with the weights a GGUF reader must get back (transformers' input)."""
    from safetensors.numpy import save_file

    out.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, out / name)
    save_file(weights, str(out / "model.safetensors"))
    return out


def _assert_same_weights(folder: Path, expected: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import load_file

    got = load_file(str(folder / "model.safetensors"))
    assert sorted(got) == sorted(expected)
    for name, w in expected.items():
        assert np.array_equal(got[name], w), name


def _greedy_equal(imported: Path, oracle_dir: Path, hf_oracle, seed: int = 3) -> None:
    prompt = [random.Random(seed).randrange(5, 300) for _ in range(19)]
    expected, _ = hf_greedy(hf_oracle(oracle_dir), prompt, NEW_TOKENS)
    llm = LLM(str(imported), kv_cache_tokens=256)
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    assert out.token_ids == expected


@pytest.mark.parametrize("qtype", QTYPES)
def test_each_quant_type_imports_to_the_dequantized_weights(qtype, model_factory, hf_oracle, tmp_path):
    source = model_factory(**K_SPEC)
    expected = write_model_gguf(tmp_path / "m.gguf", source, qtype, seed=QTYPES.index(qtype))
    _assert_same_weights(import_gguf(tmp_path / "m.gguf", tmp_path / "widened", dequantize=True), expected)
    imported = import_gguf(tmp_path / "m.gguf", tmp_path / "imported")
    quantized = json.loads((imported / "config.json").read_text()).get("quantization_config")
    if qtype in ("F32", "F16", "BF16"):
        assert quantized is None
    else:
        assert {w["type"] for w in quantized["weights"].values()} == {qtype} and quantized["widened"] == []
    _greedy_equal(imported, _expected_folder(source, expected, tmp_path / "oracle"), hf_oracle)


def test_mixed_types_as_q4_k_m_stores_them(model_factory, hf_oracle, tmp_path):
    """v_proj and down_proj in Q6_K among Q4_K (llama.cpp's Q4_K_M): q/k/v cannot be one
    weight, they run as a RowStack; the answer is still transformers' on the same values."""
    from runtime.load.quantization import RowStack

    source = model_factory(**K_SPEC)
    types = {"v_proj.weight": "Q6_K", "down_proj.weight": "Q6_K"}
    expected = write_model_gguf(tmp_path / "m.gguf", source, "Q4_K", types=types)
    imported = import_gguf(tmp_path / "m.gguf", tmp_path / "imported")
    kept = json.loads((imported / "config.json").read_text())["quantization_config"]["weights"]
    assert kept["model.layers.0.self_attn.v_proj.weight"]["type"] == "Q6_K"
    llm = LLM(str(imported), kv_cache_tokens=256)
    layer = llm.engine.runner.model.layers[0]
    assert isinstance(layer.qkv, RowStack) and len(layer.qkv.parts) == 2     # q and k fused, v apart
    _greedy_equal(imported, _expected_folder(source, expected, tmp_path / "oracle"), hf_oracle)
    # the node's packed-layer cache keeps the stack: a second load maps it, same answer
    from runtime.load.packed_weights import available

    if available():
        first = LLM(str(imported), kv_cache_tokens=256, packed_cache_dir=str(tmp_path / "packed"))
        assert first.engine.runner.model.packed_writer.result(timeout=120) > 0
        again = LLM(str(imported), kv_cache_tokens=256, packed_cache_dir=str(tmp_path / "packed"))
        model = again.engine.runner.model
        assert model.packed_mapping is not None and isinstance(model.layers[0].qkv, RowStack)
        prompt = [5, 6, 7, 8, 9]
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
        assert again.generate([prompt], params)[0].token_ids == llm.generate([prompt], params)[0].token_ids


def test_qwen2_qwen3_and_llama3_rope(model_factory, hf_oracle, tmp_path):
    """qwen2 and qwen3 rows are not permuted; qwen2 carries q/k/v biases and ties its head,
    qwen3 norms q and k per head; llama3 rope scaling comes back from rope_freqs."""
    specs = {"qwen2": dict(arch="qwen2"), "qwen3": dict(arch="qwen3"),
             "llama3": dict(arch="llama", rope_scaling=dict(LLAMA3_ROPE))}
    for name, spec in specs.items():
        source = model_factory(**spec)
        expected = write_model_gguf(tmp_path / f"{name}.gguf", source, "Q8_0")
        _assert_same_weights(import_gguf(tmp_path / f"{name}.gguf", tmp_path / f"{name}-widened", dequantize=True),
                             expected)
        imported = import_gguf(tmp_path / f"{name}.gguf", tmp_path / f"{name}-imported")
        config = json.loads((imported / "config.json").read_text())
        if name == "qwen2":
            assert config["architectures"] == ["Qwen2ForCausalLM"] and config["tie_word_embeddings"] is True
        elif name == "qwen3":
            assert config["architectures"] == ["Qwen3ForCausalLM"] and config["attention_bias"] is False
        else:
            assert config["rope_scaling"] == LLAMA3_ROPE          # (transformers adds rope_theta to its copy)
        _greedy_equal(imported, _expected_folder(source, expected, tmp_path / f"{name}-oracle"), hf_oracle)


def test_folder_has_config_tokenizer_and_chat_template(tiny_model, tmp_path):
    write_model_gguf(tmp_path / "m.gguf", tiny_model, "F16")
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "out")
    source = json.loads((tiny_model / "config.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "bos_token_id", "eos_token_id"):
        assert config[key] == source[key], key
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is False
    from runtime.core.tokenizer import Tokenizer

    ours, theirs = Tokenizer(folder), Tokenizer(tiny_model)
    text = "def add(a, b):\n    return a + b  # naïve 日本語 🙂"
    assert ours.encode(text) == theirs.encode(text)
    messages = [{"role": "user", "content": "Hello"}]
    assert ours.encode_chat(messages) == theirs.encode_chat(messages)
    assert ours.eos_token_ids == theirs.eos_token_ids


# -- refusals ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_gguf(tiny_model, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "good.gguf"
    write_model_gguf(path, tiny_model, "Q8_0")
    return path


def _refused(path: Path, tmp_path: Path) -> str:
    with pytest.raises(GGUFError) as caught:
        import_gguf(path, tmp_path / "out")
    return str(caught.value)


def test_corrupt_files_name_what_is_wrong(good_gguf, tmp_path):
    data = good_gguf.read_bytes()
    cases = {
        "not_gguf.gguf": (b"GGML" + data[4:], "magic: not a GGUF file"),
        "short_header.gguf": (data[:2000], "metadata tokenizer.ggml.tokens: array length 512 does not fit"),
        "short_data.gguf": (data[:-100], "tensor output_norm.weight: its data (256 bytes at 148992) runs past"),
        "version.gguf": (data[:4] + struct.pack("<I", 7) + data[8:], "version: 7 is not supported"),
    }
    name = b"blk.0.attn_q.weight"
    at = data.index(name) + len(name) + 4 + 2 * 8          # n_dims, two dims, then the type
    cases["bad_type.gguf"] = (data[:at] + struct.pack("<I", 99) + data[at + 4:],
                              "tensor blk.0.attn_q.weight: unknown ggml type 99")
    for file, (content, message) in cases.items():
        (tmp_path / file).write_bytes(content)
        assert message in _refused(tmp_path / file, tmp_path), file


def test_unsupported_or_incomplete_models_are_refused_by_name(tiny_model, tmp_path):
    def write(name: str, **kw) -> Path:
        write_model_gguf(tmp_path / name, tiny_model, "Q8_0", **kw)
        return tmp_path / name

    falcon = write("falcon.gguf", arch="falcon")
    supported = "(supported: llama, qwen2, qwen3)"
    assert f"general.architecture: 'falcon' is not supported {supported}" in _refused(falcon, tmp_path)
    missing = write("missing.gguf", skip=("blk.1.ffn_down.weight",))
    assert "tensor blk.1.ffn_down.weight: missing" in _refused(missing, tmp_path)
    no_layers = write("no_layers.gguf", metadata=lambda w: w.add_uint32("llama.block_count", 1))
    assert "tensor blk.1.attn_norm.weight: not part of a llama model with 1 layers" in _refused(no_layers, tmp_path)
    pre = write("pre.gguf", metadata=lambda w: w.add_tokenizer_pre("klingon"))
    assert "tokenizer.ggml.pre: 'klingon' is not supported" in _refused(pre, tmp_path)
    spm_less = write("t5.gguf", metadata=lambda w: w.add_tokenizer_model("t5"))
    assert "tokenizer.ggml.model: 't5' is not supported" in _refused(spm_less, tmp_path)

    wrong_type = write("wrong_type.gguf", metadata=lambda w: w.add_string("llama.embedding_length", "big"))
    assert "llama.embedding_length: 'big' is not an int" in _refused(wrong_type, tmp_path)


def test_a_type_nothing_dequantizes_is_refused_by_tensor(model_factory, tmp_path):
    import gguf

    def q8k(writer) -> None:                  # ggml's own intermediate type: stored, never dequantized
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((256, 292), dtype=np.uint8),
                          raw_dtype=gguf.GGMLQuantizationType.Q8_K)

    path = tmp_path / "q8k.gguf"
    write_model_gguf(path, model_factory(**K_SPEC), "Q8_0", metadata=q8k, skip=("blk.0.attn_q.weight",))
    assert "tensor blk.0.attn_q.weight: type Q8_K cannot be dequantized" in _refused(path, tmp_path)
