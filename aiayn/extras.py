"""The optional extras (pyproject.toml): what a verb beyond preparing, training, translating,
scoring, exporting and importing needs, imported when it is used, and one line naming the extra to
install when it is missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from .errors import AiaynError

EXTRAS = {"serve": "fastapi, uvicorn", "plot": "matplotlib", "evidence": "scipy, matplotlib", "document": "pysbd"}


class MissingExtra(AiaynError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def need(module: str, extra: str) -> ModuleType:
    """`module`, imported; missing, a MissingExtra that says `pip install 'aiayn[extra]'`."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = e.name or module.split(".")[0]
        raise MissingExtra(f"this needs {missing}, which is not installed: pip install 'aiayn[{extra}]' "
                           f"(the {extra} extra: {EXTRAS[extra]})") from None


def figure(**kw):
    """A new matplotlib Figure (its own canvas, no pyplot state and no backend chosen for the process)."""
    return need("matplotlib.figure", "plot").Figure(**kw)
