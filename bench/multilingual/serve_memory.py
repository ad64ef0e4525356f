"""One server for en->de, en->fr, en->cs: three bilingual checkpoints behind it, or one multilingual.

Starts `aiayn serve` on loopback for each layout and measures, in the same run: the server's
resident memory (VmRSS) once every direction has answered, each direction's first request (the
model loaded on first use) and a warm one, and with `--max-loaded-mb` room for one bilingual model,
the first request after its model was unloaded. 8 test2016 sentences a request, beam 4, fp32, 2
threads. Reads the checkpoints multi_vs_bilingual.py trained (seed 1).

    .venv/bin/python bench/multilingual/serve_memory.py [--work ~/aiayn-work/multilingual]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchdata import ROOT, cpu_meta  # noqa: E402

TARGETS = ("de", "fr", "cs")


def start(paths: list[Path], *flags: str) -> tuple[str, subprocess.Popen]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [x for p in paths for x in ("--checkpoint", str(p))]
    proc = subprocess.Popen([sys.executable, "-m", "aiayn", "serve", *args, "--host", "127.0.0.1", "--port", str(port),
                             "--precision", "fp32", *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "OMP_NUM_THREADS": "2"})
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return url, proc
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit("the server did not start")


def rss_mb(proc: subprocess.Popen) -> float:
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def ask(url: str, lines: list[str], tgt: str, src: str | None) -> float:
    began = time.perf_counter()
    r = httpx.post(url + "/translate", json={"sentences": lines, "tgt": tgt, **({"src": src} if src else {})},
                   timeout=300)
    r.raise_for_status()
    return round(time.perf_counter() - began, 3)


def layout(paths: list[Path], lines: list[str], src: str | None, bound_mb: float = 0.0) -> dict:
    url, proc = start(paths, *(["--max-loaded-mb", f"{bound_mb:.1f}"] if bound_mb else []))
    try:
        idle = rss_mb(proc)
        first = {t: ask(url, lines, t, src) for t in TARGETS}
        warm = {t: ask(url, lines, t, src) for t in TARGETS}
        out = {"rss_mb_idle": round(idle, 1), "rss_mb_all_answered": round(rss_mb(proc), 1),
               "first_request_s": first, "warm_request_s": warm}
        if bound_mb:
            out["after_unload_s"] = {t: ask(url, lines, t, src) for t in TARGETS}  # each was unloaded by the next
            out["models"] = httpx.get(url + "/health").json()["models"]
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", type=Path, default=Path.home() / "aiayn-work" / "multilingual")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "multilingual" /
                   f"{datetime.date.today()}_serve_memory.json")
    args = p.parse_args()
    bi = [args.work / f"run-{t}-seed1" / "averaged.safetensors" for t in TARGETS]
    multi = args.work / "run-multi-seed1" / "averaged.safetensors"
    lines = (args.work / "prep-en-de" / "test_2016_flickr.en.txt").read_text().splitlines()[:8]
    one_mb = max(p.stat().st_size for p in bi) / 2**20
    result = {"what": __doc__.split("\n")[0], "cpu": cpu_meta(), "sentences_per_request": len(lines),
              "checkpoint_mb": round(one_mb, 1),
              "three_bilingual": layout(bi, lines, "en"),
              "three_bilingual_bound_one": {"max_loaded_mb": round(1.5 * one_mb, 1),
                                            **layout(bi, lines, "en", 1.5 * one_mb)},
              "one_multilingual": layout([multi], lines, None)}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
