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


def _names_a_method(node: ast.AST) -> bool:
    """An expression that holds a method's name: `method`, `name`, `x.method`, `x.name`, `x["method"]`,
    `x.get("method")`."""
    keys = ("method", "name", "method_name")
    if isinstance(node, ast.Name):
        return node.id in keys
    if isinstance(node, ast.Attribute):
        return node.attr in keys
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value in keys
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys
    return False


def _constants(node: ast.AST) -> list:
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


def method_name_branches(source: str, names: set[str]) -> list[int]:
    """Lines of `source` that branch on a method's name: a comparison of a name-holding expression with a method's
    name (`name == "longrope"`, `spec["method"] in ("yarn", ...)`), or a table keyed by method names (`{"string":
    ...}`). Comparisons of rope types (`rope_type == "yarn"`) are not: transformers' names, read from configs."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if names & {v for o in operands for v in _constants(o)} and any(map(_names_a_method, operands)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict):
            if names & {k.value for k in node.keys if isinstance(k, ast.Constant)}:
                lines.append(node.lineno)
    return lines


def test_no_module_outside_methods_branches_on_a_method_name():
    """Every per-method rule lives in methods/ (the method object or an adapter registered beside it)."""
    names = set(method_names())
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}"
                 for name, path in _modules().items() if not name.startswith("rope_extend.methods")
                 for line in method_name_branches(path.read_text(), names)]
    assert not offenders, offenders


def test_the_branch_check_sees_the_forms_that_escaped_it():
    """The two branches issue 48 found past the check above (parity's `name == "longrope"`, inspect's table keyed by
    "string") and the forms around them are caught; rope-type comparisons are not."""
    names = set(method_names())
    caught = [
        'if name == "longrope":\n    pass',
        'inside = {"string": "why"}',
        'x = spec["method"] in ("yarn", "ntk")',
        'x = spec.get("method") != "dynamic"',
        'x = plan.spec.method == "self-extend"',
        'x = method_name == "yarn"',
    ]
    for source in caught:
        assert method_name_branches(source, names) == [1], source
    for source in ('x = rope_type == "yarn"', 'x = full.get("rope_type") in ("linear", "dynamic")',
                   'x = {"rope_type": "yarn"}', 'x = name == "model"'):
        assert method_name_branches(source, names) == [], source


TESTS = Path(__file__).resolve().parent


def test_test_modules_share_helpers_not_each_other():
    """Shared helpers live in tests/helpers.py (fixtures in conftest.py): no test module imports another, and no test
    calls another (a GPU test runs a shared check, not a CPU test)."""
    modules = {path.stem for path in TESTS.glob("test_*.py")}
    offenders = []
    for path in sorted(TESTS.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            imported = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                        else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else [])
            offenders += [f"{path.name}:{node.lineno} imports {name}" for name in imported
                          if name in modules and name != path.stem]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("test_"):
                offenders.append(f"{path.name}:{node.lineno} calls {node.func.id}")
    assert not offenders, offenders


ENGINE_NAMES = {"transformers", "vllm", "vllm-server", "sglang", "sglang-server", "llama.cpp", "llamacpp"}


def engine_name_comparisons(source: str) -> list[int]:
    """Lines of `source` that compare something with an engine's name (`engine == "vllm"`, `name in ("vllm",
    "sglang")`, `row.engine.startswith("transformers")`), in any letter case: what the run-engine registry
    (`engines.runs`) answers instead. Dictionary keys and messages are not comparisons."""
    def named(values) -> bool:
        return any(isinstance(v, str) and v.lower() in ENGINE_NAMES for v in values)

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and named(v for o in [node.left, *node.comparators] for v in _constants(o)):
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith") and named(v for a in node.args for v in _constants(a))):
            lines.append(node.lineno)
    return lines


def test_eval_and_the_parity_report_compare_no_engine_name():
    """`eval --engine NAME` and `engines --run NAME` go through the run-engine registry: no module of eval/, the
    parity report or the two commands compares a string with an engine's name (adding SGLang is one adapter file)."""
    checked = [path for name, path in _modules().items()
               if name.startswith("rope_extend.eval") or name in (
                   "rope_extend.engines.parity", "rope_extend.engines.runs", "rope_extend.engines.reference",
                   "rope_extend.cli.eval_cmd", "rope_extend.cli.engines_cmd")]
    assert len(checked) > 10
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in checked
                 for line in engine_name_comparisons(path.read_text())]
    assert not offenders, offenders


def test_the_engine_name_check_sees_the_forms_it_forbids():
    caught = ['x = engine == "vllm"', 'x = engine != "transformers"', 'x = name in ("vllm", "sglang")',
              'x = row.engine.startswith("transformers")', 'x = "vLLM" == hint.engine', 'x = e not in {"SGLang"}']
    for source in caught:
        assert engine_name_comparisons(source) == [1], source
    for source in ('x = hints["vLLM"]', 'x = {"vllm": "offline"}', 'f("--engine vllm")', 'x = kind == "port"'):
        assert engine_name_comparisons(source) == [], source
