"""The README's "Train on your own data" block and docs/python.md's example, run as written on the
toy corpus; only sizes are shrunk (vocabulary, model, steps) so they finish in seconds."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
PYTHON_DOC = README.parent / "docs" / "python.md"
TINY = ["--model.d_model", "32", "--model.d_ff", "64", "--model.N", "1", "--train.max_steps", "30",
        "--data.max_tokens", "400", "--train.threads", "1", "--train.save_every", "5"]


def block(marker: str, path: Path = README) -> str:
    text = path.read_text()
    m = re.search(rf"<!-- {marker} -->\s*```\w+\n(.*?)```", text, re.S)
    assert m, f"{path.name} has no {marker} block"
    return m.group(1)


def workspace(toy_corpus, tmp_path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            shutil.copy(toy_corpus / f"{split}.{lang}", data / f"{split}.{lang}")
    return tmp_path


@pytest.mark.slow
def test_own_data_commands_run_as_written(toy_corpus, tmp_path):
    cwd = workspace(toy_corpus, tmp_path)
    commands = block("readme-own-data").replace("\\\n", " ").splitlines()
    assert [c.split()[1] for c in commands] == ["prepare", "train", "average", "translate", "score"]
    for command in commands:
        args = shlex.split(command.replace("--data.vocab_size 8000", "--data.vocab_size 60"))
        assert args[0] == "aiayn"
        if args[1] == "train":
            args += TINY
        p = subprocess.run([sys.executable, "-m", "aiayn", *args[1:]], cwd=cwd, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, (command, p.stderr[-1500:])
    assert len((cwd / "runs/mydata/test.hyp").read_text().splitlines()) == 20
    assert "BLEU" in p.stdout


@pytest.mark.slow
def test_python_block_runs_as_written(toy_corpus, tmp_path):
    cwd = workspace(toy_corpus, tmp_path)
    code = block("readme-python", PYTHON_DOC).replace("vocab_size=8000", "vocab_size=60")
    code = code.replace('aiayn.preset("multi30k")', 'aiayn.apply_overrides(aiayn.preset("multi30k"), TINY)')
    tiny = dict(zip(TINY[::2], TINY[1::2]))
    prelude = f"TINY = {{k[2:]: v for k, v in {tiny!r}.items()}}\n"
    code += "\nprint('cross', maps.cross.shape)\n" + block("python-heads", PYTHON_DOC)
    p = subprocess.run([sys.executable, "-c", prelude + code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-1500:]
    assert "cross (1, 4," in p.stdout  # TINY: one layer; the multi30k preset: 4 heads
    assert "'importance':" in p.stdout and (cwd / "heads-py" / "heads.json").exists()  # the heads block ran


def test_readme_is_a_front_door():
    """Short enough to read in five minutes, and every page it sends a reader to exists."""
    text = README.read_text()
    assert len(text) <= 12_000, len(text)
    links = re.findall(r"\]\(((?:docs|bench)/[^)#]+)\)", text)
    assert len(links) >= 6 and all((README.parent / link).is_file() for link in links), links
    for page in (README.parent / "docs").glob("*.md"):
        for link in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / link).exists(), (page.name, link)


def test_the_reproduction_summary_is_generated_and_each_number_stands_beside_its_row():
    """docs/reproduction.md's summary is evidence/summary.brief of the committed result files, word for
    word; and every "ROW ΔNLL ± interval" in it is that row's line of its suite's REPORT.md (a number
    moved to another row's name, or a stale one, fails)."""
    from aiayn.evidence.report import load_results
    from aiayn.evidence.summary import brief, readme_cell

    root = README.parent
    text = (root / "docs" / "reproduction.md").read_text()
    block = re.search(r"<!-- reproduction summary:.*?-->\n(.*?)<!-- end reproduction summary -->", text, re.S)
    assert block, "docs/reproduction.md's summary lost its markers"
    suites = ("reproduction", "reproduction-5000")
    want = [brief(load_results(root / "results" / s).get("table3", [])) for s in suites]
    assert block.group(1).strip() == "\n\n".join(want)
    readme = README.read_text()
    for suite, label in zip(suites, ("Table 3 at 2,750 updates (exploratory)", "Table 3 at 5,000 updates "
                                                                                      "(confirmatory)")):
        cell = readme_cell(load_results(root / "results" / suite).get("table3", []))
        assert f"| {label} | {cell} | [REPORT](docs/{suite}/REPORT.md) |" in readme, cell
    for suite, paragraph in zip(suites, want):
        report = (root / "docs" / suite / "REPORT.md").read_text().splitlines()
        pairs = re.findall(r"([A-E](?:-[\w.]+)?) ([+-]\d+\.\d{4}) ± (\d+\.\d{4})", paragraph)
        assert len(pairs) >= 8, pairs
        for row, delta, pi in pairs:
            lines = [x for x in report if x.startswith(f"| {row} ") and f"{delta} ± {pi}" in x]
            assert lines, f"{suite}: {row} {delta} ± {pi} is not {row}'s line of its REPORT.md"


def test_the_families_readme_figure_is_generated_and_each_difference_is_its_familys_line_of_the_report():
    """The README's figure for the families at their own tuned decoding is evidence/families.families_cell of
    the committed result files; once complete, each "FAMILY Δ ± interval / Δ ± interval" is that family's
    bullet of REPORT.md's decode section, test2016 then test2017 (a number moved to another family fails)."""
    from aiayn.evidence.families import families_cell
    from aiayn.evidence.report import load_results

    results = load_results(README.parent / "results" / "reproduction")
    cell = families_cell(results.get("decode", []), results.get("tune", []))
    assert cell and f"| the models it replaced, each at its own beam and α | {cell} | [REPORT]" in README.read_text()
    report = (README.parent / "docs" / "reproduction" / "REPORT.md").read_text()
    section = report[report.index("## Every family decoded at the beam and α"):].split("\n## ")[0]
    found = re.findall(r"(\w+(?: at equal FLOPs)?) ([+-][\d.]+ ± [\d.]+) / ([+-][\d.]+ ± [\d.]+)", cell)
    assert cell.startswith("unfinished: ") or len(found) == cell.count(";") + 1, cell
    for name, d16, d17 in found:
        family = name.replace(" at equal FLOPs", " at the Transformer's training FLOPs")
        lines = [x for x in section.splitlines() if x.startswith("- **") and f"({family})" in x]
        assert len(lines) == 1, (name, lines)
        assert re.search(rf"test2016 BLEU [\d.]+ \({re.escape(d16)}, .*test2017 BLEU [\d.]+ \({re.escape(d17)},",
                         lines[0]), (name, d16, d17)


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens,
    a repeated heading's anchor numbered (-1, -2, ...)."""
    out, seen = set(), {}
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def test_every_link_to_a_section_finds_its_heading():
    """README, docs/, bench/ and the robustness notes link into pages by heading: a renamed heading
    must take its links with it."""
    assert heading_anchors(README) >= {"two-commands-on-a-fresh-machine", "results-by-processor"}
    pages = [README, *(README.parent / "docs").rglob("*.md"), *(README.parent / "bench").rglob("*.md"),
             *(README.parent / "tests" / "robustness").glob("*.md")]
    links = [(page, m.group(1), m.group(2)) for page in pages
             for m in re.finditer(r"\]\(([^)\s:#]*)#([^)\s]+)\)", page.read_text())]
    assert len(links) >= 3, len(links)
    broken = [f"{page.name}: {target}#{anchor}" for page, target, anchor in links
              if anchor not in heading_anchors(page.parent / target if target else page)]
    assert broken == []


def figures_per_paragraph(text: str) -> list[tuple[int, str]]:
    """Each prose paragraph's count of figures (code, tables and comments left out)."""
    text = re.sub(r"```.*?```|<!--.*?-->", "", text, flags=re.S)
    paras = [p for p in re.split(r"\n\s*\n", text) if p.strip() and not p.lstrip().startswith("|")]
    return [(len(re.findall(r"(?<![\w.#-])\d[\d,.]*", p)), p[:80]) for p in paras]


def test_the_figure_count_sees_a_crowded_paragraph():
    assert figures_per_paragraph("1, 2, 3, 4, 5 and 6.\n\n| 1 | 2 | 3 | 4 | 5 | 6 |\n") == [(6, "1, 2, 3, 4, 5 and 6.")]


def test_the_readme_shows_a_picture_an_install_and_python_and_keeps_its_figures_in_tables():
    text = README.read_text()
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", text)
    assert pictures and all((README.parent / p).is_file() for p in pictures)
    assert "pip install -e ." in text and "```python" in text
    crowded = [(n, p) for n, p in figures_per_paragraph(text) if n > 5]
    assert not crowded, crowded


@pytest.mark.slow
def test_the_quick_start_script_prepares_trains_averages_and_translates(tmp_path):
    """scripts/quick.sh, as the README gives it, on a budget of 30 updates: a line for its sentence,
    sacreBLEU on test2016, and the run's best and last checkpoints beside the average."""
    env = {**os.environ, "RUN": str(tmp_path / "run"), "DATA": str(tmp_path / "data")}
    budget = ["--train.max_steps", "30", "--train.warmup_steps", "10", "--train.valid_every", "30",
              "--train.save_every", "10", "--train.valid_bleu_sentences", "20", "--train.threads", "2",
              "--decode.max_len_b", "10"]  # an untrained model translates test2016 to the length limit
    p = subprocess.run(["bash", str(README.parent / "scripts" / "quick.sh"), *budget], capture_output=True,
                       text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.splitlines()
    at = out.index("== A dog runs through the snow. ==")  # then its one line (30 updates may say nothing yet)
    assert "==" not in out[at + 1] and out[at + 2].startswith("== test2016")
    assert "BLEU = " in p.stderr and "bash scripts/setup.sh && bash scripts/quick.sh" in README.read_text()
    assert {"best.safetensors", "last.safetensors"} <= {f.name for f in (tmp_path / "run" / "checkpoints").iterdir()}
    assert (tmp_path / "run" / "averaged.safetensors").is_file()


def test_the_quick_preset_scales_its_schedule_with_its_budget():
    """Warm-up a third of the run, checkpoints every 1/20 (the last 5 averaged), validation that
    lands on the last update; and it is the preset the README's Python trains."""
    from aiayn.overrides import preset

    t = preset("quick").train
    assert t.warmup_steps * 3 == t.max_steps and t.save_every * 20 == t.max_steps and t.keep_last == 5
    assert t.max_steps % t.valid_every == 0 and t.max_minutes == 0 and t.save_every_minutes == 0
    assert 'aiayn.preset("quick")' in README.read_text()
