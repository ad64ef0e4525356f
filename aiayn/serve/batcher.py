"""The server's worker: one thread owns the model and translates the waiting requests in chunks,
taking turns between them. The queue is weighed in sentences and in work: decoder rows x the
positions each may take (beam x (source subwords + the longest output §6.1 allows, input + 50)),
which is what a search costs in time and in key/value memory; one client holds at most a share."""

from __future__ import annotations

import collections
import ctypes
import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import asdict, dataclass, field
from typing import Any

from ..decode.quality import quality
from ..decode.translator import Translator
from ..score import pharaoh

log = logging.getLogger("aiayn")


class Overloaded(Exception):
    """The queue holds as many sentences, or as much work, as it may."""


class OverShare(Overloaded):
    """One client's requests hold as much of the queue's work as a client may."""


@dataclass
class Job:
    """One request's work. A translation is done in chunks between which other requests get
    their turn; a request that gave up (its future cancelled) is dropped at the next chunk."""

    ids: list[list[int]] = field(default_factory=list)  # subword ids + EOS per sentence
    options: tuple[int, float, bool, bool] | None = None  # (beam, alpha, word alignments?, quality?) of a translation
    call: Callable[[], Any] | None = None  # any other use of the model, run alone
    costs: list[int] = field(default_factory=list)  # work per sentence (Batcher.price); a call's in [0]
    client: str | None = None  # who asked (the share of the work one client may hold)
    translator: Translator | None = None  # the model it is for (a server of many: serve/pool.py); None: the batcher's
    prefixes: list[list[int]] | None = None  # target ids each translation starts with (decode/prefix.py)
    constraints: list[list[list[int]]] | None = None  # target phrases each must hold (decode/constraints.py)
    start: float = field(default_factory=time.monotonic)
    future: Future = field(default_factory=Future)
    done: int = 0  # sentences translated so far
    texts: list[str] = field(default_factory=list)
    scores: list[float | None] = field(default_factory=list)
    alignments: list[str] = field(default_factory=list)  # Pharaoh word links, when asked for
    quality: list[dict] = field(default_factory=list)  # decode/quality.py's signals, when asked for

    def cost(self, i: int) -> int:
        """Work of sentence i (of the call, for i = 0)."""
        return self.costs[i] if self.costs else 1

    @property
    def size(self) -> int:
        return len(self.ids) if self.call is None else 1

    def left(self) -> tuple[int, int]:
        """Sentences and work not yet done."""
        return self.size - self.done, sum(self.cost(i) for i in range(self.done, self.size))


def _complete(fut: Future, result: Any = None, error: BaseException | None = None) -> None:
    """Set a future's outcome unless it is already settled (cancelled by a request that gave up)."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:
        pass


def _json_safe(d: dict) -> dict:
    """NaN (a signal not read, e.g. an empty line's coverage) as None: JSON has no NaN."""
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in d.items()}


