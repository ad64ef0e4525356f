"""The server under hostile clients' floods, against a real `aiayn serve` process on loopback.

Two random models that never say EOS (every search runs to its length limit: the worst case) with
the prepared Multi30k vocabulary: the tests' size (d_model 128, N 3) and the base size (d_model
512, d_ff 2048, h 8, N 6). For each:

- work flood: 4 requests of 64 x "s" at beam 16 (about 1 KB of JSON each) at once; one second
  later a short request ("a dog") from the same machine. Reported: the short request's status and
  latency, the flood's statuses, /health's answers meanwhile, the server's peak RSS.
- connection flood: 330 sockets, half silent, half stopped in the middle of a request line; a
  short request and /health one second later and again after the header deadline (10 s).
- costliest request: the most work one client may queue (sentences of the subword cap at beam 16),
  then a short request at beam 16 and at beam 4; /health; peak RSS.
- re-opening flood: 330 silent sockets from 127.0.0.2, each replaced as the server closes it, for
  25 s; a short request and /health from 127.0.0.1 every second.
- markup: a tag of 12,000 spaces, 1,000 and 30,000 nested tags, with "markup": true.

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


async def costliest(url: str, tok: Tokenizer) -> dict:
    """The costliest request the limits accept (sentences of the subword cap at beam 16, as many as one
    client's share holds), then 1.5 s later a short request at beam 16 and one at beam 4."""
    health = httpx.get(url + "/health").json()
    cap, share = health["limits"]["max_subwords"], health["queue"]["client_work_limit"]
    words = ("a dog runs near the big red house " * 60).split()
    long = " ".join(words[:cap])
    most_chars = health["limits"].get("max_chars", 1000)
    while len(tok.encode([long])[0]) > cap or len(long) > most_chars:
        long = long.rsplit(" ", 1)[0]
    n = len(tok.encode([long])[0]) + 1
    per_sentence = 16 * (n + min(n - 1 + 50, 255) + 1)
    big = {"sentences": [long] * max(1, share // per_sentence), "beam": 16}
    async with httpx.AsyncClient(timeout=120) as client:
        heavy = asyncio.create_task(client.post(url + "/translate", json=big))
        await asyncio.sleep(1.5)
        out: dict = {"sentences": len(big["sentences"]), "subwords": n - 1}
        for beam in (16, 4):
            t = time.perf_counter()
            r = await client.post(url + "/translate", json={"sentences": ["a dog"], "beam": beam})
            out[f"short_beam{beam}"] = {"status": r.status_code, "latency_s": round(time.perf_counter() - t, 3)}
        t = time.perf_counter()
        h = (await client.get(url + "/health")).json()
        out["health"] = {"status": h["status"], "reason": h.get("reason"),
                         "answered_s": round(time.perf_counter() - t, 3)}
        heavy = await heavy
        out["heavy_status"], out["heavy_detail"] = heavy.status_code, heavy.text[:160]
    return out


def reopening_flood(url: str, port: int, seconds: float, n: int = 330) -> dict:
    """`n` silent sockets from one address (127.0.0.2), each replaced as the server closes it, for
    `seconds`; meanwhile a short request and /health from 127.0.0.1 every second."""
    def opened() -> socket.socket:
        s = socket.socket()
        s.bind(("127.0.0.2", 0))
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        s.setblocking(False)
        return s

    socks, opens, answers = [], 0, []
    end, tick = time.time() + seconds, 0.0
    try:
        while time.time() < end:
            for i, s in enumerate(socks):  # replace the closed ones
                try:
                    if s.recv(1) == b"":
                        s.close()
                        socks[i], opens = opened(), opens + 1
                except BlockingIOError:
                    pass
                except OSError:
                    socks[i], opens = opened(), opens + 1
            while len(socks) < n:
                try:
                    socks.append(opened())
                except OSError:
                    break
                opens += 1
            if time.time() >= tick:
                tick = time.time() + 1.0
                t = time.perf_counter()
                try:
                    status = httpx.post(url + "/translate", json={"sentences": ["a dog"]}, timeout=30).status_code
                except httpx.HTTPError as e:
                    status = type(e).__name__
                latency = time.perf_counter() - t
                h = httpx.get(url + "/health", timeout=10).json()
                answers.append({"status": status, "latency_s": round(latency, 3), "health": h["status"],
                                "reason": h.get("reason"), "connections": h["connections"]})
            time.sleep(0.05)
    finally:
        for s in socks:
            s.close()
    return {"sockets_opened": opens, "translate_statuses": sorted({str(a["status"]) for a in answers}),
            "slowest_s": max(a["latency_s"] for a in answers), "health": sorted({a["health"] for a in answers}),
            "answers": answers}


def markup_probes(url: str) -> dict:
    """Adversarial markup with "markup": true: one long tag, deep nesting; each one's status and time,
    and /health's answer time right after."""
    out = {}
    for name, text in (("tag_of_12000_spaces", "<a" + " " * 12_000),
                       ("nested_1000", "<b>" * 1000 + "dog" + "</b>" * 1000),
                       ("nested_30000", "<b>" * 30_000 + "dog" + "</b>" * 30_000)):
        t = time.perf_counter()
        r = httpx.post(url + "/translate", json={"sentences": [text], "markup": True}, timeout=120)
        took = time.perf_counter() - t
        t = time.perf_counter()
        httpx.get(url + "/health", timeout=30)
        out[name] = {"status": r.status_code, "seconds": round(took, 3),
                     "health_after_s": round(time.perf_counter() - t, 3),
                     "detail": r.json().get("detail", "")[:120] if r.status_code != 200 else ""}
    return out


PROBES = ("work", "connections", "costliest", "reopening", "markup")


def run_probes(url: str, port: int, pid: int, data: Path, probes: list[str]) -> dict:
    """The named probes against one server, in order."""
    out: dict = {}
    if "work" in probes:
        out["work_flood"] = asyncio.run(work_flood(url))
        out["work_flood"]["peak_rss_mb"] = round(peak_rss_mb(pid))
    if "connections" in probes:
        out["connection_flood"] = connection_flood(url, port, 10.0)
        time.sleep(11)  # the flood's sockets are closed; the server's table empties
    if "costliest" in probes:
        out["costliest"] = asyncio.run(costliest(url, Tokenizer.load(str(data / "spm.model"))))
        out["costliest"]["peak_rss_mb"] = round(peak_rss_mb(pid))
    if "reopening" in probes:
        out["reopening_flood"] = reopening_flood(url, port, 25.0)
    if "markup" in probes:
        out["markup"] = markup_probes(url)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--sizes", default="tests,base")
    p.add_argument("--probes", default=",".join(PROBES), help=f"any of {', '.join(PROBES)}")
    p.add_argument("--work", type=Path, default=Path.home() / "aiayn-work" / "serve_flood")
    p.add_argument("--out", type=Path, default=Path(__file__).with_name("serve_flood.json"))
    args = p.parse_args()
    probes = args.probes.split(",")
    if not set(probes) <= set(PROBES):
        raise SystemExit(f"--probes: any of {', '.join(PROBES)}; got {args.probes}")
    data = prepared_data(args.data)
    args.work.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.sizes.split(","):
        ckpt = never_ending_model(data, args.work / f"{name}.safetensors", SIZES[name])
        url, port, proc = start(ckpt, "--timeout", "30")
        try:
            results[name] = run_probes(url, port, proc.pid, data, probes)
        finally:
            proc.terminate()
            proc.wait(10)
        for probe, figures in results[name].items():
            brief = {k: v for k, v in figures.items() if k not in ("answers", "health")}
            print(f"{name} {probe}: {json.dumps(brief)[:1200]}", flush=True)
    meta = {"cpu": cpu_meta(), "torch": torch.__version__, "machine": platform.machine(),
            "date": time.strftime("%Y-%m-%d"), "probes": probes}
    args.out.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
