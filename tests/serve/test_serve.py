"""The HTTP API through FastAPI's TestClient: answers, limits, bad input, concurrency."""

import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import check_attention_body
from fastapi.testclient import TestClient

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode.translator import Translator
from aiayn.models.transformer import Transformer
from aiayn.serve.app import Limits, create_app


@pytest.fixture(scope="module")
def translator(toy_prepared):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, d_ff=32, h=2, N=1, p_drop=0.0, max_positions=64)
    return Translator(Transformer(cfg), tok, DecodeConfig(max_len_b=6))


@pytest.fixture(scope="module")
def client(translator):
    return TestClient(create_app(translator, Limits(max_sentences=4, max_chars=50, max_beam=8)))


def test_translate_matches_the_translator(client, translator):
    sents = ["the dog runs", "a cat", ""]
    r = client.post("/translate", json={"sentences": sents})
    assert r.status_code == 200
    body = r.json()
    assert body["translations"] == translator.translate(sents)
    assert len(body["scores"]) == 3 and body["scores"][2] is None
    r = client.post("/translate", json={"sentences": ["the dog runs"], "beam": 1})
    assert r.json()["translations"] == translator.translate(["the dog runs"], beam=1)
    assert r.json()["alignments"] is None  # only when asked for


def test_translate_returns_the_translators_word_alignments_when_asked(client, translator):
    from aiayn.score import pharaoh

    sents = ["the dog runs", "a cat", ""]
    body = client.post("/translate", json={"sentences": sents, "alignments": True}).json()
    ids = translator.encode_sources(sents)
    want = [pharaoh(x) for x in translator.align(ids, translator.translate_ids(ids))]
    assert body["alignments"] == want and body["alignments"][2] == ""
    assert body["translations"] == translator.translate(sents)


def test_translate_puts_markup_back_and_refuses_malformed_tags(client, translator):
    from aiayn.decode.markup import strip

    sents = ["the <b>dog</b> runs <x id=1/>", "**a cat**"]
    body = client.post("/translate", json={"sentences": sents, "markup": True}).json()
    plain = translator.translate(["the dog runs", "a cat"])
    assert [strip(t) for t in body["translations"]] == [" ".join(p.split()) for p in plain]
    assert body["translations"][0].count("<b>") == body["translations"][0].count("</b>") == 1
    assert body["translations"][0].count("<x id=1/>") == 1 and body["translations"][1].count("**") == 2
    assert body["alignments"] is None
    r = client.post("/translate", json={"sentences": ["ok", "a <b>dog"], "markup": True})
    assert r.status_code == 400 and "sentence 1: <b> is never closed" in r.json()["detail"]


@pytest.mark.parametrize("payload,status,fragment", [
    ({"sentences": []}, 400, "empty"),
    ({"sentences": ["a"] * 5}, 413, "too many sentences"),
    ({"sentences": ["x" * 51]}, 413, "51 characters"),
    ({"sentences": ["a"], "beam": 9}, 413, "beam 9"),
    ({"sentences": "the dog"}, 422, ""),
    ({"sentences": [1, 2]}, 422, ""),
    ({"sentences": ["a"], "beam": 0}, 422, ""),
    ({"text": ["a"]}, 422, ""),
])
def test_bad_requests(client, payload, status, fragment):
    r = client.post("/translate", json=payload)
    assert r.status_code == status
    assert fragment in str(r.json()["detail"])


def test_malformed_json_and_server_keeps_serving(client):
    r = client.post("/translate", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert client.get("/health").json()["status"] == "ok"


def test_attention_endpoint(client):
    check_attention_body(client.post("/attention", json={"sentence": "the big dog"}))
    assert client.post("/attention", json={"sentence": "  "}).status_code == 400
    assert client.post("/attention", json={"sentence": "x" * 60}).status_code == 413
    assert client.post("/attention", json={}).status_code == 422


def test_page_and_openapi(client):
    r = client.get("/")
    assert r.status_code == 200 and "<canvas" in r.text and "http" not in r.text.split("<script>")[1]
    assert "/translate" in client.get("/openapi.json").json()["paths"]


def test_concurrent_requests_are_all_answered(client, translator):
    sents = [["the dog runs"], ["a big red house", "cat"], ["the man sits near the park"], ["blue street"]] * 4
    expected = [translator.translate(s) for s in sents]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda s: client.post("/translate", json={"sentences": s}), sents))
    assert [r.status_code for r in results] == [200] * len(sents)
    assert [r.json()["translations"] for r in results] == expected


