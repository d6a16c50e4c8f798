"""The two public Azure traces, on small hand-written files of their exact shapes."""
import types

import numpy as np
import pytest

from poolsim.azure_traces import read_azure_functions, read_azure_llm
from poolsim.trace_files import TraceFileError
from poolsim.traffic import TrafficConfig
from poolsim.workload import Deployment, ModelShape, Request

SERVICE = Deployment("conv", "azure", ModelShape("llama-2-70b", 70.0, 140_000_000_000, 4), "chat")

# the first lines of AzureLLMInferenceTrace_conv.csv (2023), one row out of order at the end
LLM = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:16:51.3910170,91,16
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_llm_trace_maps_onto_the_named_deployment(tmp_path):
    trace = read_azure_llm(write(tmp_path, "conv.csv", LLM), SERVICE)
    requests = list(trace.requests())
    assert trace.deployments == (SERVICE,)
    assert [(r.deployment, r.prompt_tokens, r.output_tokens) for r in requests] == [
        ("conv", 374, 44), ("conv", 396, 109), ("conv", 879, 55), ("conv", 91, 16)]
    assert [r.at_s for r in requests] == pytest.approx([0.0, 4.314579, 4.541877, 64.710427])
    assert trace.duration_s == pytest.approx(64.710427)
    assert isinstance(trace.requests(), types.GeneratorType)


def test_llm_trace_takes_a_duration_and_checks_it(tmp_path):
    trace = read_azure_llm(write(tmp_path, "conv.csv", LLM), SERVICE, duration_s=60.0)
    assert trace.duration_s == 60.0
    with pytest.raises(TraceFileError) as caught:
        list(trace.requests())
    assert (caught.value.line, caught.value.field) == (5, "at_s")


@pytest.mark.parametrize("row, field", [
    ("2023-11-16 18:15:49.0,10,10", "at_s"),               # before the line above it
    ("16/11/2023 18:17,10,10", "TIMESTAMP"),
    ("2023-11-16 18:17:00+00:00,10,10", "TIMESTAMP"),        # a zone where the first had none
    ("2023-11-16 18:17:00,ten,10", "ContextTokens"),
    ("2023-11-16 18:17:00,10,0", "GeneratedTokens"),
    ("2023-11-16 18:17:00,10", "row"),
])
def test_a_bad_llm_row_is_named_with_its_field(tmp_path, row, field):
    path = write(tmp_path, "conv.csv", LLM + row + "\n")
    with pytest.raises(TraceFileError) as caught:
        read_azure_llm(path, SERVICE)                      # no duration: the whole file is checked at once
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), 6, field)


def test_llm_trace_needs_its_header_and_a_request(tmp_path):
    with pytest.raises(TraceFileError, match="header"):
        read_azure_llm(write(tmp_path, "a.csv", "time,prompt,output\n"), SERVICE)
    with pytest.raises(TraceFileError, match="no requests"):
        read_azure_llm(write(tmp_path, "b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"), SERVICE)


def functions_file(tmp_path, rows, minutes=4):
    header = "HashOwner,HashApp,HashFunction,Trigger," + ",".join(str(m) for m in range(1, minutes + 1))
    return write(tmp_path, "invocations_per_function_md.anon.d01.csv", "\n".join([header, *rows]) + "\n")


FUNCTIONS = ["o1,app1,fa,http,2,0,0,1", "o1,app1,fb,timer,1,1,1,1", "o2,app2,fc,queue,0,0,0,0",
             "o3,app3,fd,http,0,3,0,0"]


def test_functions_trace_makes_each_function_a_deployment(tmp_path):
    config = TrafficConfig(seed=9, code_fraction=0.5)
    trace = read_azure_functions(functions_file(tmp_path, FUNCTIONS), config)
    assert trace.duration_s == 240.0
    assert [(d.name, d.tenant) for d in trace.deployments] == [("fa", "o1"), ("fb", "o1"), ("fc", "o2"),
                                                               ("fd", "o3")]
    assert [d.mean_rate_per_s * 240 for d in trace.deployments] == pytest.approx([3, 4, 0, 3])
    requests = list(trace.requests())
    assert requests == list(trace.requests())              # the spread within minutes is seeded
    assert [r.at_s for r in requests] == sorted(r.at_s for r in requests)
    per_minute = {(name, minute): 0 for name in ("fa", "fb", "fd") for minute in range(4)}
    for r in requests:
        per_minute[(r.deployment, int(r.at_s // 60))] += 1
    assert [per_minute[("fa", m)] for m in range(4)] == [2, 0, 0, 1]
    assert [per_minute[("fb", m)] for m in range(4)] == [1, 1, 1, 1]
    assert [per_minute[("fd", m)] for m in range(4)] == [0, 3, 0, 0]


def test_functions_lengths_follow_the_kind_they_are_given(tmp_path):
    counts = ",".join(["400"] * 60)
    rows = [f"o,app,f{i},http,{counts}" for i in range(8)]
    trace = read_azure_functions(functions_file(tmp_path, rows, minutes=60), TrafficConfig(code_fraction=0.5))
    kinds = {d.name: d.kind for d in trace.deployments}
    assert set(kinds.values()) == {"chat", "code"}
    for kind, output_median in (("code", 13), ("chat", 129)):
        outputs = [r.output_tokens for r in trace.requests() if kinds[r.deployment] == kind]
        assert np.median(outputs) == pytest.approx(output_median, rel=0.1)


def test_functions_spread_needs_no_whole_day_in_memory(tmp_path):
    trace = read_azure_functions(functions_file(tmp_path, FUNCTIONS))
    assert isinstance(trace.requests(), types.GeneratorType)
    assert isinstance(next(trace.requests()), Request)


@pytest.mark.parametrize("rows, line, field", [
    (["o1,app1,fa,http,2,0,-1,1"], 2, "3"),
    (["o1,app1,fa,http,2,0,x,1"], 2, "3"),
    (["o1,app1,fa,http,2,0,1.5,1"], 2, "3"),
    (["o1,app1,fa,http,2,0,1"], 2, "row"),
    (["o1,app1,fa,http,2,0,0,1", "o1,app1,fa,http,1,0,0,1"], 3, "HashFunction"),
    (["o1,app1,,http,2,0,0,1"], 2, "HashFunction"),
])
def test_a_bad_functions_row_is_named_with_its_field(tmp_path, rows, line, field):
    path = functions_file(tmp_path, rows)
    with pytest.raises(TraceFileError) as caught:
        read_azure_functions(path)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), line, field)


def test_functions_header_must_number_the_minutes(tmp_path):
    path = write(tmp_path, "f.csv", "HashOwner,HashApp,HashFunction,Trigger,1,3\no,a,f,http,1,1\n")
    with pytest.raises(TraceFileError) as caught:
        read_azure_functions(path)
    assert (caught.value.line, caught.value.field) == (1, "header")
