"""Translation: text in, text out (§6.1 decoding settings), for the CLI, evaluation and training.

- `search_batched` runs greedy or beam search over any number of token-id sources through one
  `aiayn.decoding.engine.SearchEngine` (sorted internally, longest first), results back in input
  order.
- `Translator` adds the tokenizers: lines of text -> encoded (pieces + EOS) -> search ->
  sentencepiece-decoded text, exactly one output per input line. Its search settings are
  decided once, when it is made (`aiayn.decoding.search`).

Input rules, per line (`Translator.prepare`):
- a blank line (empty or whitespace only), or one that encodes to no pieces, translates to an
  empty line without running the model;
- a line with more source tokens (pieces + EOS) than the model can take is truncated to its first
  `limit - 1` pieces plus EOS, with a warning naming the line. The limit is `max_src_tokens`
  (default 1024) and, for learned positions, also `max_positions`.
"""

from __future__ import annotations

import copy
import queue
import sys
import threading
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch

from aiayn.data.model_dir import LoadedModel
from aiayn.decoding import precision as decode_precision
from aiayn.decoding.alignment import EOS_PIECE, SentenceAlignment, Unit
from aiayn.decoding.common import (
    AttentionRequest,
    Hypothesis,
    StepConstraint,
    check_index,
    decoder_heads,
    decoder_length_cap,
    max_output_lengths,
    model_device,
)
from aiayn.decoding.engine import Phrases, SearchEngine
from aiayn.decoding.glossary import Glossary
from aiayn.decoding.search import SearchOptions, SearchSettings, resolve_search
from aiayn.errors import UserError
from aiayn.progress import Progress

DEFAULT_MAX_SRC_TOKENS = 1024


# Builds the step constraint of a batch: (indices of the batch's sentences into the sources,
# device) -> `aiayn.decoding.common.StepConstraint` (e.g. `aiayn.parsing.constrain`)
ConstraintFactory = Callable[[Sequence[int], torch.device], StepConstraint]


def search_batched(model: Any, sources: Sequence[Sequence[int]],
                   options: SearchOptions | SearchSettings = SearchOptions(), bf16: bool = False,
                   progress: bool = False, constraint: ConstraintFactory | None = None,
                   phrases: Sequence[Phrases] | None = None,
                   continues: torch.Tensor | None = None) -> list[list[Hypothesis]]:
    """Search every source (subword ids, no specials) and return, in input order, its
    hypotheses best first (one for greedy, up to `nbest` for beam search; an empty source gets
    one empty hypothesis with score 0 without running the model). `options`: settings already
    decided (`Translator`'s), or options decided here against the model's config.

    The sources go through one `aiayn.decoding.engine.SearchEngine`, longest first: sentences
    join the search as others finish, within `batch_tokens` (live sentences x their longest
    source, padded: `aiayn.decoding.common.source_width`) and `batch_size`. The model runs on
    its own device in eval mode (a model in training mode, e.g. for dev BLEU during training,
    goes back to training mode afterwards); with `bf16` under bf16 autocast unless its weights
    are bf16 already. Sources must fit the model (`Translator.prepare` truncates). Progress
    (aiayn/progress.py, stderr) counts sentences. `constraint`, when given, builds the step
    constraint of the sentences that join together (their indices into `sources`). `phrases`,
    when given, one list per source: the target phrases its translation must contain, a
    lexically constrained search (aiayn/decoding/constraints.py); without it the paper's;
    `continues`: the target pieces that may not follow a phrase (they would continue its word)."""
    settings = (options if isinstance(options, SearchSettings)
                else resolve_search(model, options))
    results: list[list[Hypothesis]] = [[] for _ in sources]
    was_training = bool(getattr(model, "training", False))
    if was_training:
        model.eval()
    try:
        engine = SearchEngine(model, settings, bf16, constraint, lexical=phrases is not None,
                              continues=continues)

        def feed(idle: bool) -> bool:  # every source at once; the engine admits them
            for i in sorted(range(len(sources)), key=lambda i: -len(sources[i])):
                engine.submit(i, sources[i], None if phrases is None else phrases[i])
            return False

        with Progress(len(sources), desc="translating", unit="sent", enabled=progress,
                      leave=False) as bar:
            for done in engine.run(feed):
                for i, hyps in done:
                    results[i] = hyps
                bar.update(len(done))
    finally:
        if was_training:
            model.train()
    return results


