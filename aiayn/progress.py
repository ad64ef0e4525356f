"""Progress bars with an ETA for every long step (training, translation, averaging, pictures): tqdm,
redrawn by time, on a terminal every half second (and cleared at the end), in a log file every half
minute (the last line kept)."""

from __future__ import annotations

import sys

from tqdm import tqdm

LOG_INTERVAL_S = 30.0  # stderr not a terminal (a log file, CI): one line this often, not a redraw per step


def bar(total: int | None, unit: str, desc: str = "", enabled: bool = True, initial: int = 0) -> tqdm:
    """A bar over `total` items from `initial` (a resumed run: the rate and ETA count from here),
    drawn on stderr; off when `enabled` is false (other ranks, a pipe the caller keeps clean)."""
    tty = sys.stderr.isatty()
    return tqdm(total=total, initial=initial, unit=unit, desc=desc or None, disable=not enabled,
                mininterval=0.5 if tty else LOG_INTERVAL_S, dynamic_ncols=tty, leave=not tty, file=sys.stderr)
