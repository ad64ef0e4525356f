"""The server under the floods of issue #59, against a real `aiayn serve` process on loopback.

Two random models that never say EOS (every search runs to its length limit: the worst case) with
the prepared Multi30k vocabulary: the tests' size (d_model 128, N 3) and the base size (d_model
512, d_ff 2048, h 8, N 6). For each:

- work flood: 4 requests of 64 x "s" at beam 16 (about 1 KB of JSON each) at once; one second
  later a short request ("a dog") from the same machine. Reported: the short request's status and
  latency, the flood's statuses, /health's answers meanwhile, the server's peak RSS.
- connection flood: 330 sockets, half silent, half stopped in the middle of a request line; a
  short request and /health one second later and again after the header deadline (10 s).

    .venv/bin/python bench/serve/serve_flood.py [--data PREPARED_DIR] [--sizes tests,base] [--out
        bench/serve/2026-11-26_serve_flood.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: benchdata, the shared data
from benchdata import DATA, cpu_meta, prepared_data  # noqa: E402

from aiayn.checkpoint import model_tensors, save_weights  # noqa: E402
from aiayn.config import Config  # noqa: E402
from aiayn.data.tokenizer import EOS, Tokenizer  # noqa: E402
from aiayn.models.transformer import Transformer  # noqa: E402

SIZES = {"tests": dict(d_model=128, d_ff=256, h=4, N=3), "base": dict(d_model=512, d_ff=2048, h=8, N=6)}


def never_ending_model(data: Path, path: Path, size: dict) -> Path:
    tok = Tokenizer.load(str(data / "spm.model"))
    cfg = Config()
    for k, v in {**size, "vocab_size": len(tok), "max_positions": 256}.items():
        setattr(cfg.model, k, v)
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    with torch.no_grad():  # EOS's logit is -d_model whatever the input (see tests/serve/test_serve_load.py)
        model.decoder[-1].res_ffn.norm.bias.fill_(1.0)
        model.out_proj.weight[EOS].fill_(-1.0)
    save_weights(path, model_tensors(model), cfg, tok, 0)
    return path


def start(ckpt: Path, *flags: str) -> tuple[str, int, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "serve", "--checkpoint", str(ckpt), "--port", str(port),
                             *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, port, proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def peak_rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def work_flood(url: str) -> dict:
    health: list[dict] = []
    done = asyncio.Event()

    async def watch(client: httpx.AsyncClient) -> None:
        while not done.is_set():
            t = time.perf_counter()
            h = (await client.get(url + "/health", timeout=10)).json()
            health.append({"status": h["status"], "oldest_s": h["queue"]["oldest_s"], "work": h["queue"]["work"],
                           "answered_s": round(time.perf_counter() - t, 3)})
            await asyncio.sleep(0.5)

    async with httpx.AsyncClient(timeout=120) as client, httpx.AsyncClient() as monitor:
        watcher = asyncio.create_task(watch(monitor))
        flood = [asyncio.create_task(client.post(url + "/translate", json={"sentences": ["s"] * 64, "beam": 16}))
                 for _ in range(4)]
        await asyncio.sleep(1.0)
        t = time.perf_counter()
        short = await client.post(url + "/translate", json={"sentences": ["a dog"]})
        latency = time.perf_counter() - t
        statuses = [r.status_code for r in await asyncio.gather(*flood)]
        done.set()
        await watcher
    return {"short_status": short.status_code, "short_latency_s": round(latency, 3), "flood_statuses": statuses,
            "health_statuses": sorted({h["status"] for h in health}),
            "health_slowest_s": max(h["answered_s"] for h in health), "health": health}


def connection_flood(url: str, port: int, header_timeout: float) -> dict:
    socks = []
    for i in range(330):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2:
            s.sendall(b"POST /transl")
        socks.append(s)
    out = {}
    try:
        for when, wait in (("after_1s", 1.0), ("after_deadline", header_timeout + 2.0 - 1.0)):
            time.sleep(wait)
            t = time.perf_counter()
            try:
                r = httpx.post(url + "/translate", json={"sentences": ["a dog"]}, timeout=30)
                status = r.status_code
            except httpx.HTTPError as e:
                status = type(e).__name__
            latency = time.perf_counter() - t
            h = httpx.get(url + "/health", timeout=10).json()
            out[when] = {"short_status": status, "short_latency_s": round(latency, 3), "health": h["status"],
                         "connections": h["connections"]}
    finally:
        for s in socks:
            s.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--sizes", default="tests,base")
    p.add_argument("--work", type=Path, default=Path.home() / "aiayn-work" / "serve_flood")
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("serve_flood.json"))
    args = p.parse_args()
    data = prepared_data(args.data)
    args.work.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.sizes.split(","):
        ckpt = never_ending_model(data, args.work / f"{name}.safetensors", SIZES[name])
        url, port, proc = start(ckpt, "--timeout", "30")
        try:
            work = asyncio.run(work_flood(url))
            work["peak_rss_mb"] = round(peak_rss_mb(proc.pid))
            conn = connection_flood(url, port, 10.0)
        finally:
            proc.terminate()
            proc.wait(10)
        results[name] = {"work_flood": work, "connection_flood": conn}
        print(f"{name}: short request {work['short_status']} in {work['short_latency_s']:.2f} s during the work flood "
              f"(flood {work['flood_statuses']}), /health {work['health_statuses']} (slowest "
              f"{work['health_slowest_s']:.2f} s), peak RSS {work['peak_rss_mb']} MB; connection flood: "
              + "; ".join(f"{k}: {v['short_status']} in {v['short_latency_s']:.2f} s, /health {v['health']}, "
                          f"{v['connections']} connections" for k, v in conn.items()), flush=True)
    meta = {"cpu": cpu_meta(), "torch": torch.__version__, "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d")}
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
