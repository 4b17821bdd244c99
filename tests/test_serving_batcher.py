"""The continuous batcher alone, with fake engines: which jobs it hands each engine (what the
engine admits, keys, arrival order) and when an idle worker starts, jobs joining a running
search, each job answered when its own sentences are done, the bounded queue, cancellation,
errors, stop. Who joins a real search is the engine's rule (tests/test_decoding_engine.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from aiayn.serving.batcher import Batcher, Job, QueueFull, ShuttingDown, in_passing_thread

from helpers import wait_until


class FakeEngine:
    """A decoding engine's shape (`SearchEngine`): a sentence joins at the next step (room for
    `room` live sentences; `joinable` admits whole requests by that room, the first one always
    into an empty engine, none while sentences it was given wait) and finishes after as many
    steps as it has tokens, its result the engine's key and the sentence reversed. Records the
    live sentences of every step; with `gate`, its first step waits until the test sets it;
    with `fail`, its first step raises."""

    def __init__(self, key, gate: threading.Event | None = None, room: int = 1000,
                 fail: bool = False):
        self.key, self.gate, self.room, self.fail = key, gate, room, fail
        self.waiting: list = []
        self.live: dict = {}  # key -> [steps left, ids]
        self.steps: list[int] = []
        self.entered = threading.Event()

    def submit(self, key, ids):
        self.waiting.append((key, list(ids)))

    @property
    def busy(self):
        return bool(self.waiting or self.live)

    def joinable(self, groups):
        if self.waiting:
            return 0
        n = take = 0
        for group in groups:
            if len(self.live) + n and len(self.live) + n + len(group) > self.room:
                break
            n, take = n + len(group), take + 1
        return take

    def step(self):
        self.entered.set()
        if self.gate is not None and not self.steps:
            assert self.gate.wait(30)
        if self.fail and not self.steps:
            self.steps.append(0)
            raise RuntimeError("boom")
        while self.waiting and len(self.live) < self.room:
            key, ids = self.waiting.pop(0)
            self.live[key] = [len(ids), ids]
        self.steps.append(len(self.live))
        done = []
        for key in list(self.live):
            self.live[key][0] -= 1
            if not self.live[key][0]:
                done.append((key, (self.key, list(reversed(self.live.pop(key)[1])))))
        return done


class Engines:
    """The batcher's engine factory: makes and keeps a `FakeEngine` per key."""

    def __init__(self, **kwargs):
        self.kwargs, self.made = kwargs, {}

    def __call__(self, key):
        self.made[key] = FakeEngine(key, **self.kwargs)
        return self.made[key]


def run_until_idle(b: Batcher) -> None:
    while b.busy:
        b.step()


def test_hand_over_gives_each_engine_what_it_admits_in_arrival_order():
    engines = Engines(room=3)
    b = Batcher(engines, max_wait=0.0)
    j1 = b.submit("k", [[1, 2, 3]])
    j2 = b.submit("other", [[5]])
    j3 = b.submit("k", [[4], [5, 6]])  # 3 sentences: the room of k's engine
    j4 = b.submit("k", [[1, 2], [3]])  # 5 sentences > 3: left for later
    j5 = b.submit("k", [[7]])  # would fit, but the batch is full in arrival order
    assert b.pending == 7
    assert b.hand_over() == [j1, j3, j2]  # by key, each key's in arrival order
    assert b.pending == 3 and engines.made["k"].waiting == [((id(j1), 0), [1, 2, 3]),
                                                             ((id(j3), 0), [4]), ((id(j3), 1), [5, 6])]
    b.step()  # [4] is done: 2 sentences live, no room for j4's 2
    assert b.hand_over() == []  # its jobs wait here, counted
    assert b.pending == 3
    run_until_idle(b)
    assert b.hand_over() == [j4, j5] and b.pending == 0


def test_an_idle_worker_starts_when_the_engine_is_full_or_after_max_wait():
    b = Batcher(Engines(room=2), max_wait=60.0)
    b.submit("k", [[1]])
    b.submit("k", [[2], [3]])  # 3 sentences > room 2: start now, do not wait for company
    start = time.monotonic()
    assert b.wait_for_work() and time.monotonic() - start < 30
    b = Batcher(Engines(room=2), max_wait=0.05)
    job = b.submit("k", [[1]])  # room left: wait max_wait for others to join
    assert b.wait_for_work() and time.monotonic() >= job.enqueued + 0.05


def test_after_a_step_that_answered_several_requests_the_next_waits_for_their_return():
    b = Batcher(Engines(), max_wait=0.5)
    waiting = b.submit("k", [[2]])
    b.admit([Job("k", [[1]])])
    b.step()  # a step that answered one request
    assert b.deadline() == waiting.enqueued + 0.5  # nobody to wait for
    b.admit([Job("k", [[3]]), Job("k", [[4]])])
    b.step()  # a step that answered two
    assert waiting.enqueued < b._last_end
    assert b.deadline() == b._last_end + 0.5  # they get max_wait to come back and join


def test_a_job_over_the_room_goes_alone_into_an_idle_engine():
    engines = Engines(room=1)
    b = Batcher(engines, max_wait=0.0)
    big = b.submit("k", [[1, 2], [4, 5]])  # 2 sentences > room 1
    small = b.submit("k", [[1]])
    assert b.hand_over() == [big]
    b.step()  # one of big's sentences decodes, the other waits inside the engine ...
    assert b.hand_over() == [] and b.pending == 1  # ... so nothing more is handed over
    run_until_idle(b)
    assert big.future.result(0) == [("k", [2, 1]), ("k", [5, 4])]
    assert b.hand_over() == [small]