def _warn_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


class Translator:
    """Text translation with a loaded model directory (`aiayn.data.model_dir.load_model`).

        tr = Translator(load_model("runs/base/model"))
        tr.translate(["A sentence.", ""])          # -> ["Ein Satz.", ""]
        tr.translate_nbest(["A sentence."], 4)    # -> [[(score, text), ...]]

    `precision` is the decoding arithmetic (`aiayn.decoding.precision`): "auto" (the default, as
    every command's `--precision`: bf16 on a GPU or a CPU with native bf16, else fp32;
    docs/guides/decoding.md), "fp32" (the paper's), "bf16" or "int8"; the loaded model is
    converted in place, once (`loaded.model` becomes the converted model, so translators built
    on the same `loaded` share it).
    `max_src_tokens` bounds the source (pieces + EOS); longer lines are truncated with a warning
    sent to `warn` (default: stderr). The search: `settings` already decided
    (`aiayn.decoding.search.SearchSettings`, what the commands pass), or `SearchOptions` fields
    as keyword arguments, decided here against the model's config; either way once, kept in
    `self.settings`.
    """

    def __init__(self, loaded: Any, *, precision: str = "auto", convert: bool = True,
                 max_src_tokens: int = DEFAULT_MAX_SRC_TOKENS,
                 warn: Callable[[str], None] | None = None,
                 settings: SearchSettings | None = None, **options: Any):
        if settings is not None and options:
            raise TypeError(f"give search settings or options, not both: {', '.join(options)}")
        self.loaded = loaded
        self.src_tokenizer = loaded.src_tokenizer
        self.tgt_tokenizer = loaded.tgt_tokenizer
        self.settings = (settings if settings is not None
                         else resolve_search(loaded.model, SearchOptions(**options)))
        self.precision = decode_precision.resolve(precision, model_device(loaded.model))
        if convert:
            loaded.model = decode_precision.convert(loaded.model, self.precision)
        elif self.precision == "int8":
            raise ValueError("int8 decoding converts the model's weights; an in-memory model "
                             "decodes in fp32 or under bf16 autocast")
        self.model = loaded.model
        # bf16 with fp32 weights (an in-memory model) runs under autocast in `search_batched`
        self.bf16 = self.precision == "bf16"
        self.warn = warn or _warn_stderr
        limit, cap = max_src_tokens, decoder_length_cap(self.model)
        if cap is not None:  # learned positions
            limit = min(limit, cap)
        if limit < 2:
            raise ValueError(f"the source limit must allow one piece and EOS, got {limit}")
        self.max_src_tokens = limit
        self._continues: torch.Tensor | None = None  # `word_continuations`, made when first asked

    @classmethod
    def for_model(cls, model: Any, src_tokenizer: Any, tgt_tokenizer: Any | None = None,
                  **kwargs: Any) -> "Translator":
        """A translator for an in-memory model (e.g. dev BLEU during training); it never changes
        the model's weights: precision fp32 (the default here: no autocast of its own, so the
        search runs under whatever autocast its caller, such as training, holds) or bf16, which
        then means bf16 autocast."""
        tgt = tgt_tokenizer if tgt_tokenizer is not None else src_tokenizer
        kwargs.setdefault("precision", "fp32")
        return cls(LoadedModel(model, getattr(model, "cfg", None), src_tokenizer, tgt),
                   convert=False, **kwargs)

    def with_settings(self, **changes: Any) -> "Translator":
        """A translator sharing this one's model, tokenizers, precision and limits, whose search
        settings differ by `changes` (`SearchSettings` fields, e.g. beam_size, alpha: `aiayn
        serve`'s per-request search)."""
        other = copy.copy(self)
        other.settings = replace(self.settings, **changes)
        return other

    # --- text <-> ids ------------------------------------------------------------------------
    def prepare(self, lines: Sequence[str], first_line: int = 1,
                warn: Callable[[str], None] | None = None) -> list[list[int]]:
        """Source pieces per line (no EOS), truncated to the limit with a warning (to `warn`,
        default this translator's); line numbers in warnings start at `first_line`."""
        # Blank lines (empty or whitespace only) stay blank: nothing to translate.
        texts = [line if line.strip() else "" for line in lines]
        if hasattr(self.src_tokenizer, "encode_batch"):
            encoded = self.src_tokenizer.encode_batch(texts)
        else:
            encoded = [self.src_tokenizer.encode(text) if text else [] for text in texts]
        keep = self.max_src_tokens - 1  # room for EOS
        out = []
        for n, ids in enumerate(encoded, start=first_line):
            if len(ids) > keep:
                (warn or self.warn)(f"line {n}: {len(ids) + 1} source tokens (with EOS) exceed the limit of "
                          f"{self.max_src_tokens}; translating only its first {keep} pieces")
                ids = ids[:keep]
            out.append(list(ids))
        return out

    def phrases(self, lines: Sequence[str], sources: Sequence[Sequence[int]],
                glossary: Glossary, first_line: int = 1) -> list[list[list[int]]]:
        """Per line, the target pieces of each glossary term that applies to it
        (aiayn/decoding/glossary.py), cut as a word inside a sentence is; `sources` the lines'
        ids (`prepare`). UserError (the input's fault: one line naming the line) when a line's
        terms take more pieces than its translation may hold (the maximum output length, EOS
        counted)."""
        out = []
        for n, (line, src) in enumerate(zip(lines, sources), start=first_line):
            try:
                out.append(self.sentence_phrases(line, src, glossary))
            except UserError as e:
                raise UserError(f"line {n}: {e}") from None
        return out

    def sentence_phrases(self, text: str, src: Sequence[int], glossary: Glossary
                         ) -> list[list[int]]:
        """`phrases` of one sentence, `text` with source ids `src`; its UserError says what,
        not where (`aiayn serve` names the text its own way)."""
        terms = glossary.terms(text) if src else []
        ids = [p for p in (list(self.tgt_tokenizer.encode(t)) for t in terms) if p]
        if ids:
            need = sum(len(p) for p in ids) + 1  # + EOS
            mask = torch.ones(1, len(src) + 1, dtype=torch.bool)  # the source and its EOS
            room = int(max_output_lengths(mask, self.settings.max_len_a, self.settings.max_len_b,
                                          decoder_length_cap(self.model))[0])
            if need > room:
                raise UserError(f"its glossary terms take {need - 1} target pieces, and its "
                                f"translation may hold {room - 1} (with EOS, the maximum "
                                f"output length {room})")
        return ids

    def detokenize(self, tokens: Sequence[int]) -> str:
        # A decoded piece could hold a newline; one output line per input line is the contract.
        return self.tgt_tokenizer.decode(tokens).replace("\n", " ")

    # --- translation -------------------------------------------------------------------------
    def _settings(self, nbest: int, attention: AttentionRequest | None) -> SearchSettings:
        """This translator's settings with one call's n-best size and kept attention."""
        s = self.settings
        if (nbest, attention) == (s.nbest, s.attention):
            return s
        return replace(s, nbest=nbest, attention=attention)

    def search(self, sources: Sequence[Sequence[int]], nbest: int = 1, progress: bool = False,
               attention: AttentionRequest | None = None,
               constraint: ConstraintFactory | None = None,
               phrases: Sequence[Phrases] | None = None) -> list[list[Hypothesis]]:
        """Token ids in, hypotheses out (input order); an empty source gives one empty
        hypothesis with score 0 without running the model. `attention`: keep the weights the
        search used (`Hypothesis.attention`). `constraint`: limit what the search may write
        (its indices are into `sources`). `phrases`: per source, the target phrases its
        translation must contain (`phrases()` makes them from a glossary)."""
        return search_batched(self.model, sources, self._settings(nbest, attention), self.bf16,
                              progress, constraint, phrases,
                              None if phrases is None else self.word_continuations())

    def engine(self, nbest: int = 1, attention: AttentionRequest | None = None,
               lexical: bool = False) -> SearchEngine:
        """A decoding engine with this translator's model and search settings (`aiayn serve`
        keeps one per search setting): token ids in (`prepare`), hypotheses out as each
        sentence finishes; `lexical`: each sentence submitted with its target phrases."""
        return SearchEngine(self.model, self._settings(nbest, attention), self.bf16,
                            lexical=lexical,
                            continues=self.word_continuations() if lexical else None)

    def word_continuations(self) -> torch.Tensor:
        """(V,) bool: the target pieces that continue a word (no sentencepiece word-start
        mark, a letter or digit first), which a glossary term may not be followed by: its
        word ends with it. Computed once."""
        if self._continues is None:
            tok = self.tgt_tokenizer
            flags = []
            for i in range(tok.vocab_size):
                piece = tok.id_to_piece(i)
                flags.append(not piece.startswith("\u2581") and piece[:1].isalnum()
                             and not (piece.startswith("<") and piece.endswith(">")))
            self._continues = torch.tensor(flags, dtype=torch.bool)
        return self._continues

    def stream(self, groups: Iterable[list[str]], nbest: int = 1,
               glossary: Glossary | None = None
               ) -> Iterator[list[tuple[int, list[Hypothesis]]]]:
        """Translate lines as they come, through one `SearchEngine` for the whole input: yields,
        whenever some are ready, the next lines' (0-based index, hypotheses best first) in input
        order, each as soon as it and every line before it are done (a blank line: one empty
        hypothesis). `groups` yields lists of lines (`aiayn.commands.common.input_groups`); a
        background thread reads them, at most two groups ahead, so the search goes on decoding
        while the input is slow, and only waits for input when it has nothing to decode: a
        program that sends a line and waits gets its translation. Within a group, lines join
        the search longest first. A reading error (bad UTF-8, say) is raised here, after the
        lines before it. `glossary`: each line's translation holds the target terms of the
        source terms it contains (`phrases`)."""
        engine = self.engine(nbest, lexical=glossary is not None)
        inbox: queue.Queue = queue.Queue(maxsize=2)
        end = object()

        def read() -> None:
            try:
                for group in groups:
                    inbox.put(group)
                inbox.put(end)
            except BaseException as e:  # handed to the consumer, raised there
                inbox.put(e)

        threading.Thread(target=read, name="aiayn-input", daemon=True).start()
        n_read, failure = 0, None

        def feed(idle: bool) -> bool:
            """Take what input there is, waiting for it only with nothing to decode."""
            nonlocal n_read, failure
            while True:
                try:
                    item = inbox.get(block=idle)
                except queue.Empty:
                    return True
                if item is end:
                    return False
                if isinstance(item, BaseException):  # raised once the lines before it are out
                    failure = item
                    return False
                sources = self.prepare(item, first_line=n_read + 1)
                phrases = (None if glossary is None
                           else self.phrases(item, sources, glossary, n_read + 1))
                for i in sorted(range(len(sources)), key=lambda i: -len(sources[i])):
                    engine.submit(n_read + i, sources[i], None if phrases is None else phrases[i])
                n_read += len(sources)
                idle = not engine.busy

        done: dict[int, list[Hypothesis]] = {}
        n_out = 0
        for finished in engine.run(feed):
            done.update(finished)
            ready = []
            while n_out in done:
                ready.append((n_out, done.pop(n_out)))
                n_out += 1
            if ready:
                yield ready
        if failure is not None:
            raise failure

    def translate(self, lines: Sequence[str], progress: bool = False, first_line: int = 1,
                  constraint: ConstraintFactory | None = None,
                  glossary: Glossary | None = None) -> list[str]:
        """One translation per line, in order (the best hypothesis; empty if none was found).
        `constraint`: as for `search`, indices into `lines`; `glossary`: the target terms of
        the source terms a line contains are in its translation (`phrases`)."""
        found = self.hypotheses(lines, 1, progress, first_line, constraint, glossary)
        return [self.detokenize(h[0].tokens) if h else "" for h in found]

    def hypotheses(self, lines: Sequence[str], nbest: int = 1, progress: bool = False,
                   first_line: int = 1, constraint: ConstraintFactory | None = None,
                   glossary: Glossary | None = None) -> list[list[Hypothesis]]:
        """`search` over lines of text (`prepare`), with a glossary's phrases when given."""
        sources = self.prepare(lines, first_line)
        phrases = None if glossary is None else self.phrases(lines, sources, glossary, first_line)
        return self.search(sources, nbest, progress, constraint=constraint, phrases=phrases)

    def translate_nbest(self, lines: Sequence[str], nbest: int, progress: bool = False,
                        first_line: int = 1, glossary: Glossary | None = None
                        ) -> list[list[tuple[float, str]]]:
        """Per line, up to `nbest` (score, text) pairs, best first."""
        found = self.hypotheses(lines, nbest, progress, first_line, glossary=glossary)
        return [[(h.score, self.detokenize(h.tokens)) for h in hyps] for hyps in found]

    def align(self, lines: Sequence[str], layer: int = -1, head: int | None = None,
              unit: Unit = "word", progress: bool = False, first_line: int = 1
              ) -> list[SentenceAlignment]:
        """Translate each line (best hypothesis, as `translate`) and return it with the
        encoder-decoder attention the search used and the word alignment taken from it
        (`aiayn.decoding.alignment`): decoder layer `layer` (0-based, negative from the top;
        default the last), head `head` (0-based) or None for the mean of all heads.

            a = tr.align(["A dog runs."])[0]
            a.translation, a.src_pieces, a.tgt_pieces   # text, S and T piece strings
            a.attention                                  # (T, S) numpy, rows sum to 1
            a.pairs, a.format("hard")                    # [(0, 0), ...], "0-0 1-1 ..."
        """
        return [a for a, _ in self.align_hypotheses(lines, layer, head, unit, progress,
                                                     first_line)]

    def align_hypotheses(self, lines: Sequence[str], layer: int = -1, head: int | None = None,
                         unit: Unit = "word", progress: bool = False, first_line: int = 1
                         ) -> list[tuple[SentenceAlignment, Hypothesis | None]]:
        """`align`'s alignments, each with the hypothesis it was taken from (None when the
        search found none): `aiayn translate --alignment --format jsonl` adds its scores."""
        request = self.attention_request(layer, head, unit)
        sources = self.prepare(lines, first_line)
        found = self.search(sources, 1, progress, attention=request)
        out = []
        for line, src, hyps in zip(lines, sources, found):
            hyp = hyps[0] if hyps else None
            out.append((self.alignment(line, src, hyp, request, unit), hyp))
        return out

    def attention_request(self, layer: int = -1, head: int | None = None, unit: Unit = "word"
                          ) -> AttentionRequest:
        """What a search keeps for `alignment`: one decoder layer (0-based, negative from the
        top), one head or the mean of all heads; a bad index or unit is one line."""
        if unit not in ("word", "piece"):
            raise UserError(f"alignment unit must be 'word' or 'piece', got {unit!r}")
        n_layers, n_heads = decoder_heads(self.model)
        try:
            layer = check_index(layer, n_layers, "layer")
            if head is not None:
                head = check_index(head, n_heads, "head")
        except ValueError as e:
            raise UserError(str(e)) from None
        return AttentionRequest(layers=(layer,), heads=None if head is None else (head,),
                                mean_heads=True)

    def alignment(self, line: str, src: Sequence[int], hyp: Hypothesis | None,
                  request: AttentionRequest, unit: Unit = "word") -> SentenceAlignment:
        """The translation `hyp` of `line` (source ids `src`), found by a search that kept the
        attention `request` asks for, with that attention and the word alignment taken from it
        (`aiayn.decoding.alignment`). `aiayn translate --alignment` and `aiayn serve` both make
        their alignments here."""
        layer, head = request.layers[0], None if request.heads is None else request.heads[0]
        if not src or hyp is None or hyp.attention is None:  # blank line: nothing was translated
            return SentenceAlignment.build(line, "", [], [], np.zeros((0, 0), np.float32), layer,
                                           head, unit)
        src_pieces = [self.src_tokenizer.id_to_piece(i) for i in src] + [EOS_PIECE]
        tgt_pieces = [self.tgt_tokenizer.id_to_piece(i) for i in hyp.tokens]
        tgt_pieces += [EOS_PIECE] if hyp.complete else []
        attn = hyp.attention[0, 0].cpu().numpy()  # (T, S)
        return SentenceAlignment.build(line, self.detokenize(hyp.tokens), src_pieces, tgt_pieces,
                                       attn, layer, head, unit)


