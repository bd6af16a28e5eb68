"""Calibrated MXFP4: GPTQ rounding on real decision prompts, and the layers kept at fp8.

Round-to-nearest minimises each weight's own error; what moves the answers is each layer's
*output* error on the activations it really sees. GPTQ (Frantar et al., 2022) rounds one input
column at a time and pushes the rounding error onto the columns not yet rounded, weighted by
the inverse of the layer's input Hessian ``H = X^T X`` (X: the layer's inputs over real
prompts), so the errors cancel in ``X W^T`` instead of adding up. The MX block structure is
kept: the shared E8M0 exponent of each block of 32 input weights is chosen (by the codec's own
rule) from the error-updated weights when the block starts, then its 32 columns are rounded to
E2M1 on that exponent. Only the rounding choices change, so the result is an ordinary MXFP4
tensor: same file format, same loader (``decode(encode(Q)) == Q`` exactly).

The Hessians come from one pass of the float model over the calibration prompts, rendered
exactly like served decision prompts (system + state + question) from dataset records (the
shipped CLINC150 / BANKING77 *train* splits by default: the probe set is drawn from CLINC150
test). The same Hessians measure each layer's relative output error
``||X (W - Q)^T||^2 / ||X W^T||^2`` for plain rounding, GPTQ and fp8; ``auto`` keeps at fp8 the
layers where plain rounding's error is largest (on SmolLM2 the small v_proj layers: 16 of them
cost under 1 MiB).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from onepass.quant.formats import (
    _E2M1_MIDPOINTS,
    _E2M1_TIES_UP,
    E2M1_MAX,
    E2M1_VALUES,
    MX_BLOCK,
    Fp8Codec,
    Mxfp4Codec,
    decode_e8m0,
)
from onepass.quant.linear import decoder_linears
from onepass.train.dataset import TARGET_KEYS

CALIBRATION_DATASETS = ("shipped", "clinc150", "banking77")
DEFAULT_SAMPLES = 32
DEFAULT_AUTO_KEEP = 16
DAMPING = 0.01  # fraction of the mean Hessian diagonal added to it (GPTQ's default)


class CalibrationError(ValueError):
    """Calibration input that cannot be used, and why (names the flag)."""


# --------------------------------------------------------------------------- prompts


def calibration_requests(source: str | None, samples: int, data_dir: Path,
                         seed: int = 0) -> list[dict[str, Any]]:
    """``samples`` System One requests to calibrate on: ``source`` None / ``shipped`` mixes
    the shipped datasets' train splits (CLINC150 domain routing with and without descriptions,
    in-scope nouls, BANKING77 intents), ``clinc150`` / ``banking77`` one of them, anything else
    is a JSONL file of requests or Jev-native records (answers are dropped)."""
    from onepass.datasets import (
        banking77_intents,
        clinc150_domain_routing,
        clinc150_in_scope,
    )

    if samples < 1:
        raise CalibrationError(f"--calibration-samples: expected >= 1, got {samples}")
    name = source or "shipped"
    if name in CALIBRATION_DATASETS:
        if not (Path(data_dir) / "clinc150").is_dir():
            raise CalibrationError(f"--calibration-dataset {name}: no datasets at {data_dir} "
                                   "(set ONEPASS_SHARED_DIR or give a JSONL file)")
        # (weight, maker): a BANKING77 prompt lists 77 intents (~1,300 tokens, six CLINC150
        # ones), so it gets a small share of the requests
        makers: list[tuple[int, Callable[[int], list[dict[str, Any]]]]] = []
        if name in ("shipped", "clinc150"):
            makers += [
                (4, lambda n: clinc150_domain_routing(data_dir, "train", n, seed,
                                                      describe=False)),
                (3, lambda n: clinc150_domain_routing(data_dir, "train", n, seed + 1)),
                (3, lambda n: clinc150_in_scope(data_dir, "train", n, seed)),
            ]
        if name in ("shipped", "banking77"):
            makers.append((1, lambda n: banking77_intents(data_dir, "train", n, seed)))
        total = sum(w for w, _ in makers)
        shares = [max(samples * w // total, 1) for w, _ in makers]
        shares[0] += samples - sum(shares)
        records = [r for (_, make), n in zip(makers, shares) if n > 0 for r in make(n)]
    else:
        path = Path(name)
        if not path.is_file():
            raise CalibrationError(f"--calibration-dataset: {name!r} is neither a file nor one "
                                   f"of {', '.join(CALIBRATION_DATASETS)}")
        records = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CalibrationError(f"--calibration-dataset {path}:{number}: not JSON "
                                       f"({exc.msg})") from exc
            if not isinstance(record, dict) or "state" not in record \
                    or not isinstance(record.get("questions"), dict):
                raise CalibrationError(f"--calibration-dataset {path}:{number}: expected a "
                                       "request with 'state' and 'questions'")
            records.append(record)
            if len(records) == samples:
                break
        if not records:
            raise CalibrationError(f"--calibration-dataset {path}: no records")
    return [{**r, "questions": {name: {k: v for k, v in q.items() if k not in TARGET_KEYS}
                                if isinstance(q, dict) else q
                                for name, q in r["questions"].items()}} for r in records]


def prompt_ids(engine: Any, requests: Sequence[dict[str, Any]]) -> list[list[int]]:
    """Token ids of every decision prompt the engine would run for ``requests`` (prefix +
    question suffix, one prompt per question): the activations served requests produce."""
    from onepass.contract import parse_request

    prompts = []
    for raw in requests:
        try:
            request = parse_request(raw)
        except Exception as exc:  # ContractError: a field-named message
            raise CalibrationError(f"--calibration-dataset: invalid request ({exc})") from exc
        _, prefix, suffixes = engine.prompt_tokens(request)
        prompts += [prefix + s for s in suffixes]
    return prompts


# --------------------------------------------------------------------------- Hessians


class _Stop(Exception):
    """Ends a forward once the first decoder layer's input is captured."""


