"""The deploy-time check of a tensor-parallel head split (controlplane.deploy.deployment_spec),
pure: no server."""
import pytest

def test_more_ranks_than_kv_heads_replicate_them_and_counts_that_neither_divide_are_refused():
    from controlplane.deploy.deployment_spec import _check_heads
    from controlplane.store.errors import InvalidField
    from pool.api import ModelInfo

    def info(heads: int, kv_heads: int) -> ModelInfo:
        return ModelInfo("s3://b/m/", "LlamaForCausalLM", 0, "float32", 0, (),
                         num_attention_heads=heads, num_key_value_heads=kv_heads)

    _check_heads(info(8, 1), 4)             # MQA: each rank keeps a copy of the KV head
    _check_heads(info(8, 2), 4)             # GQA with fewer KV heads than ranks
    _check_heads(info(8, 4), 2)             # the KV heads split
    with pytest.raises(InvalidField, match="neither divides"):
        _check_heads(info(12, 3), 4)
    with pytest.raises(InvalidField, match="num_attention_heads"):
        _check_heads(info(9, 3), 2)


def test_a_quantized_checkpoint_refuses_what_it_does_not_run_with():
    from controlplane.deploy.deployment_spec import check_model
    from controlplane.store.errors import InvalidField
    from controlplane.deploy.deployment_spec import Resources
    from pool.api import ModelInfo

    info = ModelInfo("s3://b/m.gguf", "LlamaForCausalLM", 0, "float32", 10, (), num_attention_heads=8,
                     num_key_value_heads=8, quantized_parameters=8, quantized_bytes=4)
    check_model(info, Resources(gpu_count=1), engine={})
    cases = {"engine.quantization": (1, {"quantization": "int8"}),
             "engine.batch_invariant": (1, {"batch_invariant": True}), "resources.gpu_count": (2, {})}
    for field_name, (gpus, engine) in cases.items():
        with pytest.raises(InvalidField) as caught:
            check_model(info, Resources(gpu_count=gpus), engine=engine)
        assert caught.value.field == field_name
