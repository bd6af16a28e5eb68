"""Which option order a choice is read in by default, and whether trained weights agree.

A choice's options are read in name order by default (``debias="name-order"``: any
permutation of the declared options reads the same prompt, at the cost of ``none``), and the
trainer trains in that order (``option_orders="name"``). Weights trained in another order are
read the way they were trained: an adapter trained on the declared order may have learned the
label letters, and name order would put it at chance (docs/quality.md). This module reads an
artifact's training order from what ``onepass train`` wrote beside it and nothing else.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from onepass.calibration import BUNDLED

SUMMARY = "training_summary.json"  # what onepass train writes beside every artifact
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_FORMAT = "onepass-lora"
"""The ``format`` of an adapter_config.json onepass wrote (a peft adapter's has none)."""

DEFAULT_DEBIAS = "name-order"
"""Measured by ``benchmarks/option_order.py`` (README, "Order and calibration"): name order
removes every flip under a reordering of the options and scores at least as well as the
declared order, at the same latency."""

OPTION_ORDERS = ("name", "declared", "rotations")
"""The trainer's ``option_orders``: ``name`` (the default, as ``debias name-order`` reads),
``declared`` (as the record declares them) or ``rotations`` (one seeded cyclic rotation of the
name order per question, as ``debias rotations`` reads them)."""

TRAINING_DEBIAS = {"name": "name-order", "declared": "none", "rotations": "rotations"}
"""The debias mode whose readings the trainer trains on for each ``option_orders``."""

SERVING_DEBIAS = {"name": "name-order", "declared": "none", "rotations": "name-order"}
"""The default debias of weights trained in each order: the zero-cost mode that reads prompts
as they were trained (a rotations-trained adapter reads the names; name order is one of its
rotations)."""


def trained_order(artifact: str | Path | None) -> str | None:
    """The ``option_orders`` an artifact of ``onepass train`` was trained with: from an
    adapter's ``adapter_config.json``, a trained checkpoint's ``training_summary.json``, or the
    ``calibration.json`` that ``merge`` and ``quantize`` carry into what they write. None where
    the folder holds none of them (a model onepass did not train). Adapters written before the
    field existed were trained on the declared order."""
    if artifact is None or not Path(artifact).is_dir():
        return None
    folder = Path(artifact)
    config = _json(folder / ADAPTER_CONFIG)
    if isinstance(config, dict) and config.get("format") == ADAPTER_FORMAT:  # not a peft one
        return config.get("option_orders") or "declared"
    summary = _json(folder / SUMMARY)
    if isinstance(summary, dict) and isinstance(summary.get("configuration"), dict):
        dataset = summary["configuration"].get("dataset")
        return (dataset.get("option_orders") if isinstance(dataset, dict) else None) or "declared"
    calibration = _json(folder / BUNDLED)
    if isinstance(calibration, dict) and isinstance(calibration.get("debias"), str):
        modes = set(calibration["debias"].split("+"))
        return ("rotations" if "rotations" in modes else
                "name" if "name-order" in modes else "declared")
    return None


def default_debias(artifact: str | Path | None) -> str:
    """The debias mode an engine over ``artifact`` (an adapter or a checkpoint folder) reads
    requests in when neither the caller nor the request picks one."""
    order = trained_order(artifact)
    return SERVING_DEBIAS.get(order or "", DEFAULT_DEBIAS)


def order_warning(artifact: str | Path | None, debias: str) -> str | None:
    """Why weights trained in one option order should not be read in ``debias``'s, or None."""
    order = trained_order(artifact)
    reorders = bool({"rotations", "name-order"} & set(debias.split("+")))
    if order == "declared" and reorders:
        return (f"the weights were trained on the declared option order; debias {debias!r} "
                "reads other orders, where weights that learned the label letters are at "
                "chance: read them with debias 'none' or 'content-free', or train with "
                "--option-orders name (the default)")
    if order == "name" and not reorders:
        return (f"the weights were trained with the options in name order; debias {debias!r} "
                "reads them as declared, where weights that learned the label letters are at "
                "chance: read them with debias 'name-order' (their default)")
    return None


def carry(source: str | Path | None, target: str | Path) -> bool:
    """Record ``source``'s training order in ``target``, a checkpoint made from it (``onepass
    merge``, ``onepass quantize``), so the new folder is read the way its weights were trained
    even without a calibration to carry: its ``training_summary.json`` is copied (written from
    an adapter's config where the summary is gone); whether there was an order to carry."""
    order = trained_order(source)
    if source is None or order is None:
        return False
    folder = Path(target)
    folder.mkdir(parents=True, exist_ok=True)
    summary = Path(source) / SUMMARY
    if summary.is_file():
        shutil.copyfile(summary, folder / SUMMARY)
    else:
        (folder / SUMMARY).write_text(json.dumps(
            {"configuration": {"dataset": {"option_orders": order}}}, indent=2) + "\n")
    return True


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None
