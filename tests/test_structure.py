"""The house keeps its plan: no import cycle inside the package (imports inside functions count),
its folders in at most ten layers with no room importing upwards, no function over 60 lines, no
module over 400."""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiayn"
MAX_FUNCTION, MAX_MODULE = 60, 400


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> set[str]:
    """The package's modules that `path` imports, at any depth of the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")
            base = base[:len(base) - node.level + 1]
            target = ".".join(base + ([node.module] if node.module else []))
            candidates = [f"{target}.{a.name}" for a in node.names] + [target]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aiayn"):
            candidates = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names if a.name.startswith("aiayn")]
        else:
            continue
        out.update(c for c in candidates if c in known and c != name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, set(mods)) for name, path in mods.items()}


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(g.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(g):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_the_package():
    g = graph()
    assert len(g) > 20 and any(g.values())  # the graph was read
    cycle = find_cycle(g)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


# The plan, lowest layer first: a room (a folder of the package, or a module at its top) imports
# only rooms of layers below its own. Rooms of one layer know nothing of each other.
LAYERS = (
    ("errors", "presets", "version", "score", "doors", "progress"),  # what every layer may use
    ("files", "config", "device", "extras"),  # atomic files, markers; typed settings; the machine; optional packages
    ("data", "models", "overrides"),  # text -> subwords -> batches (§5.1); §3 and its rivals; dotted keys, YAML
    ("checkpoint", "pretrained"),  # a model's file, and the model back from it; a Marian folder read
    ("decode", "export"),  # §6.1's search; Marian / CTranslate2 files
    ("parsing", "serve"),  # §6.3, above the translator it decodes with; HTTP
    ("training",),  # §5: a run from the first step to the last checkpoint, resumed after a crash
    ("analysis", "evidence", "__init__"),  # Figures 3-5 measured; the paper's tables rerun; the Python API
    ("cli",),  # one module per stage of the command line
    ("__main__",),
)
MAX_LAYERS = 10


def room(module: str) -> str:
    """aiayn.decode.search -> decode; aiayn.config -> config; aiayn -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def rooms_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, targets in g.items():
        out.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    return out


def floors(g: dict[str, set[str]]) -> dict[str, int]:
    """Each room's floor: 1 + the highest floor it imports (the drawing's height is the max)."""
    out: dict[str, int] = {}

    def floor(n: str) -> int:
        if n not in out:
            out[n] = 0  # a cycle would read as floor 1 here; the cycle test catches it
            out[n] = 1 + max((floor(m) for m in g.get(n, ())), default=0)
        return out[n]

    for n in g:
        floor(n)
    return out


def test_every_room_has_a_layer_and_the_plan_has_at_most_ten():
    rank = {r: i for i, layer in enumerate(LAYERS) for r in layer}
    assert sorted(rooms_graph(graph())) == sorted(rank), "a room the plan does not place (or a gone one)"
    assert len(LAYERS) <= MAX_LAYERS
    assert max(floors(rooms_graph(graph())).values()) <= MAX_LAYERS


def test_the_floor_count_sees_height():
    assert floors({"a": {"b"}, "b": {"c"}, "c": set()}) == {"a": 3, "b": 2, "c": 1}


def test_no_room_imports_its_own_layer_or_one_above():
    rank = {r: i for i, layer in enumerate(LAYERS) for r in layer}
    g = graph()
    bad = sorted(f"{name} imports {t}" for name, targets in g.items() for t in targets
                 if room(t) != room(name) and rank[room(t)] >= rank[room(name)])
    assert not bad, bad


def test_the_models_know_no_parser():
    """§6.3's inputs are parsing/model.py's: the Transformer and its builder never name them."""
    words = ("pointer", "tagger", "tag_input")
    found = [f"{p.name}: {w}" for p in (PACKAGE / "models").glob("*.py") for w in words if w in p.read_text()]
    assert not found, found


def long_functions(source: str) -> list[tuple[str, int]]:
    return [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION]


def test_the_length_check_sees_a_long_function():
    body = "def f():\n" + "    x = 1\n" * MAX_FUNCTION
    assert long_functions(body) == [("f", MAX_FUNCTION + 1)] and long_functions("def g():\n    pass\n") == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_functions_and_modules_are_short(name):
    path = modules()[name]
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE, f"{path.name}: {len(source.splitlines())} lines"
    assert long_functions(source) == [], f"{path.name}: functions over {MAX_FUNCTION} lines"


@pytest.mark.parametrize("path", sorted((PACKAGE.parent / "bench").rglob("*.py")), ids=lambda p: p.name)
def test_the_benchmarks_are_kept_as_the_package_is(path):
    """bench/ is read as often as the package (its figures are the README's): the same lengths."""
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_MODULE, f"{path.name}: {len(source.splitlines())} lines"
    assert long_functions(source) == [], f"{path.name}: functions over {MAX_FUNCTION} lines"


