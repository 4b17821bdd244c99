"""The package's layering, read from the source: every import (at module top or inside a function)
goes down the layers or stays in its own package, and no two modules import each other through
any chain. docs/reference/CONTRIBUTING.md draws the same layers for a newcomer.

Parsed with `ast`, so nothing is imported and optional packages need not be installed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "aiayn"

# Bottom to top. A name is a top-level module (aiayn/NAME.py) or a package (aiayn/NAME/); a module
# may import its own package's modules and anything in a lower layer, never a higher one.
LAYERS: list[set[str]] = [
    {"__init__", "errors", "special", "files", "locks", "checks", "progress", "memory", "precision",
     "config"},
    {"kernels"},  # the CPU fast paths the model and the loss call
    {"model"},  # the paper's model and its options
    {"data"},  # corpora, tokenizers, batches, the model directory
    {"decoding"},  # search, precision, int8
    {"evaluation"},  # BLEU, chrF, perplexity
    {"training"},
    {"parsing"},  # §6.3's task
    {"recipes"},  # the recipes' presets and drivers, Tables 1 and 3
    {"presets", "tasks"},  # every preset by name; the training tasks by name
    {"export", "viz"},  # hand-offs to other runtimes; pictures
    {"serving"},
    {"commands"},
    {"cli", "__main__"},
]


def _unit(module: str) -> str:
    """aiayn.decoding.beam -> "decoding"; aiayn.config -> "config"; aiayn -> "__init__"."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported aiayn module) for every import in the file, resolved to a module that
    exists (`from aiayn.x import name` counts as aiayn.x.name when that is a module)."""
    is_package = path.name == "__init__.py"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + is_package]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            targets = [f"{name}.{a.name}" if f"{name}.{a.name}" in known else name
                       for a in node.names]
        else:
            continue
        found += [(node.lineno, t) for t in targets if t.split(".")[0] == "aiayn"]
    return found


def _graph() -> dict[str, list[tuple[int, str]]]:
    modules = _modules()
    known = set(modules)
    return {m: [(line, t) for line, t in _imports(m, p, known) if t != m]
            for m, p in modules.items()}


def _layer(unit: str) -> int:
    for i, layer in enumerate(LAYERS):
        if unit in layer:
            return i
    raise KeyError(unit)


def test_every_module_has_a_layer():
    missing = sorted({_unit(m) for m in _modules()} - set().union(*LAYERS))
    assert not missing, f"add to LAYERS in tests/test_layers.py: {missing}"


def test_no_import_climbs_a_layer():
    climbs = []
    for module, imports in _graph().items():
        for line, target in imports:
            a, b = _unit(module), _unit(target)
            if a != b and _layer(b) > _layer(a):
                climbs.append(f"{module}:{line} imports {target} ({a} below {b})")
    assert not climbs, "\n".join(climbs)


def test_no_import_cycle():
    imports = _graph()
    graph = {m: sorted({t for _, t in found if t in imports}) for m, found in imports.items()}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for node in graph:
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("source, expected", [
    ("from aiayn.data.model_dir import load_model\n", "aiayn.data.model_dir"),
    ("from aiayn.decoding import int8\n", "aiayn.decoding.int8"),
    ("from aiayn import errors\n", "aiayn.errors"),
    ("from .common import x\n", "aiayn.decoding.common"),
])
def test_imports_are_resolved_to_modules(tmp_path, source, expected):
    # The scan above is only as good as its resolution of names to modules.
    path = tmp_path / "m.py"
    path.write_text(source)
    known = set(_modules())
    assert _imports("aiayn.decoding.m", path, known) == [(1, expected)]


def test_the_readme_layout_matches_the_tree():
    # README.md's "Layout" block is a newcomer's map: every package of aiayn/ is on it, and
    # everything on it exists.
    readme = (PACKAGE.parent / "README.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```")[1]
    named = set(re.findall(r"(?:^|\s)((?:aiayn/)?[\w.]+/?)(?=\s{2,}|$)", block, re.M))
    named = {n for n in named if "/" in n or n.endswith(".py")}
    assert all((PACKAGE.parent / n).exists() for n in named), named
    packages = {f"aiayn/{p.name}/" for p in PACKAGE.iterdir()
                if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= named, sorted(packages - named)


def test_product_code_names_no_machine():
    # Figures and the machines they came from belong in docs/experiments/; a comment names the
    # page, so the code stays true on the next machine.
    pattern = re.compile(r"\b(EPYC|Zen ?\d|Xeon|Skylake|Sapphire Rapids|[AH]100|H200)\b")
    found = [f"{p.relative_to(PACKAGE.parent)}:{i}: {line.strip()}"
             for p in sorted(PACKAGE.rglob("*.py"))
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "\n".join(found)
