"""Best-fit placement and memory sizing, as pure functions."""
from dataclasses import replace

from pool.api import ModelInfo
from pool.placement import (GB, NoCapacity, Placed, PlacementRequest, SlotState, kv_bytes,
                            never_fits, place, request_for, weight_bytes)


def slots(*free_gb, node="n1", size_gb=16):
    return [SlotState(f"{node}/s{i}", node, size_gb * GB, (size_gb - f) * GB) for i, f in enumerate(free_gb)]


def test_best_fit_picks_the_tightest_slot():
    decision = place(PlacementRequest(3 * GB), slots(10, 4, 16, 3))
    assert decision == Placed("n1", ("n1/s3",), 3 * GB)


def test_best_fit_skips_slots_too_small():
    decision = place(PlacementRequest(5 * GB), slots(10, 4, 16, 3))
    assert decision == Placed("n1", ("n1/s0",), 5 * GB)


def test_multi_slot_request_stays_on_one_node():
    pool = slots(8, 1, node="a") + slots(8, 8, 8, node="b")
    decision = place(PlacementRequest(6 * GB, slot_count=2), pool)
    assert isinstance(decision, Placed) and decision.node == "b"
    assert decision.slot_ids == ("b/s0", "b/s1")


def test_multi_slot_prefers_node_with_least_leftover():
    pool = slots(8, 7, node="a") + slots(16, 16, node="b")
    assert place(PlacementRequest(6 * GB, slot_count=2), pool).node == "a"


def test_busy_pool_waits_with_a_reason():
    decision = place(PlacementRequest(6 * GB), slots(2, 3))
    assert isinstance(decision, NoCapacity) and "waiting for capacity" in decision.reason
    assert never_fits(PlacementRequest(6 * GB), slots(2, 3)) is None


def test_never_fits_too_big_or_too_many_slots():
    assert "largest slot has 16.00 GiB" in never_fits(PlacementRequest(17 * GB), slots(16, 16))
    assert never_fits(PlacementRequest(1 * GB, slot_count=3), slots(16, 16) + slots(16, 16, node="x"))
    assert never_fits(PlacementRequest(16 * GB, slot_count=2), slots(0, 0)) is None


def test_no_slots_never_fits():
    assert never_fits(PlacementRequest(1), []) is not None


INFO = ModelInfo("s3://b/m/", "LlamaForCausalLM", weight_bytes=4_000, dtype="float32",
                 num_parameters=1_000, files=("model.safetensors",), linear_parameters=800,
                 num_hidden_layers=2, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)


def test_weight_bytes_per_dtype_and_int8():
    assert weight_bytes(INFO, None, None) == 4_000
    assert weight_bytes(INFO, "bfloat16", None) == 2_000
    assert weight_bytes(INFO, None, "int8") == 4_000 - 800 * 3      # fp32 linears to a quarter
    assert weight_bytes(INFO, "bfloat16", "int8") == 2_000 - 800    # bf16 linears halved


def test_a_quantized_checkpoints_quantized_weights_keep_their_bytes_at_any_dtype():
    # 600 stored elements (int32 codes, float16 scales) that load as 1_500 bytes; 400 floats
    info = replace(INFO, quantized_parameters=600, quantized_bytes=1_500, linear_parameters=0)
    assert weight_bytes(info, "float32", None) == 400 * 4 + 1_500
    assert weight_bytes(info, "bfloat16", None) == 400 * 2 + 1_500


