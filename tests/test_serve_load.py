"""A real `aiayn serve` process under load, on loopback only, bounded in count and time:
200 concurrent requests plus 20 clients that hang up early. Only 200, 503 (queue full) and 504
(time limit) may come back; /health answers within a second throughout; the server still
translates afterwards and its queue drains to zero."""

import asyncio
import socket
import subprocess
import sys
import time

import httpx
import pytest
import torch

from aiayn.checkpoint import model_tensors, save_weights
from aiayn.config import Config
from aiayn.model import Transformer
from aiayn.tokenizer import Tokenizer

REQUESTS, HANGUPS = 200, 20


@pytest.fixture
def server(toy_prepared, tmp_path):
    tok = Tokenizer.load(str(toy_prepared / "spm.model"))
    cfg = Config()
    m = cfg.model
    m.vocab_size, m.d_model, m.d_ff, m.h, m.N, m.max_positions = len(tok), 32, 64, 4, 2, 128
    torch.manual_seed(0)
    ckpt = tmp_path / "model.safetensors"
    save_weights(ckpt, model_tensors(Transformer(m)), cfg, tok, 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(ckpt), "--host", "127.0.0.1",
                             "--port", str(port), "--max-queue", "128", "--timeout", "10"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.time() < deadline, "the server did not start"
        time.sleep(0.2)
    yield url, port
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def hang_up(port: int, i: int) -> None:
    """A client that leaves early: after the headers, mid-body, or right after a full request."""
    body = b'{"sentences": ["the big dog runs near the park", "a small cat sits"]}'
    head = (b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall([head, head + body[:10], head + body][i % 3])


async def load(url: str, port: int) -> tuple[list[int], list[float]]:
    health: list[float] = []
    stop = asyncio.Event()

    async def watch(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            t = time.perf_counter()
            r = await client.get(url + "/health", timeout=5)
            assert r.status_code == 200
            health.append(time.perf_counter() - t)
            await asyncio.sleep(0.05)

    limits = httpx.Limits(max_connections=REQUESTS + 10, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client, \
            httpx.AsyncClient(timeout=5) as monitor:
        watcher = asyncio.create_task(watch(monitor))
        sentences = ["the dog runs", "a big red house near the street", "the woman sits", "blue cat"]

        async def one(i: int) -> int:
            r = await client.post(url + "/translate", json={"sentences": sentences[: 1 + i % 4]})
            return r.status_code

        loop = asyncio.get_running_loop()
        hangups = [loop.run_in_executor(None, hang_up, port, i) for i in range(HANGUPS)]
        statuses = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(REQUESTS))), 120)
        await asyncio.gather(*hangups)
        stop.set()
        await watcher
    return list(statuses), health


def test_server_under_load_with_clients_that_hang_up(server):
    url, port = server
    statuses, health = asyncio.run(load(url, port))
    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
    print(f"statuses {counts}, /health slowest {max(health):.3f} s of {len(health)}")
    assert len(statuses) == REQUESTS
    assert set(statuses) <= {200, 503, 504}, sorted(set(statuses))
    assert statuses.count(200) > 0 and statuses.count(503) > 0  # served, and the queue bound held
    # /health never waits behind translation (seconds under this load); a busy machine may delay
    # one probe, so the median is held tight and the worst case loosely.
    assert len(health) >= 3 and sorted(health)[len(health) // 2] < 0.25 and max(health) < 3.0, health
    r = httpx.post(url + "/translate", json={"sentences": ["the dog runs"]}, timeout=30)
    assert r.status_code == 200 and len(r.json()["translations"]) == 1
    deadline = time.time() + 20
    while httpx.get(url + "/health", timeout=5).json()["queue"]["sentences"] != 0:
        assert time.time() < deadline, "the queue did not drain"
        time.sleep(0.1)
