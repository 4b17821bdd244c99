"""The HTTP API (FastAPI on uvicorn): `POST /translate`, `GET /health`, `/info`, `/metrics`, and the
web page at `/`. docs/guides/serving.md documents every request and response.

The event loop only parses, tokenizes and answers; beam search runs on the batcher's model worker
thread (`aiayn.serving.batcher`). Every refusal is a JSON object with one line,
`{"error": "..."}`, and a 4xx status (503 when the queue is full, 504 after the request timeout);
a client that goes away before its answer loses its place in the queue.

`"stream": true` answers as server-sent events (`stream_events`): each text's settled prefix
(`event: prefix`) whenever it grows, then `event: done` with the JSON of the plain response. A
refusal before the stream starts is the usual JSON 4xx; a failure after it (the timeout, a
shutdown) is one `event: error` with the one-line `{"error": ...}`.

`"glossary"`: each text's target phrases come from `Translator.phrases` (a text whose terms
cannot fit its translation is a 400 naming it), and a request with any goes to a lexically
constrained engine of its own (`SearchKey.glossary`); a request with none is searched exactly as
without a glossary. `"format": "document"`: each text a document (aiayn/serving/documents.py),
its sentences one job like any other.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from aiayn.decoding.documents import DEFAULT_LANGUAGE
from aiayn.decoding.glossary import Glossary
from aiayn.decoding.translate import confidence
from aiayn.errors import UserError
from aiayn.serving.batcher import Batcher, Job, QueueFull, ShuttingDown
from aiayn.serving.documents import Documents, join_documents, split_documents
from aiayn.serving.metrics import Metrics
from aiayn.serving.model import SearchKey, ServedModel
from aiayn.serving.schema import RequestError, TranslateRequest, decode_json, parse_translate
from aiayn.serving.settings import ServeSettings

log = logging.getLogger("aiayn.serve")

PATHS = ("/", "/health", "/info", "/metrics", "/translate")
REASONS = {400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "bad_method",
           413: "too_large", 499: "disconnected", 501: "unsupported", 503: "unavailable",
           504: "timeout"}
# The page may talk to this server only: no other origin, no CDN (enforced by the browser).
PAGE_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
            "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'")


def page_html() -> str:
    return resources.files("aiayn.serving").joinpath("page.html").read_text(encoding="utf-8")


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class CountRequests:
    """ASGI middleware: every HTTP answer counted by path (known paths only) and status."""

    def __init__(self, app: Any, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"] if scope["path"] in PATHS else "other"
        code = [500]

        async def send_counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                code[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            self.metrics.requests.labels(path, str(code[0])).inc()


def key_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison (`hmac.compare_digest`), so response times do not reveal how much
    of a guessed key is right."""
    return given is not None and hmac.compare_digest(given.encode("utf-8"), expected.encode("utf-8"))


