"""`GET /metrics`: the server's counters in the Prometheus text format (prometheus_client), on a
registry of the app's own, so that several apps in one process (tests) keep separate counts."""

from __future__ import annotations

from typing import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from aiayn.serving.batcher import BatchStats

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics:
    """requests by path and status code, errors by reason, translate latency, the sentences and
    requests of each decoding step and its duration (the `batch` names are kept from when a
    batch ran whole), sentences translated, and the queue's length."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self, queue_length: Callable[[], float]):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("aiayn_http_requests", "HTTP requests answered, by path and status",
                                ["path", "code"], registry=r)
        self.errors = Counter("aiayn_http_errors", "requests refused or failed, by "
                              "reason", ["reason"], registry=r)
        self.latency = Histogram("aiayn_translate_latency_seconds", "arrival to answer of a "
                                 "successful translate request", buckets=LATENCY_BUCKETS, registry=r)
        self.batch_sentences = Histogram("aiayn_batch_sentences", "sentences decoded per "
                                         "decoding step", buckets=BATCH_BUCKETS, registry=r)
        self.batch_requests = Histogram("aiayn_batch_requests", "requests decoded per decoding "
                                        "step", buckets=BATCH_BUCKETS, registry=r)
        self.batch_seconds = Histogram("aiayn_batch_seconds", "model time per decoding step",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.sentences = Counter("aiayn_sentences_translated", "sentences translated", registry=r)
        self.queue = Gauge("aiayn_queue_sentences", "sentences waiting for the model", registry=r)
        self.queue.set_function(queue_length)

    def observe_batch(self, stats: BatchStats) -> None:
        self.batch_sentences.observe(stats.sentences)
        self.batch_requests.observe(stats.jobs)
        self.batch_seconds.observe(stats.seconds)
        self.sentences.inc(stats.finished)

    def render(self) -> bytes:
        return generate_latest(self.registry)