def _trim_memory() -> None:
    """Hand freed heap back to the system (glibc keeps it otherwise after a large batch)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Batcher:
    """One worker thread owns the model. It takes work in chunks of about `chunk_s` seconds (from
    the rate it has measured; at most `chunk_work`, and the key/value memory of `chunk_bytes`),
    fills a chunk with waiting requests of the same options, and goes round the requests in turn,
    so a long request delays a short one by about one chunk, not by its whole length; inside one long
    sentence (a chunk however long), short newcomers are let in after chunk_s (_let_in). The queue is
    weighed in sentences and in work; a request that gave up leaves its chunk within a few decoder
    steps and costs nothing more."""

    def __init__(self, translator: Translator | None, max_queue: int = 1024, max_batch: int = 256,
                 max_work: int = 1 << 20, chunk_work: int = 1 << 14, chunk_bytes: int = 1 << 30,
                 client_share: float = 0.25, chunk_s: float = 1.0):
        self.translator = translator
        self.max_queue, self.max_batch, self.max_work = max_queue, max_batch, max_work
        self.client_work = max(1, int(max_work * client_share))  # what one client's requests may hold at once
        self.chunk_limits = (chunk_work, chunk_bytes)
        self.chunk_work = self.chunk_work_for(translator) if translator is not None else chunk_work
        self.chunk_s = chunk_s
        self.jobs: queue.Queue[Job] = queue.Queue()
        self.active: collections.deque[Job] = collections.deque()  # the worker's own: jobs under way
        self._count = threading.Lock()
        self.queued = 0  # sentences waiting or in translation
        self.work = 0  # their work
        self.by_client: collections.Counter[str | None] = collections.Counter()
        self.started: dict[int, float] = {}  # id(job) -> when it was queued, for the jobs not yet gone
        self.rate = 1_000.0  # work per second, a running estimate (Retry-After, the size of a chunk); it starts
        # low, so the first chunks are short on a large model, and grows with what the worker measures
        self._turn = time.perf_counter()  # when the chunk under way began its turn (or last let others in)
        self._aside_s = 0.0  # seconds spent on short requests let in during chunks (not the chunk's own rate)
        self._letting_in = False
        self.worker = threading.Thread(target=self._work, daemon=True, name="aiayn-batcher")
        self.worker.start()

    def chunk_work_for(self, translator: Translator) -> int:
        """A chunk's work for this model: chunk_work, and no more than chunk_bytes of key/value cache
        (fp32, 2 x 2 x 4 bytes x decoder layers x d_model per unit of work: the cache grows by doubling)."""
        cfg = translator.model.cfg
        return max(1, min(self.chunk_limits[0], self.chunk_limits[1] // (2 * 2 * 4 * cfg.n_dec * cfg.d_model)))

    def price(self, ids: list[list[int]], beam: int, translator: Translator | None = None) -> list[int]:
        """Work of each sentence: its decoder rows (beam) x the positions each holds at most, source
        subwords + the output length §6.1 allows (decode.max_len_a x input + max_len_b, + EOS)."""
        t = translator or self.translator
        d, limit = t.decode_cfg, t.model.cfg.max_positions - 1
        out = [min(int(d.max_len_a * max(len(x) - 1, 0) + d.max_len_b), limit) + 1 for x in ids]
        return [beam * (max(len(x), 1) + n) for x, n in zip(ids, out)]

    def _enqueue(self, job: Job) -> Future:
        size, work = job.left()
        with self._count:
            if self.queued + size > self.max_queue or self.work + work > self.max_work:
                raise Overloaded(f"the server is busy: {self.queued} sentences ({self.work} work) are waiting "
                                 f"(limits {self.max_queue} sentences, {self.max_work} work)")
            if self.by_client[job.client] + work > self.client_work:
                raise OverShare(f"your requests hold {self.by_client[job.client]} work of the server's queue; "
                                f"one client may hold {self.client_work}: wait for their answers")
            self.queued += size
            self.work += work
            self.by_client[job.client] += work
            self.started[id(job)] = job.start
        self.jobs.put(job)
        return job.future

    def submit(self, sentences: list[str] | list[list[int]], beam: int, alpha: float,
               client: str | None = None, alignments: bool = False, translator: Translator | None = None,
               quality: bool = False, prefixes: list[list[int]] | None = None,
               constraints: list[list[list[int]]] | None = None) -> Future:
        """Queue sentences (text, or ids from `encode_sources`) for translation by `translator` (default
        the batcher's); raises Overloaded when the queue is full (OverShare when this client's part of
        it is). The future's result is (texts, scores, alignments: Pharaoh word links per sentence, or
        None if not asked for; with `quality`, a 4th: each translation's signals, decode/quality.py)."""
        t = translator or self.translator
        ids = t.encode_sources(sentences) if sentences and isinstance(sentences[0], str) else list(sentences)
        costs = self.price(ids, beam, t)
        if constraints:  # decoded with decode.constraint_beam's rows
            wide = self.price(ids, max(t.decode_cfg.constraint_beam or 2 * beam, 1), t)
            costs = [w if c else x for x, w, c in zip(costs, wide, constraints)]
        return self._enqueue(Job(ids=ids, options=(beam, alpha, alignments, quality), costs=costs,
                                 client=client, translator=t, prefixes=prefixes, constraints=constraints))

    def call(self, fn: Callable[[], Any], work: int = 1, client: str | None = None) -> Future:
        """Queue another use of the model (e.g. attention maps, priced as `work`), run by the worker
        between chunks."""
        return self._enqueue(Job(call=fn, costs=[work], client=client))

    def oldest_s(self) -> float:
        """Seconds since the oldest job still queued or under way was queued (0 when there is none)."""
        with self._count:
            first = min(self.started.values(), default=None)
        return 0.0 if first is None else time.monotonic() - first

    def retry_after(self) -> int:
        """Seconds until the queue has likely drained, from the recent rate of work (1-60)."""
        return max(1, min(60, math.ceil(self.work / max(self.rate, 1e-3))))

    def _release(self, job: Job, sentences: int, work: int, gone: bool = False) -> None:
        with self._count:
            self.queued -= sentences
            self.work -= work
            self.by_client[job.client] -= work
            if self.by_client[job.client] <= 0:
                del self.by_client[job.client]
            if gone:
                self.started.pop(id(job), None)

    def _leave(self, job: Job) -> None:
        """A job leaves the worker (finished, failed or abandoned) with what it still held."""
        self.active.remove(job)
        self._release(job, *job.left(), gone=True)

    def _admit(self) -> None:
        """Move newly queued jobs to the active list (waiting for one when there is nothing to do)."""
        if not self.active and self.jobs.empty():
            _trim_memory()  # idle: give back what an outlier took
        try:
            job = self.jobs.get(block=not self.active)
            while True:
                self.active.append(job)
                job = self.jobs.get_nowait()
        except queue.Empty:
            pass

    def _drop_cancelled(self) -> None:
        for job in [j for j in self.active if j.future.cancelled()]:
            self._leave(job)

    def _next_chunk(self) -> list[tuple[Job, int, int]]:
        """(job, first, end) sentence ranges: from the job whose turn it is, then from waiting jobs
        with the same options, within chunk_work and max_batch sentences."""
        head = self.active[0]
        if head.call is not None:
            return [(head, 0, 1)]
        chunk, work, n = [], 0, 0
        limit = self.chunk_work if head.translator in (None, self.translator) else self.chunk_work_for(head.translator)
        budget = max(1, min(limit, int(self.rate * self.chunk_s)))
        for job in list(self.active):
            if job.call is not None or job.options != head.options or job.translator is not head.translator:
                continue
            end = job.done
            while end < job.size and n < self.max_batch and (n == 0 or work + job.cost(end) <= budget):
                work, n, end = work + job.cost(end), n + 1, end + 1
            if end > job.done:
                chunk.append((job, job.done, end))
            if n >= self.max_batch or work >= budget:
                break
        return chunk

    def _work(self) -> None:
        while True:
            chunk = []
            try:
                self._admit()
                self._drop_cancelled()
                if not self.active:
                    continue
                chunk = self._next_chunk()
                self._run(chunk)
            except BaseException as e:  # never let one request stop the worker
                log.exception("server worker: %s", e)
                for job, *_ in chunk:
                    self._fail(job, e)
            if self.active:
                self._admit()  # requests that came during the chunk queue up behind it, then
            self._rotate()  # the job that just ran goes to the back: newcomers wait one chunk at most

    def _rotate(self) -> None:
        """Finished, failed and abandoned jobs leave (with what they still held); the job whose turn
        it was goes to the back."""
        for job in [j for j in self.active if j.future.done() or j.done >= j.size]:
            self._leave(job)
        if self.active:
            self.active.rotate(-1)

    def _fail(self, job: Job, error: BaseException) -> None:
        if job in self.active:
            self._leave(job)
        _complete(job.future, error=error)

    def _let_in(self, running: set[int], paused: Translator, paused_work: int) -> None:
        """Called from inside a chunk's search every few decoder steps: once the chunk has had its turn
        (chunk_s), requests that came meanwhile and are short (at most one chunk's work at the measured
        rate, or a quarter of the paused chunk's) are translated here, on the same thread, the chunk's
        search paused on the stack around them; then it has another turn. So a short request waits
        about chunk_s behind one long sentence at a wide beam, not its whole length."""
        if self._letting_in or time.perf_counter() - self._turn < self.chunk_s:
            return
        try:
            while True:
                self.active.append(self.jobs.get_nowait())
        except queue.Empty:
            pass
        budget = max(1, int(self.rate * self.chunk_s), paused_work // 4)  # short ones measure the rate low
        short = [j for j in self.active if id(j) not in running and not j.future.done() and j.left()[1] <= budget]
        if not short:
            return
        log.debug("%d short requests let in during a chunk of %d work", len(short), paused_work)
        self._letting_in, start = True, time.perf_counter()
        head = paused.search_model
        kept = getattr(head, "align_head", None)  # the paused search's (translate_ids sets it per call)
        try:
            while short:
                first = short[0]
                part = [(first, 0, 1)] if first.call is not None else [
                    (j, j.done, j.size) for j in short
                    if j.call is None and j.options == first.options and j.translator is first.translator]
                try:
                    self._run(part)
                except Exception as e:
                    log.exception("server worker: %s", e)
                    for job, *_ in part:
                        self._fail(job, e)
                for job, *_ in part:
                    if job in self.active and (job.future.done() or job.done >= job.size):
                        self._leave(job)
                done = {id(job) for job, *_ in part}
                short = [j for j in short if id(j) not in done]
        finally:
            if hasattr(head, "align_head"):
                head.align_head = kept
            self._letting_in = False
            self._aside_s += time.perf_counter() - start
            self._turn = time.perf_counter()

    def _run(self, chunk: list[tuple[Job, int, int]]) -> None:
        head = chunk[0][0]
        if head.call is not None:
            try:
                _complete(head.future, head.call())
            finally:
                head.done = 1
                self._release(head, 1, head.cost(0))
            return
        try:
            self._translate(chunk)
        except Exception as e:
            if len(chunk) == 1:
                raise
            log.warning("a batch of %d requests failed (%s); running them one by one", len(chunk), e)
            for part in chunk:
                try:
                    self._translate([part])
                except Exception as e1:  # only the culprit fails
                    log.exception("server worker: %s", e1)
                    self._fail(part[0], e1)

    def _translate(self, chunk: list[tuple[Job, int, int]]) -> None:
        t = chunk[0][0].translator or self.translator
        ids = [x for job, a, b in chunk for x in job.ids[a:b]]
        owner = [job for job, a, b in chunk for _ in range(a, b)]
        beam, alpha, align, signals = chunk[0][0].options
        start, aside = time.perf_counter(), self._aside_s
        if not self._letting_in:
            self._turn = start
        running = {id(job) for job, _, _ in chunk}
        work = sum(job.cost(i) for job, a, b in chunk for i in range(a, b))

        def abandoned() -> set[int]:  # every few decoder steps: short newcomers are let in (_let_in), and
            self._let_in(running, t, work)  # a request that gave up during the chunk stops costing
            return {i for i, job in enumerate(owner) if job.future.cancelled()}
        forced = [p for job, a, b in chunk for p in (job.prefixes[a:b] if job.prefixes else [[]] * (b - a))]
        terms = [c for job, a, b in chunk for c in (job.constraints[a:b] if job.constraints else [[]] * (b - a))]
        hyps = t.translate_ids(ids, beam=beam, alpha=alpha, nbest=1,
                               abandoned=abandoned,
                               alignments=align or signals, prefixes=forced if any(forced) else None,
                               constraints=terms if any(terms) else None)
        texts = t.tokenizer.decode([h[0].tokens if h else [] for h in hyps])
        scores = [h[0].score if h else None for h in hyps]
        word_links = t.align(ids, hyps) if align or signals else []
        links = [pharaoh(x) for x in word_links] if align else []
        words = [len(x.split()) for x in t.tokenizer.decode([x[:-1] for x in ids])] if signals else []
        qualities = [_json_safe(asdict(quality(x, h[0] if h else None, n, lk, beam, alpha)))
                     for x, h, n, lk in zip(ids, hyps, words, word_links)] if signals else []
        own = time.perf_counter() - start - (self._aside_s - aside)  # less what was let in meanwhile
        self.rate = 0.8 * self.rate + 0.2 * work / max(own, 1e-6)
        i = 0
        for job, a, b in chunk:
            job.texts += texts[i:i + b - a]
            job.scores += scores[i:i + b - a]
            job.alignments += links[i:i + b - a]
            job.quality += qualities[i:i + b - a]
            i += b - a
            job.done = b
            self._release(job, b - a, sum(job.cost(k) for k in range(a, b)))
            if job.done >= job.size:
                answer = (job.texts, job.scores, job.alignments if align else None)
                _complete(job.future, (*answer, job.quality) if signals else answer)
