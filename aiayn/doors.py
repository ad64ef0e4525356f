"""A subpackage's door: the public names it offers, each imported from its module on first use
(PEP 562), so that naming the package costs nothing until a name is used (`aiayn --help` and a
config check run without torch)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy(package: str, where: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public names live in the modules `where`
    names (name -> module relative to the package, or module:attribute)."""
    def getattr_(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = where[name].partition(":")
        return getattr(import_module(f".{module}", package), attr or name)

    def dir_() -> list[str]:
        return sorted(where)
    return getattr_, dir_
