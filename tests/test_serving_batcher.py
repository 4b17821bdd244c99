"""The dynamic batcher alone, with a recording search: which jobs share a batch (budget, keys,
arrival order), results back to the right job, the bounded queue, cancellation, errors, stop."""

from __future__ import annotations

import threading

import pytest

from aiayn.serving.batcher import Batcher, Job, QueueFull, ShuttingDown, batch_cost


class Recorder:
    """search(key, sources) -> each source reversed, tagged with the key; records every call.
    With `gate`, the first call waits until the test sets it."""

    def __init__(self, gate: threading.Event | None = None):
        self.calls: list[tuple[object, list[list[int]]]] = []
        self.gate = gate
        self.entered = threading.Event()

    def __call__(self, key, sources):
        self.calls.append((key, [list(s) for s in sources]))
        self.entered.set()
        if self.gate is not None and len(self.calls) == 1:
            assert self.gate.wait(30)
        return [(key, list(reversed(s))) for s in sources]


def test_batch_cost_is_sentences_times_longest():
    assert batch_cost(3, 7) == 21


def test_next_batch_takes_same_key_jobs_in_order_within_the_budget():
    b = Batcher(Recorder(), batch_tokens=20, max_wait=0.0)
    j1 = b.submit("k", [[1, 2, 3]])  # longest 4 (EOS counted)
    j2 = b.submit("other", [[5]])
    j3 = b.submit("k", [[4], [5, 6]])  # 3 sentences x 4 = 12 <= 20
    j4 = b.submit("k", [[1, 2, 3, 4, 5]])  # 4 sentences x 6 = 24 > 20: left for later
    j5 = b.submit("k", [[7]])  # would fit, but the batch is full in arrival order
    assert b.pending == 6
    assert b.next_batch() == [j1, j3]
    assert b.pending == 3
    assert b.next_batch() == [j2]  # the oldest job's key goes first
    assert b.next_batch() == [j4, j5]
    assert b.pending == 0


def test_after_a_batch_of_several_requests_the_next_waits_for_their_return():
    b = Batcher(Recorder(), batch_tokens=100, max_wait=0.5)
    waiting = b.submit("k", [[2]])
    b.run_batch([Job("k", [[1]])])  # a batch that answered one request
    assert b.deadline() == waiting.enqueued + 0.5  # nobody to wait for
    b.run_batch([Job("k", [[3]]), Job("k", [[4]])])  # a batch that answered two
    assert waiting.enqueued < b._last_end
    assert b.deadline() == b._last_end + 0.5  # they get max_wait to come back and join


def test_a_job_over_the_budget_runs_alone():
    b = Batcher(Recorder(), batch_tokens=4, max_wait=0.0)
    big = b.submit("k", [[1, 2, 3], [4, 5, 6]])  # cost 8 > 4
    small = b.submit("k", [[1]])
    assert b.next_batch() == [big]
    assert b.next_batch() == [small]


def test_run_batch_gives_each_job_its_own_results_from_one_search():
    rec = Recorder()
    b = Batcher(rec, batch_tokens=100, max_wait=0.0)
    j1 = b.submit("k", [[1, 2], [3]])
    j2 = b.submit("k", [[4, 5, 6]])
    b.run_batch(b.next_batch())
    assert len(rec.calls) == 1 and rec.calls[0] == ("k", [[1, 2], [3], [4, 5, 6]])
    assert j1.future.result(0) == [("k", [2, 1]), ("k", [3])]
    assert j2.future.result(0) == [("k", [6, 5, 4])]


def test_worker_gathers_what_arrived_while_it_was_busy():
    gate = threading.Event()
    rec = Recorder(gate)
    b = Batcher(rec, batch_tokens=1000, max_wait=0.0)
    b.start()
    try:
        first = b.submit("k", [[1]])
        assert rec.entered.wait(30)  # the worker is inside the first search, held by the gate
        rest = [b.submit("k", [[i, i + 1]]) for i in range(2, 8)]
        gate.set()
        assert first.future.result(30) == [("k", [1])]
        for i, job in zip(range(2, 8), rest):
            assert job.future.result(30) == [("k", [i + 1, i])]
        # Two searches: the first request alone, then the six that waited, together.
        assert [len(sources) for _, sources in rec.calls] == [1, 6]
    finally:
        b.stop()


def test_queue_is_bounded_in_sentences_and_cancel_frees_a_place():
    b = Batcher(Recorder(), max_queue=3, max_wait=0.0)
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
    b = Batcher(Recorder(), max_queue=2)
    b.submit("k", [[1], [2], [3]])
    assert b.pending == 3


def test_a_failing_search_fails_its_jobs_and_the_worker_goes_on():
    calls = []

    def search(key, sources):
        calls.append(sources)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return sources

    b = Batcher(search, max_wait=0.0)
    b.start()
    try:
        bad = b.submit("k", [[1]])
        with pytest.raises(RuntimeError, match="boom"):
            bad.future.result(30)
        assert b.submit("k", [[2]]).future.result(30) == [[2]]
    finally:
        b.stop()


def test_stop_fails_waiting_jobs_and_refuses_new_ones():
    gate = threading.Event()
    rec = Recorder(gate)
    b = Batcher(rec, max_wait=0.0)
    b.start()
    running = b.submit("k", [[1]])
    assert rec.entered.wait(30)
    waiting = b.submit("other", [[2]])
    stopper = threading.Thread(target=b.stop)
    stopper.start()
    with pytest.raises(ShuttingDown):
        waiting.future.result(30)
    gate.set()
    stopper.join(30)
    assert running.future.result(0) == [("k", [1])]  # the running batch finished
    with pytest.raises(ShuttingDown):
        b.submit("k", [[3]])
