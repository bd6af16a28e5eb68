"""The codecs bit for bit: E4M3, E2M1 and E8M0 encodings of known values, ties to even,
saturation, nibble order, and round-trip error bounds on random and real weights."""

import pytest
import torch

from onepass.quant.formats import (
    E2M1_VALUES,
    Fp8Codec,
    Mxfp4Codec,
    codec_for,
    decode_e2m1,
    decode_e4m3,
    decode_e8m0,
    encode_e2m1,
    encode_e4m3,
    encode_e8m0,
    pack_nibbles,
    unpack_nibbles,
)

E4M3_KNOWN = [  # (value, bit pattern: sign | exponent, bias 7 | 3-bit mantissa)
    (0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (0.5, 0x30), (-2.0, 0xC0), (1.125, 0x39),
    (448.0, 0x7E),
    (2.0 ** -6, 0x08),   # smallest normal
    (2.0 ** -9, 0x01),   # smallest subnormal
    (1.0625, 0x38),      # halfway 1.0 / 1.125: ties to the even mantissa (1.0)
    (1.1875, 0x3A),      # halfway 1.125 / 1.25: ties to the even mantissa (1.25)
    (1000.0, 0x7E), (-1e9, 0xFE),  # saturates at +-448, never NaN
]


def test_e4m3_known_encodings():
    values = torch.tensor([value for value, _ in E4M3_KNOWN])
    assert encode_e4m3(values).tolist() == [bits for _, bits in E4M3_KNOWN]
    exact = [v for v, _ in E4M3_KNOWN if abs(v) <= 448 and v not in (1.0625, 1.1875)]
    assert decode_e4m3(encode_e4m3(torch.tensor(exact))).tolist() == exact


def test_e2m1_table_ties_and_saturation():
    codes = torch.arange(16, dtype=torch.uint8)
    assert decode_e2m1(codes).tolist() == list(E2M1_VALUES)
    assert encode_e2m1(torch.tensor(E2M1_VALUES)).tolist() == list(range(16))
    # each midpoint goes to the neighbour with the even code (0, 1.0, 2.0, 4.0)
    midpoints = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert decode_e2m1(encode_e2m1(midpoints)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert decode_e2m1(encode_e2m1(torch.tensor([0.26, 5.01, 7.0, 1e6, -0.3, -100.0]))).tolist() \
        == [0.5, 6.0, 6.0, 6.0, -0.5, -6.0]


def test_e8m0_and_nibble_packing():
    assert encode_e8m0(torch.tensor([0, -3, 10, -127, 127, 500])).tolist() == \
        [127, 124, 137, 0, 254, 254]
    decoded = decode_e8m0(torch.tensor([127, 124, 137, 255], dtype=torch.uint8))
    assert decoded[:3].tolist() == [1.0, 0.125, 1024.0] and torch.isnan(decoded[3])
    codes = torch.tensor([[1, 2, 3, 4], [15, 0, 8, 7]], dtype=torch.uint8)
    packed = pack_nibbles(codes)
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0x78]]  # element 2i in the low nibble
    assert torch.equal(unpack_nibbles(packed), codes)


def test_mxfp4_exact_values_and_exponents():
    # rows made of E2M1 values times a power of two decode exactly, with that exponent stored
    grid = torch.tensor(E2M1_VALUES[:8] * 4)  # 32 values, largest 6
    weight = torch.stack([grid * 2.0 ** k for k in (-4, 0, 3)])
    encoded = Mxfp4Codec().encode(weight)
    assert encoded["qweight"].shape == (3, 16)
    assert encoded["scale"].tolist() == [[123], [127], [130]]
    assert torch.equal(Mxfp4Codec().decode(encoded, 32, torch.float32), weight)


def spec_rule_error(blocks: torch.Tensor) -> torch.Tensor:
    """Squared error per block of the OCP rule alone: exponent floor(log2(absmax)) - 2."""
    exponent = torch.floor(torch.log2(blocks.abs().amax(dim=2, keepdim=True))) - 2
    scale = torch.exp2(exponent)
    return ((decode_e2m1(encode_e2m1(blocks / scale)) * scale - blocks) ** 2).sum(dim=2)


