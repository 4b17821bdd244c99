"""The decoding engine: sentences enter the search at any step and leave the step they finish.

The one way through decoding. `aiayn translate`, `aiayn parse`, `aiayn serve`, dev BLEU during
training and `Translator` all search here, with the same three parts:

- what to search: `SearchSettings` (aiayn/decoding/search.py), decided from the options and the
  model's config once, before the engine is built;
- who joins the search: `SearchEngine.joinable`, this module's one admission rule (room and join
  fraction, below); `aiayn serve`'s batcher asks it which requests to hand over;
- the loop that feeds it: `SearchEngine.run`, which `search_batched` and `Translator.stream`
  drive with their input (the server's worker steps its engines the same way, one per search
  setting, aiayn/serving/batcher.py).

Sentences wait in a queue, join the running `BeamSearch` as soon as there is room (encoded as
they join), and each is handed back the step it is done, so the batch stays full until the queue
runs dry instead of running down with its longest sentence before the next batch starts.

Room is measured as batching always has been here, sentences times their longest source, in
the positions decoding holds: the live sentences times the widest source any of their cohorts
holds (EOS included, padded as `source_batch` pads it, `source_width`; a cohort keeps its width
until its last sentence leaves) at most `batch_tokens`, and at most `batch_size` sentences when
given.
That bounds what decoding holds (the cache is k rows per live sentence, each at most its maximum
output length long) however many sentences wait: the memory of a search does not grow with its
input. Newcomers join in groups of at least half the sentences then live (one encoder call and
one cohort of the cache per group, `aiayn.model.cache.CacheCohorts`), or any number into an
empty search: under load a request joins once enough others wait or enough have finished.

A sentence's result does not depend on which others share its steps, nor on when it joined
(`BeamSearch`; tested against decoding each sentence alone, greedy and beam, n-best, fp32, bf16
and int8). Greedy search is a beam of one that stops at its first EOS: beam size 1, alpha 0 and
the "current" stopping rule (`SearchOptions(greedy=True)`) give exactly greedy search's
hypotheses (tested against an independent greedy loop, tests/helpers.py), from the same code as
every beam search.
"""

from __future__ import annotations

from collections import deque
from contextlib import nullcontext
from typing import Any, Callable, Hashable, Iterator, Sequence

import torch

from aiayn.decoding.beam import BeamSearch
from aiayn.decoding.common import (
    Hypothesis,
    StepConstraint,
    decoder_length_cap,
    first_parameter,
    model_device,
    source_batch,
    source_width,
)
from aiayn.decoding.search import SearchSettings
from aiayn.kernels.attention import decoding_kernels

# A constraint for the sentences joining now: (their keys, device) -> a `StepConstraint` with one
# row per sentence (e.g. `aiayn.parsing.constrain`'s tree constraint)
JoinConstraint = Callable[[Sequence[Hashable], torch.device], StepConstraint]

# The target phrases a sentence's translation must contain, each a list of piece ids
Phrases = Sequence[Sequence[int]]

# What waits for the engine: each item one request's (or one sentence's) sources, subword ids
Groups = Sequence[Sequence[Sequence[int]]]
# Hands the engine what input there is before a step (`SearchEngine.run`): called with True when
# the engine has nothing to decode (so it may wait for input), it submits what came and returns
# False once the input has ended
Feed = Callable[[bool], bool]

# Newcomers join once they are at least this fraction of the sentences that would then be live:
# each group that joins is a cohort of the cache, attended apart at every step, and on a 2-core
# CPU more, smaller cohorts cost more per step than the fuller batch saves (Multi30k test, the
# recipe's tiny model, fp32: 1/8 -> 7.2 cohorts a step, 1.3x the time of 1/2 -> 2.4 cohorts;
# docs/experiments/decoding.md)
JOIN_FRACTION = 1 / 2


