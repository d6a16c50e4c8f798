"""thawpool.toml and the invoke body: one parser each, refusals naming the field."""
import pytest

from spec.function_package import Batching, FunctionPackage, parse_manifest
from spec.function_request import parse_function_request
from wire.errors import ProtocolError

GOOD = b"""
[function]
handler = "pkg.classifier:TextClassifier"
requirements = ["regex==2024.11.6", "tinydep[extra]>=0.1,<1"]
[resources]
gpu_memory_gb = 2
gpu_count = 1
[batching]
max_batch_size = 16
max_wait_ms = 7
"""


def test_a_whole_manifest():
    package = parse_manifest(GOOD)
    assert package == FunctionPackage("pkg.classifier:TextClassifier",
                                      ("regex==2024.11.6", "tinydep[extra]>=0.1,<1"), 2.0, 1,
                                      Batching(16, 7.0))
    assert (package.module, package.class_name) == ("pkg.classifier", "TextClassifier")


def test_defaults_and_the_requirements_hash_ignores_order():
    package = parse_manifest(b'[function]\nhandler = "m:C"\n')
    assert package.batching == Batching() and package.requirements == ()
    a = parse_manifest(b'[function]\nhandler = "m:C"\nrequirements = ["a==1", "b==2"]\n')
    b = parse_manifest(b'[function]\nhandler = "m:C"\nrequirements = ["b==2", "a==1"]\n')
    assert a.requirements_hash == b.requirements_hash != package.requirements_hash


@pytest.mark.parametrize("raw, field", [
    (b"[function\n", "thawpool.toml"),
    (b"[batching]\nmax_batch_size = 4\n", "function.handler"),
    (b'[function]\nhandler = "no_class"\n', "function.handler"),
    (b'[function]\nhandler = "m:C"\nrequirements = ["--index-url http://evil/ x"]\n',
     "function.requirements[0]"),
    (b'[function]\nhandler = "m:C"\nrequirements = ["x @ file:///etc"]\n', "function.requirements[0]"),
    (b'[function]\nhandler = "m:C"\nrequirements = "x"\n', "function.requirements"),
    (b'[function]\nhandler = "m:C"\n[batching]\nmax_batch_size = 0\n', "batching.max_batch_size"),
    (b'[function]\nhandler = "m:C"\n[batching]\nmax_wait_ms = 1.5\n', "batching.max_wait_ms"),
    (b'[function]\nhandler = "m:C"\n[resources]\ngpu_memory_gb = 0\n', "resources.gpu_memory_gb"),
    (b'[function]\nhandler = "m:C"\nentry = "x"\n', "function.entry"),
    (b'[function]\nhandler = "m:C"\n[engine]\n', "engine"),
])
def test_refusals_name_the_field(raw, field):
    with pytest.raises(ValueError) as refused:
        parse_manifest(raw)
    assert str(refused.value).startswith(f"{field}:")


def test_invoke_bodies():
    one = parse_function_request({"input": {"text": "hi"}})
    assert one.single and one.answer([{"label": "x"}]) == {"output": {"label": "x"}}
    many = parse_function_request({"inputs": [{"a": 1}, {"a": 2}]})
    assert not many.single and len(many.items) == 2
    assert many.answer([{"y": 1}, {"y": 2}]) == {"outputs": [{"y": 1}, {"y": 2}]}


@pytest.mark.parametrize("body, param", [
    ([], "body"), ({}, "body"), ({"input": {}, "inputs": [{}]}, "body"),
    ({"input": "text"}, "input"), ({"inputs": []}, "inputs"), ({"inputs": {"a": 1}}, "inputs"),
    ({"inputs": [{"a": 1}, 3]}, "inputs[1]"), ({"input": {}, "model": "x"}, "model"),
    ({"inputs": [{}] * 1025}, "inputs"),
])
def test_bad_invoke_bodies_are_400_naming_the_field(body, param):
    with pytest.raises(ProtocolError) as refused:
        parse_function_request(body)
    assert refused.value.status == 400 and refused.value.param == param
