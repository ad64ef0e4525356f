"""A translation server: JSON API and one self-contained page with the cross-attention map.

The model is loaded once; requests are queued and a single worker thread translates them,
merging the sentences of requests that arrive together (same beam and alpha) into one batch.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, Field

from .translate import Translator

PAGE = Path(__file__).with_name("page.html")


@dataclass
class Limits:
    max_sentences: int = 64
    max_chars: int = 1000
    max_beam: int = 16


class TranslateRequest(BaseModel):
    sentences: list[str] = Field(..., description="sentences to translate, one per item")
    beam: int | None = Field(None, ge=1, description="beam size (default from the checkpoint, 4)")
    alpha: float | None = Field(None, ge=0.0, le=10.0, description="length penalty alpha (default 0.6)")


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


class Batcher:
    """One worker thread owns the model; concurrent requests with the same options share a batch."""

    def __init__(self, translator: Translator, max_batch: int = 256):
        self.translator = translator
        self.max_batch = max_batch
        self.jobs: queue.Queue = queue.Queue()
        self.lock = threading.Lock()  # the model is used by one thread at a time
        threading.Thread(target=self._work, daemon=True, name="aiayn-batcher").start()

    def submit(self, sentences: list[str], beam: int, alpha: float) -> Future:
        fut: Future = Future()
        self.jobs.put((sentences, beam, alpha, fut))
        return fut

    def _work(self) -> None:
        while True:
            jobs = [self.jobs.get()]
            size = len(jobs[0][0])
            held = []
            while size < self.max_batch:
                try:
                    job = self.jobs.get_nowait()
                except queue.Empty:
                    break
                if job[1:3] == jobs[0][1:3]:
                    jobs.append(job)
                    size += len(job[0])
                else:
                    held.append(job)
            for job in held:
                self.jobs.put(job)
            sentences = [s for job in jobs for s in job[0]]
            try:
                with self.lock:
                    ids = self.translator.encode_sources(sentences)
                    hyps = self.translator.translate_ids(ids, beam=jobs[0][1], alpha=jobs[0][2], nbest=1)
                texts = self.translator.tokenizer.decode([h[0].tokens if h else [] for h in hyps])
                scores = [h[0].score if h else None for h in hyps]
            except Exception as e:  # report to every waiting request, keep serving
                for job in jobs:
                    job[3].set_exception(e)
                continue
            start = 0
            for job in jobs:
                n = len(job[0])
                job[3].set_result((texts[start:start + n], scores[start:start + n]))
                start += n


def create_app(translator: Translator, limits: Limits | None = None) -> FastAPI:
    limits = limits or Limits()
    app = FastAPI(title="aiayn", description="Transformer translation (Attention Is All You Need)",
                  version="0.1.0")
    batcher = Batcher(translator)
    d = translator.decode_cfg

    def check_sentences(sentences: list[str]) -> None:
        if len(sentences) > limits.max_sentences:
            raise HTTPException(413, f"too many sentences: {len(sentences)} > {limits.max_sentences} per request")
        for i, s in enumerate(sentences):
            if len(s) > limits.max_chars:
                raise HTTPException(413, f"sentence {i} has {len(s)} characters; the limit is {limits.max_chars}")

    @app.get("/health")
    def health() -> dict:
        cfg = translator.model.cfg
        return {"status": "ok", "model": {"d_model": cfg.d_model, "N": cfg.N, "h": cfg.h,
                                          "vocab_size": cfg.vocab_size},
                "decode": {"beam": d.beam, "alpha": d.alpha, "max_len_b": d.max_len_b}}

    @app.post("/translate", response_model=TranslateResponse)
    async def translate(req: TranslateRequest) -> TranslateResponse:
        if not req.sentences:
            raise HTTPException(400, "sentences is empty: send at least one sentence")
        check_sentences(req.sentences)
        beam = req.beam or d.beam
        if beam > limits.max_beam:
            raise HTTPException(413, f"beam {beam} is over the limit of {limits.max_beam}")
        import asyncio

        fut = batcher.submit(req.sentences, beam, d.alpha if req.alpha is None else req.alpha)
        texts, scores = await asyncio.wrap_future(fut)
        return TranslateResponse(translations=texts, scores=scores)

    @app.post("/attention", response_model=AttentionResponse)
    def attention(req: AttentionRequest) -> AttentionResponse:
        from .plot import attention_data

        if not req.sentence.strip():
            raise HTTPException(400, "sentence is empty")
        check_sentences([req.sentence])
        with batcher.lock:
            data = attention_data(translator.model, translator.tokenizer, req.sentence, decode=d)
        return AttentionResponse(source_tokens=data.src_tokens, target_tokens=data.tgt_out_tokens,
                                 translation=data.translation, weights=data.cross.mean((0, 1)).tolist())

    @app.get("/", response_class=HTMLResponse)
    def page() -> str:
        return PAGE.read_text(encoding="utf-8")

    return app


def serve(checkpoint: str, host: str = "127.0.0.1", port: int = 8000, device: str = "cpu",
          limits: Limits | None = None) -> None:
    import uvicorn

    translator = Translator.load(checkpoint, device=device)
    uvicorn.run(create_app(translator, limits), host=host, port=port, log_level="info")
