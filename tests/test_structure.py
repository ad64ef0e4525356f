"""The house keeps its plan: no import cycle inside the package (imports inside functions count),
no lower layer importing a higher one, no function over 60 lines, no module over 400."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiayn"
MAX_FUNCTION, MAX_MODULE = 60, 400
# the ways out, the evidence and the command line sit on top: what lies below never imports them
TOP = ("aiayn.apps", "aiayn.evidence", "aiayn.cli")


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


def test_no_lower_layer_imports_a_higher_one():
    bad = []
    for name, targets in graph().items():
        mine = next((t for t in TOP if name == t or name.startswith(t + ".")), None)
        for target in targets:
            theirs = next((t for t in TOP if target == t or target.startswith(t + ".")), None)
            if theirs and theirs != mine and not name.startswith(("aiayn.cli", "aiayn.__main__")):
                bad.append(f"{name} imports {target}")
    g = graph()
    for name in (n for n in g if n.startswith("aiayn.baselines")):  # the baselines know the model's parts only
        bad += [f"{name} imports {t}" for t in g[name] if t in ("aiayn.models", "aiayn.checkpoint", "aiayn.training")]
    assert not bad, bad


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
    assert err == [f"aiayn {argv[0]}: error: unrecognized arguments: --bogus.flag 1"]
