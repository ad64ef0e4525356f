"""Provenance of a result: the machine, the libraries and the commit that made it."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any


def machine() -> dict[str, Any]:
    """What made the numbers: processor (with its family and model, which change between machines of one
    name), threads, accelerator, library versions."""
    import torch  # here, not at the top: `aiayn reproduce --help` should not wait for it

    try:
        info = cpu_info(Path("/proc/cpuinfo").read_text())
    except OSError:
        info = {}
    cpu = info.pop("cpu", None) or platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, **info, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__, "python": platform.python_version(), "git": _code_commit()}


def cpu_info(text: str) -> dict[str, Any]:
    """The first processor's name, family and model from /proc/cpuinfo's text (those it names)."""
    keys = {"model name": "cpu", "cpu family": "cpu_family", "model": "cpu_model"}
    out: dict[str, Any] = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in keys:
            out[keys[key]] = int(value) if key != "model name" and value.isdigit() else value
    return out


@functools.cache
def _code_commit() -> str | None:
    """The commit of the code this process runs: read once, when the suite starts (a result
    written an hour later must not name whatever the working tree holds by then)."""
    from ..runs import _git_commit

    return _git_commit()
