"""benchmarks/peers.py: how llama-server is built and started, how both servers are driven
and counted, and the report's ratios against the target. The servers are real: thawpool's
on the tiny model, llama-server (when .cache/llama-cpp holds a build) on its F32 export."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from benchmarks import peers
from benchmarks.serve import Workload, start_replica

ISSUE_FIGURES = {  # output tok/s quoted in the issue, from a quiet 2-core machine
    "llama.cpp llama-server, F32 GGUF": 105.0, "thawpool server, fp32": 142.0,
    "llama.cpp llama-server, Q8_0 GGUF": 109.0, "thawpool server, int8 (cpu_low_precision)": 145.0,
    "thawpool offline LLM.generate, fp32": 205.0, "thawpool offline LLM.generate, int8 (cpu_low_precision)": 187.0,
}


def test_amx_cpus_build_for_avx512_without_amx_and_others_natively() -> None:
    amx = peers.cpu_flags("processor\t: 0\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    env = peers.build_env(amx, jobs=2)
    assert env["LLAMA_CPP_BUILD_JOBS"] == "2"
    assert "-DGGML_NATIVE=OFF" in env["CMAKE_ARGS"] and "-DGGML_AMX_INT8=OFF" in env["CMAKE_ARGS"]
    assert peers.build_env(peers.cpu_flags("flags\t\t: fpu avx2 fma\n"), jobs=2) == {"LLAMA_CPP_BUILD_JOBS": "2"}


def test_llama_server_gets_one_slot_per_client_on_loopback() -> None:
    cmd = peers.llama_server_command(Path("/b/llama-server"), Path("/m.gguf"), 8123, threads=2, slots=32,
                                     slot_tokens=512)
    args = dict(zip(cmd[1::2], cmd[2::2]))
    assert args["--host"] == "127.0.0.1" and args["--port"] == "8123" and args["-m"] == "/m.gguf"
    assert (args["-np"], args["-c"], args["-t"], args["-tb"]) == ("32", str(32 * 512), "2", "2")


def test_each_api_asks_for_greedy_ignore_eos_and_counts_its_reply() -> None:
    assert peers.LLAMA_API.body([5, 6], 9) == {"prompt": [5, 6], "n_predict": 9, "temperature": 0.0,
                                               "ignore_eos": True, "cache_prompt": False}
    assert peers.THAWPOOL_API.body([5], 3)["max_tokens"] == 3
    assert peers.LLAMA_API.count({"tokens_predicted": 9, "content": "x"}) == 9
    assert peers.THAWPOOL_API.count({"usage": {"completion_tokens": 3, "prompt_tokens": 1}}) == 3


def test_report_gives_each_pairings_ratio_against_the_target() -> None:
    lines = peers.report(ISSUE_FIGURES, target=2.5)
    assert "thawpool server / llama-server, fp32 vs F32: 1.35x (target 2.5x: not met)" in lines
    assert ("thawpool server / llama-server, int8 (cpu_low_precision) vs Q8_0: 1.33x "
            "(target 2.5x: not met)") in lines
    faster = {**ISSUE_FIGURES, "thawpool server, int8 (cpu_low_precision)": 300.0}
    assert ("thawpool server / llama-server, int8 (cpu_low_precision) vs Q8_0: 2.75x "
            "(target 2.5x: met)") in peers.report(faster, 2.5)
    skipped = {**ISSUE_FIGURES, "llama.cpp llama-server, F32 GGUF": None}
    lines = peers.report(skipped, 2.5)
    assert "thawpool server / llama-server, fp32 vs F32: not measured" in lines
    assert any(line.startswith("llama.cpp llama-server, F32 GGUF") and line.endswith("skipped") for line in lines)


def test_report_holds_the_server_against_offline_all_at_once_and_at_its_concurrency() -> None:
    figures = {**ISSUE_FIGURES, "thawpool offline, fp32, max_num_seqs = concurrency": 150.0}
    lines = peers.report(figures, target=2.5)
    assert ("thawpool server / offline, fp32: 0.69x all at once, "
            "0.95x at the same concurrency") in lines
    # int8 has no capped figure: no line rather than a half one
    server_int8 = "thawpool server / offline, int8 (cpu_low_precision)"
    assert not any(line.startswith(server_int8) for line in lines)


def test_agreement_counts_the_shared_greedy_prefix() -> None:
    assert peers.agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 2
    assert peers.agreement([1, 2], [1, 2, 3]) == 2


def _workload() -> Workload:
    return Workload.random(6, (8, 40), (2, 12), vocab=400, seed=1)


def test_drive_counts_every_requested_token_and_refuses_a_short_reply(tiny_model: Path) -> None:
    replica = start_replica(tiny_model, ["--kv-cache-tokens", "1024"], threads=1)
    try:
        tok_s = asyncio.run(peers.drive(replica.url, peers.THAWPOOL_API, _workload(), concurrency=3))
        # every token a stop token: each reply ends after one token, short of what was asked
        stopping = peers.Api("/v1/completions", "max_tokens", {"stop_token_ids": list(range(512))},
                             peers.THAWPOOL_API.produced)
        with pytest.raises(SystemExit, match="1 tokens for a request of 4"):
            asyncio.run(peers.drive(replica.url, stopping, Workload([[5, 6, 7, 8] * 5], [4]), concurrency=1))
    finally:
        replica.stop()
    assert tok_s > 0


def test_llama_server_runs_the_f32_export_as_thawpool_runs_the_folder(tiny_model: Path, tmp_path: Path) -> None:
    """The check the benchmark prints, made strict on the tiny model: the same greedy tokens."""
    from benchmarks.gguf_export import export_gguf
    from pool.processes import free_port
    from tests.support.gguf_files import write_model_gguf

    binary = peers.find_llama_server(peers.CACHE / "venv")
    if binary is None:
        pytest.skip(f"llama-server is not built ({peers.CACHE / 'venv'}; benchmarks/peers.py builds it)")
    write_model_gguf(tmp_path / "vocab.gguf", tiny_model, "Q8_0")
    gguf = export_gguf(tiny_model, tmp_path / "tiny.f32.gguf", "F32", tmp_path / "vocab.gguf")
    prompt = _workload().prompts[0]
    port = free_port()
    replica = peers.start_llama_server(peers.llama_server_command(binary, gguf, port, threads=1, slots=3,
                                                                  slot_tokens=256), port, tmp_path / "log")
    try:
        theirs = asyncio.run(peers.llama_greedy(replica.url, prompt))
        tok_s = asyncio.run(peers.drive(replica.url, peers.LLAMA_API, _workload(), concurrency=3))
    finally:
        replica.stop()
    assert tok_s > 0
    assert theirs == peers.thawpool_greedy(tiny_model, prompt, peers.PAIRINGS[0])
