"""The training loop: render like the server, optimise the decision position, keep the best.

One run:

1. load and validate the datasets (file:line errors);
2. load the base (or build a from-scratch model) in float32 master weights;
3. render every question with the engine's own prompt and labels (``DecisionEngine`` over the
   model being trained), and tokenize it exactly as the whole served prompt tokenizes;
4. apply the method: LoRA adapters (lora), int4/int8/fp8/fp4 base + LoRA (qlora), or every parameter
   (full, from-scratch);
5. AdamW with linear warm-up then linear decay, gradient clipping, gradient accumulation,
   bfloat16 autocast on GPUs that support it; a progress bar with loss and throughput;
6. validation loss / accuracy / calibration after each epoch; the artifact is (re)written when
   validation loss improves by at least ``minimum_improvement``, with ``calibration.json``: a
   temperature per question type fitted on the kept weights' validation answers, which the
   engine applies whenever it loads the adapter (training sharpens the restricted softmax
   past what its accuracy supports); early stopping after ``early_stop_patience`` epochs
   without improvement;
7. a checkpoint at every epoch end (and every ``checkpoint_steps``) that ``--resume`` continues
   from exactly.

Size: one run's steps, in the order above; each is short, and split apart they would pass
the run's state (model, optimiser, datasets, best checkpoint) from module to module.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from onepass import prompt as P
from onepass.evaluate import expected_calibration_error
from onepass.option_order import TRAINING_DEBIAS
from onepass.train import artifacts
from onepass.train.config import (
    AUTO_VALIDATION_RECORDS,
    DEFAULT_VALIDATION_SPLIT,
    ConfigError,
    TrainConfig,
    check_complete,
    validation_split,
)
from onepass.train.dataset import DatasetError, Record, load_dataset, split_records
from onepass.train.loss import Batch, decision_logits, restricted_cross_entropy

ADAPTER_METHODS = ("lora", "qlora")


@dataclass(frozen=True)
class Example:
    """One trainable decision: the whole prompt's tokens, its candidates, the gold index (and
    the target distribution over the candidates, in their order, where the record gave one)."""

    ids: tuple[int, ...]
    candidates: tuple[int, ...]
    target: int
    source: str  # file:line
    question: str
    type: str = "choice"  # noul, choice or score: each type gets its own fitted temperature
    distribution: tuple[float, ...] | None = None


@dataclass
class TrainResult:
    output_directory: Path
    method: str
    history: list[dict[str, Any]] = field(default_factory=list)
    best_epoch: int | None = None
    train_examples: int = 0
    validation_examples: int = 0
    optimizer_steps: int = 0
    seconds: float = 0.0
    stopped_early: bool = False


# --------------------------------------------------------------------------- rendering


def encode_records(engine: Any, records: Sequence[Record], max_length: int,
                   option_orders: str = "name", seed: int = 0) -> list[Example]:
    """Render and tokenize every non-trivial question exactly as the engine serves it.

    ``option_orders="name"``: a choice's options sorted by name, as ``debias="name-order"``
    (the serving default) reads them; ``"declared"``: as the record declares them;
    ``"rotations"``: each question read in one of the rotations ``debias="rotations"`` serves
    (seeded draw). The answer index moves with its option."""
    memo: dict[str, list[Any]] = {}
    rng = random.Random(seed)
    debias = TRAINING_DEBIAS[option_orders]

    def readings(q: Any) -> list[Any]:  # a dataset repeats its questions: render each once
        key = json.dumps([q.type, q.instructions, q.options, q.descriptions], sort_keys=True)
        if key not in memo:
            memo[key] = engine.readings(q, debias)
        return memo[key]

    examples = []
    for record in records:
        answers = {q.name: a for q, a in zip(record.request.questions, record.answers)}
        soft = dict(zip((q.name for q in record.request.questions), record.distributions))
        chosen = {q.name: rng.choice(readings(q))
                  for q in record.request.questions if not q.is_trivial}
        live, prefix, suffixes = engine.prompt_tokens(
            record.request, lambda q, chosen=chosen: chosen[q.name][0])
        for (q, pos), suffix in zip(live, suffixes):
            ids = tuple(prefix + suffix)
            if len(ids) > max_length:
                file, _, line = record.source.rpartition(":")
                raise DatasetError(
                    file or record.source, int(line) if line.isdigit() else None,
                    f"questions.{q.name}: the prompt has {len(ids)} tokens, over "
                    f"max_sequence_length {max_length}; nothing is truncated",
                )
            order = chosen[q.name][1]  # the reading's options, as declared indices
            p = soft.get(q.name)
            examples.append(Example(
                ids, tuple(lb.token_id for lb in pos.labels), order.index(answers[q.name]),
                record.source, q.name, q.type, None if p is None else tuple(p[i] for i in order),
            ))
    return examples


# --------------------------------------------------------------------------- model setup


def _attn(family: str) -> str:
    return "eager" if family == "gemma2" else "sdpa"


def load_base(config: TrainConfig) -> tuple[Any, Any, str, str]:
    """(model in float32, tokenizer, family, base name) for the configured method."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from onepass.models import check_family, resolve
    from onepass.train import scratch

    run = config.run
    if run.method == "from-scratch":
        source = config.tokenizer.file or str(resolve(run.model).path)
        tokenizer = scratch.load_tokenizer(source)
        try:
            model = scratch.build_model(config.model, config.initialization, tokenizer, run.seed)
        except ValueError as exc:  # a geometry that cannot be built: a configuration error
            raise ConfigError(f"[model] {exc}") from None
        return model, tokenizer, config.model.architecture, "from-scratch"
    resolved = resolve(run.model)
    family = check_family(resolved.path / "config.json")
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    model = AutoModelForCausalLM.from_pretrained(
        resolved.path, dtype=torch.float32, attn_implementation=_attn(family)
    )
    return model, tokenizer, family, run.model or resolved.name


