"""A translation server: JSON API and one self-contained page with the cross-attention map.

The model is loaded once and used by one worker thread. Requests wait in a bounded queue (503
with Retry-After when it is full) for a bounded time (504 past it); the worker merges the
sentences of waiting requests with the same beam and alpha into one batch, drops requests that
gave up before it reached them, and survives every error of a request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field

from ..config import ConfigError
from ..data.tokenizer import EOS
from ..decode.constraints import MAX_PHRASES, ConstraintError, check_constraints
from ..decode.glossary import Glossary, GlossaryError
from ..decode.maps import attention_data
from ..decode.markup import MarkupError, MarkupLimit, parse, put_back
from ..decode.prefix import check_prefixes
from ..decode.translator import Translator
from ..version import __version__
from .batcher import Batcher, Overloaded, OverShare
from .edge import (
    BearerToken,
    BodyLimit,
    Concurrency,
    ConnectionCount,
    Limits,
    RateLimited,
    TrustedHosts,
    edge_protocol,
)
from .health import health_report, pool_report
from .pool import ModelPool, RouteError

PAGE = Path(__file__).with_name("page.html")
log = logging.getLogger("aiayn")
requests_log = logging.getLogger("aiayn.requests")  # one line a request, rate-limited (edge.RateLimited)


MAX_REQUEST_TERMS = 1000  # glossary entries one request may send


class TranslateRequest(BaseModel):
    sentences: list[str] = Field(..., description="sentences to translate, one per item")
    beam: int | None = Field(None, ge=1, description="beam size (default from the checkpoint, 4)")
    alpha: float | None = Field(None, ge=0.0, le=10.0, allow_inf_nan=False,
                                description="length penalty alpha (default 0.6)")
    alignments: bool = Field(False, description="also return word alignments (Pharaoh i-j, source word first) "
                                                "from the head `aiayn align` chose")
    markup: bool = Field(False, description="sentences carry inline tags (<b>, <a href=..>, <x id=1/>, **, `): "
                                            "translated without them, each put back around the aligned words")
    tgt: str | None = Field(None, max_length=32, description="the target language of a multilingual model "
                            "(its >>xx<< code, e.g. fra); /health lists them")
    src: str | None = Field(None, max_length=32, description="the source language, where the server holds "
                            "several models (it routes by src and tgt; /health lists the directions)")
    prefix: list[str] | None = Field(None, description="target text each translation starts with, one per "
                                      "sentence (\"\": none); the search goes on from it")
    glossary: list[list[str]] | None = Field(None, max_length=MAX_REQUEST_TERMS, description="[source term, "
                                              "target term] pairs: a sentence holding a source term (whole words, "
                                              "any case) is translated with its target term (decode/glossary.py)")
    constraints: list[list[str]] | None = Field(None, description="target terms each translation must hold, one "
                                                "list per sentence ([]: none)")
    quality: bool = Field(False, description="also each translation's confidence: mean subword log-probability, "
                                             "score, length ratio, repeats, source coverage and a flag "
                                             "(decode/quality.py)")


class TranslateResponse(BaseModel):
    translations: list[str]
    scores: list[float | None]
    alignments: list[str] | None = None
    quality: list[dict] | None = None


class AttentionRequest(BaseModel):
    sentence: str
    src: str | None = Field(None, max_length=32, description="as /translate's, where the server holds several models")
    tgt: str | None = Field(None, max_length=32, description="as /translate's")


class AttentionResponse(BaseModel):
    source_tokens: list[str]
    target_tokens: list[str]
    translation: str
    weights: list[list[float]] = Field(..., description="cross-attention (target x source), mean of layers and heads")


def check_size(limits: Limits, sentences: list[str]) -> None:
    """The request's count, characters and UTF-8, each a 4xx naming the sentence: read before
    anything else is done with the text (markup parsing, subwords)."""
    if len(sentences) > limits.max_sentences:
        raise HTTPException(413, f"too many sentences: {len(sentences)} > {limits.max_sentences} per request")
    for i, s in enumerate(sentences):
        if len(s) > limits.max_chars:
            raise HTTPException(413, f"sentence {i} has {len(s)} characters; the limit is {limits.max_chars}")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:  # a lone surrogate such as \\ud800: no text at all
            raise HTTPException(422, [{"loc": ["body", "sentences", i], "type": "unicode",
                                       "msg": f"not valid Unicode text at character {e.start}"}]) from None


def check_sentences(batcher: Batcher, limits: Limits, sentences: list[str], max_subwords: int,
                    beam: int, tgt: str | None = None, translator: Translator | None = None
                    ) -> tuple[list[list[int]], int]:
    """The edge: count, characters, UTF-8, the target language `tgt`, subwords and work per request,
    each a 4xx naming the sentence or the language; returns the subword ids the worker translates
    (tagged for `tgt`: Translator.tagged) and their work (Batcher.price) for `translator` (default
    the batcher's)."""
    translator = translator or batcher.translator
    check_size(limits, sentences)
    try:
        sentences = translator.tagged(sentences, tgt)
    except ConfigError as e:
        raise HTTPException(400, str(e)) from None
    pieces = translator.tokenizer.encode([s.strip() for s in sentences])  # not truncated, unlike encode_sources
    for i, x in enumerate(pieces):
        if len(x) > max_subwords:
            raise HTTPException(413, f"sentence {i} has {len(x)} subwords; the limit is {max_subwords}")
    ids = [x + [EOS] if x else [] for x in pieces]  # as encode_sources makes them
    work = sum(batcher.price(ids, beam, translator))
    if work > batcher.client_work:
        raise HTTPException(413, f"the request's work (beam {beam} x (subwords + output positions) = {work}) is over "
                                 f"what one client may hold, {batcher.client_work}; send fewer or shorter sentences, "
                                 "or a smaller beam")
    return ids, work


def _guard(app: FastAPI, limits: Limits) -> None:
    """The edge: body size and read time, requests at once, and 422s that name the field without
    echoing the input (it may be huge, or a NaN that JSON cannot carry)."""
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes, timeout_s=limits.read_timeout_s)
    if limits.token:
        app.add_middleware(BearerToken, token=limits.token)
    app.add_middleware(Concurrency, limit=limits.limit_concurrency)
    # outermost: a page on another site that points a name at 127.0.0.1 (DNS rebinding) sends its own Host
    app.add_middleware(TrustedHosts, allowed=list(limits.allowed_hosts))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)


