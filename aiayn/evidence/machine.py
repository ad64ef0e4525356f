"""Provenance of a result: the machine, the libraries and the commit that made it."""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

from ..device import cpu_class
from ..training.run_folder import git_commit


def machine() -> dict[str, Any]:
    """What made the numbers: processor (with its family and model, which change between machines of one
    name, and the vector class that decides the kernels: device.cpu_class), threads, accelerator, library
    versions."""
    import torch  # here, not at the top: `aiayn reproduce --help` should not wait for it


    info = cpu_class()
    cpu = info.pop("cpu", None) or platform.processor() or platform.machine()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {"cpu": cpu, **info, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "gpu": gpu,
            "torch": torch.__version__, "python": platform.python_version(), "git": code_commit()}


@functools.cache
def code_commit() -> str | None:
    """The commit of the code this process runs: read once, when the suite starts (a result
    written an hour later must not name whatever the working tree holds by then)."""

    return git_commit()


def machine_words(m: dict[str, Any]) -> str:
    """A result's machine in words: the GPU, or the CPU with its family, model and vector class."""
    if m.get("gpu"):
        return m["gpu"]
    if "cpu_family" not in m:
        return f"{m.get('cpu', '?')}, family and model not recorded"
    return f"{m.get('cpu', '?')} family {m['cpu_family']} model {m['cpu_model']}, {m.get('class', '?')}"


def compute_section(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The hours and hardware each suite's runs spent, summed from their result files
    (from records rather than memory)."""
    spent: dict[tuple[str, str], list] = {}
    for suite, rs in results.items():
        for r in rs:
            if "train_minutes" in r:
                cell = spent.setdefault((suite, machine_words(r.get("machine", {}))), [0, 0.0, set()])
                cell[0] += 1
                cell[1] += r["train_minutes"] / 60
                cell[2].add((r.get("machine", {}).get("git") or "?")[:7])
    if not spent:
        return []
    out = ["## Compute spent", "",
           "Training time as the result files record it (`train_minutes`: a run's clock while it trained, "
           "validation included, across resumes; time a run sat stopped, e.g. paused while tests ran, counts; work "
           "lost since the last checkpoint when a run was interrupted and the final evaluation do not), by suite "
           "and machine.", "",
           "| suite | machine | runs | training hours | commits |", "|---|---|--:|--:|---|"]
    for (suite, words), (n, hours, commits) in sorted(spent.items()):
        out.append(f"| {suite} | {words} | {n} | {hours:.1f} | {', '.join(sorted(commits))} |")
    total = sum(c[1] for c in spent.values())
    out += [f"| all | | {sum(c[0] for c in spent.values())} | {total:.1f} | |", ""]
    return out


def covered_commits(checks: list[dict[str, Any]]) -> dict[str, str]:
    """Which commits the machine test covers, each with how (results/machine-test/checks.json): a row
    re-run from its commit on another machine, bit-identical to the committed result, covers that commit;
    a row's config trained from two commits on one machine, bit-identical, covers the first when the
    second is covered (so a commit never covers itself through a chain of its own). A check marked
    `partial` (e.g. compared on another precision than the row's) covers nothing."""
    covered: dict[str, str] = {}
    for c in checks:
        if c.get("outcome") == "bit-identical" and c.get("kind") == "machine" and not c.get("partial"):
            covered.setdefault(c["commit"], f"{c['row']} re-run on {c['machine']}: bit-identical ({c['compared']})")
    grew = True
    while grew:
        grew = False
        for c in checks:
            if (c.get("outcome") == "bit-identical" and c.get("kind") == "commit" and not c.get("partial")
                    and c["commit"] not in covered and c["against"] in covered):
                covered[c["commit"]] = (f"{c['row']} trains as at {c['against'][:7]} on {c['machine']}: "
                                        f"bit-identical ({c['compared']})")
                grew = True
    return covered


def coverage_lines(rs: list[dict[str, Any]], checks: list[dict[str, Any]]) -> list[str]:
    """Every commit that made these rows, covered by the machine test or named as not covered, and the
    machines on which a row's re-run differed."""
    covered = covered_commits(checks)
    commits = sorted({r.get("machine", {}).get("git") or "?" for r in rs})
    missing = [c for c in commits if c not in covered]
    out = ["Machine test (results/machine-test/checks.json): "
           + "; ".join(f"{c[:7]}: {covered[c]}" for c in commits if c in covered) + "."]
    if missing:
        rows = {c: [r["row"] for r in rs if (r.get("machine", {}).get("git") or "?") == c] for c in missing}
        partly = {c["commit"]: c for c in checks if c.get("partial") and c.get("outcome") == "bit-identical"}
        out.append("**Not covered by the machine test:** " + "; ".join(
            f"{c[:7]} ({', '.join(rows[c])})" + (f": only partly, {partly[c]['row']} trains as at "
                                                 f"{partly[c]['against'][:7]} on {partly[c]['machine']} "
                                                 f"({partly[c]['compared']}), but {partly[c]['partial']}"
                                                 if c in partly else "") for c in missing) + ".")
    differed = [c for c in checks if c.get("kind") == "machine" and c.get("outcome") != "bit-identical"
                and c["commit"] in commits]
    if differed:  # a machine whose numbers are not these rows' (its results compare within seed noise only)
        out.append("**Re-runs that differed:** " + "; ".join(
            f"{c['row']} from {c['commit'][:7]} on {c['machine']}: {c['outcome']} ({c['compared']})"
            for c in differed) + "; rows trained there are not comparable bit for bit with these.")
    return out + [""]