# -- failure behaviour: cancelled requests, a full queue, time limits, the shared model ---------
import json  # noqa: E402
import threading  # noqa: E402

from aiayn.serve.batcher import Batcher  # noqa: E402


class Gate:
    """Holds the worker inside translate_ids until released; records what it translated."""

    def __init__(self, translator: Translator):
        self.entered, self.release, self.seen = threading.Event(), threading.Event(), []
        real = translator.translate_ids

        def slow(ids, *a, **k):
            self.seen.append(translator.tokenizer.decode(ids))
            self.entered.set()
            assert self.release.wait(20)
            return real(ids, *a, **k)

        translator.translate_ids = slow


@pytest.fixture
def gated(toy_prepared):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, d_ff=32, h=2, N=1, p_drop=0.0, max_positions=64)
    t = Translator(Transformer(cfg), tok, DecodeConfig(max_len_b=6))
    gate = Gate(t)
    yield t, gate
    gate.release.set()


def test_worker_survives_a_request_cancelled_while_waiting(gated):
    t, gate = gated
    batcher = Batcher(t)
    first = batcher.submit(["the dog"], 4, 0.6)
    assert gate.entered.wait(10)
    waiting = batcher.submit(["a cat"], 4, 0.6)
    assert waiting.cancel()  # its request gave up (time limit, or the client left)
    gate.release.set()
    first.result(timeout=20)
    later = batcher.submit(["blue street"], 4, 0.6)
    assert later.result(timeout=20)[0] == t.translate(["blue street"])
    assert batcher.worker.is_alive() and batcher.queued == 0
    assert "a cat" not in [s for batch in gate.seen for s in batch]  # the cancelled request was dropped


def test_full_queue_answers_503_with_retry_after(gated):
    t, gate = gated
    client = TestClient(create_app(t, Limits(max_queue=3)))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/translate", json={"sentences": ["the dog", "a cat"]})
        assert gate.entered.wait(10)
        r = client.post("/translate", json={"sentences": ["red house", "blue street"]})
        assert r.status_code == 503 and "busy" in r.json()["detail"]
        assert 1 <= int(r.headers["Retry-After"]) <= 60
        q = client.get("/health").json()["queue"]
        assert (q["sentences"], q["limit"]) == (2, 3)
        gate.release.set()
        assert first.result().status_code == 200
    assert client.post("/translate", json={"sentences": ["red house", "blue street"]}).status_code == 200
    assert client.get("/health").json()["queue"]["sentences"] == 0


def test_request_past_its_time_limit_gets_504_and_is_dropped(gated):
    t, gate = gated
    client = TestClient(create_app(t, Limits(timeout_s=0.5)))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(client.post, "/translate", json={"sentences": ["the dog"]})
        assert gate.entered.wait(10)
        r = client.post("/translate", json={"sentences": ["a cat"]})
        assert r.status_code == 504 and "0.5 s" in r.json()["detail"]
        time.sleep(0.1)
        h = client.get("/health").json()  # the worker is stuck on a job past the time limit
        assert h["status"] == "degraded" and h["queue"]["oldest_s"] > 0.5, h
        gate.release.set()
        assert first.result().status_code == 504  # it started, but its answer came too late
    r = client.post("/translate", json={"sentences": ["blue street"], "beam": 1})
    assert r.status_code == 200 and r.json()["translations"] == t.translate(["blue street"], beam=1)
    assert "a cat" not in [s for batch in gate.seen for s in batch]
    h = client.get("/health").json()
    assert h["queue"]["sentences"] == 0 and h["status"] == "ok"