def header_key(request: Request) -> str | None:
    """The key from `X-API-Key: KEY` or `Authorization: Bearer KEY`."""
    if "x-api-key" in request.headers:
        return request.headers["x-api-key"]
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) more than `limit` bytes without reading them all."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise RequestError(400, f"bad Content-Length {declared!r}")
        if int(declared) > limit:
            raise RequestError(413, f"request body of {declared} bytes; the limit is {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"request body over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def _client_gone(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def wait_for(request: Request, batcher: Batcher, job: Job, timeout: float) -> Any:
    """The job's result; a timeout (504) or a client that leaves (499) takes the job off the queue."""
    result = asyncio.wrap_future(job.future)
    gone = asyncio.ensure_future(_client_gone(request))
    try:
        done, _ = await asyncio.wait({result, gone}, timeout=max(timeout, 0.0),
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if result in done:
        try:
            return result.result()
        except ShuttingDown as e:
            raise RequestError(503, str(e)) from None
    batcher.cancel(job)
    result.cancel()
    if gone in done:
        raise RequestError(499, "the client closed the connection")
    raise RequestError(504, f"no answer within the request timeout of {timeout:g} s")


def create_app(served: ServedModel, settings: ServeSettings = ServeSettings(),
               api_key: str | None = None) -> FastAPI:
    """The server's ASGI app around a `ServedModel`. Its lifespan starts and stops the model
    worker (TestClient and uvicorn both run it). `api_key`: when given, /translate and /metrics
    need it (header or the body's `api_key`)."""
    batcher = Batcher(served.search_engine, max_wait=settings.max_wait_ms / 1000,
                      max_queue=settings.max_queue)
    metrics = Metrics(lambda: batcher.pending)
    batcher.on_batch = metrics.observe_batch
    info = {**served.info(), "limits": {
        "max_chars": settings.max_chars, "max_sentences": settings.max_sentences,
        "max_queue": settings.max_queue, "timeout_s": settings.timeout_s,
        "max_beam": settings.max_beam, "batch_tokens": settings.batch_tokens,
        "max_wait_ms": settings.max_wait_ms}, "api_key_required": api_key is not None}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        try:
            yield
        finally:
            await asyncio.to_thread(batcher.stop)

    # No /docs or /redoc: their pages load scripts from a CDN. /openapi.json stays.
    app = FastAPI(title="aiayn translation server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher, app.state.metrics, app.state.served = batcher, metrics, served
    app.add_middleware(CountRequests, metrics=metrics)

    @app.exception_handler(RequestError)
    async def refused(request: Request, e: RequestError) -> JSONResponse:
        metrics.errors.labels(REASONS.get(e.status, str(e.status))).inc()
        return error_response(e.status, e.message, e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        metrics.errors.labels(REASONS.get(e.status_code, str(e.status_code))).inc()
        return error_response(e.status_code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        log.exception("internal error on %s %s", request.method, request.url.path)
        metrics.errors.labels("internal").inc()
        return error_response(500, f"internal error: {type(e).__name__}")

    def check_key(given: str | None) -> None:
        if api_key is not None and not key_matches(given, api_key):
            raise RequestError(401, "missing or wrong API key (send X-API-Key or "
                                    "Authorization: Bearer)", {"WWW-Authenticate": "Bearer"})

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(page_html(), headers={"Content-Security-Policy": PAGE_CSP})

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "queue_sentences": batcher.pending}

    @app.get("/info")
    async def get_info() -> dict:
        return info

    @app.get("/metrics")
    async def get_metrics(request: Request) -> Response:
        check_key(header_key(request))
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/translate", openapi_extra={"requestBody": {"required": True, "content": {
        "application/json": {"schema": TranslateRequest.model_json_schema()}}}})
    async def translate(request: Request) -> JSONResponse:
        start = time.perf_counter()
        obj = decode_json(await read_body(request, settings.max_body_bytes))
        if api_key is not None:
            given = header_key(request)
            if given is None and isinstance(obj, dict) and isinstance(obj.get("api_key"), str):
                given = obj["api_key"]
            check_key(given)
        req = parse_translate(obj, settings, served.default_beam)
        check_languages(served, req)
        if req.alignment and not served.supports_alignment:
            raise RequestError(501, "alignment: this server serves an ensemble, whose members "
                                    "attend each their own way; serve one model for alignments")
        texts = req.texts
        docs: Documents | None = None
        if req.document:
            docs = split_documents(served.base, texts, sentence_language(served, req))
            if len(docs.sentences) > settings.max_queue:
                raise RequestError(413, f"q: {len(docs.sentences)} sentences in the documents; "
                                        f"this server takes at most {settings.max_queue} per "
                                        f"request")
            ids, warnings = [s.ids for s in docs.sentences], []
        else:
            ids, warnings = served.prepare(texts)
        phrases = glossary_phrases(served, req, texts, ids, docs)
        key = SearchKey(req.beam_size or served.default_beam,
                        served.default_alpha if req.alpha is None else float(req.alpha), req.nbest,
                        req.alignment, glossary=phrases is not None)
        prefixes: asyncio.Queue | None = None
        on_prefix = None
        if req.stream:
            prefixes, loop = asyncio.Queue(), asyncio.get_running_loop()

            def on_prefix(i: int, tokens: list) -> None:  # the model worker's thread
                loop.call_soon_threadsafe(prefixes.put_nowait, (i, tokens))
        try:
            job = batcher.submit(key, ids, on_prefix, phrases)
        except QueueFull as e:
            raise RequestError(503, f"busy: {e}; retry later",
                               {"Retry-After": str(settings.retry_after_s)}) from None
        except ShuttingDown as e:
            raise RequestError(503, str(e)) from None

        def answer(found: list) -> dict[str, Any]:
            body = (response_body(served, req, ids, found, warnings) if docs is None
                    else document_body(served, req, docs, found))
            metrics.latency.observe(time.perf_counter() - start)
            return body

        if prefixes is not None:
            left = settings.timeout_s - (time.perf_counter() - start)
            return StreamingResponse(
                stream_events(served, batcher, job, prefixes, left, settings.timeout_s, answer),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        found = await wait_for(request, batcher, job, settings.timeout_s - (time.perf_counter() - start))
        return JSONResponse(answer(found))

    return app


def response_body(served: ServedModel, req: TranslateRequest, ids: list[list[int]], found: list,
                  warnings: list[str]) -> dict[str, Any]:
    """The JSON of a `/translate` answer (streamed or not) from each text's hypotheses."""
    items = [translation_item(served, text, src, hyps, req.alignment, req.scores)
             for text, src, hyps in zip(req.texts, ids, found)]
    body: dict[str, Any] = {
        "translatedText": items[0]["tgt"] if isinstance(req.q, str) else [i["tgt"] for i in items],
        "translations": items}
    if warnings:
        body["warnings"] = warnings
    return body


def document_body(served: ServedModel, req: TranslateRequest, docs: Documents, found: list
                  ) -> dict[str, Any]:
    """The JSON of a `"format": "document"` answer: per document its translation and its
    sentences, each as a text's entry of `response_body` with the `line` it is on (0-based)."""
    items = [translation_item(served, s.text, s.ids, hyps, False, req.scores)
             for s, hyps in zip(docs.sentences, found)]
    joined = join_documents(docs, [item["tgt"] for item in items])
    entries: list[dict[str, Any]] = [{"src": text, "tgt": tgt, "sentences": []}
                                     for text, tgt in zip(req.texts, joined)]
    for s, item in zip(docs.sentences, items):
        entries[s.document]["sentences"].append({"line": s.line, **item})
    return {"translatedText": joined[0] if isinstance(req.q, str) else joined,
            "translations": entries}


def sentence_language(served: ServedModel, req: TranslateRequest) -> str:
    """The language whose rules split documents into sentences: the request's `source`, else
    the model's source language, else sentencex's default (as `aiayn translate --documents`)."""
    asked = None if req.source in (None, "auto") else req.source
    return asked or served.src_lang or DEFAULT_LANGUAGE


def glossary_phrases(served: ServedModel, req: TranslateRequest, texts: list[str],
                     ids: list[list[int]], docs: Documents | None) -> list | None:
    """Per sentence searched, the glossary's target phrases (`ServedModel.phrases`), or None
    when no sentence has any: then the search is the paper's, exactly as without a glossary.
    A sentence whose terms cannot fit its translation is a 400 naming its text (and line)."""
    pairs = req.glossary_pairs
    if not pairs:
        return None
    glossary = Glossary.of(pairs)
    if docs is None:
        units = [(text, src, f"q[{i}]") for i, (text, src) in enumerate(zip(texts, ids))]
    else:
        units = [(s.text, s.ids, f"q[{s.document}] line {s.line + 1}") for s in docs.sentences]
    phrases = []
    for text, src, where in units:
        try:
            phrases.append(served.phrases(text, src, glossary))
        except UserError as e:
            raise RequestError(400, f"{where}: {e}") from None
    return phrases if any(phrases) else None


def sse(event: str, data: dict) -> str:
    """One server-sent event: its name and one line of JSON."""
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def stream_events(served: ServedModel, batcher: Batcher, job: Job, prefixes: asyncio.Queue,
                        timeout: float, limit: float, answer: Any) -> AsyncIterator[str]:
    """`"stream": true`'s events: `prefix` {"index", "text", "pieces"} whenever text `index`'s
    settled prefix grows (the detokenized settled pieces: a piece may join the next one
    differently once that is known, so the final text replaces the prefix rather than extends
    it), then `done` with the plain response's JSON, or one `error`. A client that leaves (the
    generator is closed) or the timeout (`timeout` seconds left of the request's `limit`) takes the
    job off the queue."""
    result = asyncio.wrap_future(job.future)
    deadline = time.monotonic() + timeout
    getter: asyncio.Future | None = None

    def prefix(item: tuple[int, list]) -> str:
        i, tokens = item
        return sse("prefix", {"index": i, "text": served.detokenize(tokens), "pieces": len(tokens)})

    try:
        while not result.done():
            getter = asyncio.ensure_future(prefixes.get())
            done, _ = await asyncio.wait({result, getter}, timeout=max(deadline - time.monotonic(), 0),
                                         return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                yield prefix(getter.result())
                continue
            getter.cancel()  # before the drain below: a woken getter must not take an item
            if not done:
                yield sse("error", {"error": f"no answer within the request timeout of "
                                             f"{limit:g} s"})
                return
        while not prefixes.empty():  # told before the answer came: in order, before it
            yield prefix(prefixes.get_nowait())
        try:
            found = result.result()
        except ShuttingDown as e:
            yield sse("error", {"error": str(e)})
            return
        except Exception as e:  # headers are sent: the error is the stream's last event
            log.exception("internal error in a streamed /translate")
            yield sse("error", {"error": f"internal error: {type(e).__name__}"})
            return
        yield sse("done", answer(found))
    finally:
        if getter is not None:
            getter.cancel()
        if not job.future.done():
            batcher.cancel(job)
            result.cancel()


def check_languages(served: ServedModel, req: TranslateRequest) -> None:
    """`source` and `target`, when given, must be the model's languages ('auto' for any source)."""
    for field, asked, have in (("source", req.source, served.src_lang),
                               ("target", req.target, served.tgt_lang)):
        if asked is None or (field == "source" and asked == "auto"):
            continue
        if have is not None and asked.lower() != have.lower():
            raise RequestError(400, f"{field}: this model translates {served.src_lang} -> "
                                    f"{served.tgt_lang}, not {asked!r}")


def translation_item(served: ServedModel, text: str, src: list[int], hyps: list, alignment: bool,
                     scores: bool = False) -> dict:
    """One text's answer: the best translation, its score, and the n-best list (best first);
    with `scores`, each also with its log-probability and per-piece probabilities
    (`aiayn.decoding.translate.confidence`, as `aiayn translate --format jsonl`)."""
    nbest = [{"tgt": served.detokenize(h.tokens), "score": round(float(h.score), 6)} for h in hyps]
    if scores:
        for entry, h in zip(nbest, hyps):
            c = confidence(h)
            entry.update(logprob=c["logprob"], token_probs=c["token_probs"])
    best = nbest[0] if nbest else {"tgt": "", "score": None}
    item: dict[str, Any] = {"src": text, "tgt": best["tgt"], "score": best["score"], "nbest": nbest}
    if scores:
        item["logprob"] = best.get("logprob")
        item["token_probs"] = best.get("token_probs", [])
        # the pieces the probabilities are of (EOS's has none), so a client can group them by word
        item["pieces"] = served.tgt_pieces(hyps[0].tokens) if hyps else []
    if alignment and hyps and src:
        att = served.attention(text, src, hyps[0])
        item["attention"] = {"src_pieces": att.src_pieces, "tgt_pieces": att.tgt_pieces,
                             "weights": att.weights}
        item["alignment"] = att.alignment
    return item