def test_mxfp4_padding_shape_and_error_never_worse_than_the_spec_rule():
    torch.manual_seed(0)
    weight = torch.randn(48, 100) * torch.rand(48, 1) * 3  # 100 is not a multiple of 32
    codec = Mxfp4Codec()
    encoded = codec.encode(weight)
    assert encoded["qweight"].shape == (48, 64) and encoded["scale"].shape == (48, 4)
    decoded = codec.decode(encoded, 100, torch.float32)
    assert decoded.shape == weight.shape
    blocks = torch.nn.functional.pad(weight, (0, 28)).view(48, 4, 32)
    ours = ((torch.nn.functional.pad(decoded, (0, 28)).view(48, 4, 32) - blocks) ** 2).sum(dim=2)
    assert torch.all(ours <= spec_rule_error(blocks) + 1e-9)
    assert (ours < spec_rule_error(blocks) - 1e-9).any()  # the second candidate does win some
    # every element within two scale steps of its block's rule exponent
    bound = torch.exp2(torch.floor(torch.log2(blocks.abs().amax(dim=2, keepdim=True))) - 1)
    error = (torch.nn.functional.pad(decoded, (0, 28)).view(48, 4, 32) - blocks).abs()
    assert torch.all(error <= bound)


def test_fp8_per_channel_bound():
    torch.manual_seed(1)
    weight = torch.randn(64, 96) * torch.logspace(-3, 1, 64)[:, None]  # rows of very different size
    encoded = Fp8Codec().encode(weight)
    assert encoded["qweight"].dtype == torch.uint8 and encoded["scale"].shape == (64,)
    assert torch.allclose(weight.abs().amax(dim=1) / encoded["scale"], torch.tensor(448.0))
    error = (Fp8Codec().decode(encoded, 96, torch.float32) - weight).abs()
    # half a unit in the last place: 2^-4 relative for normals, 2^-10 x scale for subnormals
    bound = torch.maximum(weight.abs() * 2.0 ** -4, encoded["scale"][:, None] * 2.0 ** -10)
    assert torch.all(error <= bound * (1 + 1e-6))


def relative_rms(codec, weight: torch.Tensor) -> float:
    decoded = codec.decode(codec.encode(weight), weight.shape[1], torch.float32)
    return float((decoded - weight).norm() / weight.norm())


# measured: gaussian fp8 0.026, mxfp4 0.111; SmolLM2 layers fp8 0.026, mxfp4 0.112-0.120
@pytest.mark.parametrize("scheme,limit", [("fp8", 0.03), ("fp4", 0.13)])
def test_round_trip_error_on_random_weights(scheme, limit):
    torch.manual_seed(2)
    assert relative_rms(codec_for(scheme), torch.randn(256, 512)) < limit


@pytest.mark.parametrize("scheme,limit", [("fp8", 0.03), ("fp4", 0.13)])
def test_round_trip_error_on_real_weights(engine, scheme, limit):
    layers = engine.backend.model.model.layers
    for linear in (layers[0].self_attn.q_proj, layers[15].mlp.down_proj, layers[-1].mlp.up_proj):
        assert relative_rms(codec_for(scheme), linear.weight.detach()) < limit


def test_all_zero_and_non_finite_weights():
    zero = torch.zeros(4, 32)
    for scheme in ("fp8", "fp4"):
        codec = codec_for(scheme)
        assert torch.equal(codec.decode(codec.encode(zero), 32, torch.float32), zero)
        with pytest.raises(ValueError, match="NaN or infinite"):
            codec.encode(torch.tensor([[1.0, float("nan")]]))
    with pytest.raises(ValueError, match="blocks are 32"):
        codec_for("fp4", 16)
    with pytest.raises(ValueError, match="unknown weight format"):
        codec_for("fp6")


def test_int8_exact_round_trip_on_crafted_weights():
    """Rows that are integers times a per-row scale (absmax 127 x scale) decode exactly."""
    from onepass.quant.formats import Int8Codec

    torch.manual_seed(1)
    codes = torch.randint(-127, 128, (6, 40)).float()
    codes[:, 0] = 127  # each row's absmax hits the top code exactly
    scale = torch.tensor([2.0 ** -k for k in range(6)])[:, None]
    weight = codes * scale
    encoded = Int8Codec().encode(weight)
    assert encoded["qweight"].dtype == torch.int8
    assert torch.equal(encoded["qweight"].float(), codes)
    assert torch.equal(Int8Codec().decode(encoded, 40, torch.float32), weight)


