"""The page in a real browser: type a sentence, click Translate, see the translation and heatmap.

Needs Debian's chromium (/usr/bin/chromium, or $AIAYN_CHROMIUM) and the `playwright` Python
package (only its driver: the browser is the system's). `.ci/run` installs both; elsewhere the
test is skipped with the reason.
"""

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
    app = create_app(translator)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(100):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/", translator
    srv.should_exit = True
    thread.join(5)


def test_page_translates_and_draws_heatmap(server, tmp_path):
    url, translator = server
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_page()
            page.goto(url)
            page.fill("#source", "the big dog runs")
            page.click("#go")
            page.wait_for_function("document.getElementById('heatmap').dataset.rows > 0", timeout=20_000)
            text = page.inner_text("#translation")
            rows = int(page.get_attribute("#heatmap", "data-rows"))
            cols = int(page.get_attribute("#heatmap", "data-cols"))
            width = page.evaluate("document.getElementById('heatmap').width")
            assert page.inner_text("#error") == ""
            page.fill("#source", "x" * 2000)  # over the server's limit: an error shows, no crash
            page.click("#go")
            page.wait_for_function("document.getElementById('error').textContent.length > 0", timeout=20_000)
            assert "characters" in page.inner_text("#error")
        finally:
            browser.close()
    assert text == translator.translate(["the big dog runs"])[0]
    n_src = len(translator.tokenizer.pieces("the big dog runs")) + 1  # + </s>
    assert cols == n_src and rows >= 1 and width > 100