async def _answer(batcher: Batcher, timeout_s: float, enqueue: Callable[[], Future],
                  request: Request | None = None) -> Any:
    """Queue work for the model and wait for it, within the request's time limit; a client that
    hangs up meanwhile (`request` disconnected, looked at twice a second) has its work dropped then,
    not at the time limit (the worker leaves a cancelled job within a few decoder steps)."""
    try:
        fut = enqueue()
    except Overloaded as e:  # 429: this client's share is full; 503: the whole queue is
        raise HTTPException(429 if isinstance(e, OverShare) else 503, str(e),
                            headers={"Retry-After": str(batcher.retry_after())}) from None
    waiting, deadline = asyncio.wrap_future(fut), time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            return await asyncio.wait_for(asyncio.shield(waiting), max(0.0, min(0.5, left)))
        except asyncio.TimeoutError:
            if left <= 0.5:
                fut.cancel()
                raise HTTPException(504, f"no answer within {timeout_s:g} s; the server is busy, retry later") from None
            if request is not None and await request.is_disconnected():
                fut.cancel()
                raise HTTPException(499, "the client hung up") from None


def create_app(served: Translator | ModelPool, limits: Limits | None = None,
               connections: ConnectionCount | None = None) -> FastAPI:
    """The app for one model, or for a pool of them (serve/pool.py: each request routed by its src
    and tgt, one worker, one queue and one set of limits for them all)."""
    limits = limits or Limits()
    app = FastAPI(title="aiayn", description="Transformer translation (Attention Is All You Need)",
                  version=__version__)
    _guard(app, limits)
    pool = served if isinstance(served, ModelPool) else None
    single = None if pool else served
    batcher = Batcher(single, limits.max_queue, max_work=limits.max_work, chunk_work=limits.chunk_work,
                      chunk_bytes=limits.chunk_bytes, client_share=limits.client_share, chunk_s=limits.chunk_s)
    app.state.batcher = batcher

    async def model(src: str | None, tgt: str | None) -> Translator:
        if pool is None:
            return single
        try:  # a first use loads the model: off the event loop
            return await asyncio.to_thread(pool.get, src, tgt)
        except RouteError as e:
            raise HTTPException(400, str(e)) from None

    def run(enqueue: Callable[[], Future], request: Request | None = None) -> Any:
        return _answer(batcher, limits.timeout_s, enqueue, request)

    @app.get("/health")
    async def health() -> dict:
        if pool is not None:
            return pool_report(pool, batcher, limits, connections)
        return health_report(single, batcher, limits, *_subword_limits(limits, single), connections)

    @app.post("/translate", response_model=TranslateResponse)
    async def translate(req: TranslateRequest, request: Request) -> TranslateResponse:
        if not req.sentences:
            raise HTTPException(400, "sentences is empty: send at least one sentence")
        return await _translated(req, request, await model(req.src, req.tgt), batcher, limits)

    @app.post("/attention", response_model=AttentionResponse)
    async def attention(req: AttentionRequest, request: Request) -> AttentionResponse:
        if not req.sentence.strip():
            raise HTTPException(400, "sentence is empty")
        t = await model(req.src, req.tgt)
        sentence = t.tagged([req.sentence], req.tgt)[0] if req.tgt else req.sentence
        _, work = check_sentences(batcher, limits, [req.sentence], _subword_limits(limits, t)[1], t.decode_cfg.beam,
                                  req.tgt, t)

        def maps() -> AttentionResponse:  # in the worker: the search (the server's own), the arrays, the lists
            data = attention_data(t.model, t.tokenizer, sentence, decode=t.decode_cfg, search=t)
            return AttentionResponse(source_tokens=data.src_tokens, target_tokens=data.tgt_out_tokens,
                                     translation=data.translation, weights=data.cross.mean((0, 1)).tolist())

        return await run(lambda: batcher.call(maps, 2 * work, _client(request)), request)  # the search, the maps

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return PAGE.read_text(encoding="utf-8")

    return app