@pytest.mark.parametrize("codec", ["bfloat16", "int8", "float32"])
def test_embedding_codec_exact_round_trip_and_row_decoding(codec):
    from onepass.quant.formats import decode_embedding, encode_embedding

    torch.manual_seed(2)
    rows = 50
    codes = torch.randint(-127, 128, (rows, 24)).float()
    codes[:, 3] = -127
    # int8-exact rows whose values (<= 8 significant bits) bfloat16 also holds exactly
    table = codes * torch.exp2(-torch.arange(rows) % 9).float()[:, None]
    stored = encode_embedding(codec, table)
    dtype = {"bfloat16": torch.bfloat16, "int8": torch.int8, "float32": torch.float32}[codec]
    assert stored[""].dtype == dtype and stored[""].shape == table.shape
    assert ("_scale" in stored) == (codec == "int8")
    named = {"weight": stored[""]} | ({"scale": stored["_scale"]} if "_scale" in stored else {})
    assert torch.equal(decode_embedding(codec, named, torch.float32), table)
    picked = torch.tensor([7, 0, 49, 7])
    assert torch.equal(decode_embedding(codec, named, torch.float32, rows=picked), table[picked])
    bytes_per_weight = {"bfloat16": 2, "int8": 1, "float32": 4}[codec]
    stored_bytes = sum(t.numel() * t.element_size() for t in stored.values())
    assert stored_bytes == rows * 24 * bytes_per_weight + (4 * rows if codec == "int8" else 0)
    with pytest.raises(ValueError, match="embedding codec"):
        encode_embedding("fp4", table)


def test_int8_linear_runs_the_int8_kernel_close_to_the_float_matmul():
    """Int8Linear: weights exactly the int8 codec's, output within activation-quantization
    error of x @ W^T, in the input's dtype; weight bytes are the int8 ones."""
    from onepass.quant.formats import Int8Codec
    from onepass.quant.linear import Int8Linear, weight_bytes

    torch.manual_seed(3)
    weight, bias = torch.randn(96, 64) * 0.05, torch.randn(96)
    layer = Int8Linear.from_weight(weight, bias)
    q, scale = layer.int8_weight()
    encoded = Int8Codec().encode(weight)
    assert torch.equal(q, encoded["qweight"])
    assert torch.allclose(scale, encoded["scale"].reshape(-1))
    x = torch.randn(3, 5, 64)
    want = x @ layer.dequantize().T + bias
    for dtype, tol in ((torch.float32, 0.02), (torch.bfloat16, 0.03)):
        got = layer(x.to(dtype))
        assert got.dtype == dtype and got.shape == (3, 5, 96)
        assert (got.float() - want).abs().max() / want.abs().max() < tol
    assert weight_bytes(layer) == 96 * 64 + 4 * 96 + 4 * 96  # int8 + scales + float32 bias
    with pytest.raises(ValueError, match="2-D int8 weight"):
        Int8Linear(weight, scale)


def test_int8_linear_scales_activations_per_token():
    """One token with activations 300x the others (a decision prompt's first token is like
    that) must not coarsen the others' rounding: each row keeps its own relative error (with one
    scale per tensor the quiet rows' error was ~40%)."""
    from onepass.quant.linear import Int8Linear

    torch.manual_seed(5)
    layer = Int8Linear.from_weight(torch.randn(128, 64) * 0.05)
    x = torch.randn(16, 64)
    x[0] *= 300.0
    want = x @ layer.dequantize().T
    got = layer(x)
    rel = (got - want).norm(dim=1) / want.norm(dim=1)
    assert float(rel.max()) < 0.02, rel.tolist()


def test_smoothquant_moves_outlier_channels_into_the_weight():
    """Two input channels 200x the others on every token: smoothing keeps ``x W^T`` (the
    dequantized weight is back in the input's space) and cuts the int8 error several-fold."""
    from onepass.quant.linear import Int8Linear
    from onepass.quant.smooth import activation_maxima, smoothing

    torch.manual_seed(7)
    weight = torch.randn(96, 64) * 0.05
    x = torch.randn(32, 64)
    x[:, [3, 40]] *= 200.0
    # the statistics: max |input| per channel over every token of every prompt
    table = torch.nn.Embedding(32, 64)
    with torch.no_grad():
        table.weight.copy_(x)
    probe = torch.nn.Linear(64, 96, bias=False)
    model = torch.nn.Sequential(table, probe)
    maxima = activation_maxima(model, [("1", probe)], [list(range(16)), list(range(16, 32))])
    assert torch.equal(maxima["1"], x.abs().amax(dim=0))
    smooth = smoothing(maxima["1"], weight)
    smoothed = Int8Linear.from_weight(weight, smooth=smooth)
    plain = Int8Linear.from_weight(weight)
    # the weight in the input's own space (smoothing divided back out), up to int8 rounding
    assert float((smoothed.dequantize() - weight).norm() / weight.norm()) < 0.1
    want = x @ weight.T
    err = {name: float((layer(x) - want).norm() / want.norm())
           for name, layer in (("plain", plain), ("smoothed", smoothed))}
    assert err["smoothed"] < err["plain"] / 3, err
