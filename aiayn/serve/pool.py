"""Many checkpoints behind one server (not in the paper): each request goes to the model of its
direction, by its source and target language; a model is loaded when it is first asked for, and
the least recently used are unloaded to keep the loaded weights within a memory bound.

What a checkpoint serves is read from its header alone: the pair it was trained on
(`languages`), a multilingual run's `directions`, or an imported multilingual model's target
codes (any source). A direction two checkpoints claim goes to the first named, with a warning.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..checkpoint import CheckpointError, meta_extra, read_meta, read_metadata, tensor_bytes
from ..errors import AiaynError

log = logging.getLogger("aiayn")
ANY = "*"  # a model that takes any source language (an imported multilingual Marian model's codes)


class RouteError(AiaynError):
    """No served model translates the direction a request names (or it names none among several)."""


@dataclass
class Served:
    """One checkpoint: what it translates, what its weights weigh, and its translator once loaded."""

    path: Path
    directions: list[tuple[str, str]]  # (source or ANY, target)
    bytes: int
    translator: object | None = None  # decode.translator.Translator, when loaded
    last_used: float = 0.0
    loads: int = 0

    label: str = ""  # how /health and the log name it: its file name, with its folder where two share one

    def name(self) -> str:
        return self.label or self.path.name


def directions_of(path: Path) -> list[tuple[str, str]]:
    """What a checkpoint translates, from its header: its pair, its run's directions, or its
    vocabulary's target codes (ANY source); [] when it names none."""
    meta = read_metadata(path)
    extra = meta_extra(meta, path)
    ways = extra.get("directions")
    if isinstance(ways, list) and ways:
        return [tuple(str(d).split("-", 1)) for d in ways[:1000] if isinstance(d, str) and "-" in d]
    pair = extra.get("languages")
    if isinstance(pair, dict) and isinstance(pair.get("src"), str) and isinstance(pair.get("tgt"), str):
        return [(pair["src"][:16], pair["tgt"][:16])]
    codes = getattr(read_meta(meta, path)[1], "language_codes", [])
    return [(ANY, c) for c in codes]


class ModelPool:
    """The served checkpoints, loaded on first use by `load(path)` and unloaded least recently used
    first while the loaded tensors would exceed `max_bytes` (0: no bound; the model being asked for
    is always loaded, whatever its size)."""

    def __init__(self, paths: Sequence[str | Path], load: Callable[[Path], object], max_bytes: int = 0):
        self.load_fn, self.max_bytes = load, max_bytes
        self.models: list[Served] = []
        self.routes: dict[tuple[str, str], Served] = {}
        for p in map(Path, paths):
            if not p.is_file():
                raise CheckpointError(f"{p}: no such checkpoint")
            served = Served(p, directions_of(p), tensor_bytes(p))
            self.models.append(served)
            for d in served.directions:
                if d in self.routes:
                    log.warning("%s-%s: served by %s; %s also has it", *d, self.routes[d].name(), p.name)
                    continue
                self.routes[d] = served
        names = [m.path.name for m in self.models]
        for m in self.models:
            if names.count(m.path.name) > 1:  # e.g. every run's averaged.safetensors
                m.label = f"{m.path.parent.name}/{m.path.name}"
        self._lock = threading.Lock()

    def served_directions(self) -> list[str]:
        return [f"{s}-{t}" for s, t in self.routes]

    def route(self, src: str | None, tgt: str | None) -> Served:
        """The model for (src, tgt): the exact direction, else one taking any source into tgt; with
        neither named, the one model there is. A RouteError names what is served otherwise."""
        if tgt is None and src is None and len(self.models) == 1:
            return self.models[0]
        tgt = None if tgt is None else tgt.removeprefix(">>").removesuffix("<<")
        found = [m for (s, t), m in self.routes.items()
                 if (tgt is None or t == tgt) and (src is None or s in (src, ANY))]
        exact = [m for (s, t), m in self.routes.items() if t == tgt and s == src]
        if exact or len({id(m) for m in found}) == 1:
            return (exact or found)[0]
        served = ", ".join(self.served_directions()[:40]) or "no named direction"
        if not found:
            raise RouteError(f"no model here translates {src or '?'}-{tgt or '?'}; served: {served}")
        raise RouteError(f"several models translate {src or '?'}-{tgt or '?'}: name src and tgt (served: {served})")

    def get(self, src: str | None, tgt: str | None) -> object:
        """The loaded translator for (src, tgt), loading it (and unloading others) if need be."""
        served = self.route(src, tgt)
        with self._lock:
            if served.translator is None:
                self._make_room(served)
                began = time.perf_counter()
                served.translator = self.load_fn(served.path)
                served.loads += 1
                log.info("loaded %s (%.0f MB) in %.1f s", served.name(), served.bytes / 2**20,
                         time.perf_counter() - began)
            served.last_used = time.monotonic()
            return served.translator

    def _make_room(self, incoming: Served) -> None:
        """Unload the least recently used models until `incoming` fits under max_bytes (held: a
        model's requests under way keep their translator until they finish)."""
        if not self.max_bytes:
            return
        loaded = sorted((m for m in self.models if m.translator is not None), key=lambda m: m.last_used)
        total = sum(m.bytes for m in loaded)
        while loaded and total + incoming.bytes > self.max_bytes:
            out = loaded.pop(0)
            out.translator, total = None, total - out.bytes
            log.info("unloaded %s (least recently used) to stay within %.0f MB", out.name(), self.max_bytes / 2**20)
        gc.collect()

    def report(self) -> list[dict]:
        """/health's view: each model, what it serves, its size, whether it is loaded."""
        return [{"checkpoint": m.name(), "directions": [f"{s}-{t}" for s, t in m.directions],
                 "mb": round(m.bytes / 2**20, 1), "loaded": m.translator is not None, "loads": m.loads}
                for m in self.models]
