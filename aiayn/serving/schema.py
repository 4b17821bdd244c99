"""`POST /translate` requests: bytes -> JSON -> a checked `TranslateRequest`, or a `RequestError`
whose one-line message and HTTP status the server answers with.

The request's field names follow LibreTranslate (`q`, `source`, `target`, `api_key`, `format`)
and OpenNMT-py's REST server (n-best, alignment); the search settings are the paper's names (beam
size, alpha). pydantic (FastAPI's validation library) checks the types strictly: "3" is not a
number.

`glossary` (aiayn/decoding/glossary.py): `[[source term, target term], ...]` or `{source term:
target term, ...}`, at most `MAX_GLOSSARY_ENTRIES` entries (413 above), each term a non-empty
string of one line of at most `MAX_TERM_CHARS` characters (413 above), each source term once.
`format`: "text" (each text one sentence, one line) or "document" (each text a document whose
lines are paragraphs; one translation per text, so not with `nbest` above 1, `alignment` or
`stream`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from aiayn.serving.settings import ServeSettings

MAX_GLOSSARY_ENTRIES = 1000
MAX_TERM_CHARS = 200
FORMATS = ("text", "document")


class RequestError(Exception):
    """A request the server refuses: `status` (4xx) and a one-line message."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


class TranslateRequest(BaseModel):
    """The body of `POST /translate`. `q` is one text or a list of texts, each one line (one
    sentence, as a line given to `aiayn translate`) or, with `format` "document", a document
    (its lines paragraphs); the response has the same shape. `glossary` arrives as a list or an
    object and is kept as a list of (source term, target term)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    q: StrictStr | list[StrictStr] = Field(description="a line of text, or a list of lines")
    source: StrictStr | None = Field(None, description="source language code, or 'auto'")
    target: StrictStr | None = Field(None, description="target language code")
    beam_size: StrictInt | None = Field(None, description="beam size (default: the model's)")
    alpha: float | None = Field(None, allow_inf_nan=False,
                                description="length penalty exponent (default: the model's)")
    nbest: StrictInt = Field(1, description="hypotheses returned per text, best first")
    alignment: StrictBool = Field(False, description="return cross-attention and word alignment")
    scores: StrictBool = Field(False, description="also return each translation's log-probability "
                                                  "and the probability of each of its pieces")
    stream: StrictBool = Field(False, description="answer as server-sent events: each text's "
                                                  "settled prefix as it grows, then the response")
    # a list or an object as sent; `_glossary_pairs` makes either the list of pairs kept here
    glossary: list[tuple[StrictStr, StrictStr]] | None = Field(
        None, description=f"[[source term, target term], ...] or {{source term: target term}}: "
                          f"the target term is in the translation of every text holding the "
                          f"source term as whole words; at most {MAX_GLOSSARY_ENTRIES} entries, "
                          f"{MAX_TERM_CHARS} characters a term")
    format: Literal["text", "document"] = Field(
        "text", description="'text': each text one sentence on one line; 'document': each text "
                            "a document, its lines paragraphs, split into sentences")
    api_key: StrictStr | None = Field(None, description="the API key, if not sent in a header")

    @field_validator("q", mode="before")
    @classmethod
    def _text_or_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            return v
        if not isinstance(v, list):
            raise ValueError("must be a string or a list of strings")
        for i, item in enumerate(v):
            if not isinstance(item, str):
                raise ValueError(f"item {i} is {type(item).__name__}, not a string")
        return v

    @field_validator("glossary", mode="before")
    @classmethod
    def _glossary_pairs(cls, v: Any) -> Any:
        if v is None:
            return v
        if isinstance(v, dict):
            items = [(f"entry {k[:40]!r}", (k, t)) for k, t in v.items()]
        elif isinstance(v, list):
            items = []
            for i, pair in enumerate(v):
                if not isinstance(pair, list) or len(pair) != 2:
                    raise ValueError(f"item {i} is not a [source term, target term] pair")
                items.append((f"item {i}", tuple(pair)))
        else:
            raise ValueError("must be a list of [source term, target term] pairs or an object "
                             "{source term: target term}")
        first: dict[str, str] = {}
        for where, pair in items:
            for side, term in zip(("source", "target"), pair):
                if not isinstance(term, str):
                    raise ValueError(f"{where}: the {side} term is {type(term).__name__}, not "
                                     f"a string")
                if not term.strip():
                    raise ValueError(f"{where}: the {side} term is empty")
                if "\n" in term or "\r" in term:
                    raise ValueError(f"{where}: the {side} term holds a line break")
                try:
                    term.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise ValueError(f"{where}: the {side} term is not valid Unicode (a lone "
                                     f"surrogate at character {e.start})") from None
            src = pair[0].strip()
            if src in first:
                raise ValueError(f"{where} repeats the source term {src[:40]!r} of {first[src]}")
            first[src] = where
        return [pair for _, pair in items]

    @field_validator("format", mode="before")
    @classmethod
    def _known_format(cls, v: Any) -> Any:
        if not isinstance(v, str) or v not in FORMATS:
            shown = repr(v) if isinstance(v, str) else type(v).__name__
            raise ValueError(f"must be 'text' or 'document', got {shown}")
        return v

    @property
    def texts(self) -> list[str]:
        return [self.q] if isinstance(self.q, str) else list(self.q)

    @property
    def glossary_pairs(self) -> list[tuple[str, str]]:
        """The glossary's (source term, target term) pairs, in order ([] without one)."""
        return list(self.glossary or [])

    @property
    def document(self) -> bool:
        return self.format == "document"