def rendering_engine(model: Any, tokenizer: Any, name: str, context: str | None) -> Any:
    """A DecisionEngine over the model being trained: the server's renderer and labels."""
    from onepass.backends.torch import TorchBackend
    from onepass.engine import DecisionEngine

    backend = TorchBackend(model, tokenizer, name=name, cache_entries=1, cache_tokens=4096)
    return DecisionEngine(backend, context=context)


def prepare_method(model: Any, config: TrainConfig) -> Any:
    """Make the right parameters trainable; returns the module to optimise."""
    run = config.run
    if run.method in ADAPTER_METHODS:
        from onepass.train.lora import apply_lora

        model.requires_grad_(False)
        if run.method == "qlora":
            from onepass.quant.formats import codec_for
            from onepass.quant.linear import quantize_linears

            block = run.quantization_block_size if run.quantization == "int4" else None
            quantize_linears(model, codec_for(run.quantization, block))
        return apply_lora(
            model,
            rank=run.lora_rank,
            alpha=run.lora_alpha,
            dropout=run.lora_dropout,
            target_modules=run.lora_target_modules,
            last_layers=run.lora_layers,
            seed=run.seed,
        )
    model.requires_grad_(True)
    return model


def causal_lm(module: Any) -> Any:
    """The transformers causal LM inside a (possibly peft-wrapped) module."""
    return module.get_base_model() if hasattr(module, "get_base_model") else module


def trainable_tensors(module: Any) -> dict[str, torch.Tensor]:
    return {n: p for n, p in module.named_parameters() if p.requires_grad}


def schedule(warmup: int, total: int, kind: str = "linear") -> Callable[[int], float]:
    """Linear warm-up to the peak learning rate, then ``kind``: linear or cosine decay to zero
    at ``total``, or constant."""

    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / (warmup + 1)
        if kind == "constant":
            return 1.0
        left = max(0.0, (total - step) / max(1, total - warmup))
        if kind == "cosine":
            return 0.5 * (1.0 - math.cos(math.pi * left))
        return left

    return factor


def make_optimizer(module: Any, config: TrainConfig, total_steps: int) -> tuple[Any, Any]:
    """AdamW: weight decay on matrices only; LoRA B matrices at ``lora_b_learning_rate_ratio``
    times the learning rate (LoRA+), which makes the few-hundred-example runs converge."""
    run = config.run
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    b_lr = run.learning_rate * run.lora_b_learning_rate_ratio
    groups = []
    for is_b in (False, True):
        for decay in (True, False):
            params = [p for n, p in named
                      if (".lora_B." in n) == is_b and (p.ndim >= 2) == decay]
            if params:
                groups.append({"params": params,
                               "weight_decay": run.weight_decay if decay else 0.0,
                               "lr": b_lr if is_b else run.learning_rate})
    optimizer = torch.optim.AdamW(groups, lr=run.learning_rate)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, schedule(run.warmup_steps, total_steps, run.lr_schedule)
    )
    return optimizer, scheduler


