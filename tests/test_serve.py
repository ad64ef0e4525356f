"""The HTTP API through FastAPI's TestClient: answers, limits, bad input, concurrency."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from fastapi.testclient import TestClient

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.model import Transformer
from aiayn.serve import Limits, create_app
from aiayn.tokenizer import Tokenizer
from aiayn.translate import Translator


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
    r = client.post("/attention", json={"sentence": "the big dog"})
    assert r.status_code == 200
    body = r.json()
    w = body["weights"]
    assert len(w) == len(body["target_tokens"]) and all(len(row) == len(body["source_tokens"]) for row in w)
    assert all(abs(sum(row) - 1) < 1e-4 for row in w)
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