def _accumulator(linears: Sequence[tuple[str, Any]]) -> tuple[Callable[[], None],
                                                              Callable[[], dict[str, Any]]]:
    """Hooks that add ``x^T x`` of each linear's input (siblings reading the very same tensor,
    like q/k/v, share one sum); returns (remove hooks, the normalised Hessians by name)."""
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}
    alias: dict[str, str] = {}
    seen: dict[int, tuple[torch.Tensor, str]] = {}  # holds the tensors, so ids stay unique

    def make(name: str) -> Callable[..., None]:
        def accumulate(module: Any, args: tuple[torch.Tensor, ...]) -> None:
            source = args[0]
            hit = seen.get(id(source))
            if hit is not None and hit[0] is source:
                alias[name] = hit[1]
                return
            if len(seen) > 64:
                seen.clear()
            seen[id(source)] = (source, name)
            x = source.detach().reshape(-1, source.shape[-1]).float()
            if name not in sums:
                sums[name] = torch.zeros(x.shape[1], x.shape[1], device=x.device)
                counts[name] = 0
            sums[name].addmm_(x.T, x)
            counts[name] += x.shape[0]
        return accumulate

    handles = [module.register_forward_pre_hook(make(name)) for name, module in linears]

    def remove() -> None:
        for handle in handles:
            handle.remove()
        seen.clear()

    def hessians() -> dict[str, torch.Tensor]:
        out = {}
        for name, _ in linears:
            source = alias.get(name, name)
            if source not in sums:
                raise CalibrationError(f"{name} saw no input during calibration")
            out[name] = sums[source] / max(counts[source], 1)
        return out

    return remove, hessians


