"""Calibrated fp4 (GPTQ on real prompts), layers kept at fp8, and `onepass quantize --report`.

* GPTQ's rounding is ordinary MXFP4 (the codec re-encodes it exactly) with a lower output error
  on the activations it was calibrated on than round-to-nearest.
* An fp4 artifact with layers kept at fp8 loads each layer in the scheme its config names, with
  the sizes the config states.
* On the embedded model, fp4 with calibration agrees with the float model more often (and with
  a lower mean total-variation distance) than fp4 without it, over probe requests with a fixed
  seed; ``--report`` writes that measurement to report.json / report.md.
* Flag errors are one line naming the flag.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_families import REQUEST, probs, tiny_model
from train_support import tiny_base

from onepass.backends.torch import TorchBackend
from onepass.cli import main
from onepass.commands.quantize import quantize
from onepass.engine import DecisionEngine
from onepass.models import resolve
from onepass.quant import calibrate as cal
from onepass.quant.artifact import QUANT_CONFIG, write_quantized
from onepass.quant.formats import Fp8Codec, Mxfp4Codec
from onepass.quant.linear import QuantizedLinear, decoder_linears
from onepass.quant.report import REPORT_JSON, REPORT_MD


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve().path)


def correlated_inputs(n: int, dim: int, seed: int = 0) -> torch.Tensor:
    """Activations with a few outlier channels and correlated directions, like an LM's."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(dim, dim, generator=g) / dim**0.5 + torch.eye(dim)
    x = torch.randn(n, dim, generator=g) @ mix
    x[:, :4] *= 8.0
    return x


def test_gptq_writes_mxfp4_values_with_a_lower_output_error_than_rounding():
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(48, 96, generator=g) * 0.05
    x = correlated_inputs(512, 96)
    hessian = x.T @ x / len(x)
    gptq = cal.gptq_mxfp4(weight, hessian)
    codec = Mxfp4Codec()
    # ordinary MXFP4: the codec's own encoding gives back exactly these values
    assert torch.equal(codec.decode(codec.encode(gptq), 96, torch.float32), gptq)
    rtn = cal.round_to_nearest(weight)
    gptq_error = cal.output_error(weight, gptq, hessian)
    rtn_error = cal.output_error(weight, rtn, hessian)
    assert gptq_error < 0.8 * rtn_error
    # the measure is the relative output error itself
    direct = ((x @ (weight - rtn).T) ** 2).sum() / ((x @ weight.T) ** 2).sum()
    assert rtn_error == pytest.approx(float(direct), rel=1e-4)
    assert cal.output_error(weight, cal.fp8_round_trip(weight), hessian) < rtn_error