class SearchEngine:
    """A queue of sentences in front of one `BeamSearch` over `model` (eval mode, on its device).

        engine = SearchEngine(model, settings)      # settings: `search.SearchSettings`
        engine.submit("a", [17, 42, 9])             # subword ids, no specials
        while engine.busy:
            for key, hyps in engine.step():          # as each sentence finishes
                ...

    or `engine.run(feed)` (below). `settings` also holds the room (`batch_tokens`,
    `batch_size`). `bf16`: run under bf16 autocast (a model whose weights are bf16 already runs
    as it is). `constraint` builds the step constraint of each group of sentences that joins.
    `lexical`: a lexically constrained search (aiayn/decoding/constraints.py), every sentence
    submitted with its target phrases (maybe none); without it the search is the paper's and
    `submit` takes no phrases. `continues` (V,) bool: the target pieces that continue a word,
    which may not follow a phrase (`Translator.word_continuations`)."""

    def __init__(self, model: Any, settings: SearchSettings, bf16: bool = False,
                 constraint: JoinConstraint | None = None, lexical: bool = False,
                 continues: torch.Tensor | None = None):
        self.model, self.settings, self.constraint = model, settings, constraint
        self.lexical = lexical
        self.search = BeamSearch(model, settings, continues)
        # a model whose weights are bf16 already runs as it is: autocast would re-cast fp32
        # weights at every step and run LayerNorm in fp32
        p = first_parameter(model)
        self.device = model_device(model)
        self.bf16 = bf16 and (p is None or p.dtype != torch.bfloat16)
        self.source_limit = decoder_length_cap(model)  # learned positions: pad no further
        self.waiting: deque[tuple[Hashable, Sequence[int]]] = deque()
        self.phrases: dict[Hashable, Phrases] = {}  # a lexical search's waiting sentences'
        self.blank: list[tuple[Hashable, list[Hypothesis]]] = []  # empty sources, answered next step
        self.peak_sentences = 0  # the most sentences live at once (the room's test reads it)

    def submit(self, key: Hashable, ids: Sequence[int], phrases: Phrases | None = None) -> None:
        """Queue one sentence (subword ids without specials), in a lexical engine with the
        target phrases (piece ids) its translation must contain. An empty one (a blank line)
        needs no model: the next `step` hands it back with one empty hypothesis of score 0."""
        if phrases is not None and not self.lexical:
            raise ValueError("phrases need a lexically constrained engine (lexical=True)")
        if len(ids):
            self.waiting.append((key, ids))
            if self.lexical:
                self.phrases[key] = [list(p) for p in phrases or ()]
        else:
            self.blank.append((key, [Hypothesis([], 0.0, 0.0)]))

    @property
    def busy(self) -> bool:
        """Sentences waiting or being decoded."""
        return bool(self.waiting) or bool(self.search.sentences) or bool(self.blank)

    @property
    def live(self) -> int:
        return self.search.sentences

    def joinable(self, groups: Groups) -> int:
        """How many of `groups` (each a request's sentences, subword ids), taken in order and
        whole, would join the search at the next step if submitted now: the admission rule
        (module doc), the one the engine applies to its own queue. The first group always
        joins an empty search (what does not fit of it waits in the engine); none joins while
        sentences the engine was given wait for room. `aiayn serve` hands over what this
        admits."""
        return 0 if self.waiting else self._fit(groups)

    def _fit(self, groups: Groups) -> int:
        live = self.search.sentences
        widest = max(self.search.src_widths, default=0)  # what the live cohorts hold
        room, most = self.settings.batch_tokens, self.settings.batch_size
        n = take = 0  # sentences and groups admitted
        for group in groups:
            s, m = widest, n
            for ids in group:
                if len(ids):  # a blank line needs no room (`submit`)
                    s, m = max(s, source_width(len(ids) + 1, limit=self.source_limit)), m + 1  # + EOS
            if live + n and ((live + m) * s > room or (most is not None and live + m > most)):
                break
            widest, n, take = s, m, take + 1
        if live and 0 < n < JOIN_FRACTION * (live + n):
            return 0
        return take

    def _join(self) -> None:
        """Move as many waiting sentences into the search as the admission rule lets in."""
        take = self._fit([[ids] for _, ids in self.waiting])
        if not take:
            return
        group = [self.waiting.popleft() for _ in range(take)]
        keys = [key for key, _ in group]
        src, src_mask = source_batch([ids for _, ids in group], self.device, limit=self.source_limit)
        step = None if self.constraint is None else self.constraint(keys, self.device)
        phrases = [self.phrases.pop(key) for key in keys] if self.lexical else None
        self.search.add(src, src_mask, keys, step, phrases)
        self.peak_sentences = max(self.peak_sentences, self.search.sentences)

    def step(self) -> list[tuple[Hashable, list[Hypothesis]]]:
        """Let waiting sentences join if there is room, decode one step of every live sentence,
        and return (key, hypotheses best first) of those that finished."""
        done, self.blank = self.blank, []
        if not self.waiting and not self.search.sentences:
            return done
        autocast = (torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
                    if self.bf16 else nullcontext())
        with autocast, decoding_kernels(self.device):
            self._join()
            return done + self.search.step()

    def settled(self) -> list[tuple[Hashable, list[int]]]:
        """The per-step hook of streaming: after any `step`, (key, settled prefix in pieces) of
        every sentence being decoded, the pieces its final best translation is sure to start
        with (`BeamSearch.settled`; sentences still waiting for room have none yet). Reading
        it changes nothing in the search."""
        return self.search.settled()

    def run(self, feed: Feed) -> Iterator[list[tuple[Hashable, list[Hypothesis]]]]:
        """Decode until the input has ended and every sentence is done, yielding each step's
        finished (key, hypotheses best first). Before each step `feed(idle)` submits what input
        there is (`idle`: nothing is being decoded, so it may wait for some) and says whether
        more may come: input that trickles in joins a search that goes on decoding meanwhile."""
        more = True
        while True:
            if more:
                more = feed(not self.busy)
            if self.busy:
                yield self.step()
            elif not more:
                return
