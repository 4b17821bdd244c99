"""The server's limits and batching settings, in one validated dataclass (`aiayn serve` flags)."""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.decoding import MAX_BEAM_SIZE, ROOM_TOKENS


def decoding_threads(cores: int) -> int:
    """torch's threads in `aiayn serve` when `--threads` is not given: one core fewer than torch
    would take, at least one, so that the event loop (HTTP, JSON, tokenizing) keeps a core. On 2
    cores one thread and two were within about 10% of each other either way, many clients or one
    (docs/experiments/decoding.md), with the model loaded off the main thread
    (`aiayn.serving.batcher.in_passing_thread`)."""
    return max(1, cores - 1)


@dataclass(frozen=True)
class ServeSettings:
    """What one `aiayn serve` process accepts and how it batches.

    Batching: concurrent requests with the same search settings share one beam search, whose
    room, sentences x longest source (EOS and padding included, as `aiayn translate
    --batch-tokens` counts it), is `batch_tokens` (the decoding engine's, which decides who
    joins); when nothing is being decoded the worker waits at most `max_wait_ms` after the
    oldest waiting request arrived before it starts a search with room to spare.
    Limits: `max_chars` characters and `max_sentences` texts per request (answered 413 above);
    `max_queue` sentences waiting for the model (a request that would exceed it is answered 503
    with Retry-After); `timeout_s` seconds from arrival to answer (504 after); `max_beam` bounds a
    request's beam size, since beam search costs grow with it (at most `MAX_BEAM_SIZE`, every
    search's bound); `header_timeout_s` seconds for a request's line and headers to arrive, from
    its first byte (or from the connection's opening), after which the connection is closed
    (`aiayn.serving.http`): a client that sends its headers a byte at a time (slowloris) cannot
    hold a connection open for longer.
    """

    batch_tokens: int = ROOM_TOKENS
    max_wait_ms: float = 10.0
    max_chars: int = 5000
    max_sentences: int = 64
    max_queue: int = 1024
    timeout_s: float = 30.0
    max_beam: int = 8
    retry_after_s: int = 1
    header_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("batch_tokens", "max_chars", "max_sentences", "max_queue", "max_beam",
                     "retry_after_s"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_beam > MAX_BEAM_SIZE:  # what any search takes (aiayn/config.py, MAX_BEAM)
            raise ValueError(f"max_beam must be at most {MAX_BEAM_SIZE}, got {self.max_beam}")
        if self.max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must be >= 0, got {self.max_wait_ms}")
        for name in ("timeout_s", "header_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_queue < self.max_sentences:
            raise ValueError(f"max_queue ({self.max_queue}) must hold one full request "
                             f"(max_sentences {self.max_sentences})")

    @property
    def max_body_bytes(self) -> int:
        """The largest request body read: every character JSON-escaped as a surrogate pair
        (12 bytes), plus room for the other fields."""
        return 12 * self.max_chars + 64 * self.max_sentences + 4096
