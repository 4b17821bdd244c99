"""The model side of the server: `aiayn translate`'s own `Translator`, shared by every request.

Text goes through exactly the code `aiayn translate` runs (`Translator.prepare` to token ids,
the decoding engine of `Translator.engine`, `Translator.detokenize`), so a sentence served over
HTTP gets the same translation as the same line given to `aiayn translate` with the same search
settings. `aiayn serve` builds that translator from its arguments as `aiayn translate` does
(`aiayn.commands.common.translator_from_args`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from aiayn.decoding.common import Hypothesis
from aiayn.decoding.engine import SearchEngine
from aiayn.decoding.glossary import Glossary
from aiayn.decoding.translate import Translator
from aiayn.model.counting import count_parameters


@dataclass(frozen=True)
class SearchKey:
    """The search settings a batch shares: requests with different keys never share a search."""

    beam_size: int
    alpha: float
    nbest: int
    alignment: bool = False  # keep the attention behind the best translation (`ServedModel.attention`)
    # a lexically constrained search: each sentence with its glossary's phrases (`phrases`); a
    # request without any never shares it, so its search stays the paper's
    glossary: bool = False


@dataclass(frozen=True)
class Attention:
    """Cross-attention of one translation: `weights[t][s]`, target piece t (EOS last) over
    source piece s (EOS last); each row sums to 1."""

    src_pieces: list[str]
    tgt_pieces: list[str]
    weights: list[list[float]]
    alignment: str = ""  # Pharaoh pairs "i-j ..." of source and target words, 0-based


class ServedModel:
    """What the server serves: `base`, a `Translator` over a loaded model (one model or an
    ensemble, `aiayn.decoding.ensemble.load_models`), and its variants, one per beam size and
    alpha asked for (`Translator.with_settings`); they share the model (converted once, to the
    base's precision), its limits and its other search settings (`early_stop`, the room).
    `prepare` runs on the event loop, the search engines on the model worker thread only."""

    def __init__(self, base: Translator, model_paths: Sequence[str] | None = None):
        self.base = base
        self.loaded = loaded = base.loaded
        # the directories as given, an ensemble's all of them (`loaded.path` is the first's)
        self.model_paths = [str(p) for p in model_paths] if model_paths else (
            [str(loaded.path)] if loaded.path else [])
        self._translators: dict[tuple[int, float], Translator] = {}
        settings = base.settings
        self.default_beam, self.default_alpha = settings.beam_size, settings.alpha
        meta = loaded.meta or {}
        self.src_lang, self.tgt_lang = meta.get("src_lang"), meta.get("tgt_lang")

    @property
    def supports_alignment(self) -> bool:
        """One model's attention: an ensemble's members attend each their own way (as `aiayn
        translate --alignment` refuses an ensemble, the server answers 501)."""
        return getattr(self.loaded.model, "members", None) is None

    def attention(self, text: str, source: Sequence[int], hyp: Hypothesis) -> Attention:
        """The cross-attention behind `hyp` (found with `SearchKey.alignment`) and its word
        alignment, made as `aiayn translate --alignment` makes them (`Translator.alignment`):
        the last decoder layer, the mean of its heads, words."""
        a = self.base.alignment(text, source, hyp, self.base.attention_request())
        return Attention(a.src_pieces, a.tgt_pieces, a.attention.tolist(), a.format("hard"))

    def prepare(self, texts: Sequence[str]) -> tuple[list[list[int]], list[str]]:
        """Token ids per text as `aiayn translate` makes them (over-long sources truncated), and
        the truncation warnings ("line N: ...", N counting texts from 1): the response's."""
        warnings: list[str] = []
        ids = self.base.prepare(texts, warn=warnings.append)
        return ids, warnings

    def phrases(self, text: str, src: Sequence[int], glossary: Glossary) -> list[list[int]]:
        """The target phrases (piece ids) of the glossary's terms found in `text` (source ids
        `src`), as `aiayn translate --glossary` makes them (`Translator.sentence_phrases`);
        UserError, one line saying why, when they take more pieces than its translation may
        hold."""
        return self.base.sentence_phrases(text, src, glossary)

    def translator(self, beam_size: int, alpha: float) -> Translator:
        """The base translator with a request's beam size and alpha (model worker thread)."""
        key = (beam_size, alpha)
        if key not in self._translators:
            self._translators[key] = self.base.with_settings(beam_size=beam_size, alpha=alpha)
        return self._translators[key]

    def search_engine(self, key: SearchKey) -> SearchEngine:
        """The decoding engine for one search setting (the model worker keeps one per key and
        feeds it every request with that key): hypotheses best first per sentence; with
        `key.alignment` each keeps the attention `attention` reads; with `key.glossary` a
        lexically constrained engine, each sentence submitted with its phrases."""
        request = self.base.attention_request() if key.alignment else None
        return self.translator(key.beam_size, key.alpha).engine(key.nbest, request,
                                                                lexical=key.glossary)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.base.detokenize(tokens)

    def src_pieces(self, ids: Sequence[int]) -> list[str]:
        tok = self.base.src_tokenizer
        return [tok.id_to_piece(i) for i in ids]

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        tok = self.base.tgt_tokenizer
        return [tok.id_to_piece(i) for i in ids]

    def info(self) -> dict:
        """Languages, model and decoding defaults, for `GET /info`."""
        cfg = self.loaded.cfg
        # an ensemble counts every member's parameters; its architecture is the first member's
        members = getattr(self.loaded.model, "members", None)
        member_cfgs = [m.cfg for m in members] if members else [cfg]
        meta = self.loaded.meta or {}
        arch = ("vocab_size", "tgt_vocab_size", "n_layers", "d_model", "d_ff", "n_heads", "d_k",
                "d_v", "positions", "norm", "tie_embeddings", "tie_output")
        config, settings = asdict(cfg), self.base.settings
        return {
            "source_language": self.src_lang,
            "target_language": self.tgt_lang,
            "model": self.model_paths[0] if self.model_paths else None,
            "models": self.model_paths,
            "preset": meta.get("preset"),
            "step": meta.get("step"),
            "parameters": sum(count_parameters(c) for c in member_cfgs),
            "architecture": {k: config[k] for k in arch if k in config},
            "decoding": {"beam_size": settings.beam_size, "alpha": settings.alpha,
                         "max_len_a": settings.max_len_a, "max_len_b": settings.max_len_b,
                         "max_src_tokens": self.base.max_src_tokens,
                         "precision": self.base.precision,
                         "early_stop": settings.early_stop},
            "alignment": self.supports_alignment,
        }