def translate_settling(translator: Translator, line: str,
                       on_settled: Callable[[list[int]], None],
                       glossary: Glossary | None = None, first_line: int = 1
                       ) -> list[Hypothesis]:
    """Translate one line through an engine of its own (`SearchEngine.run`), calling
    `on_settled(pieces)` each time the settled prefix of its translation grows (after a step,
    `SearchEngine.settled`: the pieces its final best translation is sure to start with); the
    line's hypotheses, best first, as `Translator.hypotheses` finds them (`glossary`: its
    phrases; `first_line`: the line's number in messages)."""
    sources = translator.prepare([line], first_line)
    phrases = (None if glossary is None
               else translator.phrases([line], sources, glossary, first_line)[0])
    engine = translator.engine(1, lexical=glossary is not None)

    def feed(idle: bool) -> bool:
        engine.submit(0, sources[0], phrases)
        return False

    found: list[Hypothesis] = []
    shown = 0
    for finished in engine.run(feed):
        for _, hyps in finished:
            found = hyps
        for _, prefix in engine.settled():
            if len(prefix) > shown:
                shown = len(prefix)
                on_settled(list(prefix))
    return found


def format_nbest(index: int, entries: Sequence[tuple[float, str]]) -> Iterator[str]:
    """n-best lines `index<TAB>score<TAB>text` (no newline): index is the 0-based input line,
    score the search score (log-probability / length penalty; higher is better)."""
    for score, text in entries:
        yield f"{index}\t{score:.6f}\t{text}"


def confidence(hyp: Hypothesis) -> dict[str, Any]:
    """What the search knows of its confidence in `hyp`, JSON-ready (`aiayn translate --format
    jsonl`, `aiayn serve`'s `"scores": true`):

    - `score`: the score the beam ranked it by, logprob / lp(|Y|) (§6.1's GNMT length penalty,
      `aiayn.decoding.common.length_penalty`; plain logprob for greedy search, alpha 0);
    - `logprob`: log P(Y | X), the sum of the per-token log-probabilities, EOS's included;
    - `token_probs`: p(y_t | y_<t, X) of every generated piece, in output order, EOS's last when
      the hypothesis is complete: the float32 log-probabilities the search computed and kept
      for this hypothesis (`Hypothesis.token_logprobs`), exponentiated in float32.
    A blank line's empty hypothesis has score 0, logprob 0 and no token."""
    probs = np.exp(np.asarray(hyp.token_logprobs, dtype=np.float32))
    return {"score": float(hyp.score), "logprob": float(hyp.logprob),
            "token_probs": probs.tolist()}
