"""Provenance of a result: the machine, the libraries and the commit that made it."""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

from ..device import cpu_class
from ..training.runs import git_commit


def machine() -> dict[str, Any]:
    """What made the numbers: processor (with its family and model, which change between machines of one
    name, and the vector class that decides the kernels: device.cpu_class), threads, accelerator, library
    versions."""
    import torch  # here, not at the top: `aiayn reproduce --help` should not wait for it


    info = cpu_class()
    cpu = info.pop("cpu", None) or platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, **info, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__, "python": platform.python_version(), "git": _code_commit()}


@functools.cache
def _code_commit() -> str | None:
    """The commit of the code this process runs: read once, when the suite starts (a result
    written an hour later must not name whatever the working tree holds by then)."""

    return git_commit()