@torch.no_grad()
def collect_hessians(model: Any, prompts: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """Per decoder linear: ``X^T X / tokens`` of its float32 inputs over every prompt token,
    from one forward per prompt of the model as it is."""
    remove, hessians = _accumulator(decoder_linears(model))
    try:
        decoder = model.get_decoder()
        device = next(model.parameters()).device
        for ids in prompts:
            decoder(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
    finally:
        remove()
    return hessians()


@torch.no_grad()
def _layer_calls(model: Any, prompts: Sequence[Sequence[int]]) -> tuple[
        list[Any], list[torch.Tensor], list[list[tuple[tuple[Any, ...], dict[str, Any]]]]]:
    """The decoder layers, the first one's input hidden states per prompt, and every layer's
    other arguments per prompt (masks, positions: they do not depend on the weights), from
    one float pass; the layers can then be run one at a time on any hidden states."""
    decoder = model.get_decoder()
    layers = list(decoder.layers)
    device = next(model.parameters()).device
    hidden: list[torch.Tensor] = []
    calls: list[list[tuple[tuple[Any, ...], dict[str, Any]]]] = [[] for _ in layers]

    def capture(index: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            first = args[0] if args else kwargs["hidden_states"]
            if index == 0:
                hidden.append(first.detach())
            rest = {k: v for k, v in kwargs.items() if k != "hidden_states"}
            calls[index].append((tuple(args[1:]), rest))
        return hook

    handles = [layer.register_forward_pre_hook(capture(i), with_kwargs=True)
               for i, layer in enumerate(layers)]
    try:
        for ids in prompts:
            decoder(input_ids=torch.tensor([list(ids)], device=device), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return layers, hidden, calls


def _run_layer(layer: Any, hidden: Sequence[torch.Tensor],
               calls: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]) -> list[torch.Tensor]:
    out = []
    for h, (args, kwargs) in zip(hidden, calls):
        result = layer(h, *args, **kwargs)
        out.append(result[0] if isinstance(result, tuple) else result)
    return out


# --------------------------------------------------------------------------- rounding


def round_to_nearest(weight: torch.Tensor) -> torch.Tensor:
    """Plain MXFP4 (round to nearest, the codec's exponent search) as a float weight."""
    codec = Mxfp4Codec()
    return codec.decode(codec.encode(weight), weight.shape[1], torch.float32)


def fp8_round_trip(weight: torch.Tensor) -> torch.Tensor:
    codec = Fp8Codec()
    return codec.decode(codec.encode(weight), weight.shape[1], torch.float32)


def _block_scales(block: torch.Tensor) -> torch.Tensor:
    """The E8M0 scale (a power of two) of each row of one MX block, as the codec picks it."""
    return decode_e8m0(Mxfp4Codec().encode(block)["scale"][:, 0])


def gptq_mxfp4(weight: torch.Tensor, hessian: torch.Tensor,
               damping: float = DAMPING) -> torch.Tensor:
    """GPTQ rounding of ``weight`` ``[out, in]`` to MXFP4 values, as a float weight.

    Columns are rounded in order, one MX block of 32 at a time; each rounding error is spread
    over the remaining columns through the upper Cholesky factor of ``H^-1``. Vectorised over
    the output rows; the loop runs over input columns only."""
    w = weight.detach().float().clone()
    columns = w.shape[1]
    h = hessian.float().clone()
    dead = torch.diag(h) <= 0
    h[dead, dead] = 1.0  # an input never seen: plain rounding, no error to spread
    h.diagonal().add_(damping * torch.diag(h).mean())
    try:
        inverse = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)),
                                        upper=True)
    except RuntimeError:  # not positive definite even damped: no feedback possible
        return round_to_nearest(weight)
    quantized = torch.zeros_like(w)
    # encode_e2m1 + decode_e2m1 of one column, with their constant tensors made once
    midpoints = torch.tensor(_E2M1_MIDPOINTS, device=w.device)
    ties_up = torch.tensor(_E2M1_TIES_UP, device=w.device)
    table = torch.tensor(E2M1_VALUES[:8], device=w.device)

    def round_e2m1(x: torch.Tensor) -> torch.Tensor:
        magnitude = x.abs().clamp(max=E2M1_MAX)
        code = torch.bucketize(magnitude, midpoints) + torch.isin(magnitude, ties_up)
        return table[code].copysign(x)

    for start in range(0, columns, MX_BLOCK):
        end = min(start + MX_BLOCK, columns)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        h_block = inverse[start:end, start:end]
        scale = _block_scales(block)
        for i in range(end - start):
            column = block[:, i]
            q = round_e2m1(column / scale) * scale
            quantized[:, start + i] = q
            error = (column - q) / h_block[i, i]
            block[:, i:] -= error[:, None] * h_block[i, i:][None, :]
            errors[:, i] = error
        w[:, end:] -= errors @ inverse[start:end, end:]
    return quantized


def output_error(weight: torch.Tensor, approx: torch.Tensor, hessian: torch.Tensor) -> float:
    """``||X (W - Q)^T||^2 / ||X W^T||^2`` from ``H = X^T X / n``: the layer's relative output
    error on the calibration inputs."""
    w = weight.detach().float()
    delta = w - approx
    num = torch.einsum("oi,ij,oj->", delta, hessian, delta)
    den = torch.einsum("oi,ij,oj->", w, hessian, w)
    return float(num / den) if den > 0 else 0.0


# --------------------------------------------------------------------------- the whole model


@dataclass
class CalibrationResult:
    """What calibration did: the relative output error of every layer (``rtn``: plain fp4,
    ``gptq``, ``fp8``), the layers kept at fp8, and the prompts it saw."""

    errors: dict[str, dict[str, float]] = field(default_factory=dict)
    keep_fp8: list[str] = field(default_factory=list)
    prompts: int = 0
    tokens: int = 0
    method: str = "gptq"

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "prompts": self.prompts, "tokens": self.tokens,
                "keep_fp8": self.keep_fp8, "layer_errors": self.errors}