def test_every_error_about_input_is_an_aiayn_error():
    """One base (errors.AiaynError) that the command line prints as one line: a new kind of error
    cannot be forgotten in a list of classes the CLI must know."""
    import importlib
    import inspect

    from aiayn.errors import AiaynError

    errors = []
    for name in (n for n in modules() if not n.endswith("__main__")):  # that one runs the command line
        module = importlib.import_module(name)
        errors += [c for _, c in inspect.getmembers(module, inspect.isclass)
                   if c.__module__ == name and c.__name__.endswith("Error")]
    assert len(errors) >= 10
    assert [c.__qualname__ for c in errors if not issubclass(c, AiaynError)] == []


@pytest.mark.parametrize("argv", [["translate", "--checkpoint", "x"], ["score", "--hyp", "a", "--ref", "b"],
                                  ["average", "run", "-o", "a.safetensors"],
                                  ["export", "hf", "--checkpoint", "x", "-o", "y"],
                                  ["serve", "--checkpoint", "x"], ["params"]])
def test_unknown_arguments_are_refused_in_one_place(argv, capsys):
    """Only prepare, train and config take --section.key overrides; any other verb names what it did
    not understand, before doing anything."""
    from aiayn.cli import main

    assert main([*argv, "--bogus.flag", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"aiayn {argv[0]}: error: unrecognized arguments: --bogus.flag 1")


def lazy_imports(source: str) -> list[str]:
    """The package's own modules that a function imports (a relative import inside a def)."""
    return sorted({f"{'.' * n.level}{n.module or ''}" for f in ast.walk(ast.parse(source))
                   if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(f) if isinstance(n, ast.ImportFrom) and n.level})


def test_library_code_imports_at_the_top():
    """Only the command line imports lazily (so that `aiayn --help` answers without torch); the
    library imports its own modules at the top, where the layer test sees them."""
    assert lazy_imports("def f():\n    from .x import y\n") == [".x"] and lazy_imports("from .x import y\n") == []
    found = {name: lazy_imports(path.read_text()) for name, path in modules().items()
             if not name.startswith("aiayn.cli")}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_paper_map_names_every_module():
    """docs/paper-map.md is drawn from the tree: every module has its row, and no row names a gone one."""
    doc = (PACKAGE.parent / "docs" / "paper-map.md").read_text()
    rows = set(re.findall(r"^\| `([\w/.]+\.(?:py|html))`", doc, re.M))
    files = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if p.name not in ("__init__.py", "__main__.py") and p.parent.name not in ("cli", "evidence")}
    files.add("serve/page.html")
    assert files - rows == set(), "modules without a row"
    assert {r for r in rows if not r.startswith("evidence/")} - files == set(), "rows naming no module"


def named_files(text: str) -> set[str]:
    """Paths like `models/rnn.py` or `batches.py` that a docstring or comment names."""
    return set(re.findall(r"(?<![\w/.])((?:\w+/)*[a-z_0-9]+\.py)\b", text))


def test_the_package_names_only_files_that_exist():
    """A docstring that points at a module points at one that is there (a moved module left
    `baselines/rnn.py` and `model.py` behind in five docstrings): relative to the package, to the
    naming file's folder, to one of the package's folders, or to the repository."""
    assert named_files("the baseline (baselines/rnn.py) and batches.py; not x.pyc") == {"baselines/rnn.py",
                                                                                         "batches.py"}
    roots = [PACKAGE, PACKAGE.parent, PACKAGE.parent / "tests", PACKAGE.parent / "bench"]
    roots += [d for d in [*PACKAGE.iterdir(), *(PACKAGE.parent / "bench").iterdir()] if d.is_dir()]
    gone = {f"{path.relative_to(PACKAGE)}: {ref}" for path in PACKAGE.rglob("*.py")
            for ref in named_files(path.read_text())
            if not any((root / ref).exists() for root in [path.parent, *roots])}
    assert gone == set()


