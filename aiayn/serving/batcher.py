"""Continuous batching: requests share one running beam search, joining it at any step and
leaving as soon as their sentences are done; one worker thread runs the model.

Why a hand-written batcher: the serving libraries of the field that batch (Triton, TorchServe,
Ray Serve) are servers of their own; inside one uvicorn process the job is a queue and a thread.

- `Batcher.submit(key, sources)` queues a job (one request's sentences, as token ids) and returns
  a `concurrent.futures.Future` at once; the event loop awaits it (`asyncio.wrap_future`) and so
  never blocks on the model.
- The worker keeps one decoding engine per `key` (search settings; `engine(key)`, an
  `aiayn.decoding.engine.SearchEngine` in the server), and steps every engine that has work,
  one decoding step each in turn. Before each step it hands every engine the queued jobs of its
  key that would join its search at that step, in arrival order: the engine decides which
  (`SearchEngine.joinable`: its room, `--batch-tokens`, and its join rule,
  aiayn/decoding/engine.py), and nothing else here does. The others stay in the queue, counted
  and cancellable, until the engine has room for them. Each job is answered the step its last
  sentence finishes, without waiting for the rest of the batch.
- When nothing is being decoded the worker waits before it starts: until the oldest job's
  engine would be full with the jobs of its key that wait (one of them would not join), or
  `max_wait` seconds after the oldest job arrived. After a step that finished several requests,
  it also waits until `max_wait` after that: clients that send their next request as soon as
  they have an answer (a closed loop) then join the others instead of settling into groups that
  take turns.
- A glossary: a job submitted with `phrases` (one list per sentence, the target phrases its
  translation must contain) hands each sentence's to its engine's `submit`, a lexically
  constrained engine's (the server gives such jobs a key of their own, `SearchKey.glossary`).
- Streaming: a job submitted with `on_prefix` is told, after each step, the settled prefix of
  each of its sentences (pieces every hypothesis still in contention shares, so its final
  translation starts with them: `SearchEngine.settled`) whenever it has grown, and a sentence's
  whole best translation when it finishes before the job does. The worker calls `on_prefix`;
  it must return at once (the server only schedules the event on its loop).
- The queue is bounded in sentences: `submit` raises `QueueFull` rather than queueing more.
  `cancel(job)` (a client that went away, a timeout) removes a waiting job at once, freeing its
  place; a job already in an engine finishes and its result is dropped.

Batching never changes a sentence's result as long as the engine does not: a sentence's
hypotheses do not depend on the others in its search (aiayn/decoding/engine.py, tested).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence, TypeVar

T = TypeVar("T")
log = logging.getLogger("aiayn.serve")
# Streaming: (sentence index in the job, its settled prefix in pieces), from the worker thread
PrefixCallback = Callable[[int, list], None]


def in_passing_thread(fn: Callable[[], T]) -> T:
    """fn() on a thread of its own that has ended when this returns: its result, or its exception
    raised here. The server loads its model this way, so that the model worker is the only
    thread that ever runs torch's parallel work.

    Why: torch's CPU threads are OpenMP's (GNU libgomp in the CPU wheels), which keeps a pool of
    workers for each thread that has run parallel work, for as long as that thread lives. Once
    the pools' threads outnumber the cores, libgomp stops letting idle workers spin, and every
    parallel region pays for waking one: a small LayerNorm on a worker thread took over ten times
    as long once the main thread had run parallel work too, and `aiayn serve` with 2 threads
    decoded at half its 1-thread speed that way (docs/experiments/decoding.md). The pool of a
    thread that has ended goes with it.
    """
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the caller, raised there
            out["error"] = e

    t = threading.Thread(target=run, name="aiayn-load", daemon=True)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


class QueueFull(Exception):
    """The queue cannot take the job now; try again later."""


class ShuttingDown(Exception):
    """The batcher stopped before the job ran."""


@dataclass(eq=False)
class Job:
    key: Hashable
    sources: list[list[int]]  # token ids per sentence, no specials
    future: Future = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)
    on_prefix: PrefixCallback | None = None  # streaming (module doc)
    phrases: list | None = None  # per sentence its target phrases, for a lexical engine


@dataclass(frozen=True)
class BatchStats:
    """One decoding step of one engine: the sentences and requests it decoded, how long it took,
    and how many sentences it finished."""

    sentences: int
    jobs: int
    seconds: float
    finished: int = 0


@dataclass(eq=False)
class _Running:
    """A job inside an engine: its results so far and how many are still missing."""

    job: Job
    results: list
    left: int
    shown: list[int] = field(default_factory=list)  # streaming: pieces told so far, per sentence

    def tell(self, i: int, tokens: list) -> None:
        """Hand sentence i's settled prefix to the job's `on_prefix` if it has grown."""
        if len(tokens) <= self.shown[i]:
            return
        self.shown[i] = len(tokens)
        try:
            self.job.on_prefix(i, tokens)
        except Exception:  # a client's callback never stops the worker
            log.exception("streaming callback failed")


class Batcher:
    """One worker thread stepping one engine per search key (`engine(key)`: an object with
    `submit(key, ids)` (`submit(key, ids, phrases)` for a job with phrases), `joinable(groups)
    -> int`, `step() -> [(key, result), ...]` and `busy`,
    as `aiayn.decoding.engine.SearchEngine`) over the jobs' sentences.

    max_wait: seconds the oldest waiting job may wait for company while nothing is decoded;
    max_queue: sentences waiting; on_batch: called by the worker after each step (metrics)."""

    def __init__(self, engine: Callable[[Hashable], Any], *, max_wait: float = 0.01,
                 max_queue: int = 1024, on_batch: Callable[[BatchStats], None] | None = None):
        self.engine_for = engine
        self.max_wait = max_wait
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._queue: collections.deque[Job] = collections.deque()
        self._pending = 0  # sentences in the queue
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._last_end = float("-inf")  # when the last step that answered requests ended
        self._last_jobs = 0  # how many requests it answered
        self._engines: dict[Hashable, Any] = {}  # worker thread only, as below
        self._running: dict[Hashable, dict[int, _Running]] = {}  # per key: id(job) -> its state

    # --- the event loop's side -----------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Sentences waiting for the model (not counting those in an engine)."""
        return self._pending

    def submit(self, key: Hashable, sources: Sequence[Sequence[int]],
               on_prefix: PrefixCallback | None = None,
               phrases: Sequence[Sequence[Sequence[int]]] | None = None) -> Job:
        """Queue a job; `on_prefix`: stream its settled prefixes; `phrases`: per sentence, the
        target phrases its translation must contain (module doc)."""
        if phrases is not None and len(phrases) != len(sources):
            raise ValueError(f"{len(phrases)} lists of phrases for {len(sources)} sentences")
        job = Job(key, [list(s) for s in sources], on_prefix=on_prefix,
                  phrases=None if phrases is None else [[list(p) for p in ps] for ps in phrases])
        with self._cond:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self._queue and self._pending + len(job.sources) > self.max_queue:
                raise QueueFull(f"{self._pending} sentences are waiting (limit {self.max_queue})")
            self._queue.append(job)
            self._pending += len(job.sources)
            self._cond.notify_all()
        return job

    def cancel(self, job: Job) -> bool:
        """Drop a job that has not started: True if it was still waiting (its place is free)."""
        with self._cond:
            try:
                self._queue.remove(job)
            except ValueError:
                return False
            self._pending -= len(job.sources)
            job.future.cancel()
            self._cond.notify_all()
            return True

    # --- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="aiayn-model-worker", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> None:
        """Finish the jobs in the engines, fail every waiting job with `ShuttingDown`, end the
        thread."""
        with self._cond:
            self._stopping = True
            left = list(self._queue)
            self._queue.clear()
            self._pending = 0
            self._cond.notify_all()
        for job in left:
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(ShuttingDown("the server is shutting down"))
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the worker's side -------------------------------------------------------------------------
    def _engine(self, key: Hashable) -> Any:
        """The engine of `key`, made when first needed (worker thread only)."""
        engine = self._engines.get(key)
        if engine is None:
            engine = self._engines[key] = self.engine_for(key)
            self._running[key] = {}
        return engine

    def deadline(self) -> float:
        """When an idle worker starts at the latest, unless the oldest job's engine is full
        first: `max_wait` after the oldest waiting job arrived or, after a step that answered
        several requests, after that step ended, whichever is later. Call with the queue
        non-empty, holding the lock."""
        start = self._queue[0].enqueued
        if self._last_jobs > 1:
            start = max(start, self._last_end)
        return start + self.max_wait

    def _full(self) -> bool:
        """Whether a queued job of the oldest job's key would not join its engine's search now
        (holding the lock, the queue non-empty)."""
        key = self._queue[0].key
        queued = [job.sources for job in self._queue if job.key == key]
        return self._engine(key).joinable(queued) < len(queued)

    def wait_for_work(self) -> bool:
        """What the worker does when no engine has work: block until jobs wait and should start
        (the oldest key's engine is full, or `deadline()` has passed); False once stopping."""
        with self._cond:
            while not self._stopping:
                if not self._queue:
                    self._cond.wait()
                    continue
                left = self.deadline() - time.monotonic()
                if left <= 0 or self._full():
                    return True
                self._cond.wait(left)
            return False

    def hand_over(self) -> list[Job]:
        """Give each engine the queued jobs of its key that its search lets join at its next
        step (`joinable`, in arrival order); the rest stay queued. Returns the jobs given (a job
        cancelled meanwhile is dropped)."""
        with self._cond:
            queued: dict[Hashable, list[Job]] = {}
            for job in self._queue:
                queued.setdefault(job.key, []).append(job)
            jobs: list[Job] = []
            for key, waiting in queued.items():
                n = self._engine(key).joinable([job.sources for job in waiting])
                jobs += self._take(waiting[:n])
        self.admit(jobs)
        return jobs

    def _take(self, jobs: list[Job]) -> list[Job]:
        for job in jobs:  # holding the lock
            self._queue.remove(job)
            self._pending -= len(job.sources)
        return jobs

    def admit(self, jobs: list[Job]) -> None:
        """Hand the jobs' sentences to their keys' engines (a job cancelled meanwhile is
        dropped)."""
        for job in jobs:
            if not job.future.set_running_or_notify_cancel():
                continue
            if not job.sources:
                job.future.set_result([])
                continue
            engine = self._engine(job.key)
            self._running[job.key][id(job)] = _Running(job, [None] * len(job.sources),
                                                       len(job.sources), [0] * len(job.sources))
            for i, ids in enumerate(job.sources):
                if job.phrases is None:
                    engine.submit((id(job), i), ids)
                else:
                    engine.submit((id(job), i), ids, job.phrases[i])

    @property
    def busy(self) -> bool:
        """Whether any engine has work (worker thread)."""
        return any(e.busy for e in self._engines.values())

    def step(self) -> None:
        """One step of every engine with work; each job whose last sentence finished gets its
        results. An engine that fails fails every job in it, and a fresh one takes its place."""
        answered = 0
        for key, engine in list(self._engines.items()):
            if not engine.busy:
                continue
            running = self._running[key]
            start = time.perf_counter()
            try:
                done = engine.step()
            except BaseException as e:  # the requests get the error; the worker lives on
                for r in running.values():
                    r.job.future.set_exception(e)
                del self._engines[key], self._running[key]
                continue
            seconds = time.perf_counter() - start
            finished = []
            for (job_id, i), result in done:
                r = running[job_id]
                r.results[i] = result
                r.left -= 1
                if not r.left:
                    finished.append(running.pop(job_id))
                elif r.job.on_prefix is not None and result:  # its best is settled whole
                    r.tell(i, list(result[0].tokens))
            self.stream(engine, running)
            if self.on_batch is not None:  # before the answers: metrics read after one must count it
                live = sum(len(r.job.sources) for r in running.values()) + sum(
                    len(r.job.sources) for r in finished)
                self.on_batch(BatchStats(live, len(running) + len(finished), seconds, len(done)))
            for r in finished:
                r.job.future.set_result(r.results)
            answered += len(finished)
        if answered:
            self._last_end, self._last_jobs = time.monotonic(), answered

    @staticmethod
    def stream(engine: Any, running: dict[int, _Running]) -> None:
        """Tell the streaming jobs still in `engine` the settled prefixes that grew this step
        (read only when one streams)."""
        if not any(r.job.on_prefix is not None for r in running.values()):
            return
        try:
            settled = engine.settled()
        except Exception:  # streaming is a courtesy: the search and its answers go on
            log.exception("reading the settled prefixes failed")
            return
        for (job_id, i), tokens in settled:
            r = running.get(job_id)
            if r is not None and r.job.on_prefix is not None:
                r.tell(i, tokens)

    def _run(self) -> None:
        while self.busy or self.wait_for_work():
            self.hand_over()
            self.step()
