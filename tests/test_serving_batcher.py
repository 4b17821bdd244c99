"""The continuous batcher alone, with fake engines: which jobs the idle worker takes together
(budget, keys, arrival order), jobs joining a running search, each job answered when its own
sentences are done, the bounded queue, cancellation, errors, stop."""

from __future__ import annotations

import os
import threading

import pytest

from aiayn.decoding.common import source_batch
from aiayn.serving.batcher import (
    Batcher,
    Job,
    QueueFull,
    ShuttingDown,
    batch_cost,
    in_passing_thread,
)

from helpers import wait_until


class FakeEngine:
    """A decoding engine's shape (`SearchEngine`): a sentence joins at the next step (room for
    `room` live sentences) and finishes after as many steps as it has tokens, its result the
    engine's key and the sentence reversed. Records the live sentences of every step; with
    `gate`, its first step waits until the test sets it; with `fail`, its first step raises."""

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


def test_batch_cost_counts_the_source_positions_decoding_holds():
    for n, longest in ((3, 7), (1, 1), (2, 16), (5, 17), (4, 40)):
        src, _ = source_batch([[5] * (longest - 1)] + [[6]] * (n - 1))  # longest counts its EOS
        assert batch_cost(n, longest) == src.numel()  # sentences x the padded width
    assert batch_cost(3, 7) == 3 * 16 and batch_cost(2, 17) == 2 * 32


def test_next_batch_takes_same_key_jobs_in_order_within_the_budget():
    b = Batcher(Engines(), batch_tokens=50, max_wait=0.0)
    j1 = b.submit("k", [[1, 2, 3]])  # longest 4 (EOS counted), 16 positions padded
    j2 = b.submit("other", [[5]])
    j3 = b.submit("k", [[4], [5, 6]])  # 3 sentences x 16 = 48 <= 50
    j4 = b.submit("k", [[1, 2, 3, 4, 5]])  # 4 sentences x 16 = 64 > 50: left for later
    j5 = b.submit("k", [[7]])  # would fit, but the batch is full in arrival order
    assert b.pending == 6
    assert b.next_batch() == [j1, j3]
    assert b.pending == 3
    assert b.next_batch() == [j2]  # the oldest job's key goes first
    assert b.next_batch() == [j4, j5]
    assert b.pending == 0


def test_after_a_step_that_answered_several_requests_the_next_waits_for_their_return():
    b = Batcher(Engines(), batch_tokens=100, max_wait=0.5)
    waiting = b.submit("k", [[2]])
    b.admit([Job("k", [[1]])])
    b.step()  # a step that answered one request
    assert b.deadline() == waiting.enqueued + 0.5  # nobody to wait for
    b.admit([Job("k", [[3]]), Job("k", [[4]])])
    b.step()  # a step that answered two
    assert waiting.enqueued < b._last_end
    assert b.deadline() == b._last_end + 0.5  # they get max_wait to come back and join


def test_a_job_over_the_budget_runs_alone():
    b = Batcher(Engines(), batch_tokens=4, max_wait=0.0)
    big = b.submit("k", [[1, 2, 3], [4, 5, 6]])  # cost 2 x 16 = 32 > 4
    small = b.submit("k", [[1]])
    assert b.next_batch() == [big]
    assert b.next_batch() == [small]


def test_each_job_is_answered_the_step_its_last_sentence_finishes():
    engines = Engines()
    b = Batcher(engines, batch_tokens=100, max_wait=0.0)
    j1 = b.submit("k", [[1, 2], [3]])  # done after 2 steps
    j2 = b.submit("k", [[4, 5, 6]])  # after 3
    j3 = b.submit("other", [[7]])
    b.admit(b.next_batch())  # the idle worker takes the oldest key's jobs within the budget
    assert b.pending == 1
    b.step()
    assert not j1.future.done() and not j2.future.done()
    b.admit(b.joining())  # the other key's job joins its own engine at the next step
    b.step()
    assert j1.future.result(0) == [("k", [2, 1]), ("k", [3])] and not j2.future.done()
    assert j3.future.result(0) == [("other", [7])]
    b.step()
    assert j2.future.result(0) == [("k", [6, 5, 4])] and not b.busy
    assert engines.made["k"].steps == [3, 2, 1]  # sentences live at each step


def test_worker_lets_what_arrived_meanwhile_join_the_running_search():
    gate = threading.Event()
    engines = Engines(gate=gate)
    b = Batcher(engines, batch_tokens=1000, max_wait=0.0)
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


def test_a_key_whose_engine_has_sentences_waiting_for_room_keeps_its_jobs_queued():
    engines = Engines(room=1)
    b = Batcher(engines, max_wait=0.0)
    b.submit("k", [[1, 2]])
    b.submit("k", [[3]])
    b.admit(b.next_batch())  # both jobs go into the engine ...
    b.step()  # ... which has room for one sentence: the other waits inside it
    later = b.submit("k", [[4]])
    assert b.joining() == [] and b.pending == 1
    run_until_idle(b)
    assert b.joining() == [later]


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
    assert b.next_batch()[0] is j2  # the cancelled job never reaches the model


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