def test_attention_uses_the_model_where_it_is(translator, client, monkeypatch):
    moves = []
    real_to = translator.model.to
    monkeypatch.setattr(translator.model, "to", lambda *a, **k: moves.append((a, k)) or real_to(*a, **k))
    assert client.post("/attention", json={"sentence": "the big dog"}).status_code == 200
    assert moves == []  # a GPU server's model would otherwise have been moved to the CPU


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_options_are_rejected(client, value):
    body = '{"sentences": ["the dog"], "alpha": ' + value + "}"
    r = client.post("/translate", content=body.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == 422
    assert "alpha" in json.dumps(r.json()["detail"])


def test_oversized_bodies_get_413_before_parsing(client):
    limit = Limits(max_sentences=4, max_chars=50).max_body_bytes
    big = json.dumps({"sentences": ["a" * (limit + 10)]}).encode()
    r = client.post("/translate", content=big, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["detail"]

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        for _ in range(limit // 1000 + 2):
            yield b"x" * 1000

    r = client.post("/translate", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert client.get("/health").json()["status"] == "ok"


def test_a_batch_that_fails_is_rerun_one_request_at_a_time(translator):
    """If a merged batch still fails (a bad sentence the edge did not catch), only its request fails."""
    poison = translator.encode_sources(["red house"])[0]
    real = translator.translate_ids
    calls = []

    def fragile(ids, *a, **k):
        calls.append(len(ids))
        if poison in ids:
            raise RuntimeError("a sentence the model cannot take")
        return real(ids, *a, **k)

    gate = threading.Event()
    blocker = Batcher(translator)  # its own worker: hold it so that the three requests merge
    blocker.call(lambda: gate.wait(10))
    translator.translate_ids = fragile
    try:
        futures = [blocker.submit(s, 4, 0.6) for s in (["the dog"], ["red house", "a cat"], ["blue street"])]
        gate.set()
        good = [futures[0].result(20), futures[2].result(20)]
        with pytest.raises(RuntimeError, match="cannot take"):
            futures[1].result(20)
    finally:
        translator.translate_ids = real
    assert calls[0] == 4  # merged first, then one by one
    assert [g[0] for g in good] == [translator.translate(["the dog"]), translator.translate(["blue street"])]
    assert blocker.queued == 0 and blocker.work == 0 and blocker.worker.is_alive()


@contextlib.contextmanager
def batch_sizes(translator):
    """The number of sentences of each translate_ids call meanwhile."""
    order, real = [], translator.translate_ids

    def record(ids, *a, **k):
        order.append(len(ids))
        return real(ids, *a, **k)

    translator.translate_ids = record
    try:
        yield order
    finally:
        translator.translate_ids = real


def test_a_long_request_is_done_in_chunks_between_which_others_are_served(translator):
    """Round robin: a request of many sentences does not hold the worker until it is done."""
    gate = threading.Event()
    b = Batcher(translator, chunk_work=4 * 4 * 3)  # about three short sentences per chunk at beam 4
    b.call(lambda: gate.wait(10))
    with batch_sizes(translator) as order:
        long = b.submit(["the dog runs"] * 12, 4, 0.6)
        short = b.submit(["a cat"], 2, 0.6)  # other options: never merged with the long one
        gate.set()
        long = long.result(30)[0]
        short.result(30)
    assert long == translator.translate(["the dog runs"] * 12)
    assert len(order) > 2 and order.index(1) < len(order) - 1  # the short one ran before the long one ended


def test_attention_is_capped_and_computed_off_the_event_loop(translator, monkeypatch):
    from aiayn.serve import app as serve

    threads = []
    real = serve.attention_data

    def where(*a, **k):
        threads.append(threading.current_thread().name)
        return real(*a, **k)

    monkeypatch.setattr(serve, "attention_data", where)
    n = len(translator.tokenizer.encode(["the dog"])[0])
    client = TestClient(create_app(translator, Limits(max_attention_subwords=n)))
    assert client.post("/attention", json={"sentence": "the dog"}).status_code == 200
    assert threads == ["aiayn-batcher"]
    r = client.post("/attention", json={"sentence": "the dog runs"})
    assert r.status_code == 413 and f"the limit is {n}" in r.json()["detail"]
    assert client.post("/translate", json={"sentences": ["the dog runs"]}).status_code == 200  # its own limit
    import subprocess
    import sys

    code = "import sys, aiayn.serve.app; print('matplotlib' in sys.modules)"  # no plotting library, ever
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_a_server_with_a_shortlist_answers_as_its_translator_and_says_so(toy_prepared):
    """`serve --shortlist`: the app answers what the shortlisted translator gives; /health reports it."""
    from aiayn.decode.shortlist import build

    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, d_ff=32, h=2, N=1, p_drop=0.0, max_positions=64)
    translator = Translator(Transformer(cfg), tok, DecodeConfig(max_len_b=6))
    plain = translator.translate(["the dog runs", "a cat"])
    translator.use_shortlist(build(toy_prepared, per_source=2, frequent=0))
    short = translator.translate(["the dog runs", "a cat"])
    client = TestClient(create_app(translator))
    assert client.post("/translate", json={"sentences": ["the dog runs", "a cat"]}).json()["translations"] == short
    assert client.get("/health").json()["decode"]["shortlist"] is True
    assert short != plain  # a random model's translations leave two subwords per source word


def test_one_client_holds_a_share_of_the_work_and_gets_429_beyond_it(gated):
    """Work is priced as rows x positions: beam x (source subwords + the longest output), so 64 x "s"
    at beam 16 is no longer nearly free; one client may hold a quarter of the queue's work."""
    t, gate = gated
    batcher_work = Batcher(t).price(t.encode_sources(["s"]), 16)[0]
    assert batcher_work == 16 * (2 + min(1 + 6, 63) + 1)  # beam x (source + EOS + max output + EOS)
    limits = Limits(max_work=8 * 64 * batcher_work, max_beam=16)  # a client may hold 2 such requests
    client = TestClient(create_app(t, limits))
    big = {"sentences": ["s"] * 64, "beam": 16}
    with ThreadPoolExecutor(3) as pool:
        held = [pool.submit(client.post, "/translate", json=big) for _ in range(2)]
        assert gate.entered.wait(10)
        deadline = time.time() + 10
        while client.get("/health").json()["queue"]["work"] < 2 * 64 * batcher_work:
            assert time.time() < deadline
            time.sleep(0.02)
        r = client.post("/translate", json=big)
        assert r.status_code == 429 and "one client may hold" in r.json()["detail"] and "Retry-After" in r.headers
        h = client.get("/health").json()["queue"]
        assert h["client_work_limit"] == 2 * 64 * batcher_work and h["work"] == 2 * 64 * batcher_work
        gate.release.set()
        assert [f.result().status_code for f in held] == [200, 200]
    r = client.post("/translate", json={"sentences": ["s"] * 64 * 3, "beam": 16})
    assert r.status_code == 413  # one request over a client's share can never be served


def test_the_access_log_limit_counts_what_it_held_back(caplog):
    from aiayn.serve.edge import RateLimited

    logger = logging.getLogger("aiayn-test.access")  # not under uvicorn's loggers, which do not propagate
    logger.addFilter(RateLimited())
    logger.propagate = True
    with caplog.at_level(logging.INFO):
        for i in range(60):
            logger.info('%s - "%s %s HTTP/%s" %d', f"127.0.0.1:{40000 + i}", "GET", "/health", "1.1", 200)
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", "/translate", "1.1", 200)  # another kind
        time.sleep(1.05)
        logger.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:2", "GET", "/health", "1.1", 200)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("/health" in x and "held back" not in x for x in lines) == 2
    assert any("/translate" in x for x in lines)
    assert any("59 more log lines like this one were held back" in x for x in lines), lines


def test_a_chunk_is_about_chunk_s_of_work_at_the_measured_rate(translator):
    """Chunks follow the rate the worker measures, so a short request waits about `chunk_s` behind a
    long one on any model (a fixed amount of work took 7 s a chunk on a base-sized model)."""
    gate = threading.Event()
    b = Batcher(translator, chunk_s=0.5)
    per = b.price(translator.encode_sources(["the dog runs"]), 4)[0]
    b.call(lambda: gate.wait(10))
    with batch_sizes(translator) as order:
        b.rate = 6 * per  # work per second: 3 sentences in half a second
        long = b.submit(["the dog runs"] * 12, 4, 0.6)
        gate.set()
        long.result(30)
    assert order[0] == 3 and sum(order) == 12, order


def test_markup_past_its_bounds_is_a_422_and_costs_no_time(translator):
    """Nested 1,000 and 30,000 deep, and an unclosed tag of 12,000 spaces (once 40 s of a blocked
    event loop): a 422 naming the sentence, at once; the size limits still come first."""
    import time

    client = TestClient(create_app(translator, Limits(max_chars=250_000)))
    for bad, said in (("<b>" * 1000 + "w" + "</b>" * 1000, "tags nested deeper than 64"),
                      ("<b>" * 30_000 + "w" + "</b>" * 30_000, "tags nested deeper than 64"),
                      ("<a" + " " * 12_000, "a tag longer than 1000 characters")):
        start = time.perf_counter()
        r = client.post("/translate", json={"sentences": ["ok", bad], "markup": True})
        assert r.status_code == 422 and r.json()["detail"].startswith(f"sentence 1: {said}"), r.text[:300]
        assert time.perf_counter() - start < 2.0
    small = TestClient(create_app(translator, Limits(max_chars=50)))
    r = small.post("/translate", json={"sentences": ["<b>" * 1000 + "w" + "</b>" * 1000], "markup": True})
    assert r.status_code == 413 and "characters" in r.json()["detail"]


def test_translate_returns_each_translations_quality_when_asked(client, translator):
    """`"quality": true`: decode/quality.py's signals of each translation, as `translate --quality` reads
    them (the same search, alignments from the same head); none unless asked; an empty line's coverage null."""
    from aiayn.decode.quality import FIELDS, quality

    sents = ["the dog runs", "a cat", ""]
    body = client.post("/translate", json={"sentences": sents, "quality": True}).json()
    assert body["translations"] == translator.translate(sents) and len(body["quality"]) == 3
    ids = translator.encode_sources(sents)
    hyps = translator.translate_ids(ids)
    for got, x, h, line, links in zip(body["quality"], ids, hyps, sents, translator.align(ids, hyps)):
        want = quality(x, h[0] if h else None, len(line.split()), links, 4, 0.6)
        assert list(got) == list(FIELDS)
        assert got["flag"] == want.flag and got["repeated"] == want.repeated
        assert got["mean_logprob"] == pytest.approx(want.mean_logprob, abs=1e-5)
    assert body["quality"][2]["coverage"] is None
    assert client.post("/translate", json={"sentences": sents}).json()["quality"] is None


def test_translate_starts_each_translation_with_its_prefix(client, translator):
    """`"prefix"`: one target text per sentence, as Translator.translate(prefixes=) gives; a count that
    does not match, or a prefix too long for its output, is one 4xx naming it."""
    sents, prefixes = ["the dog runs", "a cat", "the woman"], ["der", "", "die frau"]
    r = client.post("/translate", json={"sentences": sents, "prefix": prefixes})
    assert r.status_code == 200 and r.json()["translations"] == translator.translate(sents, prefixes=prefixes)
    r = client.post("/translate", json={"sentences": sents, "prefix": ["der"]})
    assert r.status_code == 400 and "1 prefixes for 3 sentences" in r.json()["detail"]
    r = client.post("/translate", json={"sentences": ["a cat"], "prefix": ["der " * 12]})
    assert r.status_code == 413 and "prefix 1 has" in r.json()["detail"]
