"""A span-based chart parser over the Transformer's encoder (not in the paper; an option beside
§6.3's sequence-to-sequence parser).

§6.3 writes a tree as a sequence and lets the decoder learn to write well-formed ones. This
parser keeps the paper's encoder (§3.1, the same `EncoderLayer`s) and drops the decoder: every
span of the sentence gets a score per label, and CKY picks the best-scoring tree, so every output
is a well-formed tree over exactly the input's words by construction. This is the design of Stern
et al. (2017, "A Minimal Span-Based Neural Constituency Parser") on the self-attentive encoder of
Kitaev & Klein (2018, "Constituency Parsing with a Self-Attentive Encoder"); it learns from fewer
trees than the sequence-to-sequence parser, which is what the 10% WSJ sample has
(docs/parsing.md, "A chart parser"). Each word reaches the encoder as its embedding plus what a
character CNN reads in its spelling (`CharEncoder`, `d_char`; 0 turns it off), so rare and
unknown words are more than their signature.

Fenceposts and spans: a sentence of n words has fenceposts 0..n; the span (i, j), i < j, holds
words i+1..j. The encoder reads BOS w_1 .. w_n EOS; each output splits into a forward half f and
a backward half b (Kitaev & Klein §2.1), fencepost k reads f at token k (left of it) and b at
token k+1 (right of it), and the span (i, j) is [f_j - f_i ; b_i - b_j], scored by a two-layer
MLP into one logit per label. Label 0 is "no constituent"; a unary chain (`S -> VP`) is one
label, `S+VP`; part-of-speech tags are not predicted (they are normalized to XX as in the
sequence-to-sequence target, and EVALB reads the gold tags with `--tags-from-gold`).

Training is local: cross-entropy of every span's label (label 0 for the spans that are not
constituents). Decoding treats the spans as independent: a tree's log-probability is the sum of
log p(label) over its spans plus log p(none) over all others, so CKY maximizes the sum, over the
spans of a binary bracketing, of max(0, max_label log p(label) - log p(none)): a span whose best
is "none" is one of the binarization's helper nodes and is dissolved. The whole sentence always
gets a label. CKY is written here (numpy, one vectorized max over split points per span) because
no package the field uses does it for a score tensor.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.config import Config
from aiayn.errors import UserError
from aiayn.io import atomic_write
from aiayn.model.dropout import dropout, word_dropout
from aiayn.model.embedding import ScaledEmbedding, SinusoidalPositions
from aiayn.model.layers import EncoderLayer
from aiayn.parsing.signatures import signature
from aiayn.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID  # noqa: F401 (EOS_ID in encode)

NONE = "<none>"  # label 0: the span is not a constituent
KIND = "chart"  # chart.json's "kind": what `aiayn parse` looks for in a model directory
SPECIALS = ("<pad>", "<unk>", "<s>", "</s>")  # ids PAD_ID, UNK_ID, BOS_ID, EOS_ID


@dataclass(frozen=True)
class ChartConfig:
    """The chart parser's sizes and training settings (the encoder's names are the paper's). The
    defaults were chosen on dev (docs/parsing.md, c1-c7): d_model 128 parsed the 10% WSJ sample
    better in 15 minutes than d_model 256 in 10 (dev F1 81.97 against 76.26), making five times
    the updates on 2 CPU cores; the character CNN gained 1.3 in 30 minutes (83.71 against 82.45)
    and 2.2 over 78 epochs on a GPU."""

    n_layers: int = 4
    d_model: int = 128
    d_ff: int = 512
    n_heads: int = 4
    p_drop: float = 0.2
    p_word_drop: float = 0.1  # a training word read as UNK with this probability
    d_span: int = 128  # the span MLP's hidden size
    warmup_steps: int = 1000
    lr_scale: float = 1.0
    lr_cooldown: float = 0.2  # the rate falls linearly to 0 over this last share of the run
    max_cells: int = 40_000  # (fenceposts)^2 x sentences per batch: the span tensor's size
    d_char: int = 32  # > 0: each word's characters also read by a CNN (`CharEncoder`); 0: off
    max_chars: int = 20  # a longer word is read as its first and last max_chars / 2 characters

    def __post_init__(self):
        for name in ("n_layers", "d_model", "d_ff", "n_heads", "d_span", "warmup_steps", "max_cells",
                     "max_chars"):
            if getattr(self, name) < 1:
                raise UserError(f"chart config: {name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads or self.d_model % 2:
            raise UserError(f"chart config: d_model {self.d_model} must be even and divisible by "
                            f"n_heads {self.n_heads}")
        for name in ("p_drop", "p_word_drop", "lr_cooldown"):
            if not 0 <= getattr(self, name) < 1:
                raise UserError(f"chart config: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.lr_scale <= 0:
            raise UserError(f"chart config: lr_scale must be > 0, got {self.lr_scale}")
        if self.d_char < 0:
            raise UserError(f"chart config: d_char must be >= 0 (0: no character encoder), got {self.d_char}")

    def encoder_config(self, vocab: int) -> Config:
        """The aiayn Config of the encoder layers: pre-norm (docs/parsing.md: post-norm encoders
        collapse on this little data), Adam and Eq. 3 as §5.3 (this warmup)."""
        return Config(n_layers=self.n_layers, d_model=self.d_model, d_ff=self.d_ff,
                      n_heads=self.n_heads, p_drop=self.p_drop, norm="pre",
                      warmup_steps=self.warmup_steps, lr_scale=self.lr_scale,
                      vocab_size=vocab)


def parse_sets(pairs: Sequence[str], cfg: ChartConfig) -> ChartConfig:
    """`--set NAME=VALUE ...` over `cfg`, with one clear error for an unknown name or value."""
    types = {f.name: f.type for f in fields(ChartConfig)}
    changes = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or name not in types:
            raise UserError(f"--set {pair}: expected NAME=VALUE with NAME one of {', '.join(types)}")
        try:
            changes[name] = float(value) if types[name] in (float, "float") else int(value)
        except ValueError:
            raise UserError(f"--set {pair}: {value!r} is not a number") from None
    return replace(cfg, **changes)


# --- trees and spans ---------------------------------------------------------------------------


def tree_spans(tree) -> list[tuple[int, int, str]]:
    """The labelled spans (i, j, label) of an nltk tree, parents before children: preterminals
    left out, a unary chain one label joined by `+`, top first (`S+VP`)."""
    out: list[tuple[int, int, str]] = []

    def walk(node, i: int) -> int:
        if isinstance(node, str) or (len(node) == 1 and isinstance(node[0], str)):
            return i + 1
        chain = [node.label()]
        while len(node) == 1 and not (len(node[0]) == 1 and isinstance(node[0][0], str)):
            node = node[0]
            chain.append(node.label())
        at = len(out)
        out.append((i, i, ""))  # filled once the end is known
        j = i
        for child in node:
            j = walk(child, j)
        out[at] = (i, j, "+".join(chain))
        return j

    walk(tree, 0)
    return out


def cky(span_scores: np.ndarray) -> list[tuple[int, int]]:
    """The binary bracketing of fenceposts 0..n whose spans' scores sum highest: `span_scores`
    (n+1, n+1), the score of span (i, j) at [i, j] (i < j). Returns its 2n - 1 spans (i, j), the
    whole sentence first, then preorder. Ties break to the leftmost split."""
    n = span_scores.shape[0] - 1
    best = np.zeros((n + 1, n + 1))
    split = np.zeros((n + 1, n + 1), dtype=np.int64)
    for length in range(1, n + 1):
        for i in range(0, n - length + 1):
            j = i + length
            if length == 1:
                best[i, j] = span_scores[i, j]
                continue
            inner = best[i, i + 1:j] + best[i + 1:j, j]  # split at k = i+1 .. j-1
            k = int(np.argmax(inner))
            split[i, j] = i + 1 + k
            best[i, j] = span_scores[i, j] + inner[k]
    spans: list[tuple[int, int]] = []
    stack = [(0, n)]
    while stack:
        i, j = stack.pop()
        spans.append((i, j))
        if j - i > 1:
            k = int(split[i, j])
            stack.append((k, j))
            stack.append((i, k))
    return spans


def spans_to_tree(words: Sequence[str], spans: Sequence[tuple[int, int, str]], tag: str = "XX") -> str:
    """The one-line tree over `words` from labelled spans that do not cross (the whole sentence
    among them), each word under a `tag` preterminal; `A+B` labels become a unary chain."""
    order = sorted(spans, key=lambda s: (s[0], -s[1]))
    leaves = [f"({tag} {w})" for w in words]

    def build(lo: int, hi: int, items: list) -> list[str]:
        parts, k, p = [], 0, lo
        while k < len(items):
            i, j, label = items[k]
            parts.extend(leaves[p:i])
            inner, k = [], k + 1
            while k < len(items) and items[k][1] <= j:
                inner.append(items[k])
                k += 1
            text = " ".join(build(i, j, inner))
            for lab in reversed(label.split("+")):
                text = f"({lab} {text})"
            parts.append(text)
            p = j
        parts.extend(leaves[p:hi])
        return parts

    return " ".join(build(0, len(words), order))


def decode_tree(log_probs: np.ndarray, words: Sequence[str], labels: Sequence[str],
                votes: np.ndarray | float | None = None) -> str:
    """The tree CKY finds in one sentence's (n+1, n+1, L) label log-probabilities, plus `votes`
    ((n+1, n+1, L), or one number for all) added to each label's score over "none" where given
    (`span_votes`)."""
    n = len(words)
    gain = log_probs[..., 1:] - log_probs[..., :1]  # (n+1, n+1, L-1): over "none"
    if votes is not None:
        gain = gain + (votes[..., 1:] if isinstance(votes, np.ndarray) else votes)
    best_label = gain.argmax(-1) + 1  # (n+1, n+1)
    best_gain = gain.max(-1)
    keep = np.maximum(best_gain, 0.0)
    keep[0, n] = best_gain[0, n]  # the whole sentence is always a constituent
    chosen = []
    for i, j in cky(keep):
        if (i, j) == (0, n) or best_gain[i, j] > 0:
            chosen.append((i, j, labels[int(best_label[i, j])]))
    return spans_to_tree(words, chosen)


def span_votes(trees: Sequence, n: int, labels: Sequence[str], weight: float) -> np.ndarray:
    """(n+1, n+1, L): `weight` for every labelled span of every tree in `trees` (other parsers'
    trees of one sentence of n words, nltk trees), summed; a label the model does not have
    adds nothing (the chart can only write its own labels)."""
    index = {lab: k for k, lab in enumerate(labels)}
    votes = np.zeros((n + 1, n + 1, len(labels)))
    for tree in trees:
        for i, j, lab in tree_spans(tree):
            if lab in index:
                votes[i, j, index[lab]] += weight
    return votes


# --- the model ---------------------------------------------------------------------------------


CHAR_SPECIALS = ("<cpad>", "<cunk>", "<w>", "</w>")  # char ids 0-3: pad, unknown, word start, end


def char_ids(words_list: Sequence[Sequence[str]], index: dict[str, int],
             max_chars: int) -> tuple[Tensor, Tensor]:
    """The characters of sentences read as BOS w_1..w_n EOS PAD.., each distinct word once:
    `chars` (U + 1, C), row u the u-th distinct word as `<w>` its characters `</w>` (a word
    longer than max_chars as its first and last max_chars // 2 characters: the prefix and the
    suffix carry its shape and part of speech), row 0 empty; `where` (B, S), each slot's row
    (0 for BOS, EOS and PAD). The char encoder then runs once per distinct word rather than per
    slot: in news text `the` and `,` fill many slots."""
    half = max_chars // 2
    rows: dict[str, int] = {}
    s = max(len(w) for w in words_list) + 2
    where = [[0] + [rows.setdefault(w, len(rows) + 1) for w in words] + [0] * (s - 1 - len(words))
             for words in words_list]  # +1: BOS is slot 0, row 0 is the empty word
    def clip(w: str) -> str:  # not w[-half:]: at half 0 that is the whole word
        return w if len(w) <= max_chars else w[:half] + w[len(w) - half:]

    spelled = [[2] + [index.get(c, 1) for c in clip(w)] + [3] for w in rows]
    c = max((len(x) for x in spelled), default=2)
    chars = torch.tensor([[0] * c] + [x + [0] * (c - len(x)) for x in spelled], dtype=torch.long)
    where = torch.tensor(where, dtype=torch.long)
    return chars, where


class CharEncoder(nn.Module):
    """A word from its characters (not in the paper): embeddings, one convolution of width 3,
    ReLU, the maximum over the word's characters (Kim et al. 2016's character CNN, one width).
    A word the vocabulary does not know, or training's word dropout hid, still reaches the model
    as its spelling; a CNN rather than Kitaev & Klein's character LSTM because it is one batched
    convolution on a CPU.

    (chars (U, C), where (B, S)) from `char_ids` -> (B, S, d_model); row 0 (BOS, EOS, PAD) gives 0."""

    def __init__(self, n_chars: int, d_char: int, d_model: int):
        super().__init__()
        self.embed = nn.Embedding(n_chars, d_char, padding_idx=0)
        self.conv = nn.Conv1d(d_char, d_model, kernel_size=3, padding=1)

    def forward(self, chars: tuple[Tensor, Tensor]) -> Tensor:
        spelled, where = chars  # (U, C), (B, S)
        x = self.embed(spelled).transpose(1, 2)  # (U, d_char, C)
        h = F.relu(self.conv(x))  # (U, d_model, C)
        h = h.masked_fill((spelled == 0)[:, None, :], 0.0)  # pads never win the max; row 0 is all 0
        return h.amax(dim=-1)[where]  # (B, S, d_model)


class SpanParser(nn.Module):
    """The paper's encoder stack (pre-norm) and a span scorer.

    `model(ids, chars)`: ids (B, S) = BOS w_1..w_n EOS PAD.., chars their characters
    (`char_ids`; None when cfg.d_char is 0) -> logits (B, F, F, L) with F = S - 1 fenceposts;
    only cells i < j <= n (the sentence's words) mean anything."""

    def __init__(self, cfg: ChartConfig, n_words: int, n_labels: int, n_chars: int = 0):
        super().__init__()
        self.cfg = cfg
        enc = cfg.encoder_config(n_words)
        d = cfg.d_model
        self.embed = ScaledEmbedding(n_words, d)
        self.pos = SinusoidalPositions(d)
        self.char_encoder = CharEncoder(n_chars, cfg.d_char, d) if cfg.d_char else None
        self.layers = nn.ModuleList(EncoderLayer(enc) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(d)
        self.span_hidden = nn.Linear(d, cfg.d_span)
        self.span_norm = nn.LayerNorm(cfg.d_span)
        self.span_out = nn.Linear(cfg.d_span, n_labels)
        for name, p in self.named_parameters():
            if p.dim() == 2 and "embed" not in name:
                nn.init.xavier_uniform_(p)

    def encode(self, ids: Tensor, chars: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """ids (B, S), chars from `char_ids` or None -> the encoder's output (B, S, d_model), after the
        final LayerNorm. Word dropout hides the word's id, not its characters."""
        mask = ids != PAD_ID  # (B, S)
        ids = word_dropout(ids, self.cfg.p_word_drop, self.training)
        x = self.embed(ids) + self.pos(ids.size(1), 0).to(self.embed.weight.dtype)  # (B, S, d)
        if self.char_encoder is not None:
            if chars is None:
                raise ValueError("this chart parser reads characters: pass chars (char_ids)")
            x = x + self.char_encoder(chars)
        x = dropout(x, self.cfg.p_drop, self.training)
        attend = mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.layers:
            x, _ = layer(x, attend)
        return self.norm(x)

    def forward(self, ids: Tensor, chars: tuple[Tensor, Tensor] | None = None) -> Tensor:
        h = self.encode(ids, chars)  # (B, S, d)
        n_words = (ids != PAD_ID).sum(dim=1) - 2  # (B,)
        f = ids.size(1) - 1  # fenceposts of the longest sentence
        half = h.size(-1) // 2
        fwd, bwd = h[:, :-1, :half], h[:, 1:, half:]  # (B, F, d/2): fencepost k's left, right
        # span_hidden([f_j - f_i ; b_i - b_j]) = A_j - A_i + B_i - B_j + bias, with A and B its
        # two halves applied once per fencepost instead of once per span: the same numbers, F
        # matrix rows instead of F^2
        w = self.span_hidden.weight  # (d_span, d)
        a, b = F.linear(fwd, w[:, :half]), F.linear(bwd, w[:, half:])  # (B, F, d_span) each
        grid = torch.ones(f, f, dtype=torch.bool, device=ids.device).triu(1)  # i < j
        valid = grid[None] & (torch.arange(f, device=ids.device)[None, None, :] <= n_words[:, None, None])
        bi, i, j = valid.nonzero(as_tuple=True)  # (N,) each: the spans i < j <= n
        pre = a[bi, j] - a[bi, i] + b[bi, i] - b[bi, j] + self.span_hidden.bias  # (N, d_span)
        hidden = F.relu(self.span_norm(pre))
        cells = self.span_out(dropout(hidden, self.cfg.p_drop, self.training))  # (N, L)
        out = cells.new_zeros(ids.size(0), f, f, cells.size(-1))  # (B, F, F, L); 0 where not a span
        out[bi, i, j] = cells
        return out


def span_targets(spans: Sequence[tuple[int, int, int]], n: int) -> Tensor:
    """(n+1, n+1) long: the label id of each span i < j (0: none), -100 elsewhere (ignored).
    A span labelled twice (impossible in a tree) keeps the first."""
    t = torch.full((n + 1, n + 1), -100, dtype=torch.long)
    upper = torch.triu(torch.ones(n + 1, n + 1, dtype=torch.bool), diagonal=1)
    t[upper] = 0
    for i, j, lab in reversed(spans):
        t[i, j] = lab
    return t


def span_loss(logits: Tensor, targets: Tensor) -> tuple[Tensor, int]:
    """Summed cross-entropy over the cells targets does not ignore, and their number.
    logits (B, F, F, L), targets (B, F', F') with F' <= F."""
    f = targets.size(1)
    logits = logits[:, :f, :f]  # (B, F', F', L)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1),
                           ignore_index=-100, reduction="sum")
    return loss, int((targets != -100).sum())


# --- data --------------------------------------------------------------------------------------


@dataclass
class Sentence:
    words: list[str]  # as the model reads them (rare words as their signatures)
    spans: list[tuple[int, int, int]]  # (i, j, label id)
    spelling: list[str] | None = None  # the words as written (what the char encoder reads)


def read_split(corpus: Path, split: str) -> tuple[list[list[str]], list]:
    """SPLIT.src (or SPLIT.words) and SPLIT.gold of an `aiayn treebank` directory, as word lists
    and nltk trees; a line count or word mismatch is one error line."""
    from aiayn.parsing.treebank import parse_tree

    src = corpus / f"{split}.src"
    if not src.exists():
        src = corpus / f"{split}.words"
    gold = corpus / f"{split}.gold"
    for p in (src, gold):
        if not p.exists():
            raise UserError(f"{p}: no such file (make the corpus with `aiayn treebank --out {corpus}`)")
    words = [line.split() for line in src.read_text(encoding="utf-8").splitlines()]
    trees = [parse_tree(line, f"{gold}:{k + 1}") for k, line in
             enumerate(gold.read_text(encoding="utf-8").splitlines())]
    if len(words) != len(trees):
        raise UserError(f"{src} has {len(words)} lines but {gold} has {len(trees)}")
    for k, (w, t) in enumerate(zip(words, trees)):
        if len(w) != len(t.leaves()):
            raise UserError(f"{src}:{k + 1}: {len(w)} words, but its tree in {gold} has {len(t.leaves())}")
    return words, trees


def batches(sents: Sequence[Sentence], max_cells: int, shuffle: random.Random | None) -> list[list[int]]:
    """Sentence indices grouped by length so that each batch's (n+1)^2 x size stays under
    max_cells (a longer sentence alone when it does not fit)."""
    order = sorted(range(len(sents)), key=lambda k: len(sents[k].words))
    out, cur, width = [], [], 0
    for k in order:
        f = len(sents[k].words) + 1
        if cur and max(width, f) ** 2 * (len(cur) + 1) > max_cells:
            out.append(cur)
            cur, width = [], 0
        cur.append(k)
        width = max(width, f)
    if cur:
        out.append(cur)
    if shuffle is not None:
        shuffle.shuffle(out)
    return out


def encode(words_list: Sequence[Sequence[str]], index: dict[str, int]) -> Tensor:
    """(B, S) ids: BOS, each word's id (UNK when unknown), EOS, right-padded with PAD."""
    s = max(len(w) for w in words_list) + 2
    ids = torch.full((len(words_list), s), PAD_ID, dtype=torch.long)
    for b, words in enumerate(words_list):
        row = [BOS_ID] + [index.get(w, UNK_ID) for w in words] + [EOS_ID]
        ids[b, : len(row)] = torch.tensor(row)
    return ids


def model_words(words: Sequence[str], index: dict[str, int]) -> list[str]:
    """A sentence as the model reads it: a word the vocabulary lacks as its signature when the
    vocabulary has that (as training saw rare words), else as it is (then UNK)."""
    out = []
    for w in words:
        sig = w if w in index else signature(w)
        out.append(sig if sig in index else w)
    return out


# --- training, saving, parsing -----------------------------------------------------------------


@dataclass
class ChartModel:
    model: SpanParser
    words: list[str]  # id -> word (SPECIALS first)
    labels: list[str]  # id -> label (NONE first)
    chars: Sequence[str] = ()  # id -> character (CHAR_SPECIALS first); empty without a char encoder

    def __post_init__(self):
        self.index = {w: k for k, w in enumerate(self.words)}  # word -> id, built once
        self.char_index = {c: k for k, c in enumerate(self.chars)}

    def logits(self, spellings: Sequence[Sequence[str]]) -> Tensor:
        """(B, F, F, L) span logits of sentences given as their words as written."""
        ids = encode([model_words(w, self.index) for w in spellings], self.index)
        chars = (char_ids(spellings, self.char_index, self.model.cfg.max_chars)
                 if self.model.char_encoder is not None else None)
        return self.model(ids, chars)


def save_chart(m: ChartModel, out: Path, info: dict) -> None:
    """out/chart.json (kind, config, vocabulary, labels, training info) and out/model.safetensors,
    written into a temporary sibling directory that then replaces `out`."""
    from safetensors.torch import save_file

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.detach().contiguous().cpu() for k, v in m.model.state_dict().items()},
              str(tmp / "model.safetensors"))
    with atomic_write(tmp / "chart.json") as f:
        json.dump({"kind": KIND, "config": asdict(m.model.cfg), "words": m.words, "labels": m.labels,
                   "chars": list(m.chars), "info": info}, f, indent=1)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


