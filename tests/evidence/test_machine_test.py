"""The machine test's coverage: every commit that made a judged Table 3 row is covered by a bit-identical
re-run on another machine, or trains bit for bit as a covered commit (results/machine-test/checks.json)."""

import json
from pathlib import Path

from aiayn.evidence.machine import coverage_lines, covered_commits

REPO = Path(__file__).resolve().parents[2]


def _machine(commit, outcome="bit-identical"):
    return {"kind": "machine", "commit": commit, "row": "ref-s1", "machine": "M", "compared": "all", "outcome": outcome}


def _commit(commit, against, outcome="bit-identical"):
    return {"kind": "commit", "commit": commit, "against": against, "row": "C-N4", "machine": "M2",
            "compared": "weights", "outcome": outcome}


def test_a_commit_is_covered_by_a_rerun_or_through_a_chain_that_ends_in_one():
    checks = [_commit("c", "b"), _commit("b", "a"), _machine("a"), _machine("x", "differs"),
              _commit("y", "x"), _commit("p", "q"), _commit("q", "p"), _commit("d", "a", "differs")]
    covered = covered_commits(checks)
    assert set(covered) == {"a", "b", "c"}  # x differed, so y rests on nothing; p and q only on each other
    assert "trains as at a on M2" in covered["b"] and "re-run on M" in covered["a"]


def test_a_row_from_an_uncovered_commit_is_named_in_the_report():
    rs = [{"row": "ref-s1", "machine": {"git": "a"}}, {"row": "C-N4", "machine": {"git": "z"}}]
    lines = coverage_lines(rs, [_machine("a")])
    assert lines[1] == "**Not covered by the machine test:** z (C-N4)."
    partial = {**_commit("z", "a"), "partial": "the row trained in bf16"}
    assert covered_commits([_machine("a"), partial]) == covered_commits([_machine("a")])
    assert coverage_lines(rs, [_machine("a"), partial])[1] == (
        "**Not covered by the machine test:** z (C-N4): only partly, C-N4 trains as at a on M2 (weights), "
        "but the row trained in bf16.")


def test_a_rerun_that_differed_is_named_with_its_machine():
    rs = [{"row": "ref-s1", "machine": {"git": "a"}}]
    lines = coverage_lines(rs, [_machine("a"), {**_machine("a", "differs"), "machine": "Intel X"}])
    assert lines[1] == ("**Re-runs that differed:** ref-s1 from a on Intel X: differs (all); rows trained there "
                        "are not comparable bit for bit with these.")
    assert len(coverage_lines(rs, [_machine("a"), _machine("b", "differs")])) == 2  # another commit's: not here


# Commits of judged rows not yet covered bit for bit on their rows' own path, each named in the report (none now:
# the two bf16 rows' commits train as 228cd8d does, checked on a CPU with native bf16).
NOT_YET: dict[str, str] = {}


def test_every_commit_of_a_judged_table3_row_is_covered_by_the_machine_test():
    """Every commit that made a Table 3 row of either suite is covered, but the ones NOT_YET names, which the
    report names as not covered; a result from any other uncovered commit fails here."""
    checks = json.loads((REPO / "results/machine-test/checks.json").read_text())["checks"]
    covered = covered_commits(checks)
    for suite in ("reproduction", "reproduction-5000"):
        rs = [json.loads(p.read_text()) for p in sorted((REPO / "results" / suite / "table3").glob("*.json"))]
        for r in rs:
            c = r["machine"]["git"]
            assert c in covered or NOT_YET.get(c) == r["row"], f"{suite}/{r['row']}: commit {c} not covered"
        report = (REPO / "docs" / suite / "REPORT.md").read_text()
        assert "\n".join(coverage_lines(rs, checks)) in report
        for c in {r["machine"]["git"] for r in rs} & set(NOT_YET):
            assert f"{c[:7]} ({NOT_YET[c]})" in report.split("**Not covered by the machine test:**")[1]
    for c in checks:  # every file a check names is kept beside it
        assert all((REPO / "results/machine-test" / f).exists() for f in c.get("files", [])), c
