"""Why the embedded model answers at chance: it cannot map a listed option to its letter, but
it can name the option when no list is shown. A design study for issue 30, not a served format.

Two sets, every record zero-shot, one plain full forward each (``backend.reference_logits``):

* **verbatim**: a one-word topic said word for word in a short note ("This message is about
  the singer."), asked as a choice of 3-6 such words. It needs no knowledge, only a copy, so it
  tells the reading apart from what the model knows. Generated here, seeded: 120 held-out
  records over words the 800 training records (``--write-verbatim DIR``) never use.
* **CLINC150 10-domain routing** (``../shared/data``), the set `onepass bench` reports.

Readers, all restricted to the candidates' own tokens (an answer cannot leave the set):

* ``engine``: the shipped prompt and readout (document first, lettered options, letter read);
* ``listed, letter`` / ``listed, name``: the same layout by hand, the letter or the first token
  of the option's name read after ``Answer:``;
* ``cloze``: no option list at all, the note and the question, then a sentence the option's
  name completes (``This message is about the``); the first token of each name is read
  (records whose names' first tokens collide are left out of a reader: its ``n``);
* ``cloze, Answer:``: the same with the generic ``Answer:`` an engine would have to use.

    .venv/bin/python benchmarks/cloze_reading.py [--limit 100] [--model ALIAS]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from pathlib import Path

from prompt_formats import accuracy  # beside this file: one question per record here
from rich.console import Console
from rich.progress import track
from rich.table import Table

from onepass import prompt as P
from onepass.datasets import clinc150_domain_routing
from onepass.engine import DecisionEngine

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
WORDS = ["apple", "banana", "cherry", "grape", "lemon", "mango", "orange", "peach", "pear",
         "plum", "tiger", "lion", "horse", "zebra", "camel", "eagle", "falcon", "parrot",
         "salmon", "shark", "violin", "guitar", "piano", "drum", "flute", "trumpet", "hammer",
         "wrench", "drill", "saw", "ladder", "bucket", "candle", "mirror", "pillow", "blanket",
         "carpet", "curtain", "window", "garden", "forest", "river", "mountain", "desert",
         "island", "ocean", "valley", "canyon", "glacier", "volcano", "castle", "bridge", "tower",
         "temple", "church", "palace", "market", "school", "library", "museum", "hospital",
         "airport", "harbor", "station", "factory", "office", "kitchen", "bakery", "bicycle",
         "truck", "tractor", "rocket", "helmet", "jacket", "sweater", "scarf", "boots", "gloves",
         "wallet", "camera", "laptop", "printer", "tablet", "battery", "cable", "engine",
         "magnet", "compass", "anchor", "arrow", "basket", "bottle", "button", "coffee", "copper",
         "cotton", "crystal", "diamond", "dragon", "feather", "finger", "flower", "ginger",
         "honey", "insect", "jungle", "kettle", "knife", "lantern", "leather", "marble", "meadow",
         "needle", "noodle", "onion", "oyster", "pepper", "pencil", "pirate", "planet", "pocket",
         "potato", "puzzle", "rabbit", "radio", "saddle", "salad", "sandal", "shadow", "shovel",
         "silver", "spider", "spoon", "stamp", "sugar", "summer", "tennis", "thunder", "ticket",
         "tomato", "turtle", "umbrella", "velvet", "walnut", "wizard", "yogurt", "zipper",
         "cactus", "dolphin", "lobster", "mushroom", "pumpkin", "rainbow", "sailor", "sheriff",
         "soldier", "teacher", "nurse", "farmer", "baker", "tailor", "plumber", "painter",
         "doctor", "lawyer", "pilot", "singer", "dancer"]
TRAIN_WORDS, HELDOUT_WORDS = WORDS[:125], WORDS[125:]  # the held-out set names unseen words
FILLER = ["The note was written this morning.", "Nothing else needs to be added here.",
          "Some of this may not matter.", "Further notes may follow later.",
          "Questions are welcome.", "There is some background to this.",
          "Let me know if anything is unclear.", "It was a long week."]


def verbatim_record(rng: random.Random, words: list[str], count: int) -> dict:
    """A choice of ``count`` words; the note names the gold one word for word."""
    options = rng.sample(words, count)
    gold = rng.choice(options)
    sentences = rng.sample(FILLER, rng.randint(1, 3))
    sentences.insert(rng.randint(0, len(sentences)), f"This message is about the {gold}.")
    return {"state": " ".join(sentences), "questions": {"q": {
        "type": "choice", "instructions": "Which thing is this message about?",
        "criteria": {o: None for o in options}, "answer": gold}}}


def verbatim_sets(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """800 training and 120 held-out records (3-6 options each), the held-out ones over words
    no training record uses: the LoRA check in docs/training.md trains on the first and is
    validated on the second, which this study also reads."""
    rng = random.Random(seed)
    train = [verbatim_record(rng, TRAIN_WORDS, rng.randint(3, 6)) for _ in range(800)]
    heldout = [verbatim_record(rng, HELDOUT_WORDS, rng.randint(3, 6)) for _ in range(120)]
    return train, heldout


def clinc_set(limit: int) -> list[dict]:
    return clinc150_domain_routing(DATA, "test", limit, seed=1)


# what a reader's prompt ends with, per set: (the cloze sentence the name completes)
CLOZE_LEAD = {"verbatim": "This message is about the", "clinc150": "The request belongs to the"}


def listed_prompt(backend, state: str, question: dict, names: list[str], read: str) -> str:
    if read == "letter":
        lines = [f"{x}) {n}" + (f": {d}" if d else "")
                 for x, n, d in zip(P.LETTERS, names, (question["criteria"][n] for n in names))]
    else:
        lines = [f"- {n}" + (f": {question['criteria'][n]}" if question["criteria"][n] else "")
                 for n in names]
    user = (f"<document>\n{state}\n</document>\n\nQuestion: {question['instructions']}\n"
            "Options:\n" + "\n".join(lines) + f"\nAnswer with the option's {read}.")
    return backend.render_chat([{"role": "system", "content": P.SYSTEM_INSTRUCTIONS},
                                {"role": "user", "content": user}]) + "Answer:"


def cloze_prompt(backend, state: str, question: dict, lead: str) -> str:
    user = f"{state}\n\n{question['instructions']}"
    return backend.render_chat([{"role": "user", "content": user}]) + lead


def read(backend, records: list[dict], prompt: Callable[[dict, dict, list[str]], str],
         words: Callable[[list[str]], list[str]], label: str) -> tuple[float, int]:
    """Accuracy of the top candidate, over the records whose candidate tokens are distinct."""
    right = counted = 0
    for record in track(records, description=label, transient=True):
        (question,) = record["questions"].values()
        names = list(question["criteria"])
        candidates = [backend.encode(w, bos=False)[0] for w in words(names)]
        if len(set(candidates)) != len(candidates):
            continue
        logits = backend.reference_logits(
            backend.encode(prompt(record, question, names)), candidates)
        right += names[logits.index(max(logits))] == question["answer"]
        counted += 1
    return right / max(counted, 1), counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--limit", type=int, default=100, help="records per set")
    parser.add_argument("--output", type=Path, default=None, help="write results as JSON")
    parser.add_argument("--write-verbatim", type=Path, default=None, metavar="DIR",
                        help="write the verbatim train.jsonl and heldout.jsonl to DIR and stop")
    args = parser.parse_args()
    if args.write_verbatim:
        args.write_verbatim.mkdir(parents=True, exist_ok=True)
        for name, records in zip(("train", "heldout"), verbatim_sets()):
            (args.write_verbatim / f"{name}.jsonl").write_text(
                "".join(json.dumps(r) + "\n" for r in records))
        return

    engine = DecisionEngine.from_pretrained(args.model, dtype="float32")
    backend = engine.backend
    start = time.perf_counter()
    results: dict[str, dict[str, tuple[float, int]]] = {}
    for name, records in (("verbatim", verbatim_sets()[1][: args.limit]),
                          ("clinc150", clinc_set(args.limit))):
        row = {"engine": (accuracy(engine, records, f"{name}: engine"), len(records))}
        for how in ("letter", "name"):
            row[f"listed, {how}"] = read(
                backend, records,
                lambda r, q, n, how=how: listed_prompt(backend, r["state"], q, n, how),
                lambda n, how=how: [" " + w for w in (P.LETTERS[: len(n)] if how == "letter"
                                                      else n)],
                f"{name}: listed, {how}")
        for reader, lead in (("cloze", CLOZE_LEAD[name]), ("cloze, Answer:", "Answer:")):
            row[reader] = read(
                backend, records,
                lambda r, q, n, lead=lead: cloze_prompt(backend, r["state"], q, lead),
                lambda n: [" " + w for w in n], f"{name}: {reader}")
        results[name] = row
        print(name, {k: round(v[0], 3) for k, v in row.items()}, flush=True)
    table = Table(title=f"zero-shot accuracy, {engine.served_name}, float32, one run")
    table.add_column("reader")
    for name in results:
        table.add_column(f"{name} (n)", justify="right")
    for reader in results["verbatim"]:
        table.add_row(reader, *(f"{results[s][reader][0]:.3f} ({results[s][reader][1]})"
                                for s in results))
    Console().print(table)
    print(f"seconds: {time.perf_counter() - start:.1f}")
    if args.output:
        args.output.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
