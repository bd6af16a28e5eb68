"""Row-invariant linears (backends/rows.py): the fixed-block scheme gives a row the same bits
in any call, a quantized linear decodes its weight once a call however many blocks it runs,
and a training step (gradients on) runs one plain call."""

from __future__ import annotations

import torch
from torch import nn

from onepass.backends.rows import block_rows, in_row_blocks, make_rows_invariant
from onepass.quant.formats import codec_for
from onepass.quant.linear import QuantizedLinear


def counting(module: nn.Module) -> list[int]:
    """Rows of each call ``module``'s own forward receives."""
    seen: list[int] = []
    forward = module.forward

    def counted(x, *args, **kwargs):
        seen.append(x.reshape(-1, x.shape[-1]).shape[0])
        return forward(x, *args, **kwargs)

    module.forward = counted
    return seen


@torch.inference_mode()
def test_a_blocked_linear_gives_the_last_rows_the_same_bits_alone():
    torch.manual_seed(0)
    linear = nn.Linear(576, 1536)
    x = torch.randn(700, 576)
    block_rows(linear, 8)
    whole = linear(x)
    for rows in (1, 3, 8, 17, 256):
        assert torch.equal(linear(x[-rows:]), whole[-rows:]), rows
    assert whole.shape == (700, 1536)


def test_every_call_is_exactly_one_block_and_the_padding_is_dropped():
    linear = nn.Linear(16, 4)
    seen = counting(linear)
    block_rows(linear, 8, batched=False)
    x = torch.randn(2, 9, 16)  # 18 rows: 3 blocks, the last padded with 6 copies of row 0
    with torch.inference_mode():
        out = linear(x)
    assert seen == [8, 8, 8]
    assert out.shape == (2, 9, 4)
    with torch.inference_mode():
        assert torch.allclose(out, nn.functional.linear(x, linear.weight, linear.bias), atol=1e-6)


def test_the_batched_blocks_are_one_matmul_of_block_sized_products(monkeypatch):
    torch.manual_seed(0)
    linear = nn.Linear(16, 4)
    block_rows(linear, 8)
    shapes = []
    bmm = torch.baddbmm
    monkeypatch.setattr(torch, "baddbmm", lambda b, x, w: shapes.append(tuple(x.shape)) or
                        bmm(b, x, w))
    x = torch.randn(2, 9, 16)
    with torch.inference_mode():
        out = linear(x)
    assert shapes == [(3, 8, 16)]  # one call, three 8-row products (the last padded)
    assert out.shape == (2, 9, 4)
    assert torch.allclose(out, nn.functional.linear(x, linear.weight, linear.bias), atol=1e-6)
    block_rows(linear, 4, batched=False)  # again: the scheme is replaced, not stacked
    seen = counting(linear)
    with torch.inference_mode():
        linear(x)
    assert shapes == [(3, 8, 16)] and seen == [18]


def test_a_quantized_linear_decodes_once_a_call_and_blocks_its_product(monkeypatch):
    torch.manual_seed(0)
    quantized = QuantizedLinear.from_linear(nn.Linear(64, 32), codec_for("fp8"))
    decodes = []
    codec = type(quantized.codec)
    decode = codec.decode_for_matmul
    monkeypatch.setattr(codec, "decode_for_matmul",
                        lambda *a: decodes.append(1) or decode(*a))
    x = torch.randn(100, 64)
    with torch.inference_mode():
        plain = quantized(x)
        block_rows(quantized, 8)
        blocked = quantized(x)
        assert quantized.row_block == 8 and len(decodes) == 2  # one a call: 13 blocks in this
        alone = quantized(x[-3:])
    assert torch.allclose(blocked, plain, atol=1e-5)
    assert torch.equal(alone, blocked[-3:])


def test_gradients_on_run_one_plain_call_and_train():
    linear = nn.Linear(16, 4)
    seen = counting(linear)
    block_rows(linear, 8, batched=False)
    x = torch.randn(20, 16)
    linear(x).sum().backward()
    assert seen == [20] and linear.weight.grad is not None
    assert torch.equal(in_row_blocks(torch.nn.functional.relu, x, None), x.relu())
    batched = nn.Linear(16, 4)
    block_rows(batched, 8)
    out = batched(x)
    out.sum().backward()
    assert batched.weight.grad is not None
    assert torch.equal(out, nn.functional.linear(x, batched.weight, batched.bias))


def test_the_load_time_probe_names_the_scheme_it_applied():
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 8))
    scheme = make_rows_invariant(model)
    assert scheme in ("padded", "blocked", "blocked per call")
    x = torch.randn(40, 32)
    with torch.inference_mode():
        whole = model(x)
        assert torch.equal(model(x[-1:]), whole[-1:])  # whichever scheme, a row alone agrees


def test_the_probe_is_remembered_per_key_and_a_bad_entry_is_probed_again(tmp_path,
                                                                          monkeypatch):
    """A second load with the same key applies the remembered scheme without probing, and a
    row alone still reads the same bits; another thread count (a key fact) probes anew; an
    unreadable entry is probed again and rewritten."""
    import onepass.backends.rows as rows

    probes = []
    agree = rows._rows_agree
    monkeypatch.setattr(rows, "_rows_agree", lambda m, d: probes.append(1) or agree(m, d))

    def fresh() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 8))

    first = make_rows_invariant(fresh(), memo=tmp_path)
    probed = len(probes)
    assert probed >= 1 and len(list(tmp_path.glob("*.json"))) == 1
    model = fresh()
    assert make_rows_invariant(model, memo=tmp_path) == first and len(probes) == probed
    x = torch.randn(40, 32)
    with torch.inference_mode():
        assert torch.equal(model(x[-1:]), model(x)[-1:])
    entry = next(tmp_path.glob("*.json"))
    entry.write_text("{not json")
    assert make_rows_invariant(fresh(), memo=tmp_path) == first and len(probes) > probed
    assert rows._recall(entry) == first  # rewritten whole
    threads = torch.get_num_threads()
    before = len(probes)
    try:
        torch.set_num_threads(threads + 1)
        make_rows_invariant(fresh(), memo=tmp_path)
    finally:
        torch.set_num_threads(threads)
    assert len(probes) > before and len(list(tmp_path.glob("*.json"))) == 2
    assert not list(tmp_path.glob("*.tmp"))


def test_the_probe_key_names_shape_dtype_and_kind():
    from onepass.backends.rows import probe_key

    a = [nn.Linear(32, 32)]
    assert probe_key(a, torch.float32) == probe_key([nn.Linear(32, 32)], torch.float32)
    assert probe_key(a, torch.float32) != probe_key(a, torch.bfloat16)
    assert probe_key(a, torch.float32) != probe_key([nn.Linear(32, 33)], torch.float32)
    assert probe_key(a, torch.float32) != probe_key([nn.Linear(32, 32, bias=False)],
                                                    torch.float32)
    quantized = QuantizedLinear.from_linear(nn.Linear(32, 32), codec_for("fp8"))
    assert probe_key(a, torch.float32) != probe_key([quantized], torch.float32)
