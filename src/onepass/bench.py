"""``onepass bench``: the public evaluations of one model, in one run, written to a folder.

What it measures, every number from this one run (no torch here: the engine does the work):

* CLINC150 10-domain routing (test split), a fixed 10-intent BANKING77 subset (test split) and
  CLINC150 domain membership as a yes/no question (``clinc150-noul``, half yes): accuracy,
  Brier, ECE, the median label mass (how much of its probability the model put on the option
  labels over the first 50 records: low means the readout reads noise) and reliability
  diagrams for each setting: zero-shot (``none``), ``name-order`` (a choice's options sorted
  by name: one reading, no order effect), ``rotations``,
  ``rotations+content-free`` (the blank-document prior divided out), each ``+calibration``
  (fitted on CLINC150 validation / BANKING77 train records, never on the scored ones), and
  ``+teach K`` (K examples per option from the train split, pinned as the system context);
* ``rotations(logmean)``: the rotations combined by mean log-probability instead of mean
  probability (the engine's default rule was chosen from this row);
* the option-permutation flip rate: the top answer with the options in declared order vs a
  seeded shuffle of them, for every debias setting;
* JevBench (the ``jevbench`` package's frozen mini suite, chosen domains) against the real
  HTTP app served in this process, for every debias setting;
* latency per request: a state never seen (miss) and the same request again (hit), medians.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onepass import calibration as C

BANKING_SUBSET = (
    "activate_my_card", "card_arrival", "lost_or_stolen_card", "exchange_rate",
    "transfer_not_received_by_recipient", "cash_withdrawal_charge", "pin_blocked",
    "top_up_failed", "declined_card_payment", "Refund_not_showing_up",
)
JEVBENCH_DOMAINS = ("customer_support", "ecommerce_returns")
DATASETS = ("clinc150", "banking77", "clinc150-noul")
DEBIAS_SETTINGS = ("none", "name-order", "rotations", "rotations+content-free")

Tick = Callable[[str, int, int], None]


@dataclass
class BenchConfig:
    """Sizes and choices of one bench run (defaults: minutes on a laptop CPU)."""

    data_dir: Path
    output: Path = Path("bench")
    limit: int = 100  # scored records per dataset
    fit_limit: int = 100  # records per dataset that calibration is fitted on
    teach: Sequence[int] = (1, 2, 4)
    flip_records: int = 40
    latency_requests: int = 10
    domains: Sequence[str] | None = JEVBENCH_DOMAINS  # None: no JevBench
    seed: int = 0
    describe: bool = True  # CLINC150 options with one-line descriptions (False: names only)
    datasets: Sequence[str] = DATASETS  # the first one also gives flip/latency
    banking_intents: Sequence[str] = BANKING_SUBSET
    compare_combine: bool = True  # also score rotations combined by mean log-probability
    debias_settings: Sequence[str] = DEBIAS_SETTINGS  # the readings compared
    settings: dict[str, Any] = field(default_factory=dict)  # what was loaded, for the report


# --------------------------------------------------------------------------- data


def datasets(config: BenchConfig) -> dict[str, dict[str, list[Any]]]:
    """Per dataset: ``test`` (scored), ``fit`` (calibration) and ``teach`` (example pool)."""
    from onepass.datasets import (
        banking77_intents,
        clinc150_domain_membership,
        clinc150_domain_routing,
    )
    from onepass.train.dataset import parse_record

    def parsed(raws: list[dict[str, Any]], name: str) -> list[Any]:
        return [parse_record(r, name, i) for i, r in enumerate(raws, start=1)]

    def banking(split: str, limit: int, seed: int) -> list[Any]:
        keep = set(config.banking_intents)
        rows = [r for r in banking77_intents(config.data_dir, split, seed=seed)
                if r["questions"]["intent"]["answer"] in keep]
        rows = _balanced(rows, "intent", limit, seed)
        for r in rows:
            q = r["questions"]["intent"]
            q["criteria"] = {k: v for k, v in q["criteria"].items() if k in keep}
        return parsed(rows, f"banking77-{split}")

    def clinc(split: str, limit: int) -> list[Any]:
        return parsed(clinc150_domain_routing(config.data_dir, split, limit, config.seed,
                                              describe=config.describe), f"clinc150-{split}")

    def member(split: str, limit: int) -> list[Any]:
        return parsed(clinc150_domain_membership(config.data_dir, split, limit, config.seed),
                      f"clinc150-noul-{split}")

    out: dict[str, dict[str, list[Any]]] = {}
    for name in config.datasets:
        if name == "clinc150":
            out[name] = {"test": clinc("test", config.limit), "fit": clinc("val", config.fit_limit),
                         "teach": clinc("train", 500)}
        elif name == "clinc150-noul":
            out[name] = {"test": member("test", config.limit),
                         "fit": member("val", config.fit_limit), "teach": member("train", 500)}
        elif name == "banking77":
            out[name] = {"test": banking("test", config.limit, config.seed),
                         "fit": banking("train", config.fit_limit, config.seed + 1),
                         "teach": banking("train", 300, config.seed + 2)}
        else:
            raise ValueError(f"unknown dataset {name!r}: one of {', '.join(DATASETS)}")
    return out


def _balanced(rows: list[dict[str, Any]], question: str, limit: int, seed: int
              ) -> list[dict[str, Any]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["questions"][question]["answer"], []).append(r)
    out = []
    for i in range(max((len(v) for v in by.values()), default=0)):
        for key in sorted(by):
            if i < len(by[key]) and len(out) < limit:
                out.append(by[key][i])
    random.Random(seed).shuffle(out)
    return out


# --------------------------------------------------------------------------- measures


def quality(samples: Sequence[C.Sample], calibration: C.Calibration | None = None
            ) -> dict[str, Any]:
    """Accuracy, NLL, Brier, ECE, the reliability bins and the median label mass of
    ``samples``."""
    from onepass.evaluate import calibration_bins, label_health
    from onepass.readout import argmax_first

    row = C.metrics(samples, calibration)
    health = label_health([s.diagnostics for s in samples if s.diagnostics is not None])
    row["label_mass"] = health["median_label_mass"] if health else None
    probs = [calibration.apply(s.question, s.probabilities) if calibration else s.probabilities
             for s in samples]
    row["bins"] = calibration_bins([max(p) for p in probs],
                                   [argmax_first(p) == s.gold for p, s in zip(probs, samples)])
    return row


def flip_rate(engine: Any, records: Sequence[Any], debias: str, seed: int) -> dict[str, float]:
    """How often a seeded shuffle of a choice's options changes its top answer, and the mean
    total-variation distance between the two distributions (declared-order option names)."""
    from onepass.datasets import strip_answers

    rng = random.Random(seed)
    flips, distances = 0, []
    for record in records:
        request, _ = strip_answers(record.raw)
        name, question = next(iter(request["questions"].items()))
        names = list(question["criteria"])
        shuffled = names[:]
        while shuffled == names:
            rng.shuffle(shuffled)
        permuted = {**question, "criteria": {k: question["criteria"][k] for k in shuffled}}
        a = engine.answer(request, debias=debias)["answers"][name]
        b = engine.answer({**request, "questions": {name: permuted}},
                          debias=debias)["answers"][name]
        flips += a["choice"] != b["choice"]
        distances.append(0.5 * sum(abs(a["probabilities"][k] - b["probabilities"][k])
                                   for k in names))
    n = max(1, len(records))
    return {"n": len(records), "flip_rate": flips / n, "mean_tv": sum(distances) / n}


def latency(engine: Any, records: Sequence[Any], debias: str) -> dict[str, float]:
    """Median ms per request: a state never seen before (miss), then the same again (hit)."""
    from onepass.datasets import strip_answers

    miss, hit = [], []
    for i, record in enumerate(records):
        request, _ = strip_answers(record.raw)
        request["state"] = f"{request['state']} (bench {time.time_ns()} {i})"
        for times in (miss, hit):
            start = time.perf_counter()
            engine.answer(request, debias=debias)
            times.append((time.perf_counter() - start) * 1000)
    return {"n": len(records), "miss_ms": statistics.median(miss),
            "hit_ms": statistics.median(hit)}


def jevbench(engine: Any, domains: Sequence[str], debias: str) -> dict[str, Any]:
    """JevBench mini (frozen plan, ``domains``) against the onepass HTTP app served here."""
    import socket
    import threading

    import jevbench as jb
    import uvicorn

    from onepass.server.app import create_app
    from onepass.server.settings import ServerSettings

    saved = engine.debias
    engine.debias = debias  # the server default: JevBench sends no extension fields
    app = create_app(engine, ServerSettings(request_deadline=300.0, playground=False))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.05)
        model = jb.systemone(f"http://127.0.0.1:{port}/v1/systemone", model=engine.served_name,
                             timeout=600.0)
        # min_n 2: two domains give 4 tests per relation (the suite's own minimum is for 12)
        report = jb.evaluate(model, "jevbench-mini", domains=list(domains), cache=None,
                             min_n=2)
        return {"domains": list(domains), "debias": debias, "overall": report.overall,
                "interval": report.interval, "dimensions": report.dimensions,
                "errors": len(report.errors), "table": report.table()}
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        engine.debias = saved


# --------------------------------------------------------------------------- the run


def run(engine: Any, config: BenchConfig, tick: Tick | None = None) -> dict[str, Any]:
    """Every measure above; returns the JSON-ready report and writes the output folder."""
    from onepass import DecisionEngine
    from onepass.teach import render_context, select_examples

    tick = tick or (lambda stage, done, total: None)
    data = datasets(config)
    identity = engine.identity()
    results: dict[str, dict[str, Any]] = {name: {} for name in data}
    fitted: dict[str, Any] = {}

    def collect(eng: Any, records: list[Any], debias: str, stage: str) -> list[C.Sample]:
        return C.collect(eng, records, debias=debias,
                         on_record=lambda done: tick(stage, done, len(records)))

    modes = config.debias_settings
    for debias in modes:
        for name, parts in data.items():
            test = collect(engine, parts["test"], debias, f"{name} {debias}")
            results[name][debias] = quality(test)
            if debias == "rotations" and config.compare_combine:
                saved, engine.combine = engine.combine, "logmean"
                try:
                    results[name]["rotations(logmean)"] = quality(collect(
                        engine, parts["test"], debias, f"{name} rotations logmean"))
                finally:
                    engine.combine = saved
            fit_samples = collect(engine, parts["fit"], debias, f"{name} {debias} (fit)")
            prior = C.content_free_bias(engine, [fit_samples[0].question], debias=debias)
            method, table = C.choose(fit_samples, identity, content_free=prior, debias=debias,
                                     seed=config.seed)
            cal = C.fit(fit_samples, method, identity, content_free=prior, debias=debias)
            results[name][f"{debias}+calibration"] = {**quality(test, cal), "method": method}
            fitted[f"{name} {debias}"] = {"method": method, "held_out": table}
    for k in config.teach:
        for name, parts in data.items():
            context = render_context(select_examples(parts["teach"], k, config.seed))
            taught = DecisionEngine(engine.backend, context=context,
                                    max_input_tokens=engine.max_input_tokens)
            test = collect(taught, parts["test"], "none", f"{name} teach {k}")
            results[name][f"none+teach{k}"] = {**quality(test),
                                               "context_tokens": taught.pinned_tokens}
    first = data[config.datasets[0]]["test"]
    flips = {debias: flip_rate(engine, first[: config.flip_records], debias, config.seed)
             for debias in modes}
    tick("flip rate", 1, 1)
    lat = {debias: latency(engine, first[: config.latency_requests], debias)
           for debias in modes}
    tick("latency", 1, 1)
    jev: dict[str, Any] = {}
    report = {"identity": identity, "settings": config.settings, "limit": config.limit,
              "seed": config.seed, "banking77_intents": list(config.banking_intents),
              "clinc150_descriptions": config.describe, "flip_latency_dataset": config.datasets[0],
              "results": results, "calibration": fitted, "flip": flips, "latency": lat,
              "jevbench": jev}
    write(report, Path(config.output))  # what is measured so far survives a JevBench fault
    if config.domains:
        for debias in modes:
            jev[debias] = jevbench(engine, config.domains, debias)
            tick(f"jevbench {debias}", 1, 1)
            write(report, Path(config.output))
    return report


# --------------------------------------------------------------------------- output


def _f(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def write(report: dict[str, Any], folder: Path) -> None:
    """REPORT.md, report.json and one reliability diagram per dataset."""
    from onepass.evaluate import ECE_NOTE, reliability_diagram

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    ident = report["identity"]
    lines = [
        "# onepass bench", "",
        f"- model `{ident['model']}`, dtype `{ident['dtype']}`, adapter `{ident['adapter']}`, "
        f"prompt `{ident['prompt_version']}`",
        f"- {report['limit']} scored test records per dataset (seed {report['seed']}); "
        f"BANKING77 intents: {', '.join(report['banking77_intents'])}; CLINC150 options "
        + ("with descriptions" if report["clinc150_descriptions"] else "by name only"),
        f"- {ECE_NOTE}; Brier: multi-class, averaged; calibration fitted on other records "
        "(CLINC150 validation, BANKING77 train)", "",
        "| dataset | setting | accuracy | Brier | ECE | NLL | label mass | n |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in report["results"].items():
        for setting, row in rows.items():
            extra = f" ({row['method']})" if "method" in row else ""
            lines.append(f"| {name} | {setting}{extra} | {_f(row['accuracy'])} | "
                         f"{_f(row['brier'])} | {_f(row['ece'])} | {_f(row['nll'])} | "
                         f"{_f(row.get('label_mass'))} | {row['n']} |")
        try:
            reliability_diagram({s: r["bins"] for s, r in rows.items()},
                                folder / f"reliability_{name}.png", f"{name}: reliability")
            lines += ["", f"![{name}](reliability_{name}.png)", ""]
        except RuntimeError:  # no matplotlib: the numbers still stand
            pass
    lines += ["", f"Flip rate and latency on {report['flip_latency_dataset']} test records.", "",
              "| option order | flip rate | mean TV | n |", "|---|---|---|---|"]
    for debias, row in report["flip"].items():
        lines.append(f"| {debias} | {_f(row['flip_rate'])} | {_f(row['mean_tv'], 4)} | "
                     f"{row['n']} |")
    lines += ["", "| latency per request | miss ms | hit ms | n |", "|---|---|---|---|"]
    for debias, row in report["latency"].items():
        lines.append(f"| {debias} | {_f(row['miss_ms'], 1)} | {_f(row['hit_ms'], 1)} | "
                     f"{row['n']} |")
    for debias, row in report.get("jevbench", {}).items():
        lines += ["", f"## JevBench mini ({', '.join(row['domains'])}), debias {debias}", "",
                  "```", str(row["table"]).rstrip(), "```"]
    (folder / "REPORT.md").write_text("\n".join(lines) + "\n")
