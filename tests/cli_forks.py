"""Many `aiayn` command lines, each in a process of its own, for the price of one torch import.

A zygote process imports torch and the package once, then forks one child per command line: the
child changes to its folder, points its stdin at /dev/null and its stdout/stderr at files, and runs
what `python -m aiayn` runs (`sys.exit(aiayn.cli.main())`); an exception that escapes prints its
traceback and exits 1, as the interpreter would. Exit status, output, files written and pickles
executed are each child's own, as with `subprocess.run([sys.executable, "-m", "aiayn", ...])`;
what is saved is the ~1.5 s of imports every such process repeats (82 of them in test_bad_input).
A child ends with `os._exit` after flushing its output, so atexit handlers do not run (the package
registers none; its temporary files are removed by `with` blocks before `main` returns).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Result:
    """What `subprocess.run(..., capture_output=True, text=True)` would have given."""

    returncode: int
    stdout: str
    stderr: str


def run_many(cases: list[tuple[list[str], Path]], jobs: int = 4, timeout: int = 120,
             env: dict[str, str] | None = None) -> list[Result]:
    """Run `aiayn ARGV` in folder CWD for each (ARGV, CWD), `jobs` at a time; results in order."""
    with tempfile.TemporaryDirectory(prefix="aiayn-forks-") as tmp:
        spec = [{"argv": [str(a) for a in argv], "cwd": str(cwd), "out": f"{tmp}/{i}.out", "err": f"{tmp}/{i}.err"}
                for i, (argv, cwd) in enumerate(cases)]
        Path(tmp, "cases.json").write_text(json.dumps({"cases": spec, "jobs": jobs, "timeout": timeout}))
        zygote = subprocess.run([sys.executable, __file__, f"{tmp}/cases.json"], capture_output=True, text=True,
                                timeout=timeout * len(cases) / jobs + 120, env=env, stdin=subprocess.DEVNULL)
        assert zygote.returncode == 0, zygote.stderr[-3000:]
        codes = json.loads(zygote.stdout)
        return [Result(code, Path(s["out"]).read_text(errors="replace"), Path(s["err"]).read_text(errors="replace"))
                for code, s in zip(codes, spec, strict=True)]


def _child(case: dict, timeout: int) -> None:
    """In the forked child: become `python -m aiayn ARGV` in CWD; never returns."""
    code = 1
    try:
        signal.alarm(timeout)  # a hung case dies as subprocess.run's timeout would have ended it
        os.chdir(case["cwd"])
        for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, case["out"], os.O_WRONLY | os.O_CREAT),
                                (2, case["err"], os.O_WRONLY | os.O_CREAT)):
            os.dup2(os.open(path, flags, 0o644), fd)
        sys.stdin = open(0, closefd=False)
        sys.argv = ["aiayn", *case["argv"]]
        from aiayn.cli import main

        try:
            code = main(case["argv"])
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 1
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _fork(alive: dict, codes: dict) -> int:
    """os.fork, waiting for a child to end while the system has no process to spare (EAGAIN)."""
    for _ in range(100):
        try:
            return os.fork()
        except BlockingIOError:
            if alive:
                pid, status = os.wait()
                codes[alive.pop(pid)] = os.waitstatus_to_exitcode(status)
            time.sleep(0.1)
    return os.fork()


def _serve(spec_path: str) -> None:
    """The zygote: import once, fork a child per case, at most `jobs` alive; print the exit codes."""
    import torch  # noqa: F401  what every checkpoint verb imports first

    import aiayn.checkpoint  # noqa: F401
    import aiayn.cli  # noqa: F401
    import aiayn.decode.translator  # noqa: F401

    spec = json.loads(Path(spec_path).read_text())
    cases, codes, alive = spec["cases"], {}, {}
    for i, case in enumerate(cases):
        while len(alive) >= spec["jobs"]:
            pid, status = os.wait()
            codes[alive.pop(pid)] = os.waitstatus_to_exitcode(status)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = _fork(alive, codes)
        if pid == 0:
            _child(case, spec["timeout"])
        alive[pid] = i
    while alive:
        pid, status = os.wait()
        codes[alive.pop(pid)] = os.waitstatus_to_exitcode(status)
    print(json.dumps([codes[i] for i in range(len(cases))]))


if __name__ == "__main__":
    _serve(sys.argv[1])
