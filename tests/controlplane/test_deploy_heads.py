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