def test_keep_fp8_artifact_loads_each_layer_in_its_scheme(tokenizer, tmp_path):
    model = tiny_model("llama", len(tokenizer))
    names = [n for n, _ in decoder_linears(model)]
    kept = {names[0]: "fp8", names[5]: "fp8"}
    config = write_quantized(model, tokenizer, tmp_path, "fp4", embedding="float32",
                             compute="stored", layer_schemes=kept)
    assert config["layer_schemes"] == dict(sorted(kept.items()))
    assert json.loads((tmp_path / QUANT_CONFIG).read_text()) == config
    loaded = TorchBackend.load(tmp_path, name="x", device="cpu", dtype="float32")
    layers = dict(decoder_linears_any(loaded.model))
    for name, layer in layers.items():
        assert isinstance(layer, QuantizedLinear)
        assert layer.codec.name == ("fp8" if name in kept else "mxfp4"), name
    # sizes as stated: fp8 layers 1 byte per weight + a float32 scale per row, fp4 half a byte
    # + one exponent byte per 32 weights
    stored = 0
    for name, linear in decoder_linears(model):
        out, inp = linear.weight.shape
        stored += out * inp + 4 * out if name in kept else out * inp // 2 + out * inp // 32 + 16
        got = sum(b.numel() * b.element_size() for b in layers[name].tensors().values())
        assert got == (out * inp + 4 * out if name in kept else out * inp // 2 + out * inp // 32)
    assert config["bytes"]["quantized_layers"] == stored
    # and the answers are those of the float model with each layer decoded in its own scheme
    reference = tiny_model("llama", len(tokenizer))
    with torch.no_grad():
        for name, linear in decoder_linears(reference):
            codec = Fp8Codec() if name in kept else Mxfp4Codec()
            linear.weight.copy_(codec.decode(codec.encode(linear.weight), linear.in_features,
                                             torch.float32))
    want = DecisionEngine(TorchBackend(reference, loaded.tokenizer, name="ref")).answer(REQUEST)
    got = DecisionEngine(loaded).answer(REQUEST)
    for name in REQUEST["questions"]:
        assert probs(got["answers"][name]) == pytest.approx(probs(want["answers"][name]),
                                                            abs=1e-5)


def decoder_linears_any(model):
    from onepass.quant.linear import working_candidates

    return working_candidates(model)


def test_quantize_keeps_named_layers_and_calibrates_on_a_file(tmp_path, data_dir):
    base = tiny_base(tmp_path / "base")
    requests = tmp_path / "calibration.jsonl"
    requests.write_text("\n".join(json.dumps(
        {"state": f"order {i} arrived broken", "questions": {"q": {
            "type": "noul", "instructions": "The customer reports a problem."}}})
        for i in range(6)) + "\n")
    config = quantize(str(base), None, "fp4", tmp_path / "out", calibration_dataset=str(requests),
                      keep_fp8="layers.1.mlp.down_proj,model.layers.0.self_attn.q_proj")
    assert config["layer_schemes"] == {"model.layers.0.self_attn.q_proj": "fp8",
                                       "model.layers.1.mlp.down_proj": "fp8"}
    assert config["calibration"]["method"] == "gptq"
    assert config["calibration"]["prompts"] == 6
    loaded = TorchBackend.load(tmp_path / "out", name="x", device="cpu", compute="stored")
    down = loaded.model.get_submodule("model.layers.1.mlp.down_proj")
    assert down.codec.name == "fp8"
    auto = quantize(str(base), None, "fp4", tmp_path / "auto", calibration_samples=8,
                    keep_fp8="auto:3", data_dir=data_dir)
    assert len(auto["layer_schemes"]) == 3 and auto["calibration"]["prompts"] >= 8


def test_calibrated_fp4_keeps_the_worst_layers_at_fp8_by_default(tmp_path, data_dir):
    """GPTQ alone agrees with float less than GPTQ with --keep-fp8 auto (the real-model proof
    below), so auto is the default when calibrating: an eighth of the tiny model's 14 linears,
    (which one: the report test below); ``none`` opts out, and plain rounding keeps none."""
    assert [cal.default_auto_keep(n) for n in (14, 16, 210)] == [1, 2, 16]
    base = tiny_base(tmp_path / "base")
    auto = quantize(str(base), None, "fp4", tmp_path / "auto", calibration_samples=4,
                    data_dir=data_dir)
    assert len(auto["layer_schemes"]) == 1 and auto["calibration"]["method"] == "gptq"
    assert auto["calibration"]["keep_fp8"] == list(auto["layer_schemes"])
    none = quantize(str(base), None, "fp4", tmp_path / "none", calibration_samples=4,
                    keep_fp8="none", data_dir=data_dir)
    assert not none.get("layer_schemes") and none["calibration"]["method"] == "gptq"
    plain = quantize(str(base), None, "fp4", tmp_path / "plain", calibration_dataset="none")
    assert not plain.get("layer_schemes")


@pytest.mark.parametrize("flags,flag", [
    (["--keep-fp8", "nope_proj"], "--keep-fp8"),
    (["--keep-fp8", "auto:0"], "--keep-fp8"),
    (["--keep-fp8", "q_proj"], "--keep-fp8"),  # ambiguous: one per layer
    (["--calibration-dataset", "missing.jsonl"], "--calibration-dataset"),
    (["--calibration-samples", "0"], "--calibration-samples"),
    (["--quantization", "fp8", "--keep-fp8", "auto"], "--keep-fp8"),
    (["--quantization", "fp8", "--calibration-dataset", "shipped"], "--calibration-dataset"),
    (["--calibration-dataset", "none", "--keep-fp8", "auto"], "--keep-fp8"),
])
def test_flag_errors_are_one_line_naming_the_flag(flags, flag, tmp_path, capsys):
    base = tiny_base(tmp_path / "base")
    capsys.readouterr()
    scheme = [] if "--quantization" in flags else ["--quantization", "fp4"]
    with pytest.raises(SystemExit) if flag == "--calibration-samples" else _no_raise() as exit:
        code = main(["quantize", "--model", str(base), "--output-directory",
                     str(tmp_path / "out"), *scheme, *flags])
    code = exit.value.code if flag == "--calibration-samples" else code
    assert code == 2
    # transformers' own progress bars aside (loading the base), the error is one line
    lines = [line for line in capsys.readouterr().err.splitlines()
             if line.strip() and "it/s]" not in line]
    assert len(lines) == 1 and flag in lines[0], lines
    assert not (tmp_path / "out" / "model.safetensors").exists()


class _no_raise:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_report_writes_what_was_traded(tmp_path, data_dir):
    base = tiny_base(tmp_path / "base")
    config = quantize(str(base), None, "fp4", tmp_path / "out", calibration_samples=8,
                      keep_fp8="auto:2", report=True, report_probes=6, data_dir=data_dir)
    report = json.loads((tmp_path / "out" / REPORT_JSON).read_text())
    assert report == json.loads(json.dumps(config["report"]))
    assert report["keep_fp8"] == sorted(config["layer_schemes"]) and len(report["keep_fp8"]) == 2
    assert report["calibration"]["method"] == "gptq" and report["calibration"]["prompts"] >= 8
    assert report["probe"]["requests"] == 6 and 0 <= report["probe"]["agreement"] <= 1
    assert report["probe"]["mean_tv"] >= 0
    assert set(report["size"]) >= {"disk_bytes", "disk_ratio", "resident_bytes",
                                   "resident_ratio", "float32_bytes"}
    assert report["size"]["disk_bytes"] == (tmp_path / "out" / "model.safetensors").stat().st_size
    assert report["latency"]["median_seconds"] > 0
    assert report["size"]["resident_stored_bytes"] < report["size"]["float32_bytes"]
    errors = report["layer_errors"]
    assert len(errors) == 7 * 2 and all(set(e) == {"rtn", "gptq", "fp8"} for e in errors.values())
    worst = sorted(errors, key=lambda n: errors[n]["rtn"], reverse=True)[:2]
    assert sorted(worst) == report["keep_fp8"]  # auto: where plain rounding hurts most
    text = (tmp_path / "out" / REPORT_MD).read_text()
    assert "agreement" in text and report["keep_fp8"][0] in text


# --------------------------------------------------------------------------- the real model


GPTQ_ALONE_PROBES = 50


@pytest.mark.proof
def test_calibrated_fp4_agrees_with_float_more_than_plain_fp4(engine, data_dir, probe_reference):
    """Over the 100 probe requests (the prompts are fixed; the calibration records a seeded
    draw from the train splits): GPTQ lowers every layer's output error and the mean TV (over
    the first 50, paired with plain fp4 on the same ones), and with the layers plain rounding
    hurts most kept at fp8 (--keep-fp8 auto) the top answer agrees more often than plain
    fp4's."""
    import copy

    from onepass.commands.merge import load_merged
    from onepass.evaluate import compare_answers
    from onepass.quant.linear import decoder_linears

    probes, reference = probe_reference  # ~2.5 min in all on 2 cores
    model, tokenizer = load_merged(resolve(), None)
    prompts = cal.prompt_ids(engine, cal.calibration_requests(None, cal.DEFAULT_SAMPLES,
                                                              data_dir))
    float_weights = {n: m.weight.detach().clone() for n, m in decoder_linears(model)}
    plain = copy.deepcopy(model)
    with torch.no_grad():
        for _, linear in decoder_linears(plain):
            linear.weight.copy_(cal.round_to_nearest(linear.weight))
    gptq = copy.deepcopy(model)
    done = cal.calibrate(gptq, prompts)
    # --keep-fp8 auto: the same GPTQ weights (each layer is calibrated on float inputs), the K
    # layers where plain rounding's error is largest decoded from fp8 instead
    kept = copy.deepcopy(gptq)
    worst = sorted(done.errors, key=lambda n: done.errors[n]["rtn"],
                   reverse=True)[:cal.DEFAULT_AUTO_KEEP]
    with torch.no_grad():
        for name in worst:
            kept.get_submodule(name).weight.copy_(cal.fp8_round_trip(float_weights[name]))
    # plain and the default over all the probes; GPTQ alone (an intermediate, not a default)
    # over the first GPTQ_ALONE_PROBES against plain on the same ones: a paired comparison,
    # for half a pass (~45 s in float32 on an AVX2 CPU)
    answers = {}
    for name, quantized, count in (("plain", plain, len(probes)), ("gptq", gptq, GPTQ_ALONE_PROBES),
                                   ("gptq+fp8", kept, len(probes))):
        variant = DecisionEngine(TorchBackend(quantized, tokenizer, name=name))
        answers[name] = [variant.answer(r) for r in probes[:count]]
    results = {name: compare_answers(reference[:len(a)], a) for name, a in answers.items()}
    plain_paired = compare_answers(reference[:GPTQ_ALONE_PROBES],
                                   answers["plain"][:GPTQ_ALONE_PROBES])
    summary = {n: (r["questions"], round(r["agreement"], 3), round(r["mean_tv"], 4))
               for n, r in {**results, "plain (paired)": plain_paired}.items()}
    print(f"\nfp4 vs float (probes, agreement, mean TV): {summary}")
    plain, gptq, kept = results["plain"], results["gptq"], results["gptq+fp8"]
    assert gptq["mean_tv"] < plain_paired["mean_tv"]
    assert kept["agreement"] > plain["agreement"] and kept["mean_tv"] < plain["mean_tv"]
    assert kept["agreement"] >= 0.85  # what the default (auto) delivers on held-out probes
    errors = done.errors.values()
    assert sum(e["gptq"] < e["rtn"] for e in errors) >= 0.95 * len(errors)
