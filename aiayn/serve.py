"""A translation server: JSON API and one self-contained page with the cross-attention map.

The model is loaded once and used by one worker thread. Requests wait in a bounded queue (503
with Retry-After when it is full) for a bounded time (504 past it); the worker merges the
sentences of waiting requests with the same beam and alpha into one batch, drops requests that
gave up before it reached them, and survives every error of a request.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, Field

from .translate import Translator

PAGE = Path(__file__).with_name("page.html")
log = logging.getLogger("aiayn")


@dataclass
class Limits:
    max_sentences: int = 64  # per request (413 above)
    max_chars: int = 1000  # per sentence (413 above)
    max_beam: int = 16
    max_queue: int = 1024  # sentences waiting or being translated (503 above)
    timeout_s: float = 60.0  # per request, queueing included (504 past it)

    @property
    def max_body_bytes(self) -> int:
        """Room for max_sentences sentences of max_chars characters, each escaped as \\uXXXX."""
        return self.max_sentences * (6 * self.max_chars + 8) + 4096


class TranslateRequest(BaseModel):
    sentences: list[str] = Field(..., description="sentences to translate, one per item")
    beam: int | None = Field(None, ge=1, description="beam size (default from the checkpoint, 4)")
    alpha: float | None = Field(None, ge=0.0, le=10.0, allow_inf_nan=False,
                                description="length penalty alpha (default 0.6)")


class TranslateResponse(BaseModel):
    translations: list[str]
    scores: list[float | None]


class AttentionRequest(BaseModel):
    sentence: str


class AttentionResponse(BaseModel):
    source_tokens: list[str]
    target_tokens: list[str]
    translation: str
    weights: list[list[float]] = Field(..., description="cross-attention (target x source), mean of layers and heads")


class Overloaded(Exception):
    """The queue holds as many sentences as it may."""


@dataclass
class Job:
    size: int  # sentences it adds to the queue
    future: Future = field(default_factory=Future)
    sentences: list[str] = field(default_factory=list)
    options: tuple[int, float] | None = None  # (beam, alpha) of a translation
    call: Callable[[], Any] | None = None  # any other use of the model, run alone


def _complete(fut: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Set a future's outcome unless it is already settled (cancelled by a request that gave up)."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass


class Batcher:
    """One worker thread owns the model; waiting requests with the same options share a batch."""

    def __init__(self, translator: Translator, max_queue: int = 1024, max_batch: int = 256):
        self.translator = translator
        self.max_queue, self.max_batch = max_queue, max_batch
        self.jobs: queue.Queue[Job] = queue.Queue()
        self._count = threading.Lock()
        self.queued = 0  # sentences waiting or in translation
        self.rate = 20.0  # sentences per second, a running estimate for Retry-After
        self.worker = threading.Thread(target=self._work, daemon=True, name="aiayn-batcher")
        self.worker.start()

    def _enqueue(self, job: Job) -> Future:
        with self._count:
            if self.queued + job.size > self.max_queue:
                raise Overloaded(f"the server is busy: {self.queued} sentences are waiting (limit {self.max_queue})")
            self.queued += job.size
        self.jobs.put(job)
        return job.future

    def submit(self, sentences: list[str], beam: int, alpha: float) -> Future:
        """Queue sentences for translation; raises Overloaded when the queue is full."""
        return self._enqueue(Job(len(sentences), sentences=sentences, options=(beam, alpha)))

    def call(self, fn: Callable[[], Any]) -> Future:
        """Queue another use of the model (e.g. attention maps), run by the worker between batches."""
        return self._enqueue(Job(1, call=fn))

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained, from the recent translation rate (1-60)."""
        return max(1, min(60, math.ceil(self.queued / max(self.rate, 1e-3))))

    def _done(self, jobs: list[Job]) -> None:
        with self._count:
            self.queued -= sum(j.size for j in jobs)

    def _take(self) -> list[Job]:
        """The next live job and, for a translation, the live waiting ones with the same options."""
        first = self.jobs.get()
        if not first.future.set_running_or_notify_cancel():  # its request gave up while waiting
            self._done([first])
            return []
        if first.call is not None:
            return [first]
        jobs, held, size = [first], [], first.size
        while size < self.max_batch:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job.options != first.options:
                held.append(job)
            elif job.future.set_running_or_notify_cancel():
                jobs.append(job)
                size += job.size
            else:
                self._done([job])
        for job in held:
            self.jobs.put(job)
        return jobs

    def _work(self) -> None:
        while True:
            jobs = []
            try:
                jobs = self._take()
                if jobs:
                    self._run(jobs)
            except BaseException as e:  # never let one request stop the worker
                log.exception("server worker: %s", e)
                for job in jobs:
                    _complete(job.future, error=e)
            finally:
                self._done(jobs)

    def _run(self, jobs: list[Job]) -> None:
        if jobs[0].call is not None:
            _complete(jobs[0].future, jobs[0].call())
            return
        t = self.translator
        sentences = [s for job in jobs for s in job.sentences]
        beam, alpha = jobs[0].options
        start = time.perf_counter()
        hyps = t.translate_ids(t.encode_sources(sentences), beam=beam, alpha=alpha, nbest=1)
        texts = t.tokenizer.decode([h[0].tokens if h else [] for h in hyps])
        scores = [h[0].score if h else None for h in hyps]
        self.rate = 0.8 * self.rate + 0.2 * len(sentences) / max(time.perf_counter() - start, 1e-6)
        i = 0
        for job in jobs:
            _complete(job.future, (texts[i:i + job.size], scores[i:i + job.size]))
            i += job.size


