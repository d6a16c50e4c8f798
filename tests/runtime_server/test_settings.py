"""Command line -> ServerSettings, parsed once; every engine argument has a flag."""
from __future__ import annotations

import pytest

from runtime.serve.server import parse_settings
from spec import engine_options


def test_engine_flags_become_llm_kwargs():
    s = parse_settings(["--model", "/m", "--port", "9000", "--dtype", "bfloat16",
                        "--kv-cache-tokens", "4096", "--block-size", "32", "--max-num-seqs", "8",
                        "--max-num-batched-tokens", "512", "--no-enable-prefix-caching",
                        "--speculative", '{"method": "ngram", "k": 4}', "--quantization", "int8",
                        "--tensor-parallel-size", "2", "--served-model-name", "m1",
                        "--kv-cache-dtype", "bfloat16", "--batch-invariant"])
    assert (s.model, s.port, s.served_model_name, s.standby) == ("/m", 9000, "m1", False)
    assert s.engine_kwargs == {"dtype": "bfloat16", "kv_cache_tokens": 4096, "block_size": 32,
                               "max_num_seqs": 8, "max_num_batched_tokens": 512,
                               "enable_prefix_caching": False,
                               "speculative": {"method": "ngram", "k": 4},
                               "quantization": "int8", "tensor_parallel_size": 2,
                               "kv_cache_dtype": "bfloat16", "batch_invariant": True}
    assert s.load_request().served_model_name == "m1"


def test_unset_flags_keep_engine_defaults_and_name_defaults_to_the_folder():
    s = parse_settings(["--model", "/models/x"])
    assert s.engine_kwargs == {} and s.load_request().served_model_name == "/models/x"


def test_standby_and_model_are_exclusive():
    assert parse_settings(["--standby"]).standby
    for argv in ([], ["--standby", "--model", "/m"]):
        with pytest.raises(SystemExit):
            parse_settings(argv)


def test_every_engine_option_round_trips_through_the_pools_flags():
    """The pool spells each option with spec.engine_options.to_flags; the server reads every
    one of them back as it was."""
    options = {"device": "cuda:1", "dtype": "bfloat16", "kv_cache_tokens": 4096,
               "kv_cache_memory_fraction": 0.25, "kv_cache_max_bytes_cpu": 1 << 30,
               "enable_prefix_caching": False, "cache_salt": "rev-1", "speculative": {"method": "ngram"},
               "quantization": "int8", "tensor_parallel_size": 2, "block_size": 32, "max_num_seqs": 8,
               "max_num_batched_tokens": 512, "max_model_len": 1024, "seed": 7, "task": "embed",
               "pooling": "mean", "kv_cache_dtype": "bfloat16", "batch_invariant": True,
               "packed_cache_dir": "/cache/packed", "packed_cache_gb": 2.5, "cuda_graphs": True,
               "cpu_low_precision": True, "cpu_replay": False, "max_loras": 3, "max_lora_rank": 64,
               "scheduling_policy": "fcfs"}
    assert set(options) == engine_options.OPTIONS
    settings = parse_settings(["--model", "/m", *engine_options.to_flags(options)])
    assert settings.engine_kwargs == options


def test_the_secret_comes_from_the_environment_or_an_owner_only_file(tmp_path, capsys):
    from wire.replica_secret import SECRET_ENV, SECRET_FILE_ENV

    secret_file = tmp_path / "secret"
    secret_file.write_text("from-the-file\n")
    secret_file.chmod(0o600)
    assert parse_settings(["--standby"], env={}).secret is None
    assert parse_settings(["--standby"], env={SECRET_FILE_ENV: str(secret_file)}).secret == "from-the-file"
    both = {SECRET_ENV: "from-the-env", SECRET_FILE_ENV: str(secret_file)}
    settings = parse_settings(["--standby"], env=both)
    assert settings.secret == "from-the-env" and "from-the-env" not in repr(settings)

    secret_file.chmod(0o644)
    (tmp_path / "empty").write_text("")
    (tmp_path / "empty").chmod(0o600)
    for path, why in [(secret_file, "may be read by others"), (tmp_path / "empty", "is empty"),
                      (tmp_path / "missing", "cannot read")]:
        with pytest.raises(SystemExit):
            parse_settings(["--standby"], env={SECRET_FILE_ENV: str(path)})
        assert why in capsys.readouterr().err
