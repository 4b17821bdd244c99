"""Sentences to trees with chart parsers (`aiayn parse --model CHART_DIR`): span log-probabilities
of one model or the mean of an ensemble's, other parsers' trees as votes, CKY (aiayn/parsing/chart/
trees.py), so every output is a tree over exactly its words."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from aiayn.errors import UserError
from aiayn.parsing.chart.data import length_batches
from aiayn.parsing.chart.files import ChartModel
from aiayn.parsing.chart.trees import decode_tree, span_votes
from aiayn.progress import Progress


@torch.no_grad()
def chart_parse(models: Sequence[ChartModel], lines: Sequence[str], max_cells: int = 40_000,
                progress: bool = False, votes: Sequence[Sequence] | None = None,
                vote_weight: float = 1.0) -> list[str]:
    """One tree per line (a blank line gives a blank line); several models parse as their
    ensemble, the mean of their label log-probabilities per span (they must share labels).
    `votes`: per line, other parsers' trees of that sentence (nltk trees over its words), each
    labelled span of which adds `vote_weight` to that label's score before CKY: a combination of
    parsers in which every output is still a tree over exactly the words."""
    labels = models[0].vocab.labels
    for m in models[1:]:
        if m.vocab.labels != labels:
            raise UserError("chart parser ensemble: the models have different label sets "
                            "(train them on one corpus)")
    sents = [line.split() for line in lines]
    todo = [k for k, w in enumerate(sents) if w]
    out = [""] * len(sents)
    bar = Progress(len(todo), desc="parsing", unit="sent", enabled=progress)
    for batch in length_batches([len(sents[k]) for k in todo], max_cells):
        words = [sents[todo[k]] for k in batch]
        lp = None
        for m in models:
            x = F.log_softmax(m.logits(words).float(), dim=-1)  # (B, F, F, L)
            lp = x if lp is None else lp + x
        lp = (lp / len(models)).cpu().numpy()
        for b, k in enumerate(batch):
            n = len(words[b])
            extra = None if votes is None else span_votes(votes[todo[k]], n, labels, vote_weight)
            out[todo[k]] = decode_tree(lp[b, : n + 1, : n + 1], words[b], labels, extra)
        bar.update(len(batch))
    bar.close()
    return out