def is_chart_model(path: str | os.PathLike) -> bool:
    p = Path(path) / "chart.json"
    if not p.exists():
        return False
    try:
        return json.loads(p.read_text(encoding="utf-8")).get("kind") == KIND
    except (ValueError, UnicodeDecodeError):
        return False


def load_chart(path: str | os.PathLike) -> ChartModel:
    from safetensors.torch import load_file

    p = Path(path)
    try:
        meta = json.loads((p / "chart.json").read_text(encoding="utf-8"))
        cfg = ChartConfig(**{"d_char": 0, **meta["config"]})  # models saved before d_char read no characters
        model = SpanParser(cfg, len(meta["words"]), len(meta["labels"]), len(meta.get("chars", ())))
        model.load_state_dict(load_file(str(p / "model.safetensors")))
    except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise UserError(f"{p}: not a chart parser model ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    model.eval()
    return ChartModel(model, meta["words"], meta["labels"], meta.get("chars", []))


def _sentences(words_list, trees, label_index: dict[str, int]) -> list[Sentence]:
    """Sentences with their spans' label ids (a label training never saw: 0, none) and their
    spelling (the gold tree's leaves: the words before signatures replaced the rare ones)."""
    return [Sentence(words, [(i, j, label_index.get(lab, 0)) for i, j, lab in tree_spans(tree)],
                     tree.leaves())
            for words, tree in zip(words_list, trees)]


def train_chart(corpus: Path, out: Path, cfg: ChartConfig, minutes: float, seed: int = 1,
                threads: int | None = None, progress: bool = True, log=print,
                max_steps: int | None = None, device: str | None = None) -> dict:
    """Train a chart parser on `corpus` (from `aiayn treebank`) for `minutes` (or `max_steps`
    updates, whichever comes first) on `device` (None: CUDA when available, else the CPU),
    average the weights of the last 5 of 30 snapshots taken evenly through the run (as `aiayn
    average` does for checkpoints), save it to `out`; returns the training summary."""
    from tqdm import tqdm

    from aiayn.training.average import average_state_dicts
    from aiayn.training.distributed import pick_device
    from aiayn.training.schedule import build_optimizer, cooldown_factor, lr_at, set_lr

    if minutes <= 0:
        raise UserError(f"--minutes must be > 0, got {minutes}")
    if max_steps is not None and max_steps < 1:
        raise UserError(f"--max-steps must be >= 1, got {max_steps}")
    if threads:
        torch.set_num_threads(threads)
    where = pick_device(device)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    train_words, train_trees = read_split(corpus, "train")
    dev_words, dev_trees = read_split(corpus, "valid")
    counts = Counter(w for ws in train_words for w in ws)
    vocab = list(SPECIALS) + sorted(counts)
    index = {w: k for k, w in enumerate(vocab)}
    label_counts = Counter(lab for t in train_trees for _, _, lab in tree_spans(t))
    labels = [NONE] + sorted(label_counts)
    label_index = {lab: k for k, lab in enumerate(labels)}
    train = _sentences(train_words, train_trees, label_index)
    dev = _sentences([model_words(w, index) for w in dev_words], dev_trees, label_index)
    chars = list(CHAR_SPECIALS) + sorted({c for s in train for w in s.spelling for c in w}) if cfg.d_char else []
    char_index = {c: k for k, c in enumerate(chars)}
    model = SpanParser(cfg, len(vocab), len(labels), len(chars)).to(where)
    enc_cfg = cfg.encoder_config(len(vocab))
    opt = build_optimizer(model.parameters(), enc_cfg)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"chart parser: {n_params:,} parameters, {len(vocab):,} words, {len(chars)} characters, "
        f"{len(labels)} labels; "
        f"{len(train):,} training trees, {len(dev)} dev; {minutes} minutes, seed {seed}, {where.type}")

    def run_batch(sents: Sequence[Sentence], train_mode: bool) -> tuple[Tensor, int]:
        ids = encode([s.words for s in sents], index).to(where)
        chars_in = (tuple(t.to(where) for t in char_ids([s.spelling for s in sents], char_index, cfg.max_chars))
                    if cfg.d_char else None)
        f = max(len(s.words) for s in sents) + 1
        targets = torch.full((len(sents), f, f), -100, dtype=torch.long)
        for b, s in enumerate(sents):
            t = span_targets(s.spans, len(s.words))
            targets[b, : t.size(0), : t.size(1)] = t
        model.train(train_mode)
        return span_loss(model(ids, chars_in), targets.to(where))

    budget = minutes * 60.0
    snapshots: list[dict[str, Tensor]] = []
    step, epoch, tokens, start, next_snap, done_share = 0, 0, 0, time.monotonic(), 1, 0.0
    bar = tqdm(total=int(budget), unit="s", disable=not progress, desc="chart training")
    done = False
    while not done:
        epoch += 1
        for batch in batches(train, cfg.max_cells, rng):
            step += 1
            set_lr(opt, lr_at(enc_cfg, step) * cooldown_factor(done_share, cfg.lr_cooldown))
            loss, cells = run_batch([train[k] for k in batch], True)
            opt.zero_grad(set_to_none=True)
            (loss / max(cells, 1)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            tokens += sum(len(train[k].words) for k in batch)
            elapsed = time.monotonic() - start
            done_share = max(elapsed / budget, step / max_steps if max_steps else 0.0)
            bar.n = min(int(elapsed), int(budget))
            bar.set_postfix(step=step, epoch=epoch, loss=f"{loss.item() / max(cells, 1):.4f}", refresh=False)
            bar.refresh()
            if done_share >= next_snap / 30:  # 30 snapshots through the run; the last 5 kept
                snapshots = (snapshots + [{k: v.detach().clone() for k, v in model.state_dict().items()}])[-5:]
                next_snap = int(done_share * 30) + 1
                if not progress:  # a line a snapshot where there is no bar
                    log(f"step {step} (epoch {epoch}), {elapsed / 60:.1f} min: span loss "
                        f"{loss.item() / max(cells, 1):.4f}, {tokens / elapsed:,.0f} words/s")
            if done_share >= 1:
                done = True
                break
    bar.close()
    train_s = time.monotonic() - start
    if snapshots:
        model.load_state_dict(average_state_dicts(snapshots))
    model.eval()
    with torch.no_grad():
        total, cells = 0.0, 0
        for batch in batches(dev, cfg.max_cells, None):
            loss, c = run_batch([dev[k] for k in batch], False)
            total, cells = total + float(loss), cells + c
    per_epoch = len(batches(train, cfg.max_cells, None))  # the same count whatever the order
    summary = {"steps": step, "epochs": round(step / max(per_epoch, 1), 2),
               "train_seconds": round(train_s, 1), "words_per_s": round(tokens / max(train_s, 1e-9)),
               "averaged": len(snapshots), "dev_span_loss": round(total / max(cells, 1), 5),
               "parameters": n_params, "seed": seed, "corpus": str(corpus)}
    log(f"done: {step} steps ({summary['epochs']} epochs) in {train_s:.0f}s, "
        f"{summary['words_per_s']:,} words/s; averaged {len(snapshots)} snapshots; "
        f"dev span loss {summary['dev_span_loss']:.5f}")
    save_chart(ChartModel(model.cpu(), vocab, labels, chars), out, summary)
    log(f"saved {out}")
    return summary


@torch.no_grad()
def chart_parse(models: Sequence[ChartModel], lines: Sequence[str], max_cells: int = 40_000,
                progress: bool = False, votes: Sequence[Sequence] | None = None,
                vote_weight: float = 1.0, span_bonus: float = 0.0) -> list[str]:
    """One tree per line (a blank line gives a blank line); several models parse as their
    ensemble, the mean of their label log-probabilities per span (they must share labels).
    `votes`: per line, other parsers' trees of that sentence (nltk trees over its words), each
    labelled span of which adds `vote_weight` to that label's score before CKY: a combination of
    parsers in which every output is still a tree over exactly the words. `span_bonus` is added
    to every label's score over "none" (> 0: more brackets, < 0: fewer)."""
    from tqdm import tqdm

    first = models[0]
    for m in models[1:]:
        if m.labels != first.labels:
            raise UserError("chart parser ensemble: the models have different label sets "
                            "(train them on one corpus)")
    sents = [line.split() for line in lines]
    todo = [k for k, w in enumerate(sents) if w]
    out = [""] * len(sents)
    fake = [Sentence(sents[k], []) for k in todo]
    bar = tqdm(total=len(todo), unit="sent", disable=not progress, desc="parsing")
    for batch in batches(fake, max_cells, None):
        words = [fake[k].words for k in batch]
        lp = None
        for m in models:
            x = F.log_softmax(m.logits(words).float(), dim=-1)  # (B, F, F, L)
            lp = x if lp is None else lp + x
        lp = (lp / len(models)).numpy()
        for b, k in enumerate(batch):
            n = len(words[b])
            extra = None if votes is None else span_votes(votes[todo[k]], n, first.labels, vote_weight)
            if span_bonus:
                extra = span_bonus if extra is None else extra + span_bonus
            out[todo[k]] = decode_tree(lp[b, : n + 1, : n + 1], words[b], first.labels, extra)
        bar.update(len(batch))
    bar.close()
    return out
