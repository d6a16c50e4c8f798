"""Trace files: write and read back the same trace; each broken rule names file, line and field."""
import json
import types

import pytest

from poolsim.trace_files import (TraceFileError, read_deployments, read_requests, read_trace, write_requests,
                                 write_trace)
from poolsim.traffic import TrafficConfig, generate
from poolsim.workload import Deployment, ModelShape, Request

MODEL = ModelShape("llama-3-8b", 8.0, 16_000_000_000, 1)
DEPLOYMENTS = {"duration_s": 100.0, "deployments": [
    {"name": "a", "tenant": "t", "model": "llama-3-8b", "parameters_b": 8.0, "weight_bytes": 16_000_000_000,
     "gpu_count": 1, "kind": "chat"},
    {"name": "b,c", "tenant": "t", "model": "llama-3-70b", "parameters_b": 70, "weight_bytes": 140_000_000_000,
     "gpu_count": 4, "kind": "code", "mean_rate_per_s": 0.5},
]}


@pytest.fixture()
def deployments_file(tmp_path):
    path = tmp_path / "deployments.json"
    path.write_text(json.dumps(DEPLOYMENTS))
    return path


@pytest.mark.parametrize("name", ["requests.jsonl", "requests.csv", "requests.jsonl.gz", "requests.csv.gz"])
def test_a_generated_trace_reads_back_the_same(tmp_path, name):
    trace = generate(TrafficConfig(deployments=40, rate_scale=0.01, duration_s=7200.0, seed=2))
    count = write_trace(trace, tmp_path / name, tmp_path / "deployments.json")
    back = read_trace(tmp_path / name, tmp_path / "deployments.json")
    assert count > 100
    assert back.deployments == trace.deployments and back.duration_s == 7200.0
    assert isinstance(back.requests(), types.GeneratorType)
    assert list(back.requests()) == list(trace.requests())       # floats to the last bit
    assert list(back.requests()) == list(back.requests())


def test_the_documented_shapes_read(tmp_path, deployments_file):
    (tmp_path / "r.jsonl").write_text(
        '{"at_s": 0.731, "deployment": "a", "prompt_tokens": 1469, "output_tokens": 13}\n'
        '\n'
        '{"at_s": 2, "deployment": "b,c", "prompt_tokens": 5, "output_tokens": 7, "note": "extra keys are fine"}\n')
    (tmp_path / "r.csv").write_text('at_s,deployment,prompt_tokens,output_tokens\n0.731,a,1469,13\n2,"b,c",5,7\n')
    expected = [Request(0.731, "a", 1469, 13), Request(2.0, "b,c", 5, 7)]
    for name in ("r.jsonl", "r.csv"):
        trace = read_trace(tmp_path / name, deployments_file)
        assert list(trace.requests()) == expected
    assert trace.deployment("b,c") == Deployment("b,c", "t", ModelShape("llama-3-70b", 70.0, 140_000_000_000, 4),
                                                 "code", 0.5)
    assert trace.deployment("a").mean_rate_per_s == 0.0


def test_columns_may_come_in_any_order(tmp_path):
    (tmp_path / "r.csv").write_text("deployment,output_tokens,at_s,prompt_tokens\na,3,1.5,2\n")
    assert list(read_requests(tmp_path / "r.csv")) == [Request(1.5, "a", 2, 3)]


GOOD = '{"at_s": 1.0, "deployment": "a", "prompt_tokens": 10, "output_tokens": 5}'
BAD_LINES = [
    ('{"at_s": 1.0, "deployment": "a", "prompt_tokens": 10', "json"),
    ('[1, 2]', "json"),
    ('{"deployment": "a", "prompt_tokens": 10, "output_tokens": 5}', "at_s"),
    ('{"at_s": "1.0", "deployment": "a", "prompt_tokens": 10, "output_tokens": 5}', "at_s"),
    ('{"at_s": NaN, "deployment": "a", "prompt_tokens": 10, "output_tokens": 5}', "at_s"),
    ('{"at_s": 0.5, "deployment": "a", "prompt_tokens": 10, "output_tokens": 5}', "at_s"),       # back in time
    ('{"at_s": 100.5, "deployment": "a", "prompt_tokens": 10, "output_tokens": 5}', "at_s"),     # past the end
    ('{"at_s": 2.0, "deployment": "zz", "prompt_tokens": 10, "output_tokens": 5}', "deployment"),
    ('{"at_s": 2.0, "deployment": 7, "prompt_tokens": 10, "output_tokens": 5}', "deployment"),
    ('{"at_s": 2.0, "deployment": "a", "prompt_tokens": 1.5, "output_tokens": 5}', "prompt_tokens"),
    ('{"at_s": 2.0, "deployment": "a", "prompt_tokens": true, "output_tokens": 5}', "prompt_tokens"),
    ('{"at_s": 2.0, "deployment": "a", "prompt_tokens": 10, "output_tokens": 0}', "output_tokens"),
]


