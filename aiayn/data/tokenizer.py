"""The subword vocabulary: byte-pair encoding shared by source and target (§5.1, §3.4).

We use sentencepiece: one self-contained model file holds the whole tokenizer; it treats whitespace
as an ordinary symbol ("▁"), so text -> ids -> text round-trips exactly; and it needs no
language-specific pre-tokenization (no Moses tokenizer, no detokenizer after decoding).

Settings chosen for exact round trips of ordinary text:
- `normalization_rule_name="identity"`, `remove_extra_whitespaces=False`: sentencepiece's default
  NFKC normalisation and whitespace collapsing would change the text;
- `character_coverage=1.0`: every character seen in training gets a piece;
- `byte_fallback=True` for BPE and unigram models: a character never seen in training is spelled as
  its UTF-8 bytes (256 reserved pieces) rather than becoming UNK. Character and word models leave it
  off by default (it would add 256 pieces to a vocabulary of a few dozen characters); for them an
  unseen character decodes as UNK's surface " ⁇ ".

Special ids are fixed project-wide (defined in `aiayn.special`, re-exported here): PAD_ID=0,
UNK_ID=1, BOS_ID=2, EOS_ID=3. Encoded sequences hold subword ids only; adding BOS/EOS is the
batcher's job. `decode` drops PAD, BOS and EOS.
"""

from __future__ import annotations

import io
import itertools
import re
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm

