"""Dynamic batching: requests that arrive together share one beam search, run by one worker thread.

Why a hand-written batcher: the serving libraries of the field that batch (Triton, TorchServe,
Ray Serve) are servers of their own; inside one uvicorn process the job is a queue and a thread.

- `Batcher.submit(key, sources)` queues a job (one request's sentences, as token ids) and returns
  a `concurrent.futures.Future` at once; the event loop awaits it (`asyncio.wrap_future`) and so
  never blocks on the model.
- The worker thread takes the oldest job, then every other queued job with the same `key` (search
  settings) in arrival order while the batch cost, sentences x longest source, stays within the
  token budget; it starts as soon as the budget is full, or `max_wait` seconds after the oldest
  job arrived. While the model is busy, new jobs gather, so under load batches fill without
  waiting. After a batch that answered several requests, the next one also waits until
  `max_wait` after it ended: clients that send their next request as soon as they have an answer
  (a closed loop) then join the others instead of settling into two groups that take turns, each
  in half-full batches. A lone client waits no longer than before (its next request arrives after
  the batch ended anyway). One call of `search(key, sources)` runs the whole batch; results go
  back per job.
- The queue is bounded in sentences: `submit` raises `QueueFull` rather than queueing more.
  `cancel(job)` (a client that went away, a timeout) removes a waiting job at once, freeing its
  place; a job already running finishes and its result is dropped.

Batching never changes a sentence's result as long as `search` does not: `aiayn translate`
batches the same way (tested: batched = one sentence at a time).
"""

from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Sequence


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

    @property
    def longest(self) -> int:
        """The longest source with its EOS: the batch cost's length term."""
        return max((len(s) for s in self.sources), default=0) + 1


def batch_cost(n_sentences: int, longest: int) -> int:
    """Sentences x longest source (EOS included), the `--batch-tokens` measure of a batch."""
    return n_sentences * longest


@dataclass(frozen=True)
class BatchStats:
    sentences: int
    jobs: int
    seconds: float


class Batcher:
    """One worker thread running `search(key, sources) -> per-source results` on gathered jobs.

    batch_tokens: the cost budget of one batch (a single job over it runs alone);
    max_wait: seconds the oldest waiting job may wait for company; max_queue: sentences waiting;
    on_batch: called by the worker after each batch (metrics)."""

    def __init__(self, search: Callable[[Hashable, list[list[int]]], Sequence[Any]], *,
                 batch_tokens: int = 4000, max_wait: float = 0.01, max_queue: int = 1024,
                 on_batch: Callable[[BatchStats], None] | None = None):
        self.search = search
        self.batch_tokens = batch_tokens
        self.max_wait = max_wait
        self.max_queue = max_queue
        self.on_batch = on_batch
        self._queue: collections.deque[Job] = collections.deque()
        self._pending = 0  # sentences in the queue
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._last_end = float("-inf")  # when the previous batch ended (worker thread only)
        self._last_jobs = 0  # how many requests it answered

    # --- the event loop's side -----------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Sentences waiting for the model (not counting the batch running now)."""
        return self._pending

    def submit(self, key: Hashable, sources: Sequence[Sequence[int]]) -> Job:
        job = Job(key, [list(s) for s in sources])
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
        """Finish the running batch, fail every waiting job with `ShuttingDown`, end the thread."""
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
    def _pick(self, key: Hashable) -> tuple[list[Job], bool]:
        """Jobs with `key`, oldest first, within the budget (the oldest always); and whether the
        batch is full (a job with `key` was left out for lack of room)."""
        picked: list[Job] = []
        n = longest = 0
        for job in self._queue:
            if job.key != key:
                continue
            m, l = n + len(job.sources), max(longest, job.longest)
            if picked and batch_cost(m, l) > self.batch_tokens:
                return picked, True
            picked.append(job)
            n, longest = m, l
        return picked, False

    def deadline(self) -> float:
        """When the next batch starts at the latest, unless its budget fills first: `max_wait`
        after the oldest waiting job arrived or, after a batch of several requests, after that
        batch ended, whichever is later. Call with the queue non-empty, holding the lock."""
        start = self._queue[0].enqueued
        if self._last_jobs > 1:
            start = max(start, self._last_end)
        return start + self.max_wait

    def next_batch(self) -> list[Job]:
        """Block until a batch is ready and take it off the queue ([] once stopping)."""
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            while not self._stopping:
                key, deadline = self._queue[0].key, self.deadline()
                picked, full = self._pick(key)
                now = time.monotonic()
                if full or now >= deadline:
                    break
                self._cond.wait(deadline - now)
                if not self._queue:  # every waiting job was cancelled
                    while not self._queue and not self._stopping:
                        self._cond.wait()
            if self._stopping:
                return []
            for job in picked:
                self._queue.remove(job)
                self._pending -= len(job.sources)
            return picked

    def run_batch(self, jobs: list[Job]) -> None:
        """Search every sentence of the jobs in one call and hand each job its results."""
        jobs = [j for j in jobs if j.future.set_running_or_notify_cancel()]
        if not jobs:
            return
        sources = [s for j in jobs for s in j.sources]
        start = time.perf_counter()
        try:
            results = list(self.search(jobs[0].key, sources))
        except BaseException as e:  # the requests get the error; the worker lives on
            for job in jobs:
                job.future.set_exception(e)
            return
        seconds = time.perf_counter() - start
        self._last_end, self._last_jobs = time.monotonic(), len(jobs)
        if self.on_batch is not None:  # before the answers: metrics read after one must count it
            self.on_batch(BatchStats(len(sources), len(jobs), seconds))
        at = 0
        for job in jobs:
            job.future.set_result(results[at: at + len(job.sources)])
            at += len(job.sources)

    def _run(self) -> None:
        while True:
            jobs = self.next_batch()
            if not jobs:
                return
            self.run_batch(jobs)