def decode_json(body: bytes) -> Any:
    """The request body as JSON: strict UTF-8 (RFC 8259) and nothing after the value."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RequestError(400, f"request body is not valid UTF-8 (byte {e.start})") from None
    if not text.strip():
        raise RequestError(400, "empty request body: send a JSON object such as {\"q\": \"Hello.\"}")
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise RequestError(400, f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:  # NaN / Infinity, or nested too deeply
        raise RequestError(400, f"malformed JSON: {e}") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def validation_message(e: ValidationError) -> str:
    """pydantic's first complaint as one line: `field: message`."""
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"] if p not in ("str", "list[str]"))
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:
        return f"request: {msg.replace('instance of TranslateRequest', 'object')}"
    if err["type"] == "missing":
        return f"{loc}: required (the text to translate)" if loc == "q" else f"{loc}: required"
    if err["type"] == "extra_forbidden":
        return f"{loc}: unknown field"
    return f"{loc}: {msg}"


def parse_translate(obj: Any, settings: ServeSettings, default_beam: int) -> TranslateRequest:
    """Check a decoded body against the types and the server's limits (400, or 413 when too
    large); the search settings are not looked up here beyond the default beam size."""
    try:
        req = TranslateRequest.model_validate(obj)
    except ValidationError as e:
        raise RequestError(400, validation_message(e)) from None
    texts = req.texts
    if not texts:
        raise RequestError(400, "q: empty list, nothing to translate")
    if isinstance(req.q, str) and not req.q.strip():
        raise RequestError(400, "q: empty text, nothing to translate")
    if len(texts) > settings.max_sentences:
        raise RequestError(413, f"q: {len(texts)} texts; this server takes at most "
                                f"{settings.max_sentences} per request")
    chars = sum(len(t) for t in texts)
    if chars > settings.max_chars:
        raise RequestError(413, f"q: {chars} characters; this server takes at most "
                                f"{settings.max_chars} per request")
    for i, text in enumerate(texts):
        if ("\n" in text or "\r" in text) and not req.document:
            raise RequestError(400, f"q[{i}]: a line break; send one line per text (a list for "
                                    f"several), or \"format\": \"document\" for paragraphs")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise RequestError(400, f"q[{i}]: not valid Unicode (a lone surrogate at character {e.start})") from None
    beam = default_beam if req.beam_size is None else req.beam_size
    if not 1 <= beam <= settings.max_beam:
        raise RequestError(400, f"beam_size: must be between 1 and {settings.max_beam}, got {beam}")
    if req.alpha is not None and not 0 <= req.alpha <= 10:
        raise RequestError(400, f"alpha: must be between 0 and 10, got {req.alpha}")
    if not 1 <= req.nbest <= beam:
        raise RequestError(400, f"nbest: must be between 1 and the beam size {beam}, got {req.nbest}")
    check_glossary(req.glossary_pairs)
    if req.document:  # one translation per document, answered whole
        for name, asked, why in (
                ("nbest", req.nbest > 1, "answers one translation per document"),
                ("alignment", req.alignment, "joins its sentences' translations"),
                ("stream", req.stream, "answers each document whole")):
            if asked:
                raise RequestError(400, f"{name}: not with format 'document', which {why}; "
                                        f"use format 'text' for {name}")
    return req


def check_glossary(pairs: list[tuple[str, str]]) -> None:
    """The glossary's size against the server's caps (413 above them)."""
    if len(pairs) > MAX_GLOSSARY_ENTRIES:
        raise RequestError(413, f"glossary: {len(pairs)} entries; this server takes at most "
                                f"{MAX_GLOSSARY_ENTRIES}")
    for pair in pairs:
        for term in pair:
            if len(term) > MAX_TERM_CHARS:
                raise RequestError(413, f"glossary: the term {term[:20] + '...'!r} has "
                                        f"{len(term)} characters; this server takes at most "
                                        f"{MAX_TERM_CHARS} a term")