from aiayn.errors import UserError
from aiayn.files import atomic_write
from aiayn.special import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__all__ = ["PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "Tokenizer", "train_tokenizers", "MODEL_TYPES"]

SPECIAL_IDS = frozenset({PAD_ID, BOS_ID, EOS_ID})  # dropped by decode; UNK keeps its surface
MODEL_TYPES = ("bpe", "unigram", "char", "word")


def _friendly_train_error(e: RuntimeError, vocab_size: int) -> UserError | None:
    """Turn sentencepiece's vocabulary-size complaints into advice; None for anything else."""
    msg = str(e)
    m = re.search(r"Please set it to a value <= (\d+)", msg)
    if m:
        return UserError(
            f"vocabulary size {vocab_size} is too large for this corpus: sentencepiece can build at "
            f"most {m.group(1)} pieces from it; pass --vocab-size {m.group(1)} or less"
        )
    m = re.search(r"smaller than required_chars\. (\d+) vs (\d+)", msg)
    if m:
        return UserError(
            f"vocabulary size {vocab_size} is too small: the corpus's characters, the special tokens"
            f" and the byte-fallback pieces need {m.group(2)}; pass --vocab-size {m.group(2)} or more"
        )
    return None


class Tokenizer:
    """A sentencepiece model with the project's special ids. Construct with `train` or `load`."""

    def __init__(self, model_proto: bytes, path: Path | None = None):
        self._proto = bytes(model_proto)
        self.path = path
        try:
            self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        except RuntimeError as e:
            raise UserError(f"{path or 'tokenizer'}: not a sentencepiece model ({e})") from None
        specials = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if specials != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise UserError(
                f"{path or 'tokenizer'}: special ids (pad, unk, bos, eos) are {specials}, "
                f"expected {(PAD_ID, UNK_ID, BOS_ID, EOS_ID)}; train it with aiayn prepare"
            )

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        model_type: str = "bpe",
        path: str | Path | None = None,
        *,
        byte_fallback: bool | None = None,
        character_coverage: float = 1.0,
        num_threads: int = 4,
    ) -> Tokenizer:
        """Learn a vocabulary of `vocab_size` pieces (specials included) from `texts`, in memory;
        if `path` is given, save the model there atomically. `byte_fallback=None` means on for
        "bpe"/"unigram", off for "char"/"word" (see the module docstring)."""
        if model_type not in MODEL_TYPES:
            raise UserError(f"unknown tokenizer model type {model_type!r}; "
                            f"choose one of {', '.join(MODEL_TYPES)}")
        if vocab_size < 5:
            raise UserError(f"vocabulary size {vocab_size} is too small (4 ids are reserved for specials)")
        if byte_fallback is None:
            byte_fallback = model_type in ("bpe", "unigram")
        # Newlines would split a sentence in two inside sentencepiece's trainer; blank lines teach it nothing.
        sentences = (t for t in texts if t and not t.isspace())
        first = next(sentences, None)
        if first is None:
            raise UserError("cannot learn a vocabulary from empty training text")

        def all_sentences():
            yield first
            yield from sentences

        model = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=all_sentences(),
                model_writer=model,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                byte_fallback=byte_fallback,
                normalization_rule_name="identity",
                remove_extra_whitespaces=False,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                num_threads=num_threads,
                minloglevel=2,  # warnings and errors only: no per-iteration log spam
            )
        except RuntimeError as e:
            friendly = _friendly_train_error(e, vocab_size)
            if friendly is None:
                raise
            raise friendly from None
        tok = cls(model.getvalue())
        if path is not None:
            tok.save(path)
        return tok

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        p = Path(path)
        try:
            proto = p.read_bytes()
        except FileNotFoundError:
            raise UserError(f"{p}: no such tokenizer model") from None
        except IsADirectoryError:
            raise UserError(f"{p}: is a directory, expected a sentencepiece model") from None
        return cls(proto, p)

    def save(self, path: str | Path) -> None:
        with atomic_write(path, "wb") as f:
            f.write(self._proto)
        self.path = Path(path)

    # --- use ----------------------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def model_proto(self) -> bytes:
        return self._proto

    def encode(self, text: str) -> list[int]:
        """Subword ids of `text`, no BOS/EOS."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str], num_threads: int = 4) -> list[list[int]]:
        return self._sp.encode(list(texts), out_type=int, num_threads=num_threads)

    def pieces(self) -> list[tuple[str, float, bool]]:
        """(piece, score, normal) for every id: `normal` is False for specials, UNK, byte-fallback
        and unused pieces. For BPE the score orders the merges (higher merges first)."""
        sp = self._sp
        return [(sp.id_to_piece(i), sp.get_score(i),
                 not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i) or sp.is_unused(i)))
                for i in range(sp.get_piece_size())]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of `ids`; PAD, BOS and EOS are dropped wherever they occur."""
        return self._sp.decode([int(i) for i in ids if int(i) not in SPECIAL_IDS])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(int(i))

    def piece_to_id(self, piece: str) -> int:
        return self._sp.piece_to_id(piece)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self._proto == other._proto

    def __hash__(self) -> int:
        return hash(self._proto)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, path={str(self.path) if self.path else None!r})"

    def __getstate__(self) -> dict:
        return {"proto": self._proto, "path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["proto"], state["path"])


def train_tokenizers(
    src_texts: Sequence[str],
    tgt_texts: Sequence[str],
    vocab_size: int,
    model_type: str = "bpe",
    separate: bool = False,
    tgt_vocab_size: int | None = None,
    tgt_model_type: str | None = None,
    **kwargs,
) -> tuple[Tokenizer, Tokenizer]:
    """(source, target) tokenizers: one shared model learned on both sides (§3.4; the same object
    twice), or with `separate` one per side (`tgt_vocab_size` and `tgt_model_type` default to the
    source's; e.g. characters in, phoneme symbols out for grapheme-to-phoneme)."""
    if not separate:
        tok = Tokenizer.train(itertools.chain(src_texts, tgt_texts), vocab_size, model_type, **kwargs)
        return tok, tok
    src = Tokenizer.train(src_texts, vocab_size, model_type, **kwargs)
    tgt_type = tgt_model_type or model_type
    tgt_kwargs = dict(kwargs)
    if tgt_type != model_type:
        tgt_kwargs["byte_fallback"] = None  # that model type's own default
    tgt = Tokenizer.train(tgt_texts, tgt_vocab_size or vocab_size, tgt_type, **tgt_kwargs)
    return src, tgt
