"""Arguments shared by every command that loads a model, and the parser every command uses.

A flag declared with :func:`env_argument` also reads ``ONEPASS_<FLAG>`` from the environment
(dashes become underscores, upper case): precedence is flag > environment > default, the same
rule everywhere. An environment value goes through the flag's own type, range and choices check,
at start-up, and a bad one fails with the same one-line message as the flag would.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from onepass.contract import DEBIAS_MODES
from onepass.server.served_models import BACKENDS, ENGINES

if TYPE_CHECKING:
    from onepass.engine import EngineConfig

ENV_PREFIX = "ONEPASS_"
_ENV_ATTR = "onepass_env_var"  # set on an argparse action that reads the environment


class _FromEnv:
    """An environment value waiting for argparse to say whether its flag was given."""

    def __init__(self, var: str, raw: str):
        self.var = var
        self.raw = raw


class CommandParser(argparse.ArgumentParser):
    """argparse with ``ONEPASS_<FLAG>`` fallbacks parsed exactly like the flags, and errors on
    one line (no usage dump, no traceback)."""

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace = argparse.Namespace() if namespace is None else namespace
        for action in self._actions:
            raw = _env_value(action)
            if raw and not _appends(action) and not hasattr(namespace, action.dest):
                setattr(namespace, action.dest, raw)  # a given flag replaces it
        namespace, extras = super().parse_known_args(args, namespace)
        for action in self._actions:
            value = getattr(namespace, action.dest, None)
            if value is None and _appends(action):  # a repeatable flag not given at all
                value = _env_value(action)
            if isinstance(value, _FromEnv):
                try:  # the flag's own conversion and choices check, so both fail alike
                    converted = self._get_values(action, [value.raw])
                except argparse.ArgumentError as exc:
                    self.error(f"{value.var} (environment, for {action.option_strings[0]}): "
                               f"{exc.message}")
                setattr(namespace, action.dest, [converted] if _appends(action) else converted)
        return namespace, extras

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _env_value(action: argparse.Action) -> _FromEnv | None:
    var = getattr(action, _ENV_ATTR, None)
    raw = os.environ.get(var) if var else None
    return _FromEnv(var, raw) if var and raw else None


def _appends(action: argparse.Action) -> bool:
    return isinstance(action, argparse._AppendAction)


def env_argument(container: Any, flag: str, *aliases: str, **kwargs: Any) -> argparse.Action:
    """``container.add_argument(flag, *aliases, **kwargs)`` that falls back to
    ``$ONEPASS_<FLAG>`` (``flag`` names the destination; ``aliases`` are other spellings,
    typed-lm's among them)."""
    action = container.add_argument(flag, *aliases, **kwargs)
    setattr(action, _ENV_ATTR, ENV_PREFIX + action.dest.upper())
    return action


def positive_float(text: str) -> float:
    """A finite number > 0 (``nan`` and ``inf`` parse as floats but are no temperature)."""
    try:
        value: float | None = float(text)
    except ValueError:
        value = None
    if value is None or not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _integer(text: str, low: int) -> int:
    try:
        value: int | None = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
    return value


def default_data_dir() -> Path:
    """The datasets a default reads: ``$ONEPASS_SHARED_DIR/data`` when set (the full sets,
    used as given), else ``../shared/data`` beside the checkout when it holds them, else the
    small subsets packaged in ``onepass/data`` (what an installed wheel has)."""
    from onepass.datasets import PACKAGED_DATA_DIR

    if os.environ.get("ONEPASS_SHARED_DIR"):
        return Path(os.environ["ONEPASS_SHARED_DIR"]) / "data"
    beside = Path(__file__).resolve().parents[3].parent / "shared" / "data"
    return beside if (beside / "clinc150").is_dir() else PACKAGED_DATA_DIR


def positive_int(text: str) -> int:
    return _integer(text, 1)


def non_negative_int(text: str) -> int:
    return _integer(text, 0)


def add_model_arguments(
    parser: argparse.ArgumentParser, *, readout: bool = True, several: bool = False
) -> None:
    """The flags that load a model; ``readout=False`` leaves out the decision readout's
    ``--temperature`` (``onepass generate`` has a sampling one of its own); ``several`` makes
    ``--model`` repeatable (``onepass serve`` keeps every one resident)."""
    g = parser.add_argument_group("model")
    env_argument(
        g, "--model", "--model-id", action="append" if several else "store",
        help="embedded alias (default: smollm2-135m-instruct; also gemma3-270m, "
        "qwen2.5-coder-0.5b-instruct), a .gguf file, a checkpoint directory or a hub id"
        + ("; repeat it to serve several models, each selected by its name" if several else ""),
    )
    env_argument(g, "--adapter", "--adapter-directory",
                 help="LoRA adapter directory merged into the model at load")
    env_argument(g, "--weights-file",
                 help="typed-lm's flag: a .gguf file inside the --model hub repository or "
                 "directory; that file is the model (one --model only)")
    env_argument(g, "--served-model-name",
                 help="name reported in responses (default: the model's name)")
    env_argument(g, "--device", default="auto", choices=["auto", "cpu", "cuda", "mps"],
                 help="default: auto")
    env_argument(g, "--dtype", "--model-dtype", default="auto",
                 choices=["auto", "float32", "bfloat16", "float16"],
                 help="default: auto (bfloat16 on a CPU with native bfloat16 units, else "
                 "float32; bfloat16/float16 on GPU)")
    env_argument(g, "--compute", choices=["auto", "stored", "int8", "fp8", "float32",
                                          "bfloat16", "float16"],
                 help="torch: the decoder linears' working weights: auto (the model's dtype; "
                 "a quantized artifact decoded once), stored (decode every forward: least "
                 "memory), int8 (VNNI kernels: faster, moves answers more), fp8 (a GPU's fp8 "
                 "tensor cores), or a float dtype (default: what the artifact recorded, else "
                 "auto)")
    env_argument(g, "--context-path",
                 help="a system context file (policy, memory) prefilled once at start-up")
    env_argument(g, "--session-cache-entries", type=non_negative_int, default=16,
                 help="prefix cache entries (default 16; 0 disables)")
    env_argument(g, "--session-cache-tokens", type=non_negative_int, default=32768,
                 help="prefix cache resident tokens (default 32768; 0 disables)")
    env_argument(g, "--max-input-tokens", type=positive_int, default=8192,
                 help="refuse prompts longer than this (default 8192); nothing is truncated")
    add_backend_arguments(parser)
    if readout:
        env_argument(g, "--temperature", type=positive_float, default=1.0,
                     help="readout temperature over the candidate labels (finite, > 0; "
                     "default 1.0)")
        add_quality_arguments(parser)


def probability(text: str) -> float:
    """A number within [0, 1]."""
    try:
        value: float | None = float(text)
    except ValueError:
        value = None
    if value is None or not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number within [0, 1], got {text!r}")
    return value


def add_quality_arguments(parser: argparse.ArgumentParser) -> None:
    """Order-invariance, calibration and abstention of the decision readout."""
    g = parser.add_argument_group("decision quality")
    env_argument(g, "--debias", choices=list(DEBIAS_MODES),
                 help="name-order: read a choice's options sorted by name (any declared order "
                 "reads the same prompt, at no cost); none: in declared order; rotations: read "
                 "every cyclic rotation of each question's options in the same forward and "
                 "average them back (K suffixes for K options); content-free: divide out each "
                 "question's answer about a blank document (the model's prior; its suffixes "
                 "again); a request's 'debias' field overrides it (default: name-order, or the "
                 "order the --adapter or trained --model was trained in)")
    env_argument(g, "--calibration",
                 help="a calibration.json from onepass calibrate, applied to every answer "
                 "(refused when fitted for another model, dtype, adapter or prompt version); "
                 "default: the --adapter's own, fitted by onepass train on its validation "
                 "split; none: no calibration")
    env_argument(g, "--abstain-below", type=probability,
                 help="mark answers whose top probability is below this with "
                 "\"abstained\": true (default: the calibration file's fitted threshold, if any)")


def apply_quality(engine: Any, args: argparse.Namespace) -> Any:
    """Set the quality flags on a loaded engine; a mismatched calibration exits with why."""
    from onepass.calibration import CalibrationError
    from onepass.option_order import order_warning

    if getattr(args, "debias", None):  # else the engine's default (the weights' training order)
        engine.debias = args.debias
        if warning := order_warning(engine.trained, engine.debias):
            print(f"warning: {warning}", file=sys.stderr)
    if getattr(args, "calibration", None) == "none":
        engine.set_calibration(None)
    elif getattr(args, "calibration", None):
        try:
            engine.set_calibration(args.calibration)
        except CalibrationError as exc:
            raise SystemExit(f"error: --calibration {args.calibration}: {exc}") from None
        if engine.calibration.debias != engine.debias:
            if not getattr(args, "debias", None):
                engine.debias = engine.calibration.debias  # no --debias: read as it was fitted
            else:
                print(f"warning: --calibration was fitted with --debias "
                      f"{engine.calibration.debias}; it applies only to requests read that way "
                      f"(--debias is {engine.debias})", file=sys.stderr)
    threshold = getattr(args, "abstain_below", None)
    if threshold is None and engine.calibration is not None:
        threshold = engine.calibration.abstain_below
    engine.set_abstain_below(threshold)
    return engine



def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """Where decisions are computed: in process (torch, llamacpp) or by a remote engine."""
    g = parser.add_argument_group("backend")
    env_argument(g, "--backend", default="torch", choices=list(BACKENDS),
                 help="torch (default): transformers in process; llamacpp: the GGUF run "
                 "natively by llama.cpp (pip install 'onepass[gguf]'); remote: an engine at "
                 "--engine-url computes the label log-probabilities")
    env_argument(g, "--engine", choices=list(ENGINES),
                 help="the remote engine's HTTP dialect (with --backend remote)")
    env_argument(g, "--engine-url", help="the remote engine's base URL (with --backend remote)")
    env_argument(g, "--engine-api-key",
                 help="sent to the remote engine as 'Authorization: Bearer <key>' (an engine "
                 "started with an API key); never logged. Prefer the environment "
                 "(ONEPASS_ENGINE_API_KEY) so the key stays out of process listings")
    env_argument(g, "--n-ctx", type=positive_int,
                 help="llamacpp: context length in tokens (default 4096)")
    env_argument(g, "--n-threads", type=positive_int,
                 help="llamacpp: CPU threads (default: the cores, at most 8)")


# the remote engine runs its own weights: an adapter would be recorded as applied (and a
# calibration fitted for it accepted) while the answers come from the base
REMOTE_ADAPTER = ("--adapter needs --backend torch: a remote engine serves its own weights and "
                  "onepass cannot apply an adapter there (merge it with onepass merge and "
                  "serve the merged checkpoint from the engine)")


def backend_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``DecisionEngine.from_pretrained`` keywords of the backend group."""
    if getattr(args, "backend", "torch") == "remote" and not (args.engine and args.engine_url):
        raise SystemExit("error: --backend remote needs --engine and --engine-url")
    if getattr(args, "backend", "torch") == "remote" and getattr(args, "adapter", None):
        raise SystemExit(f"error: {REMOTE_ADAPTER}")
    return {"backend": getattr(args, "backend", "torch"), "engine": getattr(args, "engine", None),
            "engine_url": getattr(args, "engine_url", None),
            "engine_api_key": getattr(args, "engine_api_key", None) or None,
            "n_ctx": getattr(args, "n_ctx", None), "n_threads": getattr(args, "n_threads", None)}


def apply_weights_file(args: argparse.Namespace) -> None:
    """``--weights-file F`` with ``--model REPO``: ``args.model`` becomes the local GGUF file
    (downloaded once from the hub), so everything after loads it like ``--model F.gguf``."""
    filename = getattr(args, "weights_file", None)
    if not filename:
        return
    from onepass.models import ModelError, weights_file

    several = isinstance(args.model, list)
    models = args.model if several else [args.model]
    if several and len(models) != 1:
        raise SystemExit("onepass: error: --weights-file names a file of one --model; give "
                         "exactly one --model with it")
    try:
        path = str(weights_file(models[0], filename))
    except ModelError as exc:
        raise SystemExit(f"onepass: error: {exc}") from None
    args.model = [path] if several else path
    args.weights_file = None


def engine_config(args: argparse.Namespace, *, readout: bool = True) -> EngineConfig:
    """The engine options the model flags give (``readout``: the command reads answers, so
    ``--temperature`` applies)."""
    from onepass.engine import EngineConfig

    return EngineConfig(
        device=args.device,
        dtype=args.dtype,
        context_path=args.context_path,
        adapter=args.adapter,
        session_cache_entries=args.session_cache_entries,
        session_cache_tokens=args.session_cache_tokens,
        max_input_tokens=args.max_input_tokens,
        temperature=args.temperature if readout else 1.0,
        served_name=getattr(args, "served_model_name", None),
        compute=getattr(args, "compute", None),
        **backend_options(args),
    )


def engine_from_args(args: argparse.Namespace, *, readout: bool = True):
    from onepass.engine import DecisionEngine

    apply_weights_file(args)
    engine = DecisionEngine.from_config(args.model, engine_config(args, readout=readout))
    return apply_quality(engine, args) if readout else engine
