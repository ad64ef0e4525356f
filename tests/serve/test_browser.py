"""The page in a real browser: type a sentence, click Translate, see the translation and heatmap.

Needs Debian's chromium (/usr/bin/chromium, or $AIAYN_CHROMIUM) and the `playwright` Python
package (only its driver: the browser is the system's). `.ci/run` installs both; elsewhere the
test is skipped with the reason.
"""

import contextlib
import os
import shutil
import socket
import threading
import time

import pytest
import torch

from aiayn.config import DecodeConfig, ModelConfig
from aiayn.data.tokenizer import Tokenizer
from aiayn.decode.translator import Translator
from aiayn.models.transformer import Transformer
from aiayn.serve.app import create_app

CHROMIUM = os.environ.get("AIAYN_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def server(toy_prepared):
    uvicorn = pytest.importorskip("uvicorn")
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(tok), d_model=16, d_ff=32, h=2, N=1, p_drop=0.0, max_positions=64)
    translator = Translator(Transformer(cfg), tok, DecodeConfig(max_len_b=6))
    with running(create_app(translator), uvicorn) as url:
        yield url, translator


@contextlib.contextmanager
def running(app, uvicorn):
    """`app` under uvicorn in a thread on a free loopback port; yields its page's URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    try:
        for _ in range(100):
            if srv.started:
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/"
    finally:
        srv.should_exit = True
        thread.join(5)


def test_page_translates_and_draws_heatmap(server, tmp_path):
    """The page opens translated (the example's two sentences), names the model, and takes several
    sentences, beam, alpha and alignments; a click on a translation draws its attention; an input
    over the server's limits shows an error, no crash."""
    url, translator = server
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(url)
            page.wait_for_function("document.querySelectorAll('.result').length == 2", timeout=20_000)
            page.wait_for_function("document.getElementById('heatmap').dataset.rows > 0", timeout=20_000)
            model = page.inner_text("#model")
            page.fill("#source", "the big dog runs\nthe cat")
            page.fill("#beam", "2")
            page.check("#alignments")
            page.click("#go")
            page.wait_for_function("document.querySelector('.result .meta') && "
                                   "document.querySelector('.result .meta').textContent.includes('links')",
                                   timeout=20_000)
            texts = [page.inner_text(f".result:nth-child({i}) .text") for i in (1, 2)]
            page.click(".result:nth-child(2)")
            page.wait_for_function(f"document.getElementById('heatmap').dataset.cols == "
                                   f"{len(translator.tokenizer.pieces('the cat')) + 1}", timeout=20_000)
            shown = page.get_attribute(".result:nth-child(2)", "class")
            width = page.evaluate("document.getElementById('heatmap').width")
            page.screenshot(path=str(tmp_path / "page.png"))
            assert page.inner_text("#error") == ""
            page.fill("#source", "x" * 2000)  # over the server's limit: an error shows, no crash
            page.click("#go")
            page.wait_for_function("document.getElementById('error').textContent.length > 0", timeout=20_000)
            assert "characters" in page.inner_text("#error")
        finally:
            browser.close()
    assert texts == translator.translate(["the big dog runs", "the cat"], beam=2)
    assert "parameters" in model and "d_model 16" in model and "shown" in shown and width > 100


def test_page_offers_the_directions_of_a_server_of_several_models(toy_prepared, tmp_path):
    """A server of two checkpoints: the page lists their directions to pick from and translates with
    the model of the one picked."""
    uvicorn = pytest.importorskip("uvicorn")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    from aiayn.checkpoint import model_tensors, save_weights
    from aiayn.config import Config
    from aiayn.serve.pool import ModelPool

    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    paths = []
    for seed, tgt in ((1, "de"), (2, "fr")):
        cfg = Config()
        cfg.model.vocab_size, cfg.model.d_model, cfg.model.d_ff, cfg.model.h, cfg.model.N = len(tok), 16, 32, 2, 1
        cfg.decode.max_len_b = 6
        torch.manual_seed(seed)
        paths.append(tmp_path / f"en{tgt}.safetensors")
        save_weights(paths[-1], model_tensors(Transformer(cfg.model)), cfg, tok, 0,
                     {"languages": {"src": "en", "tgt": tgt}})
    app = create_app(ModelPool(paths, lambda p: Translator.load(p, precision="fp32")))
    with running(app, uvicorn) as url:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
            try:
                page = browser.new_page()
                page.goto(url)
                page.wait_for_function("document.querySelectorAll('#pair option').length == 2", timeout=20_000)
                options = page.eval_on_selector_all("#pair option", "els => els.map(e => e.value)")
                visible = page.is_visible("#pair")
                page.select_option("#pair", "en-fr")
                page.fill("#source", "the big dog runs")
                page.click("#go")
                page.wait_for_function("document.querySelectorAll('.result').length == 1", timeout=20_000)
                text = page.inner_text(".result .text")
            finally:
                browser.close()
    assert options == ["en-de", "en-fr"] and visible
    assert text == Translator.load(paths[1], precision="fp32").translate(["the big dog runs"])[0]