def default_auto_keep(layers: int) -> int:
    """K for fp4's default ``--keep-fp8 auto`` (when calibrating and no ``--keep-fp8`` is
    given): 16 (on the embedded model's 210 linears, 16 ``v_proj`` under 1 MiB bring top-answer
    agreement from 0.64 to 0.94), at most an eighth of a small model's layers, so fp4 stays
    mostly fp4."""
    return max(1, min(DEFAULT_AUTO_KEEP, layers // 8))


def parse_keep_fp8(spec: str | None, names: Sequence[str]) -> tuple[list[str], int | None]:
    """``--keep-fp8``: a comma list of decoder linear names (or unique suffixes of one), or
    ``auto[:k]``, or ``none`` -> (names given, k for auto or None)."""
    if spec is None or not spec.strip() or spec.strip() == "none":
        return [], None
    spec = spec.strip()
    if spec == "auto" or spec.startswith("auto:"):
        k_text = spec.partition(":")[2] or str(DEFAULT_AUTO_KEEP)
        if not k_text.isdigit() or int(k_text) < 1:
            raise CalibrationError(f"--keep-fp8: auto:K needs an integer K >= 1, got {spec!r}")
        return [], int(k_text)
    chosen = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        matches = [n for n in names if n == part or n.endswith("." + part)]
        if len(matches) != 1:
            example = names[0] if names else "model.layers.0.mlp.down_proj"
            why = "matches no decoder linear" if not matches else \
                f"matches {len(matches)} layers"
            raise CalibrationError(f"--keep-fp8: {part!r} {why} (e.g. {example}, or auto[:K])")
        chosen.append(matches[0])
    return sorted(set(chosen)), None


@torch.no_grad()
def calibrate(model: Any, prompts: Sequence[Sequence[int]], *, gptq: bool = True,
              keep_fp8: Sequence[str] = (), auto_keep: int | None = None,
              progress: Callable[[], None] | None = None,
              sequential: bool = False) -> CalibrationResult:
    """Replace every decoder linear's weight of ``model`` (in place) by its MXFP4 rounding
    (GPTQ when ``gptq``, else round to nearest) and measure each layer's relative output error
    on the calibration inputs (``rtn``: plain rounding, ``gptq``, ``fp8``); the layers in
    ``keep_fp8`` (plus, with ``auto_keep``, the k where plain rounding's error is largest)
    keep their float weights, to be written as fp8.

    Each decoder layer is run on its own, on the float model's inputs to it. ``sequential``
    feeds it the outputs of the already rounded layers before it instead, as the GPTQ paper
    does; on the embedded model that was worse (probe TV 0.119 vs 0.102, same 32 prompts):
    each layer then fits its own rounded inputs, not the float target."""
    layers, hidden, calls = _layer_calls(model, prompts)
    result = CalibrationResult(prompts=len(prompts), tokens=sum(len(p) for p in prompts),
                               method="gptq" if gptq else "rtn")
    names = dict(decoder_linears(model))
    by_module = {id(module): name for name, module in names.items()}
    originals: dict[str, torch.Tensor] = {}
    for layer, layer_calls in zip(layers, calls):
        linears = [(by_module[id(m)], m) for m in layer.modules() if id(m) in by_module]
        remove, collected = _accumulator(linears)
        try:
            reference = _run_layer(layer, hidden, layer_calls)
        finally:
            remove()
        hessians = collected()
        for name, linear in linears:
            weight, h = linear.weight, hessians[name]
            rtn = round_to_nearest(weight)
            errors = {"rtn": output_error(weight, rtn, h),
                      "fp8": output_error(weight, fp8_round_trip(weight), h)}
            rounded = rtn
            if gptq and name not in keep_fp8:
                rounded = gptq_mxfp4(weight, h)
                errors["gptq"] = output_error(weight, rounded, h)
            elif gptq:
                errors["gptq"] = errors["rtn"]  # kept at fp8: not rounded to fp4 at all
            result.errors[name] = errors
            if auto_keep and name not in keep_fp8:  # the float weights of the k worst so far
                originals[name] = weight.detach().clone()
                worst = sorted(originals, key=lambda n: result.errors[n]["rtn"],
                               reverse=True)[:auto_keep]
                originals = {n: originals[n] for n in worst}
            if name not in keep_fp8:
                linear.weight.copy_(rounded.to(weight.dtype))
            if progress is not None:
                progress()
        hidden = _run_layer(layer, hidden, layer_calls) if sequential else reference
    result.keep_fp8 = sorted(set(keep_fp8) | set(originals))
    for name, weight in originals.items():  # chosen after rounding: back to the float weight
        names[name].weight.copy_(weight)
    return result
