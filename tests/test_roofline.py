"""benchmarks/roofline.py's FLOP count, against sums done by hand."""
from benchmarks.roofline import DecoderShape, workload_flops

# 1 layer, hidden 4, MLP 8, 2 heads of 2 (4 wide), 1 KV head, vocab 10
SHAPE = DecoderShape(hidden=4, intermediate=8, layers=1, heads=2, kv_heads=1, head_dim=2, vocab=10)


def test_a_layers_weights_are_its_projections():
    # q and o: 4x4 each; k and v: 4x2 each; MLP: 3 x 4x8
    assert SHAPE.layer_weights == 16 + 16 + 8 + 8 + 96


def test_a_token_costs_twice_the_weights_plus_attention_over_its_context():
    assert SHAPE.token_flops(1) == 2 * 144 + 4 * 1 * 2 * 2
    assert SHAPE.token_flops(5) - SHAPE.token_flops(1) == 4 * 4 * 2 * 2


def test_the_last_output_token_is_never_fed_back_and_each_output_pays_the_head():
    # a 3-token prompt and 2 outputs: positions 1..4 go through the layers, the head twice
    expected = sum(SHAPE.token_flops(c) for c in (1, 2, 3, 4)) + 2 * 2 * 4 * 10
    assert workload_flops(SHAPE, [3], [2]) == expected
    assert workload_flops(SHAPE, [3, 3], [2, 2]) == 2 * expected
