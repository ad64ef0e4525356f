"""One `aiayn serve` process for several checkpoints (serve/pool.py), over real sockets: each
request goes to the model of its direction, a model loads when first asked for, the least
recently used is unloaded under --max-loaded-mb, and a direction nobody serves is one 400."""

import httpx
import pytest
import torch
from conftest import toy_multilingual
from test_serve_load import start, stop

from aiayn.checkpoint import model_tensors, save_weights, tensor_bytes
from aiayn.config import Config
from aiayn.data.directions import prepare_many
from aiayn.data.tokenizer import load_tokenizer
from aiayn.decode.translator import Translator
from aiayn.models.transformer import Transformer
from aiayn.serve.pool import ModelPool, RouteError

pytestmark = pytest.mark.slow


def checkpoint(path, spm, seed: int, **extra):
    tok = load_tokenizer(str(spm))
    cfg = Config()
    m = cfg.model
    m.vocab_size, m.d_model, m.d_ff, m.h, m.N, m.max_positions = len(tok), 32, 64, 4, 1, 64
    cfg.decode.max_len_b = 6
    torch.manual_seed(seed)
    save_weights(path, model_tensors(Transformer(m)), cfg, tok, 0, extra)
    return path


@pytest.fixture(scope="module")
def models(toy_corpus, toy_prepared, tmp_path_factory):
    """en-de and en-fr bilingual models, and one multilingual model of de-en and fr-en."""
    d = tmp_path_factory.mktemp("pool")
    text = toy_multilingual(toy_corpus, d / "text")
    prepare_many({(s, t): {n: (text / f"{n}.{s}", text / f"{n}.{t}") for n in ("train", "valid")}
                  for s, t in (("de", "en"), ("fr", "en"))}, d / "multi", 90, max_len=64)
    spm = toy_prepared / "spm.model"
    return {"en-de": checkpoint(d / "ende.safetensors", spm, 1, languages={"src": "en", "tgt": "de"}),
            "en-fr": checkpoint(d / "enfr.safetensors", spm, 2, languages={"src": "en", "tgt": "fr"}),
            "multi": checkpoint(d / "multi.safetensors", d / "multi" / "spm.model", 3,
                                directions=["de-en", "fr-en"])}


def test_a_pool_routes_each_direction_and_refuses_the_rest(models):
    loaded = []
    pool = ModelPool(list(models.values()), lambda p: loaded.append(p.name) or p.name)
    assert pool.served_directions() == ["en-de", "en-fr", "de-en", "fr-en"] and loaded == []
    assert pool.get("en", "de") == "ende.safetensors" and pool.get("fr", "en") == "multi.safetensors"
    assert pool.get(None, "fr") == "enfr.safetensors"  # one model translates into fr: no source needed
    assert pool.get(None, "en") == "multi.safetensors"  # its two directions, one model
    for src, tgt, why in (("en", "cs", "no model here translates en-cs"), ("de", "fr", "translates de-fr"),
                          (None, None, "several models")):
        with pytest.raises(RouteError, match=why):
            pool.get(src, tgt)
    assert loaded == ["ende.safetensors", "multi.safetensors", "enfr.safetensors"]  # once each, when asked for


def test_one_server_serves_every_direction_within_its_memory_bound(models, toy_corpus):
    one = max(tensor_bytes(p) for p in models.values())
    bound = 1.5 * one / 2**20  # room for one model at a time
    url, _, proc = start(models["en-de"], "--checkpoint", str(models["en-fr"]), "--checkpoint", str(models["multi"]),
                         "--max-loaded-mb", f"{bound:.4f}", "--precision", "fp32")
    try:
        health = httpx.get(url + "/health").json()
        assert health["directions"] == ["en-de", "en-fr", "de-en", "fr-en"]
        assert [m["loaded"] for m in health["models"]] == [False, False, False]
        src = (toy_corpus / "test.en").read_text().splitlines()[:4]
        de_src = (toy_corpus / "test.de").read_text().splitlines()[:4]
        for direction, lines in (("en-de", src), ("en-fr", src), ("de-en", de_src), ("en-de", src)):
            s, t = direction.split("-")
            r = httpx.post(url + "/translate", json={"sentences": lines, "src": s, "tgt": t}, timeout=60)
            assert r.status_code == 200, r.text
            path = models.get(direction, models["multi"])
            want = Translator.load(path, precision="fp32").translate(lines, tgt_lang=t if path == models["multi"]
                                                                     else None)
            assert r.json()["translations"] == want, direction
            state = {m["checkpoint"]: m for m in httpx.get(url + "/health").json()["models"]}
            assert [m["checkpoint"] for m in state.values() if m["loaded"]] == [path.name]  # the bound held
        assert state["ende.safetensors"]["loads"] == 2  # unloaded while others ran, loaded again
        for body, fragment in (({"sentences": ["a"], "src": "en", "tgt": "cs"}, "no model here translates en-cs"),
                               ({"sentences": ["a"]}, "several models")):
            r = httpx.post(url + "/translate", json=body, timeout=30)
            assert r.status_code == 400 and fragment in r.json()["detail"] and "en-de, en-fr, de-en" in r.json()[
                "detail"]
    finally:
        stop(proc)


def test_a_folder_of_checkpoints_is_served_as_they_are(models, tmp_path):
    """`serve --checkpoint FOLDER`: its .safetensors files, one server (a folder is refused elsewhere)."""
    import shutil

    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("en-de", "en-fr"):
        shutil.copy(models[name], folder)
    url, _, proc = start(folder)
    try:
        assert httpx.get(url + "/health").json()["directions"] == ["en-de", "en-fr"]
        r = httpx.post(url + "/translate", json={"sentences": ["the dog"], "src": "en", "tgt": "fr"}, timeout=30)
        assert r.status_code == 200
    finally:
        stop(proc)
