"""The import rules beside import-linter's contracts (pyproject.toml, run by `make lint`): imports at module tops,
the optional libraries listed in one place, light start-up, and docs/ARCHITECTURE.md stating the same layers."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pope.optional import OPTIONAL, extra_of

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "pope"

# Modules whose imports inside functions predate these rules and which another change is splitting; each must leave
# this set once its imports sit at its top (or say why they do not).
PENDING: set[str] = set()


def _modules():
    for path in sorted(SRC.rglob("*.py")):
        yield path.relative_to(SRC).as_posix(), path.read_text()


def _function_level_imports(tree: ast.AST):
    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                yield child
            yield from visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    yield from visit(tree, False)


def test_imports_inside_functions_say_why():
    """Outside the command layer (pope.cli, whose rule its docstring states), an import inside a function carries
    a comment saying why it is not at the module's top: on its line, or on the line above its block of imports."""
    unexplained = []
    for name, text in _modules():
        if name.startswith("cli/") or name in PENDING:
            continue
        lines = text.splitlines()
        for node in _function_level_imports(ast.parse(text)):
            here = lines[node.lineno - 1]
            above = node.lineno - 2
            while lines[above].strip().startswith(("import ", "from ")) and "#" not in lines[above]:
                above -= 1
            if "#" not in here and "#" not in lines[above]:
                unexplained.append(f"src/pope/{name}:{node.lineno}: {here.strip()}")
    assert not unexplained, "imports inside functions without a reason:\n" + "\n".join(unexplained)


def test_pending_modules_still_exist():
    """PENDING names modules that exist; a module that left it (split, or its imports moved) is removed from it."""
    assert all((SRC / name).is_file() for name in PENDING), PENDING


def _require_calls():
    for name, text in _modules():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    extra = node.args[1] if len(node.args) > 1 else None
                    extra = next((k.value for k in node.keywords if k.arg == "extra"), extra)
                    yield name, node.lineno, first.value, getattr(extra, "value", None)


def test_optional_libraries_are_listed_in_one_place():
    """Every library pope.optional.require imports is listed in pope.optional.OPTIONAL, with the extra a call
    names (when it names one); every listed library is an extra of pope-attention in pyproject.toml."""
    calls = list(_require_calls())
    assert len(calls) > 10
    for name, line, module, extra in calls:
        assert extra in (None, extra_of(module)), f"src/pope/{name}:{line}: require({module!r}, {extra!r})"
    extras = re.search(r"\[project\.optional-dependencies\](.*?)\n\[", (ROOT / "pyproject.toml").read_text(), re.S)
    declared = set(re.findall(r"^([\w-]+) = ", extras.group(1), re.M))
    assert set(OPTIONAL.values()) <= declared


def _imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": ""}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


def test_import_pope_is_light():
    """`import pope` imports neither torch nor numpy (names load on first use)."""
    assert not {"torch", "numpy"} & _imported_after("import pope")


def test_the_command_line_parser_is_light():
    """`pope --help` builds the whole parser, every command module imported: neither torch nor numpy."""
    assert not {"torch", "numpy"} & _imported_after("import pope.cli; pope.cli.build_parser()")


@pytest.mark.parametrize("module", ["pope.attention", "pope.encodings", "pope.model", "pope.ops"])
def test_the_model_stack_imports_no_triton(module):
    """The model stack imports torch only: Triton and torch._dynamo (~1.2 s) load on the first kernel call."""
    assert not {"triton", "torch._dynamo"} & _imported_after(f"import {module}")


def test_architecture_states_the_contracts():
    """docs/ARCHITECTURE.md names every layer of pyproject's layers contract, in its order, and every contract."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    layers = re.findall(r'^    "(pope\.[^"]+)",$', pyproject.split('type = "layers"')[1].split("]")[0], re.M)
    assert len(layers) >= 10
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    positions = [doc.find(layer) for layer in layers]
    assert -1 not in positions, [layer for layer, at in zip(layers, positions) if at == -1]
    assert positions == sorted(positions), "the layers appear in another order"
    for name in re.findall(r'^name = "(.+)"$', pyproject.split("[tool.importlinter]")[1], re.M):
        assert name in doc, f"docs/ARCHITECTURE.md does not state the contract {name!r}"