@pytest.mark.parametrize("line, field", BAD_LINES)
def test_a_bad_jsonl_line_is_named_with_its_field(tmp_path, deployments_file, line, field):
    path = tmp_path / "r.jsonl"
    path.write_text(f"{GOOD}\n{GOOD}\n{line}\n{GOOD}\n")
    trace = read_trace(path, deployments_file)
    stream = trace.requests()
    assert next(stream).at_s == 1.0                      # the lines before it still stream
    with pytest.raises(TraceFileError) as caught:
        list(stream)
    error = caught.value
    assert (error.path, error.line, error.field) == (str(path), 3, field)
    assert str(error).startswith(f"{path}:3: {field}: ")


@pytest.mark.parametrize("text, line, field", [
    ("at_s,deployment,prompt\n", 1, "header"),
    ("at_s,deployment,prompt_tokens,output_tokens\n1,a,2\n", 2, "row"),
    ("at_s,deployment,prompt_tokens,output_tokens\n1,a,2,3\n\nx,a,2,3\n", 4, "at_s"),
    ("at_s,deployment,prompt_tokens,output_tokens\n1,a,2,3\n1,a,-2,3\n", 3, "prompt_tokens"),
    ("at_s,deployment,prompt_tokens,output_tokens\n1,a,2,3\n1,a,2,3.0\n", 3, "output_tokens"),
])
def test_a_bad_csv_line_is_named_with_its_field(tmp_path, text, line, field):
    path = tmp_path / "r.csv"
    path.write_text(text)
    with pytest.raises(TraceFileError) as caught:
        list(read_requests(path))
    assert (caught.value.line, caught.value.field) == (line, field)


def entry(**changes):
    return {**DEPLOYMENTS["deployments"][0], **changes}


@pytest.mark.parametrize("document, field", [
    ({"deployments": [entry()]}, "duration_s"),
    ({"duration_s": -1, "deployments": [entry()]}, "duration_s"),
    ({"duration_s": 10}, "deployments"),
    ({"duration_s": 10, "deployments": [entry(), entry(kind="vision")]}, "deployments[1].kind"),
    ({"duration_s": 10, "deployments": [entry(gpu_count=0)]}, "deployments[0].gpu_count"),
    ({"duration_s": 10, "deployments": [entry(gpu_count=1.5)]}, "deployments[0].gpu_count"),
    ({"duration_s": 10, "deployments": [entry(tenant="")]}, "deployments[0].tenant"),
    ({"duration_s": 10, "deployments": [entry(weight_bytes=None)]}, "deployments[0].weight_bytes"),
    ({"duration_s": 10, "deployments": [entry(mean_rate_per_s=-1)]}, "deployments[0].mean_rate_per_s"),
    ({"duration_s": 10, "deployments": [entry(), entry()]}, "deployments[1].name"),
    ({"duration_s": 10, "deployments": ["a"]}, "deployments[0]"),
])
def test_a_bad_deployments_file_names_the_entry_and_field(tmp_path, document, field):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(document))
    with pytest.raises(TraceFileError) as caught:
        read_deployments(path)
    assert caught.value.field == field and caught.value.path == str(path)


def test_a_deployments_file_that_is_not_json_names_the_line(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"duration_s": 10,\n "deployments": [\n  {"name": "a",,}]}')
    with pytest.raises(TraceFileError) as caught:
        read_deployments(path)
    assert (caught.value.line, caught.value.field) == (3, "json")


def test_an_unknown_extension_is_refused(tmp_path, deployments_file):
    with pytest.raises(ValueError, match=r"\.jsonl or \.csv"):
        read_trace(tmp_path / "r.parquet", deployments_file)
    with pytest.raises(ValueError, match=r"\.jsonl or \.csv"):
        write_requests([], tmp_path / "r.txt")