def test_no_module_imports_another_modules_private_names():
    """A module's underscore names are its own: another module of the package that needs one needs
    a public name (the door), not a reach into the room."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("aiayn")):
                found += [f"{name}: {a.name}" for a in node.names if a.name.startswith("_") and a.name[:2] != "__"]
    assert not found, found


SUBPACKAGES = sorted(p.parent for p in PACKAGE.glob("*/**/__init__.py"))


@pytest.mark.parametrize("folder", SUBPACKAGES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_subpackage_door_lists_its_names_and_each_opens(folder):
    """Each subpackage's __init__ says what to read first and exports its public names in __all__;
    every one of them resolves (a door naming a moved or gone name fails here)."""
    import importlib

    source = (folder / "__init__.py").read_text()
    doc = ast.get_docstring(ast.parse(source)) or ""
    assert doc and "Read first" in doc or folder.name == "cli", f"{folder.name}: no docstring saying what to read first"
    package = importlib.import_module(module_name(folder / "__init__.py"))
    assert getattr(package, "__all__", None), f"{folder.name}: no __all__"
    for public in package.__all__:
        assert getattr(package, public) is not None


def test_the_door_check_sees_a_name_that_is_gone(tmp_path):
    from aiayn.doors import lazy

    get, names = lazy("aiayn.data", {"prepare": "prepare", "gone": "prepare"})
    assert callable(get("prepare")) and names() == ["gone", "prepare"]
    with pytest.raises(AttributeError):
        get("gone")
    with pytest.raises(AttributeError, match="no attribute 'other'"):
        get("other")


def test_a_translation_model_is_built_and_decoded_without_the_parser():
    """§6.3's parser sits above the translator: building a translation model through aiayn.build_model,
    its fused step and a Translator import nothing from parsing/ (in a fresh process)."""
    import subprocess
    import sys

    code = ("import sys, aiayn\nfrom aiayn.config import ModelConfig\n"
            "m = aiayn.build_model(ModelConfig(vocab_size=40, d_model=16, d_ff=32, h=2, N=1)).eval()\n"
            "from aiayn.decode.fast import fast_decoder\nfast_decoder(m)\naiayn.Translator\n"
            "import aiayn.checkpoint, aiayn.decode.translator\n"
            "print(sorted(k for k in sys.modules if k.startswith('aiayn.parsing')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]", res.stdout


ORDINAL = (r"((twenty|thirty)-)?(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
           r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(st|nd|rd|th))")
HISTORY = re.compile(rf"\b{ORDINAL} (visit|session)\b|\bGPU visit\b|\bvisit\d|"
                     r"(?<![\w/-])(issue |task )?#\d{2,3}\b(?!\d)", re.IGNORECASE)
TEXT = (".py", ".sh", ".md", ".yaml", ".yml", ".toml", ".cfg", ".txt")
PROSE = r"in|of|on|against|from|see|this|that|the|our|an?|and|by|per|as|at|to|for|with|since|under|after|before"
OTHERS = re.compile(rf"[\w-]+/[\w-]+ ?#\d+|\b(?!(?:{PROSE})\b)[\w-]+ issues? (#\d+(, )?)+",  # another project's, cited
                    re.IGNORECASE)


def history_mentions(source: str) -> list[str]:
    return [m.group(0) for m in HISTORY.finditer(OTHERS.sub("", source))]


def test_the_history_check_sees_a_visit_and_an_issue_but_not_another_projects_issue():
    assert history_mentions("as the sixth visit measured (issue #58)") == ["sixth visit", "issue #58"]
    assert history_mentions("since the thirteenth session; twenty-fourth session; a 3rd visit") == [
        "thirteenth session", "twenty-fourth session", "3rd visit"]
    assert history_mentions("run.json's sessions; a training session resumes") == []
    assert history_mentions("measured in issue #58; against Issue #30's target") == ["issue #58", "Issue #30"]
    assert history_mentions("pytorch/pytorch#176653; uvicorn issues #160, #1192") == []


def project_text_files() -> list[Path]:
    """The repository's own text (code, scripts, docs, configs): git's tracked files, or outside a checkout
    every file but the environment, caches and a user's runs and data (the git-ignored folders)."""
    import subprocess

    root = PACKAGE.parent
    listed = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        files = [root / name for name in listed.stdout.splitlines()]
    else:
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", ".whl", ".gpudata", "runs", "work",
                "build", "dist"}
        files = [p for p in root.rglob("*") if not skip.intersection(p.relative_to(root).parts)
                 and not any(part.endswith(".egg-info") for part in p.relative_to(root).parts)]
    return sorted(p for p in files if p.suffix in TEXT and p.is_file() and p != Path(__file__))


def test_no_comment_docstring_or_doc_names_a_session_a_visit_or_an_issue_number():
    """History lives in commits and notes: a comment or a doc that cites "the fifth visit", "the sixth
    session" or "#61" rots. Every text file of the repository is read, the package's and the rest."""
    root = PACKAGE.parent
    found = [f"{p.relative_to(root)}: {m}" for p in project_text_files()
             for m in history_mentions(p.read_text(errors="replace"))]
    assert not found, found


def test_docs_hold_prose_and_pictures_and_results_hold_the_data():
    """Result data (JSON, hypotheses, metrics) lives under results/; docs/ holds prose and pictures."""
    root = PACKAGE.parent
    docs = root / "docs"
    data = [p.relative_to(root) for p in docs.rglob("*") if p.is_file() and p.suffix not in (".md", ".png", ".svg")]
    assert not data, data
    assert any((root / "results" / "reproduction" / "table3").glob("*.json"))