def test_kv_bytes_and_request_sizing():
    assert kv_bytes(INFO, None, 10) == 2 * 2 * 2 * 16 * 4 * 10
    assert kv_bytes(INFO, None, 10, gpu_count=2) == kv_bytes(INFO, None, 10)   # 2 KV heads split
    assert kv_bytes(INFO, None, 10, gpu_count=4) == 2 * kv_bytes(INFO, None, 10)   # replicated
    req = request_for(INFO, gpu_memory_gb=0, gpu_count=2, engine={"kv_cache_tokens": 10},
                      kv_tokens_default=4096, overhead_fraction=0.0)
    assert req == PlacementRequest((4_000 + 5120) // 2, 2)
    declared = request_for(INFO, gpu_memory_gb=1, gpu_count=1, engine={}, kv_tokens_default=1,
                           overhead_fraction=0.1)
    assert declared.bytes_per_slot == GB


def test_bf16_checkpoint_without_an_engine_dtype_is_sized_at_the_runtime_float32():
    bf16 = ModelInfo("s3://b/m/", "LlamaForCausalLM", weight_bytes=2_000, dtype="bfloat16",
                     num_parameters=1_000, files=("model.safetensors",), linear_parameters=800,
                     num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
                     max_position_embeddings=512)
    req = request_for(bf16, gpu_memory_gb=0, gpu_count=1, engine={"quantization": "int8",
                      "kv_cache_tokens": 10}, kv_tokens_default=1, overhead_fraction=0.0)
    fp32_kv = 2 * 2 * 2 * 16 * 4 * 10
    assert req.bytes_per_slot == (4_000 - 800 * 3) + fp32_kv


def test_a_draft_model_adds_its_weights_and_kv_at_the_targets_dtype_unquantized():
    draft = ModelInfo("s3://b/draft/", "LlamaForCausalLM", weight_bytes=400, dtype="float32",
                      num_parameters=100, files=("model.safetensors",), linear_parameters=80,
                      num_hidden_layers=1, num_key_value_heads=1, head_dim=16, max_position_embeddings=512)
    engine = {"kv_cache_tokens": 10, "dtype": "bfloat16", "quantization": "int8"}
    alone = request_for(INFO, 0, 1, engine, kv_tokens_default=1, overhead_fraction=0.0)
    with_draft = request_for(INFO, 0, 1, engine, kv_tokens_default=1, overhead_fraction=0.0, draft=draft)
    assert with_draft.bytes_per_slot - alone.bytes_per_slot == 100 * 2 + 2 * 1 * 1 * 16 * 2 * 10


# -- preferred nodes (they already hold the revision's weights) -------------

def test_preferred_node_wins_over_a_tighter_fit_elsewhere():
    pool = slots(4, node="a") + slots(10, 16, node="b")
    assert place(PlacementRequest(3 * GB), pool) == Placed("a", ("a/s0",), 3 * GB)
    assert place(PlacementRequest(3 * GB), pool, prefer_nodes={"b"}) == Placed("b", ("b/s0",), 3 * GB)


def test_best_fit_decides_among_preferred_nodes():
    pool = slots(4, node="a") + slots(16, node="b") + slots(6, node="c")
    decision = place(PlacementRequest(3 * GB), pool, prefer_nodes={"b", "c"})
    assert decision == Placed("c", ("c/s0",), 3 * GB)


def test_preferred_node_without_room_falls_back_to_best_fit():
    pool = slots(2, 1, node="a") + slots(16, node="b") + slots(5, node="c")
    decision = place(PlacementRequest(3 * GB), pool, prefer_nodes={"a"})
    assert decision == Placed("c", ("c/s0",), 3 * GB)


def test_preference_keeps_a_multi_slot_replica_on_one_node():
    pool = slots(8, 2, node="a") + slots(8, 8, node="b") + slots(6, 6, node="c")
    assert place(PlacementRequest(6 * GB, slot_count=2), pool).node == "c"
    decision = place(PlacementRequest(6 * GB, slot_count=2), pool, prefer_nodes=("a", "b"))
    assert decision == Placed("b", ("b/s0", "b/s1"), 6 * GB)


def test_unknown_preferred_nodes_change_nothing():
    pool = slots(10, 4, 16, 3)
    assert place(PlacementRequest(3 * GB), pool, prefer_nodes={"gone"}) == Placed("n1", ("n1/s3",), 3 * GB)


def test_a_quantized_checkpoint_is_sized_by_its_quantized_bytes():
    """GGUF 4-bit: its matrices take their own bytes whatever the dtype; the rest widen."""
    info = ModelInfo("s3://b/m.gguf", "LlamaForCausalLM", weight_bytes=1_600, dtype="float32",
                     num_parameters=1_000, files=("m.gguf",), quantized_parameters=900, quantized_bytes=500)
    assert weight_bytes(info, "float32", None) == 500 + 100 * 4
    assert weight_bytes(info, "bfloat16", None) == 500 + 100 * 2


def test_a_busy_replica_goes_where_the_expected_load_leaves_room():
    """Best fit would pack it beside the busy one (less memory left over); by load it
    takes the idle GPU, even off the node that caches its weights."""
    slots = [SlotState("a/0", "a", 80 * GB, 40 * GB, load=0.7), SlotState("b/0", "b", 80 * GB, 10 * GB, load=0.1)]
    busy = PlacementRequest(20 * GB, load=0.5)
    assert place(busy, slots, prefer_nodes={"a"}).slot_ids == ("b/0",)
    assert place(PlacementRequest(20 * GB), slots, prefer_nodes={"a"}).slot_ids == ("a/0",)   # no load: as before


def test_with_every_gpu_loaded_the_least_overloaded_best_fit_still_places():
    slots = [SlotState("a/0", "a", 80 * GB, 40 * GB, load=0.9), SlotState("a/1", "a", 80 * GB, 10 * GB, load=0.8)]
    assert place(PlacementRequest(20 * GB, load=0.5), slots).slot_ids == ("a/0",)


def test_admission_counts_the_load_of_replicas_it_just_placed():
    from pool.admission import Pending, admit
    slots = [SlotState("a/0", "a", 80 * GB), SlotState("a/1", "a", 80 * GB)]
    pending = [Pending(f"r{i}", "t", PlacementRequest(10 * GB, load=0.6), seq=i) for i in range(2)]
    grants = dict(admit(pending, slots, {}, {}).placed)
    assert {grants["r0"].slot_ids, grants["r1"].slot_ids} == {("a/0",), ("a/1",)}
    light = [Pending(f"r{i}", "t", PlacementRequest(10 * GB, load=0.1), seq=i) for i in range(2)]
    grants = dict(admit(light, slots, {}, {}).placed)
    assert grants["r0"].slot_ids == grants["r1"].slot_ids       # light ones pack by memory