def pick_device(name: str) -> torch.device:
    from onepass.backends.torch import pick_device as pick

    return pick(name)


def use_bf16(config: TrainConfig, device: torch.device) -> bool:
    if config.run.compute_dtype == "float32":
        return False
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return True
    if config.run.compute_dtype == "bfloat16":
        return device.type == "cpu"  # asked for explicitly: CPU autocast supports it (slower)
    return False


# --------------------------------------------------------------------------- batches


def batches(examples: Sequence[Example], size: int) -> list[list[Example]]:
    return [list(examples[i : i + size]) for i in range(0, len(examples), size)]


def collate(examples: Sequence[Example], device: torch.device) -> Batch:
    return Batch.collate(
        [e.ids for e in examples], [e.candidates for e in examples],
        [e.target for e in examples], distributions=[e.distribution for e in examples],
    ).to(device)


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(f"onepass:{seed}:{epoch}").shuffle(order)
    return order


@dataclass
class Validation:
    """Validation metrics and every example's candidate logits (its own candidates only)."""

    metrics: dict[str, Any]
    logits: list[list[float]]


@torch.no_grad()
def validate(
    lm: Any, examples: Sequence[Example], batch_size: int, device: torch.device, bf16: bool
) -> Validation:
    """Loss, accuracy and top-label calibration over ``examples`` (model in eval mode)."""
    was_training = lm.training
    lm.eval()
    losses, confidences, correct, rows = [], [], [], []
    for group in batches(examples, batch_size):
        batch = collate(group, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            logits = decision_logits(lm, batch)
        losses += restricted_cross_entropy(logits, batch.distributions, "none").tolist()
        probs = torch.softmax(logits, dim=-1)
        top, pred = probs.max(dim=-1)
        confidences += top.tolist()
        correct += (pred == batch.targets).tolist()
        rows += [row[: len(e.candidates)] for e, row in zip(group, logits.float().tolist())]
    lm.train(was_training)
    n = len(examples)
    return Validation({
        "loss": sum(losses) / n,
        "accuracy": sum(correct) / n,
        "ece": expected_calibration_error(confidences, correct),
        "examples": n,
    }, rows)


def fit_calibration(examples: Sequence[Example], logits: Sequence[Sequence[float]],
                    identity: dict[str, Any], debias: str) -> Any:
    """A :class:`onepass.calibration.Calibration` holding one temperature per question type,
    fitted on the validation answers of the weights being written, with the validation ECE
    before and after in its report."""
    from onepass.calibration import Calibration, fit_temperature, temperature_nll

    cal = Calibration(identity=dict(identity), method="temperature", debias=debias)
    report: dict[str, Any] = {"fitted_on": "validation", "examples": len(examples)}
    for kind in sorted({e.type for e in examples}):
        kept = [(r, e) for e, r in zip(examples, logits) if e.type == kind]
        z, golds = [r for r, _ in kept], [e.target for _, e in kept]
        # fitted to the targets trained on: a target distribution where one was given
        targets = [e.target if e.distribution is None else e.distribution for _, e in kept]
        temperature = fit_temperature(z, targets)
        cal.type_temperature[kind] = temperature
        scaled = [torch.softmax(torch.tensor(r) / temperature, -1).tolist() for r in z]
        plain = [torch.softmax(torch.tensor(r), -1).tolist() for r in z]
        report[kind] = {
            "temperature": temperature, "examples": len(kept),
            "nll": [temperature_nll(z, targets, 1.0), temperature_nll(z, targets, temperature)],
            "ece": [_top_ece(plain, golds), _top_ece(scaled, golds)],
        }
    cal.report = report
    return cal


def _top_ece(probabilities: Sequence[Sequence[float]], golds: Sequence[int]) -> float:
    tops = [max(range(len(p)), key=p.__getitem__) for p in probabilities]
    return expected_calibration_error([max(p) for p in probabilities],
                                      [t == g for t, g in zip(tops, golds)])


# --------------------------------------------------------------------------- the run


def _fingerprint(config: TrainConfig, n_train: int) -> dict[str, Any]:
    run = config.run
    return {
        "method": run.method, "model": run.model, "seed": run.seed, "train_examples": n_train,
        "batch_size": run.batch_size,
        "gradient_accumulation_steps": run.gradient_accumulation_steps,
    }


def _artifact_config(config: TrainConfig, family: str, base: str, engine: Any) -> dict[str, Any]:
    run = config.run
    return {
        "method": run.method,
        "rank": run.lora_rank,
        "alpha": run.lora_alpha,
        "base": base,
        "architecture": family,
        "prompt_version": P.PROMPT_VERSION,
        "prompt_style": asdict(engine.style),
        "target_modules": list(run.lora_target_modules),
        "layers": run.lora_layers or "all",
        "quantization": run.quantization if run.method == "qlora" else None,
        "context_path": run.context_path,
        "option_orders": config.dataset.option_orders,
    }


def train(
    config: TrainConfig,
    *,
    console: Any = None,
    show_progress: bool = True,
) -> TrainResult:
    """Run one training job end to end; returns the per-epoch history and where it wrote."""
    from rich.console import Console

    check_complete(config)
    run = config.run
    console = console or Console(stderr=True)
    started = time.perf_counter()
    if run.threads:
        torch.set_num_threads(run.threads)
    if run.method == "qlora" and run.quantization == "int4" and run.quantization_block_size % 2:
        raise ConfigError("quantization_block_size: expected an even number for int4")
    random.seed(run.seed)
    torch.manual_seed(run.seed)
    out = Path(run.output_directory)

    # 1. data
    train_records = load_dataset(config.dataset.path)
    val_records: list[Record] = []
    if config.dataset.validation_path:
        val_records = load_dataset(config.dataset.validation_path)
    elif held_out := validation_split(config, len(train_records)):
        train_records, val_records = split_records(
            train_records, held_out, run.seed, config.dataset.path
        )

    # 2-3. model and the server's rendering
    with console.status("loading the model…"):
        model, tokenizer, family, base = load_base(config)
        context = Path(run.context_path).read_text() if run.context_path else None
        engine = rendering_engine(model, tokenizer, base, context)
        orders = config.dataset.option_orders
        train_examples = encode_records(engine, train_records, run.max_sequence_length, orders,
                                        run.seed)
        val_examples = encode_records(engine, val_records, run.max_sequence_length, orders,
                                      run.seed)
    if not train_examples:
        raise DatasetError(config.dataset.path, None, "no question with two or more candidates")
    artifact_config = _artifact_config(config, family, base, engine)
    del engine

    # 4. method
    module = prepare_method(model, config)
    lm = causal_lm(module)
    device = pick_device(run.device)
    module.to(device)
    bf16 = use_bf16(config, device)
    micro = batches(range(len(train_examples)), run.batch_size)
    steps_per_epoch = math.ceil(len(micro) / run.gradient_accumulation_steps)
    total_steps = steps_per_epoch * run.epochs
    if run.warmup_steps >= total_steps:
        warmup = total_steps // 10
        console.print(f"warm-up of {run.warmup_steps} steps is not shorter than the run "
                      f"({total_steps} steps): using {warmup}")
        config.run.warmup_steps = warmup
    optimizer, scheduler = make_optimizer(module, config, total_steps)
    trainable = trainable_tensors(module)
    n_trainable = sum(p.numel() for p in trainable.values())

    state: dict[str, Any] = {
        "epoch": 0, "micro_batch": 0, "step": 0, "best_loss": None, "best_epoch": None,
        "bad_epochs": 0, "history": [], "stopped_early": False, "done": False,
        "untrained": None,  # validation metrics before the first step: what training must beat
        "fingerprint": _fingerprint(config, len(train_examples)),
        # the current epoch so far, so a mid-epoch resume reports the whole epoch's loss
        "epoch_loss_sum": 0.0, "epoch_questions": 0, "epoch_seconds": 0.0,
    }
    if run.resume:
        loaded = artifacts.load_training_state(out)
        if loaded is None:
            console.print(f"no checkpoint in {out}: starting from the beginning")
        else:
            tensors, bundle, saved = loaded
            if saved.get("fingerprint") != state["fingerprint"]:
                raise ConfigError(
                    f"--resume: the checkpoint in {out} was made by a different run "
                    f"({saved.get('fingerprint')}); use a new output directory"
                )
            with torch.no_grad():
                for name, param in trainable.items():
                    param.copy_(tensors[name].to(param.device, param.dtype))
            optimizer.load_state_dict(bundle["optimizer"])
            scheduler.load_state_dict(bundle["scheduler"])
            torch.set_rng_state(bundle["torch_rng"])
            state = {**state, **saved}
            console.print(
                f"resuming from epoch {state['epoch'] + 1}, micro-batch {state['micro_batch']}"
            )

    def checkpoint() -> None:
        artifacts.save_training_state(out, trainable, optimizer, scheduler, state)

    def write_artifact(validation: Validation | None = None) -> None:
        if not val_examples:
            artifacts.write_calibration(out, None)
        elif validation is not None:
            identity = {"model": base, "dtype": "float32", "adapter": None,
                        "prompt_version": P.PROMPT_VERSION}
            debias = TRAINING_DEBIAS[config.dataset.option_orders]
            cal = fit_calibration(val_examples, validation.logits, identity, debias)
            artifacts.write_calibration(out, cal.to_json())
            state["calibration"] = cal.report
        if run.method in ADAPTER_METHODS:
            from onepass.train.lora import adapter_tensors

            artifacts.write_adapter(out, adapter_tensors(module), artifact_config)
        else:
            lm.config.use_cache = True
            artifacts.write_checkpoint(out, lm, tokenizer)

    def beat_untrained() -> bool | None:
        """Whether the kept epoch's validation accuracy is above the untrained model's."""
        kept = [r for r in state["history"] if r["epoch"] == state["best_epoch"]]
        if state["untrained"] is None or not kept or "validation_accuracy" not in kept[0]:
            return None
        return kept[0]["validation_accuracy"] > state["untrained"]["accuracy"]

    def summary() -> dict[str, Any]:
        return {
            "method": run.method, "base": base, "architecture": family,
            "prompt_version": P.PROMPT_VERSION, "trainable_parameters": n_trainable,
            "train_examples": len(train_examples), "validation_examples": len(val_examples),
            "optimizer_steps": state["step"], "best_epoch": state["best_epoch"],
            "stopped_early": state["stopped_early"], "history": state["history"],
            "untrained_validation": state["untrained"], "beat_untrained": beat_untrained(),
            "calibration": state.get("calibration"), "configuration": config.to_dict(),
        }

    console.print(
        f"[bold]{run.method}[/] "
        + (f"{family} model" if run.method == "from-scratch" else f"on {base} ({family})")
        + f": {len(train_examples)} training and "
        f"{len(val_examples)} validation questions, {n_trainable:,} trainable parameters, "
        f"{total_steps} optimizer steps, device {device.type}"
        + (", bfloat16 compute" if bf16 else ", float32 compute")
        + ("" if val_examples else "; no validation set: the last epoch is kept and no "
           f"calibration is fitted (--validation-split, default {DEFAULT_VALIDATION_SPLIT} of "
           f"sets of {AUTO_VALIDATION_RECORDS}+ records)")
    )

    # 5-7. epochs
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]epoch {task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[speed]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=console,
        disable=not show_progress,
    )
    if val_examples and state["untrained"] is None and state["step"] == 0:  # fresh, not resumed
        with torch.no_grad():
            before = validate(lm, val_examples, run.batch_size, device, bf16).metrics
        state["untrained"] = {k: before[k] for k in ("loss", "accuracy", "ece")}
        console.print(f"untrained: validation loss {before['loss']:.4f}, accuracy "
                      f"{before['accuracy']:.3f}, ECE {before['ece']:.3f}")
    module.train()
    with progress:
        while state["epoch"] < run.epochs and not state["done"]:
            epoch = state["epoch"]
            order = epoch_order(len(train_examples), run.seed, epoch)
            groups = [[train_examples[i] for i in order[j : j + run.batch_size]]
                      for j in range(0, len(order), run.batch_size)]
            task = progress.add_task("train", total=len(groups), completed=state["micro_batch"],
                                     epoch=f"{epoch + 1}/{run.epochs}", loss="-", speed="")
            seen, tokens, t0 = 0, 0, time.perf_counter()  # this session: throughput only
            seconds_before = state["epoch_seconds"]
            i = state["micro_batch"]
            tenth = max(1, len(groups) // 10)  # without a bar: a line this often
            while i < len(groups):
                window = groups[i : i + run.gradient_accumulation_steps]
                n_window = sum(len(g) for g in window)
                optimizer.zero_grad(set_to_none=True)
                for group in window:
                    batch = collate(group, device)
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                        logits = decision_logits(lm, batch)
                    loss = restricted_cross_entropy(logits, batch.distributions, "sum")
                    (loss / n_window).backward()
                    state["epoch_loss_sum"] += loss.item()
                    state["epoch_questions"] += len(group)
                    seen += len(group)
                    tokens += batch.tokens
                if run.maximum_gradient_norm > 0:
                    torch.nn.utils.clip_grad_norm_(list(trainable.values()),
                                                   run.maximum_gradient_norm)
                optimizer.step()
                scheduler.step()
                state["step"] += 1
                i += len(window)
                state["micro_batch"] = i
                elapsed = max(time.perf_counter() - t0, 1e-9)
                state["epoch_seconds"] = seconds_before + elapsed
                shown = {"loss": f"{state['epoch_loss_sum'] / state['epoch_questions']:.4f}",
                         "speed": f"{seen / elapsed:.2f} q/s {tokens / elapsed:,.0f} tok/s"}
                progress.update(task, completed=i, **shown)
                if not show_progress and i // tenth != (i - len(window)) // tenth:
                    # no bar (a log file, a pipe): a plain line every tenth of the epoch
                    console.print(f"epoch {epoch + 1}/{run.epochs}: {i}/{len(groups)} batches, "
                                  f"loss {shown['loss']}, {shown['speed']}")
                if run.checkpoint_steps and state["step"] % run.checkpoint_steps == 0:
                    checkpoint()
            progress.remove_task(task)
            record: dict[str, Any] = {
                "epoch": epoch + 1,
                "train_loss": state["epoch_loss_sum"] / max(state["epoch_questions"], 1),
                "learning_rate": scheduler.get_last_lr()[0], "steps": state["step"],
                "seconds": round(seconds_before + time.perf_counter() - t0, 2),
            }
            improved, validation = True, None
            if val_examples:
                validation = validate(lm, val_examples, run.batch_size, device, bf16)
                metrics = validation.metrics
                record.update({f"validation_{k}": v for k, v in metrics.items()})
                best = state["best_loss"]
                improved = best is None or metrics["loss"] < best - run.minimum_improvement
                if improved:
                    state["best_loss"], state["best_epoch"], state["bad_epochs"] = (
                        metrics["loss"], epoch + 1, 0
                    )
                else:
                    state["bad_epochs"] += 1
                console.print(
                    f"epoch {epoch + 1}: train loss {record['train_loss']:.4f}, validation "
                    f"loss {metrics['loss']:.4f}, accuracy {metrics['accuracy']:.3f}, ECE "
                    f"{metrics['ece']:.3f} (10 bins, n={metrics['examples']})"
                    + ("" if improved else f" — no improvement ({state['bad_epochs']})")
                )
            else:
                state["best_epoch"] = epoch + 1
                console.print(f"epoch {epoch + 1}: train loss {record['train_loss']:.4f}")
            state["history"].append(record)
            if improved:
                write_artifact(validation)
            state["epoch"], state["micro_batch"] = epoch + 1, 0
            state["epoch_loss_sum"], state["epoch_questions"], state["epoch_seconds"] = 0.0, 0, 0.0
            if (run.early_stop_patience and state["bad_epochs"] >= run.early_stop_patience
                    and state["epoch"] < run.epochs):
                state["stopped_early"] = state["done"] = True
                console.print(f"early stop: {state['bad_epochs']} epochs without improvement")
            checkpoint()
            artifacts.write_summary(out, summary())
    if not (out / artifacts.SUMMARY).exists() or state["best_epoch"] is None:
        write_artifact()  # resumed after the last epoch, or no epoch ran
        artifacts.write_summary(out, summary())
    seconds = time.perf_counter() - started
    console.print(f"wrote {out} ({run.method}) in {seconds:.1f} s")
    if beat_untrained() is False:
        kept = next(r for r in state["history"] if r["epoch"] == state["best_epoch"])
        console.print(
            f"[bold yellow]warning:[/] the trained {run.method} does not beat the untrained model "
            f"on validation accuracy ({state['untrained']['accuracy']:.3f} untrained, "
            f"{kept['validation_accuracy']:.3f} after epoch {state['best_epoch']}): more records "
            "or epochs, or a higher --learning-rate; the artifact is written but teaches nothing")
    return TrainResult(
        out, run.method, state["history"], state["best_epoch"], len(train_examples),
        len(val_examples), state["step"], seconds, state["stopped_early"],
    )
