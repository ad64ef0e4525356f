"""Provenance of a result: the machine, the libraries and the commit that made it."""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

import torch


def machine() -> dict[str, Any]:
    """What made the numbers: processor, threads, accelerator, library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__, "python": platform.python_version(), "git": _code_commit()}


@functools.cache
def _code_commit() -> str | None:
    """The commit of the code this process runs: read once, when the suite starts (a result
    written an hour later must not name whatever the working tree holds by then)."""
    from ..runs import _git_commit

    return _git_commit()
