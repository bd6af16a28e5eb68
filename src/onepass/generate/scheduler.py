"""Continuous batching: one thread decides what runs in the next forward, for every sequence.

Each step is ONE backend forward over (a) the next token of every sequence that is decoding
and (b) prompt chunks of newly admitted sequences, under a token budget (``step_tokens``), so a
long prompt never stalls the others for more than one bounded step. New requests are admitted
at step boundaries while sequences and key/value rows are free; finished or cancelled ones are
retired at once and their rows reused. A prompt starts from the longest prefix the prefix cache
holds (shared with decisions) and, once computed, is stored there for the next request; the
cached entry is a copy, so generated tokens never touch it.

Consumers read a :class:`GenerationStream` (sync or async iteration) of :class:`Delta` events
ending with one :class:`Finish`.

Size: the one thread that plans a step over four kinds of work (sequences, decisions, readings
and their admission); they share one token budget and one key/value arena, so their planning
stays together.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from onepass.backends.base import StepRow
from onepass.generate.grammar import GrammarError
from onepass.generate.pace import DEFAULT_STREAM_SLOWDOWN, StepPace
from onepass.generate.sampling import SamplingParams, TokenHistory, make_generator, sample
from onepass.generate.streams import (  # noqa: F401  (re-exported: the scheduler's own API)
    Delta,
    Finish,
    GenerationStream,
    ReadCancelled,
    Reader,
    Saturated,
    SchedulerClosed,
    TokenInfo,
    _resolve,
)
from onepass.generate.text import IncrementalDetokenizer, StopMatcher

log = logging.getLogger("onepass.generate")

DEFAULT_MAX_SEQUENCES = 8
DEFAULT_STEP_TOKENS = 512
DEFAULT_ARENA_ROWS = 65536


_LIVE: weakref.WeakSet[GenerationScheduler] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Stop every step thread before interpreter teardown (a forward running on a daemon
    thread while the runtime unloads aborts the process)."""
    for scheduler in list(_LIVE):
        scheduler.close(timeout=5.0)


@dataclass(eq=False)
class _Sequence:
    owner: int
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stream: GenerationStream
    reserved: int
    detok: IncrementalDetokenizer
    stop: StopMatcher
    generator: Any
    history: TokenHistory
    table: list[int] = field(default_factory=list)
    computed: int = 0  # prompt tokens whose keys/values are in the arena
    cached: int = 0
    generated: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    matcher: Any = None  # a grammar Matcher (generate/grammar.py): masks every draw
    request: RequestShare | None = None
    until: Callable[[list[int]], bool] | None = None  # ends it after a token (open fields)

    @property
    def decoding(self) -> bool:
        return self.computed == len(self.prompt)


@dataclass(eq=False)
class RequestShare:
    """The sequences of one request (its ``n``) share one bounded part of the scheduler: at
    most ``max_request_sequences`` of them run at once and together they reserve at most
    ``max_request_rows`` (the rest wait in line behind them, and the line moves past them),
    so one request never takes every slot or the whole arena. ``deadline`` (monotonic
    seconds) is the queue deadline: a request none of whose sequences started by then leaves
    the line with reason "deadline"."""

    deadline: float | None = None
    enqueued: float = field(default_factory=time.monotonic)
    active: int = 0
    rows: int = 0
    started: bool = False


@dataclass(eq=False)
class _Decision:
    """One decision request: a shared prefix and question suffixes, candidate logits out.

    The prefix is owned by ``owner``; each suffix has its own owner whose queries also see the
    prefix (``parent``), so suffixes never see each other, exactly as in the packed forward of
    :meth:`TorchBackend.score`. Suffixes can ride in the same step as the prefix's last chunk."""

    prefix: list[int]
    suffixes: list[list[int]]
    candidates: list[list[int]]
    owner: int
    suffix_owners: list[int]
    reserved: int
    future: Future = field(default_factory=Future)
    table: list[int] = field(default_factory=list)
    suffix_tables: list[list[int]] = field(default_factory=list)
    computed: int = 0
    cached: int = 0
    written: int = 0  # prefix tokens this decision computed and stored in the prefix cache
    namespace: str | None = None  # its prefix-cache partition (a prompt_cache_key)
    scheduled: int = 0  # suffixes sent to a step so far
    results: dict[int, list[float]] = field(default_factory=dict)


