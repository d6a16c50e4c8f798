"""The shared fixtures start real services and write loadable model folders."""
import json

from safetensors import safe_open


def test_tiny_model_folder_is_complete(tiny_model):
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_key_value_heads"] < config["num_attention_heads"]
    with safe_open(str(tiny_model / "model.safetensors"), "pt") as f:
        assert "model.embed_tokens.weight" in f.keys()
    tok_config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    assert "im_start" in tok_config["chat_template"]


def test_tokenizer_round_trips_multibyte(tiny_model):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tiny_model / "tokenizer.json"))
    text = "café 日本 🙂 def add(a, b):"
    assert tok.decode(tok.encode(text).ids) == text
    assert tok.get_vocab_size() <= 512


def test_model_upload_to_s3(tiny_model, s3_server, s3_bucket):
    from tests.support.model_factory import upload_model

    uri = upload_model(tiny_model, s3_server.client(), s3_bucket, "m/tiny")
    assert uri == f"s3://{s3_bucket}/m/tiny/"
    keys = {o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_bucket)["Contents"]}
    assert "m/tiny/model.safetensors" in keys and "m/tiny/config.json" in keys


async def test_postgres_accepts_queries(pg_server):
    import asyncpg

    conn = await asyncpg.connect(pg_server.libpq_uri)
    try:
        assert await conn.fetchval("select 1 + 1") == 2
    finally:
        await conn.close()