def test_each_job_is_answered_the_step_its_last_sentence_finishes():
    engines = Engines()
    b = Batcher(engines, max_wait=0.0)
    j1 = b.submit("k", [[1, 2], [3]])  # done after 2 steps
    j2 = b.submit("k", [[4, 5, 6]])  # after 3
    j3 = b.submit("other", [[7]])  # after 1, in its own engine
    assert b.hand_over() == [j1, j2, j3] and b.pending == 0
    b.step()
    assert not j1.future.done() and not j2.future.done()
    assert j3.future.result(0) == [("other", [7])]
    b.step()
    assert j1.future.result(0) == [("k", [2, 1]), ("k", [3])] and not j2.future.done()
    b.step()
    assert j2.future.result(0) == [("k", [6, 5, 4])] and not b.busy
    assert engines.made["k"].steps == [3, 2, 1]  # sentences live at each step


def test_worker_lets_what_arrived_meanwhile_join_the_running_search():
    gate = threading.Event()
    engines = Engines(gate=gate)
    b = Batcher(engines, max_wait=0.0)
    b.start()
    try:
        first = b.submit("k", [[1, 2, 3, 4]])
        wait_until(lambda: "k" in engines.made and engines.made["k"].entered.is_set())
        rest = [b.submit("k", [[i, i + 1]]) for i in range(2, 8)]  # while the step is held
        gate.set()
        assert first.future.result(30) == [("k", [4, 3, 2, 1])]
        for i, job in zip(range(2, 8), rest):
            assert job.future.result(30) == [("k", [i + 1, i])]
        # the first sentence alone, then the six joined it at the next step
        assert engines.made["k"].steps[:3] == [1, 7, 7] and len(engines.made) == 1
    finally:
        b.stop()


def test_jobs_the_engine_has_no_room_for_stay_queued_and_cancellable():
    b = Batcher(Engines(room=1), max_wait=0.0)
    j1 = b.submit("k", [[1, 2]])
    j2 = b.submit("k", [[3]])
    assert b.hand_over() == [j1] and b.pending == 1  # the engine has room for one sentence
    b.step()
    assert b.hand_over() == [] and b.pending == 1  # j1 still decodes: j2 waits in the queue ...
    assert b.cancel(j2) and j2.future.cancelled() and b.pending == 0  # ... and can leave it
    later = b.submit("k", [[4]])
    run_until_idle(b)
    assert b.hand_over() == [later]


def test_queue_is_bounded_in_sentences_and_cancel_frees_a_place():
    b = Batcher(Engines(), max_queue=3, max_wait=0.0)
    j1 = b.submit("k", [[1], [2]])
    with pytest.raises(QueueFull):
        b.submit("k", [[3], [4]])
    j2 = b.submit("k", [[3]])
    assert b.pending == 3
    assert b.cancel(j1) and j1.future.cancelled()
    assert b.pending == 1
    b.submit("k", [[5], [6]])  # the cancelled job's place is free again
    assert not b.cancel(j1)  # already gone
    assert b.hand_over()[0] is j2  # the cancelled job never reaches the model


def test_an_empty_queue_takes_even_an_oversized_job():
    b = Batcher(Engines(), max_queue=2)
    b.submit("k", [[1], [2], [3]])
    assert b.pending == 3


def test_a_failing_engine_fails_its_jobs_and_the_worker_goes_on_with_a_fresh_one():
    made = []

    def engine(key):
        made.append(FakeEngine(key, fail=not made))  # the first one fails
        return made[-1]

    b = Batcher(engine, max_wait=0.0)
    b.start()
    try:
        bad = b.submit("k", [[1]])
        with pytest.raises(RuntimeError, match="boom"):
            bad.future.result(30)
        assert b.submit("k", [[2]]).future.result(30) == [("k", [2])]
        assert len(made) == 2
    finally:
        b.stop()


def test_stop_fails_waiting_jobs_and_refuses_new_ones():
    gate = threading.Event()
    engines = Engines(gate=gate)
    b = Batcher(engines, max_wait=0.0)
    b.start()
    running = b.submit("k", [[1]])
    wait_until(lambda: "k" in engines.made and engines.made["k"].entered.is_set())
    waiting = b.submit("other", [[2]])
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    with pytest.raises(ShuttingDown):
        waiting.future.result(30)
    gate.set()
    stopper.join(30)
    assert running.future.result(0) == [("k", [1])]  # the job in the engine finished
    with pytest.raises(ShuttingDown):
        b.submit("k", [[3]])


# --- loading the model off the main thread ----------------------------------------------------------
def _thread_ids() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def test_in_passing_thread_returns_what_fn_returns_from_another_thread_that_has_ended():
    seen = []
    out = in_passing_thread(lambda: seen.append(threading.current_thread()) or 42)
    assert out == 42
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()


def test_in_passing_thread_raises_fns_exception_here():
    def fail():
        raise ValueError("no int8 path")

    with pytest.raises(ValueError, match="no int8 path"):
        in_passing_thread(fail)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_torchs_worker_threads_leave_with_the_passing_thread():
    """What `aiayn serve` relies on: the OpenMP pool that parallel work on the passing thread
    creates is gone once it returns, so the model worker's pool is the only one. (Threads are
    told apart by their ids, so others starting or ending meanwhile do not matter.)"""
    import torch

    threads_before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _thread_ids()

        def parallel_work() -> set[str]:
            torch.ones(1 << 22).mul_(2.0)  # far above torch's grain: runs on 2 threads
            return _thread_ids()

        new = in_passing_thread(parallel_work) - before
        assert len(new) >= 2  # the passing thread and its pool's worker
        wait_until(lambda: not new & _thread_ids(), timeout=10, what="the pool's threads to end")
    finally:
        torch.set_num_threads(threads_before)