class BodyLimit:
    """ASGI middleware: 413 for a request body over `limit` bytes, before it is read in full."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            detail = f"request body of {length.decode(errors='replace')} bytes; the limit is {self.limit}"
            return await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)
        received = 0

        async def limited():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise HTTPException(413, f"request body over {self.limit} bytes")
            return message

        return await self.app(scope, limited, send)


def create_app(translator: Translator, limits: Limits | None = None) -> FastAPI:
    limits = limits or Limits()
    app = FastAPI(title="aiayn", description="Transformer translation (Attention Is All You Need)",
                  version="0.1.0")
    app.add_middleware(BodyLimit, limit=limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Where and what, without echoing the input (it may be huge, or a NaN that JSON cannot carry).
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in exc.errors()]
        return JSONResponse({"detail": errors}, status_code=422)

    batcher = Batcher(translator, limits.max_queue)
    app.state.batcher = batcher
    d = translator.decode_cfg

    def check_sentences(sentences: list[str]) -> None:
        if len(sentences) > limits.max_sentences:
            raise HTTPException(413, f"too many sentences: {len(sentences)} > {limits.max_sentences} per request")
        for i, s in enumerate(sentences):
            if len(s) > limits.max_chars:
                raise HTTPException(413, f"sentence {i} has {len(s)} characters; the limit is {limits.max_chars}")

    async def run(enqueue: Callable[[], Future]) -> Any:
        """Queue work for the model and wait for it, within the request's time limit."""
        try:
            fut = enqueue()
        except Overloaded as e:
            raise HTTPException(503, str(e), headers={"Retry-After": str(batcher.retry_after())}) from None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), limits.timeout_s)
        except asyncio.TimeoutError:  # wait_for cancelled the job: dropped if not yet started
            raise HTTPException(504, f"no answer within {limits.timeout_s:g} s; the server is busy, "
                                     "retry later") from None

    @app.get("/health")
    async def health() -> dict:
        cfg = translator.model.cfg
        return {"status": "ok" if batcher.worker.is_alive() else "worker stopped",
                "queue": {"sentences": batcher.queued, "limit": limits.max_queue},
                "model": {"d_model": cfg.d_model, "N": cfg.N, "h": cfg.h, "vocab_size": cfg.vocab_size},
                "decode": {"beam": d.beam, "alpha": d.alpha, "max_len_b": d.max_len_b}}

    @app.post("/translate", response_model=TranslateResponse)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        if not req.sentences:
            raise HTTPException(400, "sentences is empty: send at least one sentence")
        check_sentences(req.sentences)
        beam = req.beam or d.beam
        if beam > limits.max_beam:
            raise HTTPException(413, f"beam {beam} is over the limit of {limits.max_beam}")
        alpha = d.alpha if req.alpha is None else req.alpha
        texts, scores = await run(lambda: batcher.submit(req.sentences, beam, alpha))
        return TranslateResponse(translations=texts, scores=scores)

    @app.post("/attention", response_model=AttentionResponse)
    async def attention(req: AttentionRequest) -> AttentionResponse:
        from .plot import attention_data

        if not req.sentence.strip():
            raise HTTPException(400, "sentence is empty")
        check_sentences([req.sentence])
        data = await run(lambda: batcher.call(
            lambda: attention_data(translator.model, translator.tokenizer, req.sentence, decode=d)))
        return AttentionResponse(source_tokens=data.src_tokens, target_tokens=data.tgt_out_tokens,
                                 translation=data.translation, weights=data.cross.mean((0, 1)).tolist())

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return PAGE.read_text(encoding="utf-8")

    return app


def serve(checkpoint: str, host: str = "127.0.0.1", port: int = 8000, device: str | None = None,
          limits: Limits | None = None, precision: str = "auto") -> None:
    import uvicorn

    translator = Translator.load(checkpoint, device=device, precision=precision)
    uvicorn.run(create_app(translator, limits), host=host, port=port, log_level="info")