async def _translated(req: TranslateRequest, request: Request, t: Translator, batcher: Batcher, limits: Limits
                      ) -> TranslateResponse:
    """/translate's answer from model `t`: the beam and α (the request's, `aiayn tune`'s for its
    language, the checkpoint's), markup parsed off the event loop, the edge's checks, the queue."""
    d = t.decode_cfg
    tuned_beam, tuned_alpha = t.setting_for(req.beam, req.alpha, req.tgt)
    beam = tuned_beam or d.beam
    if beam > limits.max_beam:
        raise HTTPException(413, f"beam {beam} is over the limit of {limits.max_beam}")
    trees = await asyncio.to_thread(_markup, limits, req.sentences) if req.markup else None
    plain = [p for p, _ in trees] if trees else req.sentences
    ids, _ = check_sentences(batcher, limits, plain, _subword_limits(limits, t)[0], beam, req.tgt, t)
    prefixes = _prefixes(req, ids, t, limits)
    terms = _terms(req, plain, ids, prefixes, t)
    alpha = d.alpha if tuned_alpha is None else tuned_alpha
    began = time.perf_counter()
    texts, scores, links, *signals = await _answer(batcher, limits.timeout_s, lambda: batcher.submit(
        ids, beam, alpha, _client(request), req.alignments or req.markup, t, req.quality, prefixes, terms), request)
    requests_log.info("translate from %s: %d sentence(s), %d subwords, beam %d, %.0f ms", _client(request),
                      len(ids), sum(map(len, ids)), beam, 1000 * (time.perf_counter() - began))
    if trees:
        texts = [put_back(root, text, x) for (_, root), text, x in zip(trees, texts, links)]
    return TranslateResponse(translations=texts, scores=scores, alignments=links if req.alignments else None,
                             quality=signals[0] if signals else None)


def _prefixes(req: TranslateRequest, ids: list[list[int]], t: Translator, limits: Limits) -> list[list[int]] | None:
    """The request's target prefixes as ids, one per sentence, each checked (a 4xx naming it)."""
    if req.prefix is None:
        return None
    if len(req.prefix) != len(req.sentences):
        raise HTTPException(400, f"{len(req.prefix)} prefixes for {len(req.sentences)} sentences: one each "
                                 "(\"\": none)")
    check_size(limits, req.prefix)
    forced = t.tokenizer.encode_target([p.strip() for p in req.prefix])
    try:
        check_prefixes(forced, ids, t.decode_cfg.max_len_a, t.decode_cfg.max_len_b, t.shortlist is not None)
    except ValueError as e:
        raise HTTPException(413 if "subwords" in str(e) else 400, str(e)) from None
    return forced


def _terms(req: TranslateRequest, plain: list[str], ids: list[list[int]], prefixes: list[list[int]] | None,
           t: Translator) -> list[list[list[int]]] | None:
    """The target phrases each sentence must hold (the request's glossary, else the server's, and its
    constraints), each checked: a 4xx naming the entry or the sentence."""
    if req.constraints is not None and len(req.constraints) != len(req.sentences):
        raise HTTPException(400, f"{len(req.constraints)} constraint lists for {len(req.sentences)} sentences: "
                                 "one each ([]: none)")
    if any(len(c) > MAX_PHRASES for c in req.constraints or []):
        raise HTTPException(413, f"more than {MAX_PHRASES} constraints for one sentence")
    try:
        given = None if req.glossary is None else Glossary.from_pairs(req.glossary, "glossary entry")
        terms = t.terms(plain, given, req.constraints)
        if terms is not None:
            d = t.decode_cfg
            check_constraints(terms, ids, d.max_len_a, d.max_len_b, prefixes, t.shortlist is not None, d.sample, 0)
    except (GlossaryError, ConstraintError) as e:
        raise HTTPException(413 if "subwords" in str(e) or "at most" in str(e) else 400, str(e)) from None
    return terms