@dataclass(eq=False)
class _Reading:
    """Inputs read for their final hidden states (embeddings, prompt scoring), in prompt
    chunks within the step budget like any prompt, after decode tokens, decisions and
    generation prompts. Each input has its own owner (inputs never see each other) and is
    begun only while its rows fit the task's share (``reserved``); it is released when read.
    A set ``cancel`` stops it at the next step boundary."""

    reader: Reader
    owners: list[int]
    reserved: int
    cancel: threading.Event | None
    future: Future = field(default_factory=Future)
    tables: list[list[int]] = field(default_factory=list)
    computed: list[int] = field(default_factory=list)  # tokens read, per input
    begun: int = 0  # inputs whose rows are held or already released
    held: int = 0  # rows held by begun, unfinished inputs
    done: int = 0  # inputs fully read (in order)

    @property
    def cancelled(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()


def _blocks(tokens: int, block: int) -> int:
    """Rows ``tokens`` positions occupy in the arena (whole blocks)."""
    return -(-tokens // block) * block


class GenerationScheduler:
    """Owns the model's forwards for generation AND decisions (one thread, one arena): every
    step packs decode tokens, decision prefixes/suffixes and prompt chunks into one forward."""

    def __init__(
        self,
        backend: Any,
        *,
        max_sequences: int = DEFAULT_MAX_SEQUENCES,
        step_tokens: int = DEFAULT_STEP_TOKENS,
        arena_rows: int | None = None,
        max_waiting: int = 64,
        on_step: Callable[[int, int], None] | None = None,
        max_request_sequences: int | None = None,
        decision_rows: int | None = None,
        stream_slowdown: float | None = DEFAULT_STREAM_SLOWDOWN,
    ):
        if max_sequences < 1 or step_tokens < 1 or max_waiting < 1:
            raise ValueError("max_sequences, step_tokens and max_waiting must be positive")
        if max_request_sequences is not None and max_request_sequences < 1:
            raise ValueError("max_request_sequences must be positive")
        self.backend = backend
        self.max_sequences = max_sequences
        # one request's sequences running at once (default: half the slots)
        self.max_request_sequences = min(max_sequences,
                                         max_request_sequences or max(1, max_sequences // 2))
        self.step_tokens = step_tokens
        # while sequences decode, a step carries only the other tokens that keep its time
        # within stream_slowdown x a decode-only step (None: the whole step budget)
        self.pace = StepPace(stream_slowdown) if stream_slowdown else None
        self.max_waiting = max_waiting
        context = backend.context_length
        # room for every sequence at full context, up to 64k rows (allocated lazily, zeroed
        # only as far as rows are used), never less than one full-context sequence
        self.arena = backend.new_arena(
            arena_rows or min(max_sequences * context, max(context, DEFAULT_ARENA_ROWS))
        )
        # rows generation never reserves, so decisions always have room (default: an eighth
        # of the arena, as long as one full-context sequence still fits beside it); of the
        # rest, one request's sequences reserve at most half (one sequence always may)
        block, rows = self.arena.block, self.arena.capacity
        reserve = decision_rows if decision_rows is not None else min(rows // 8, rows - context)
        self.decision_rows = min(max(0, reserve - reserve % block), rows - block)
        self.generation_rows = rows - self.decision_rows
        self.max_request_rows = self.generation_rows // 2
        self._generation_reserved = 0
        self.eos = backend.eos_ids
        self.on_step = on_step
        self._waiting: deque[_Sequence] = deque()
        self._active: list[_Sequence] = []
        self._decisions_waiting: deque[_Decision] = deque()
        self._decisions: list[_Decision] = []
        self._readings_waiting: deque[_Reading] = deque()
        self._readings: list[_Reading] = []
        self._reserved = 0
        self._cond = threading.Condition()
        self._closed = False
        self._owners = itertools.count()
        self._thread: threading.Thread | None = None
        self.steps = 0
        self.tokens = 0  # tokens every step so far has processed
        _LIVE.add(self)

    # ------------------------------------------------------------------ public

    @property
    def capacity(self) -> int:
        """The most tokens (prompt + output limit) one sequence may ever need."""
        return self.arena.capacity

    @property
    def active(self) -> int:
        return len(self._active)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def decisions_waiting(self) -> int:
        """Decisions queued for rows (not yet in a step)."""
        return len(self._decisions_waiting)

    def share(self, deadline: float | None = None) -> RequestShare:
        """A new request's share (pass it to every :meth:`submit` of that request)."""
        return RequestShare(deadline)

    def submit(self, prompt: Sequence[int], params: SamplingParams, max_tokens: int,
               *, seed_offset: int = 0, grammar: Any = None, matcher: Any = None,
               until: Callable[[list[int]], bool] | None = None,
               request: RequestShare | None = None) -> GenerationStream:
        """Queue one sequence; raises :class:`Saturated` instead of queueing without bound.
        ``request`` (from :meth:`share`) groups the sequences of one request; None: its own.

        ``grammar`` (a compiled :class:`~onepass.generate.grammar.Grammar`) constrains every
        token; the sequence gets its own matcher and ends with "stop" when the grammar is
        complete (EOS is allowed only there, whatever ``ignore_eos`` says). ``matcher``: an
        already advanced matcher instead (the caller reads its state after the Finish).
        ``until(ids)``, called on the step thread after each token, ends the sequence with
        "stop" when true (that token kept): a decision's open field ends at its closing quote
        or its deadline this way."""
        if not prompt:
            raise ValueError("a generation needs at least one prompt token")
        need = len(prompt) + max_tokens
        if need > self.generation_rows:
            raise ValueError(f"{need} tokens do not fit the key/value arena's generation part "
                             f"({self.generation_rows})")
        stream = GenerationStream()
        decode = self.backend.decode
        seed = None if params.seed is None else params.seed + seed_offset
        seq = _Sequence(
            owner=next(self._owners), prompt=list(prompt), params=params,
            max_tokens=max_tokens, stream=stream, reserved=_blocks(need, self.arena.block),
            detok=IncrementalDetokenizer(decode, list(prompt[-4:])),
            stop=StopMatcher(params.stop), generator=make_generator(seed),
            history=TokenHistory(prompt),
            matcher=matcher if grammar is None else grammar.matcher(),
            request=request or RequestShare(), until=until,
        )
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the server is shutting down")
            if len(self._waiting) >= self.max_waiting:
                self._drop_waiting()  # clients that left make room at once
            if len(self._waiting) >= self.max_waiting:
                raise Saturated(
                    f"{len(self._waiting)} generations are waiting for a slot "
                    f"(max {self.max_waiting}); retry later"
                )
            self._waiting.append(seq)
            self._cond.notify()
            self._ensure_thread()
        return stream

    def score(
        self,
        prefix: Sequence[int],
        suffixes: Sequence[Sequence[int]],
        candidates: Sequence[Sequence[int]],
        *,
        namespace: str | None = None,
    ) -> Any:
        """The backend protocol's ``score``, run inside the shared steps: blocks until the
        candidate logits are ready. Concurrent callers are packed into the same forwards.
        ``namespace``: the prefix-cache partition its prefix is loaded from and stored in."""
        from onepass.backends.base import ScoreResult, has_work

        if not has_work(suffixes, candidates):
            return ScoreResult([], 0)
        block = self.arena.block
        start = len(prefix)  # each suffix's rows, from the block its first position falls in
        reserved = _blocks(start, block) + block * sum(
            (start + len(x) - 1) // block - start // block + 1 for x in suffixes)
        if reserved > self.capacity:
            raise ValueError(f"{reserved} rows do not fit the key/value arena ({self.capacity})")
        task = _Decision(
            prefix=list(prefix), suffixes=[list(x) for x in suffixes],
            candidates=[list(c) for c in candidates], owner=next(self._owners),
            suffix_owners=[next(self._owners) for _ in suffixes], reserved=reserved,
            namespace=namespace,
        )
        task.suffix_tables = [[] for _ in suffixes]
        self._enqueue(self._decisions_waiting, task)
        from onepass.server.admission import wait_for_model  # stdlib only: no server stack

        # within the request's deadline (a server job), withdrawn if the model has not taken it
        logits = wait_for_model(task.future, lambda: self._withdraw(task))
        return ScoreResult(logits, task.cached, task.written)

    def complete(self, prompt: Sequence[int], max_tokens: int, *, matcher: Any = None,
                 until: Callable[[list[int]], bool] | None = None) -> Finish:
        """One greedy sequence run to its end inside the shared steps (a decision's open
        value: see :meth:`submit` for ``matcher`` and ``until``); blocks until its Finish,
        within the running server job's deadline like :meth:`score`: a sequence still waiting
        then leaves the line; a running one is awaited (``until`` bounds it in time)."""
        stream = self.submit(prompt, SamplingParams(temperature=0.0), max_tokens,
                             matcher=matcher, until=until)

        def withdraw() -> bool:
            with self._cond:
                waiting = [s for s in self._waiting if s.stream is stream]
                for seq in waiting:
                    self._waiting.remove(seq)
            if waiting:
                stream.cancel()
            return bool(waiting)

        from onepass.server.admission import wait_for_model  # stdlib only: no server stack

        return wait_for_model(stream.finished, withdraw)

    def _withdraw(self, task: _Decision) -> bool:
        """Take a decision out of the line; False when a step already took it."""
        with self._cond:
            if task not in self._decisions_waiting:
                return False
            self._decisions_waiting.remove(task)
        task.future.cancel()
        return True

    def read(self, reader: Reader, cancel: threading.Event | None = None) -> Any:
        """Run ``reader`` (embeddings, prompt scoring) inside the shared steps, in prompt
        chunks interleaved with everything else; blocks until ``reader.result()`` is ready.
        Setting ``cancel`` stops it at the next step boundary (raises :class:`ReadCancelled`)."""
        inputs = reader.inputs
        if not inputs or not all(inputs):
            raise ValueError("a reading needs at least one token per input")
        block = self.arena.block
        sizes = [_blocks(len(x), block) for x in inputs]
        # enough for the longest input, and for about one step of short ones side by side
        reserved = min(sum(sizes), max(max(sizes), _blocks(self.step_tokens, block)))
        if reserved > self.generation_rows:
            raise ValueError(f"{reserved} rows do not fit the key/value arena's generation "
                             f"rows ({self.generation_rows})")
        task = _Reading(reader=reader, owners=[next(self._owners) for _ in inputs],
                        reserved=reserved, cancel=cancel)
        task.tables = [[] for _ in inputs]
        task.computed = [0] * len(inputs)
        self._enqueue(self._readings_waiting, task)
        return task.future.result()

    def _enqueue(self, line: deque, task: Any) -> None:
        """Put a decision or reading in its line for the step thread (started on first use)."""
        with self._cond:
            if self._closed:
                raise SchedulerClosed("the server is shutting down")
            line.append(task)
            self._cond.notify()
            self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="onepass-steps", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Finish every waiting and running sequence as cancelled and stop the thread (waits
        for the step in flight, so no forward runs while the interpreter tears down)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._idle_ends() and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for seq in [*self._waiting, *self._active]:
                        self._finish(seq, "cancelled")
                    self._waiting.clear()
                    for task in [*self._decisions_waiting, *self._decisions]:
                        self._settle(task, SchedulerClosed("the server is shutting down"))
                    self._decisions_waiting.clear()
                    for reading in [*self._readings_waiting, *self._readings]:
                        self._end_reading(reading, SchedulerClosed("the server is shutting down"))
                    self._readings_waiting.clear()
                    return
            try:  # a fault fails the work in flight, never the thread (callers would wait)
                with self._cond:
                    self._admit()
                self._step()
            except Exception as exc:
                log.error("step failed", exc_info=True)
                with self._cond:
                    for seq in list(self._active):
                        self._finish(seq, "error", exc)
                    for task in list(self._decisions):
                        self._settle(task, exc)
                    for reading in list(self._readings):
                        self._end_reading(reading, exc)

    def _idle_ends(self) -> bool:
        return bool(self._waiting or self._active or self._decisions_waiting or self._decisions
                    or self._readings_waiting or self._readings)

    def _admit(self) -> None:
        """Move waiting work in (first come, first served) while slots and rows last:
        decisions first (one short step each), then readings, then generation sequences.
        A decision whose prefix starts with one a running decision is still computing waits
        until it is stored, then loads it (concurrent requests about one state compute it
        once, however their arrivals fall between steps)."""
        held: list[_Decision] = []
        while self._decisions_waiting:
            task = self._decisions_waiting[0]
            if self._reserved + task.reserved > self.arena.capacity:
                break
            self._decisions_waiting.popleft()
            if any(d.computed < len(d.prefix) and task.prefix[:len(d.prefix)] == d.prefix
                   and d.namespace == task.namespace for d in self._decisions):
                held.append(task)
                continue
            self._reserved += task.reserved
            self._decisions.append(task)
            task.cached = task.computed = self.backend.load_prefix(
                self.arena, task.table, task.owner, task.prefix, keep_last=False,
                namespace=task.namespace,
            )
        self._decisions_waiting.extendleft(reversed(held))
        self._drop_waiting()
        if len(self._decisions_waiting) > len(held):  # one waits for rows: generation waits
            return
        while self._readings_waiting:  # readings take generation rows, never decisions' reserve
            reading = self._readings_waiting[0]
            if reading.cancelled:
                self._readings_waiting.popleft()
                self._end_reading(reading, ReadCancelled("the reading was cancelled"))
                continue
            if (self._generation_reserved + reading.reserved > self.generation_rows
                    or self._reserved + reading.reserved > self.arena.capacity):
                break
            self._readings_waiting.popleft()
            self._reserved += reading.reserved
            self._generation_reserved += reading.reserved
            self._readings.append(reading)
        i = 0
        while i < len(self._waiting) and len(self._active) < self.max_sequences:
            seq = self._waiting[i]
            share = seq.request
            assert share is not None
            if share.active and (share.active >= self.max_request_sequences
                                 or share.rows + seq.reserved > self.max_request_rows):
                i += 1  # its request holds its share: the line moves past it
                continue
            if (self._generation_reserved + seq.reserved > self.generation_rows
                    or self._reserved + seq.reserved > self.arena.capacity):
                return
            del self._waiting[i]
            self._reserved += seq.reserved
            self._generation_reserved += seq.reserved
            share.active += 1
            share.rows += seq.reserved
            share.started = True
            self._active.append(seq)
            seq.cached = seq.computed = self.backend.load_prefix(
                self.arena, seq.table, seq.owner, seq.prompt
            )

    def _drop_waiting(self) -> None:
        """Waiting sequences whose client left, or whose request did not start before its
        queue deadline, leave the line now (not when they reach its head), so they never
        hold places in it."""
        now = time.monotonic()
        kept: deque[_Sequence] = deque()
        for seq in self._waiting:
            share = seq.request
            if seq.stream.cancelled:
                seq.stream.push(Finish("cancelled", len(seq.prompt), 0, 0))
            elif (share is not None and not share.started and share.deadline is not None
                  and now > share.deadline):
                seq.stream.push(Finish("deadline", len(seq.prompt), 0, 0, Saturated(
                    f"the generation waited {now - share.enqueued:.1f} s without a free slot "
                    f"(request deadline {round(share.deadline - share.enqueued, 2):g} s); the "
                    "server is saturated, retry later")))
            else:
                kept.append(seq)
        self._waiting = kept

    def _step(self) -> None:

        for seq in [s for s in self._active if s.stream.cancelled]:
            self._finish(seq, "cancelled")
        for reading in [r for r in self._readings if r.cancelled]:
            self._end_reading(reading, ReadCancelled("the reading was cancelled"))
        budget = self.step_tokens
        rows, owners = [], []
        for seq in self._active:  # every decoding sequence advances by one token
            if seq.decoding:
                start = len(seq.prompt) + len(seq.generated) - 1
                rows.append(StepRow(seq.table, seq.owner, seq.generated[-1:], start,
                                    decode=True))
                owners.append(seq)
                budget -= 1
        decoding = len(rows)
        if decoding and self.pace is not None:  # the streams' pace bounds the other work
            budget = min(budget, self.pace.allowance(budget))
        for task in self._decisions:  # then decisions: prefix rest, then suffixes
            budget = self._plan_decision(task, rows, owners, budget,
                                         first=len(rows) == decoding)
        for seq in self._active:  # then prompt chunks, oldest first, within the budget
            if not seq.decoding and budget > 0:
                chunk = seq.prompt[seq.computed : seq.computed + budget]
                last = seq.computed + len(chunk) == len(seq.prompt)
                rows.append(StepRow(seq.table, seq.owner, chunk, seq.computed, last))
                owners.append(seq)
                budget -= len(chunk)
        for reading in self._readings:  # then readings, with what the budget has left
            budget = self._plan_reading(reading, rows, owners, budget)
        if not rows:
            return
        started = time.monotonic()
        hidden = self.backend.step(self.arena, rows)
        tokens = sum(len(r.tokens) for r in rows)
        self.steps += 1
        self.tokens += tokens
        if self.on_step:
            self.on_step(len(rows), tokens)
        wanted = [i for i, h in enumerate(hidden)
                  if h is not None and isinstance(owners[i], _Sequence)]
        logits = self.backend.vocab_logits(torch.stack([hidden[i] for i in wanted])) if wanted \
            else None
        if self.pace is not None:
            self.pace.observe(decoding, tokens - decoding, time.monotonic() - started)
        rows_logits = dict(zip(wanted, logits)) if logits is not None else {}
        for i, (seq, row) in enumerate(zip(owners, rows)):
            if isinstance(seq, _Decision):
                self._absorb_decision(seq, row, hidden[i])
                continue
            if isinstance(seq, _Reading):
                self._absorb_reading(seq, row, hidden[i])
                continue
            if not seq.decoding:
                seq.computed += len(row.tokens)
                if seq.decoding:
                    self.backend.store_prefix(self.arena, seq.table, seq.prompt)
            if i in rows_logits:
                try:  # a sequence's own fault (its grammar, its sampling) ends it alone
                    self._advance(seq, rows_logits[i])
                except Exception as exc:
                    log.error("sequence failed", exc_info=True)
                    if seq in self._active:
                        self._finish(seq, "error", exc)

    def _plan_decision(self, task: _Decision, rows: list, owners: list, budget: int,
                       first: bool) -> int:
        """Add the task's next rows to this step within ``budget``; returns what is left."""

        if task.computed < len(task.prefix):
            if budget <= 0:
                return budget
            chunk = task.prefix[task.computed : task.computed + budget]
            rows.append(StepRow(task.table, task.owner, chunk, task.computed, False))
            owners.append(task)
            budget -= len(chunk)
            first = False
            if task.computed + len(chunk) < len(task.prefix):
                return budget
        while task.scheduled < len(task.suffixes):
            i = task.scheduled
            suffix = task.suffixes[i]
            if len(suffix) > budget and not first:  # a lone oversized suffix still runs
                break
            rows.append(StepRow(task.suffix_tables[i], task.suffix_owners[i], suffix,
                                len(task.prefix), True, task.owner, task.table))
            owners.append(task)
            budget -= len(suffix)
            task.scheduled += 1
            first = False
        return budget

    def _absorb_decision(self, task: _Decision, row: Any, hidden: Any) -> None:
        if row.owner == task.owner:  # a prefix chunk
            task.computed += len(row.tokens)
            if task.computed == len(task.prefix) and task.cached < len(task.prefix) \
                    and self.backend.store_prefix(self.arena, task.table, task.prefix,
                                                  namespace=task.namespace):
                task.written = len(task.prefix) - task.cached
            return
        i = task.suffix_owners.index(row.owner)
        task.results[i] = self.backend.candidate_logits(hidden[None], [task.candidates[i]])[0]
        self.arena.release(task.suffix_tables[i])
        if len(task.results) == len(task.suffixes):
            self._settle(task)

    def _settle(self, task: _Decision, error: BaseException | None = None) -> None:
        """Retire a decision: free its rows and hand its logits (or error) to the caller."""
        if task in self._decisions:
            self._decisions.remove(task)
            self._reserved -= task.reserved
            self._release(task.table, *task.suffix_tables)
        _resolve(task.future, error, lambda: [task.results[i] for i in range(len(task.suffixes))])

    def _plan_reading(self, task: _Reading, rows: list, owners: list, budget: int) -> int:
        """Add the reading's next chunks to this step within ``budget`` (inputs in order, a new
        one begun only while its rows fit the task's share); returns what is left."""

        inputs, block = task.reader.inputs, self.arena.block
        i = task.done
        while budget > 0 and i < len(inputs):
            ids = inputs[i]
            if i == task.begun:
                need = _blocks(len(ids), block)
                if task.held + need > task.reserved:
                    break
                task.held += need
                task.begun += 1
            start = task.computed[i]
            chunk = ids[start : start + budget]
            rows.append(StepRow(task.tables[i], task.owners[i], chunk, start, False,
                                every=True))
            owners.append(task)
            budget -= len(chunk)
            if start + len(chunk) < len(ids):
                break  # this input goes on in the next step
            i += 1
        return budget

    def _absorb_reading(self, task: _Reading, row: Any, hidden: Any) -> None:
        if task.future.done():  # failed earlier in this step
            return
        i = task.owners.index(row.owner)
        ids = task.reader.inputs[i]
        try:  # a reader's fault fails its own request, never the step
            task.reader.take(i, row.start, hidden)
            task.computed[i] += len(row.tokens)
            if task.computed[i] == len(ids):
                self.arena.release(task.tables[i])
                task.held -= _blocks(len(ids), self.arena.block)
                task.done = i + 1
                if task.done == len(task.reader.inputs):
                    self._end_reading(task, result=task.reader.result())
        except Exception as exc:
            log.error("reading failed", exc_info=True)
            self._end_reading(task, exc)

    def _end_reading(self, task: _Reading, error: BaseException | None = None,
                     result: Any = None) -> None:
        """Retire a reading: free its rows and hand its result (or error) to the caller."""
        if task in self._readings:
            self._readings.remove(task)
            self._reserved -= task.reserved
            self._generation_reserved -= task.reserved
            self._release(*task.tables)
        _resolve(task.future, error, lambda: result)

    def _release(self, *tables: list[int]) -> None:
        for table in tables:
            if table:
                self.arena.release(table)

    def _advance(self, seq: _Sequence, logits: Any) -> None:
        """Draw the next token, emit its text, and retire the sequence when it is done."""
        history, matcher = seq.history, seq.matcher
        try:
            mask = None if matcher is None else matcher.allowed_mask(logits.numel(), logits.device)
        except GrammarError as exc:  # the mask allows nothing: a loud stop, never a guess
            self._finish(seq, "error", exc)
            return
        draw = sample(logits, seq.params, history.output_counts, history.context_ids,
                      seq.generator, mask)
        seq.completion_tokens += 1  # usage counts the EOS too, as the reference does
        if seq.stream.first_token_at is None:
            seq.stream.first_token_at = time.monotonic()
        if draw.token in self.eos and (matcher is not None or not seq.params.ignore_eos):
            self._release_text(seq)
            self._finish(seq, "stop")
            return
        seq.generated.append(draw.token)
        history.add(draw.token)
        if matcher is not None:
            try:  # the mask allowed it; the parser may still meet a limit (its row size)
                matcher.accept(draw.token)
            except GrammarError as exc:  # this sequence's grammar fault: it ends alone
                self._finish(seq, "error", exc)
                return
        info: tuple[TokenInfo, ...] = ()
        if seq.params.logprobs is not None:
            decode = self.backend.decode
            info = (TokenInfo(draw.token, decode([draw.token]), draw.logprob,
                              tuple((decode([t]), lp) for t, lp in draw.top)),)
        text, stopped = seq.stop.push(seq.detok.push(draw.token))
        if text or info:
            seq.stream.push(Delta(text, info))
        if stopped:
            self._finish(seq, "stop")
        elif ((seq.until is not None and seq.until(seq.generated))  # the caller's end
              or (matcher is not None and matcher.done)):  # complete: nothing may follow
            self._release_text(seq)
            self._finish(seq, "stop")
        elif len(seq.generated) >= seq.max_tokens:
            self._release_text(seq)
            self._finish(seq, "length")

    @staticmethod
    def _release_text(seq: _Sequence) -> None:
        """At the end, the text held back (a partial character, a possible stop string)."""
        text, stopped = seq.stop.push(seq.detok.flush())
        if not stopped:
            text += seq.stop.flush()
        if text:
            seq.stream.push(Delta(text))

    def _finish(self, seq: _Sequence, reason: str, error: BaseException | None = None) -> None:
        """Retire ``seq`` (on the loop thread, which alone owns the arena): free its rows and
        send its Finish."""
        if seq in self._active:
            self._active.remove(seq)
            self._reserved -= seq.reserved
            self._generation_reserved -= seq.reserved
            if seq.request is not None:
                seq.request.active -= 1
                seq.request.rows -= seq.reserved
            self.arena.release(seq.table)
        seq.stream.push(Finish(reason, len(seq.prompt), seq.completion_tokens, seq.cached,
                               error, tuple(seq.generated)))
