"""Structure rules of the package, checked on its source: no import cycles anywhere in rope_extend/ (imports
inside functions included), and no module outside methods/ branches on a method name (the method object owns every
per-method rule)."""

from __future__ import annotations

import ast
from pathlib import Path

from rope_extend.methods import method_names

PACKAGE = Path(__file__).resolve().parents[1] / "rope_extend"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    tree = ast.parse(path.read_text())
    type_only = {  # `if TYPE_CHECKING:` imports never run
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", None)) == "TYPE_CHECKING"
        for child in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            target = f"{base}.{node.module}" if node.module else base
            candidates = [target] + [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rope_extend"):
            candidates = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names if alias.name.startswith("rope_extend")]
        else:
            continue
        found |= {c for c in candidates if c in modules and c != name}
    return found


def test_no_import_cycles_in_the_package():
    modules = _modules()
    # a package's __init__ re-exports its children: importing a child imports the parent first, so edges into an
    # __init__ from its own children are not cycles of the code's making; we drop child -> ancestor edges
    edges = {
        name: {t for t in _imports(name, path, modules) if not name.startswith(t + ".")}
        for name, path in modules.items()
    }
    cycles = []

    def visit(node, stack, seen):
        for target in edges.get(node, ()):
            if target in stack:
                cycles.append(stack[stack.index(target):] + [target])
            elif target not in seen:
                seen.add(target)
                visit(target, stack + [target], seen)

    for start in sorted(edges):
        visit(start, [start], {start})
    assert not cycles, [" -> ".join(c) for c in cycles[:5]]


def test_no_module_outside_methods_branches_on_a_method_name():
    names = set(method_names())
    offenders = []
    for name, path in _modules().items():
        if name.startswith("rope_extend.methods"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            left = node.left
            on_method = (isinstance(left, ast.Attribute) and left.attr in ("method", "name")) or (
                isinstance(left, ast.Name) and left.id in ("method", "method_name")
            )
            values = []
            for comparator in node.comparators:
                if isinstance(comparator, ast.Constant):
                    values.append(comparator.value)
                elif isinstance(comparator, (ast.Tuple, ast.List, ast.Set)):
                    values += [e.value for e in comparator.elts if isinstance(e, ast.Constant)]
            if on_method and names & set(values):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not offenders, offenders