def _subword_limits(limits: Limits, translator: Translator) -> tuple[int, int]:
    """Subwords per sentence a request may send to this model, and to /attention."""
    most = limits.max_subwords or max(1, min(_training_length(translator), translator.model.cfg.max_positions - 1))
    return most, min(most, limits.max_attention_subwords)


def _markup(limits: Limits, sentences: list[str]) -> list:
    """Each sentence's plain text and tag tree (decode/markup.py; linear in its length), after the
    request's size is checked, or a 400 naming the sentence (malformed), a 422 (nested past
    MAX_DEPTH, a tag past MAX_TAG)."""
    check_size(limits, sentences)
    out = []
    for i, s in enumerate(sentences):
        try:
            out.append(parse(s))
        except MarkupError as e:
            raise HTTPException(422 if isinstance(e, MarkupLimit) else 400, f"sentence {i}: {e}") from None
    return out


def _client(request: Request) -> str | None:
    """Who sent a request, for the share of the queue one client may hold: its address."""
    return request.client.host if request.client else None


def _training_length(translator: Translator) -> int:
    """Subwords per sentence the model was trained on (data.max_len less EOS), from its checkpoint."""
    return (translator.data_max_len or 1 << 30) - 1


def serving_hosts(host: str, extra: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """The Host names a server answers: the address it listens on, the loopback names, and `extra`
    (--allow-host). Listening on all interfaces (0.0.0.0, ::) names no host: clients on other
    machines need --allow-host with the name or address they use, or '*'."""
    loopback = ("localhost", "127.0.0.1", "::1")
    own = () if host in ("0.0.0.0", "::", "") else (host,)
    if not own and not extra:
        log.warning("listening on %s: only requests naming %s are answered; add --allow-host NAME for the "
                    "names other machines use (docs/serving.md)", host or "every interface", ", ".join(loopback))
    return tuple(dict.fromkeys((*own, *loopback, *extra)))


def serve(checkpoint: str | list[str], host: str = "127.0.0.1", port: int = 8000, device: str | None = None,
          limits: Limits | None = None, precision: str = "auto", compiled: bool = False,
          shortlist: str | None = None, step: str | None = None, trust_proxy: bool = False,
          max_loaded_bytes: int = 0) -> None:
    """Run the app under uvicorn with connection limits and timeouts; the open-file limit is raised
    to its hard maximum so that many connections cannot make the server unreachable. A list of
    checkpoints: one server for them all (serve/pool.py), each loaded when first asked for and the
    least recently used unloaded beyond `max_loaded_bytes` of weights."""
    import resource

    import uvicorn

    limits = limits or Limits()
    if "*" in limits.allowed_hosts:  # the default of create_app; a server names the hosts it answers to
        limits.allowed_hosts = serving_hosts(host, ())

    def load(path: str | Path) -> Translator:
        t = Translator.load(path, device=device, precision=precision, compiled=compiled, shortlist=shortlist,
                            **({"step": step} if step else {}))
        t.compile_now()  # before the first request, not during it
        return t

    served = ModelPool(checkpoint, load, max_loaded_bytes) if isinstance(checkpoint, list) else load(checkpoint)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):
            pass
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    files = 1 << 20 if files == resource.RLIM_INFINITY else files
    # Connections: room for the requests, the health checks and the process's own files, under its
    # open-file limit; above it uvicorn answers 503 and closes, so a flood cannot exhaust the files.
    connections = max(8, min(limits.limit_concurrency + 64, files - 64))
    limits.limit_concurrency = min(limits.limit_concurrency, max(1, connections - 32))
    for name in ("uvicorn.error", "uvicorn.access", "asyncio", requests_log.name, "aiayn.connections"):
        logging.getLogger(name).addFilter(RateLimited())
    log.info("serving on http://%s:%d: %d requests at once, %d connections (open-file limit %d)", host, port,
             limits.limit_concurrency, connections, files)
    count = ConnectionCount(connections, max(8, int(connections * limits.client_share)))  # an address's share
    uvicorn.run(create_app(served, limits, count), host=host, port=port, log_level="info",
                proxy_headers=trust_proxy,  # X-Forwarded-For names the client only when asked (--trust-proxy)
                limit_concurrency=connections, http=edge_protocol(count, limits.header_timeout_s),
                timeout_keep_alive=max(1, round(limits.keep_alive_s)), h11_max_incomplete_event_size=64 * 1024)
