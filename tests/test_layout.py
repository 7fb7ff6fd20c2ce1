"""Structure rules of the package, checked on its source: no import cycles anywhere in rope_extend/ (imports
inside functions and type-only imports under `if TYPE_CHECKING:` included: a type hint is a dependency too), no
import from a lower layer to a higher one (the layer table of docs/development.md), no private name imported across
modules (nor by a test file from another or from rope_extend), no module outside methods/ branches on a method name
(the method object owns every per-method rule), and no function longer than a reader can hold (80 lines).

`python tests/test_layout.py [LINES]` lists the functions of rope_extend/ longer than LINES (default 80), longest
first."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from rope_extend.methods import method_names

PACKAGE = Path(__file__).resolve().parents[1] / "rope_extend"


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):  # `if TYPE_CHECKING:` imports too: what a module names
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


# Cycles still to untangle, each the modules on it (sorted), with its issue: nothing else may join this list.
CYCLES_LEFT: set[tuple[str, ...]] = set()


def import_cycles(modules: dict[str, Path]) -> set[tuple[str, ...]]:
    """Every import cycle among `modules`, as the sorted modules on it."""
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
    return {tuple(sorted(set(cycle))) for cycle in cycles}


def test_no_import_cycles_in_the_package():
    found = import_cycles(_modules())
    assert not found - CYCLES_LEFT, sorted(found - CYCLES_LEFT)
    assert not CYCLES_LEFT - found, f"untangled: remove {sorted(CYCLES_LEFT - found)} from CYCLES_LEFT"


def test_the_cycle_check_sees_a_type_only_import(tmp_path):
    """A cycle closed by an import under `if TYPE_CHECKING:` (the methods <-> spec circle issue 67 found) is a
    cycle: the type names a dependency all the same."""
    package = tmp_path / "rope_extend"
    (package / "methods").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spec.py").write_text("from .methods import registry\n")
    (package / "methods" / "__init__.py").write_text("")
    (package / "methods" / "registry.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from ..spec import RopeSpec\n")
    modules = {_module_name(path, package): path for path in package.rglob("*.py")}
    assert import_cycles(modules) == {("rope_extend.methods.registry", "rope_extend.spec")}


DOCS = PACKAGE.parent / "docs" / "development.md"


def layer_table() -> dict[str, int]:
    """docs/development.md's layer table: ``{module or package prefix: layer}`` (`x.py` a module, `x/` a package;
    a file named inside a package, `engines/parity.py`, has its own layer)."""
    table = {}
    for line in DOCS.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].isdigit():
            continue
        for name in re.findall(r"`([\w/]+(?:\.py|/))`", cells[1]):
            table["rope_extend." + name.removesuffix("/").removesuffix(".py").replace("/", ".")] = int(cells[0])
    return table


def layer_of(module: str, table: dict[str, int]) -> int | None:
    """The layer of `module`: its own row, else its nearest package's (the package root and `__main__`: above all)."""
    if module == "rope_extend" or module.endswith(".__main__"):  # the package's API and `python -m` entry points
        return max(table.values()) + 1
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in table:
            return table[".".join(parts[:n])]
    return None


def upward_imports(modules: dict[str, Path], table: dict[str, int]) -> list[str]:
    """``a (layer m) -> b (layer n)`` for every import (inside functions too) from a module to a higher layer."""
    found = []
    for name, path in sorted(modules.items()):
        for target in sorted(_imports(name, path, modules)):
            if name.startswith(target + "."):  # a package's __init__, imported first by its own children
                continue
            if layer_of(target, table) > layer_of(name, table):
                found.append(f"{name} ({layer_of(name, table)}) -> {target} ({layer_of(target, table)})")
    return found


def test_every_module_has_a_layer_in_the_docs_table():
    table = layer_table()
    assert len(table) > 20, "docs/development.md's layer table was not found"
    assert not [name for name in _modules() if layer_of(name, table) is None]


# Upward imports still to remove, each with its issue: nothing else may join this list.
NOT_YET_LAYERED: set[str] = set()  # upward imports still to remove (none)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    """The layer rule of docs/development.md: a module imports only from its own layer or lower ones."""
    found = upward_imports(_modules(), layer_table())
    assert not set(found) - NOT_YET_LAYERED, found
    assert not NOT_YET_LAYERED - set(found), "fixed: remove from NOT_YET_LAYERED"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """An import from a layer-1 module into the layer-8 CLI, inside a function, is caught; a downward one is not."""
    package = tmp_path / "rope_extend"
    (package / "cli").mkdir(parents=True)
    for name in ("__init__.py", "cli/__init__.py", "cli/app.py"):
        (package / name).write_text("")
    (package / "errors.py").write_text("def f():\n    from .cli import app\n")
    (package / "version.py").write_text("from . import errors\n")
    modules = {_module_name(path, package): path for path in package.rglob("*.py")}
    assert upward_imports(modules, layer_table()) == ["rope_extend.errors (1) -> rope_extend.cli (8)",
                                                      "rope_extend.errors (1) -> rope_extend.cli.app (8)"]


def private_names_crossing_modules(modules: dict[str, Path]) -> list[str]:
    """``module:line uses name of other`` for every `_private` name another module of the package imports (``from
    .record import _walk``) or reaches through an imported module (``record._walk``): a module's private helpers are
    its own; what others need is public."""
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path.name
        bound = {}  # local name -> module of the package it is bound to
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rope_extend"):
                source = node.module
            elif isinstance(node, ast.Import):
                bound |= {alias.asname: alias.name for alias in node.names if alias.name in modules and alias.asname}
                continue
            else:
                continue
            bound |= {alias.asname or alias.name: f"{source}.{alias.name}" for alias in node.names
                      if f"{source}.{alias.name}" in modules}
            found += [f"{where}:{node.lineno} uses {alias.name} of {source}" for alias in node.names
                      if _private(alias.name) and source != name]
        found += [f"{where}:{node.lineno} uses {node.attr} of {bound[node.value.id]}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr)
                  and bound.get(node.value.id, name) != name]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_name_is_imported_across_modules():
    assert not private_names_crossing_modules(_modules())


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
    ...}`). Comparisons of rope types (`rope_type == "yarn"`) are not: transformers' names, read from configs; nor is
    a table named `..._BY_ROPE_TYPE` (an engine room's rules, keyed by the rope_type the engine dispatches on)."""
    tree = ast.parse(source)
    rope_type_tables = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                        and any(isinstance(t, ast.Name) and t.id.endswith("BY_ROPE_TYPE") for t in node.targets)}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if names & {v for o in operands for v in _constants(o)} and any(map(_names_a_method, operands)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and id(node) not in rope_type_tables:
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
        'RULES = {"yarn": f, "linear": g}',
        'x = spec["method"] in ("yarn", "ntk")',
        'x = spec.get("method") != "dynamic"',
        'x = plan.spec.method == "self-extend"',
        'x = method_name == "yarn"',
    ]
    for source in caught:
        assert method_name_branches(source, names) == [1], source
    for source in ('x = rope_type == "yarn"', 'x = full.get("rope_type") in ("linear", "dynamic")',
                   'x = {"rope_type": "yarn"}', 'x = name == "model"', 'BY_ROPE_TYPE = {"yarn": f, "linear": g}'):
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


def private_imports_in_tests(tests: Path) -> list[str]:
    """``file:line imports name from module`` for every `_private` name a file of `tests` imports from another of its
    files (helpers.py, tiny.py, hubserver.py...) or from rope_extend (``from helpers import _cache``, ``from
    rope_extend.eval.runner import _config_window``, ``import rope_extend.x._y``): what tests share is public
    (helpers' names, fixtures in conftest.py), and a test reaches rope-extend through what a module makes public."""
    local = {path.stem for path in tests.glob("*.py")}
    found = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module:
                top = node.module.split(".")[0]
                if top == "rope_extend" or (top in local and node.module != path.stem):
                    found += [f"{path.name}:{node.lineno} imports {alias.name} from {node.module}"
                              for alias in node.names if _private(alias.name)]
                    found += [f"{path.name}:{node.lineno} imports {part} from {node.module}"
                              for part in node.module.split(".")[1:] if _private(part)]
            elif isinstance(node, ast.Import):
                found += [f"{path.name}:{node.lineno} imports {part} from {alias.name}" for alias in node.names
                          if alias.name.split(".")[0] in local | {"rope_extend"}
                          for part in alias.name.split(".")[1:] if _private(part)]
    return found


def test_tests_import_no_private_name_across_files():
    assert not private_imports_in_tests(TESTS)


def test_the_test_import_check_sees_private_names(tmp_path):
    """A private name imported from another test file or from rope_extend is caught, in a function too; a file's
    own private names, public names, dunders and other libraries' private names are not."""
    (tmp_path / "helpers.py").write_text("def _cache():\n    pass\n\n\ndef cache():\n    pass\n")
    (tmp_path / "test_a.py").write_text(
        "from helpers import _cache, cache\nfrom os import _exit\nfrom rope_extend import __version__\n"
        "import rope_extend._hidden\n\n\ndef _own():\n    pass\n\n\n"
        "def test_x():\n    from rope_extend.eval.runner import _config_window\n    from test_a import _own\n")
    assert private_imports_in_tests(tmp_path) == [
        "test_a.py:1 imports _cache from helpers", "test_a.py:4 imports _hidden from rope_extend._hidden",
        "test_a.py:12 imports _config_window from rope_extend.eval.runner"]


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


def test_engine_knowledge_lives_in_the_engines_rooms():
    """Issue 64's counts: no module outside an engine's room (`rope_extend/engines/<name>/`) compares a string with an
    engine's name -- methods/, the reports that loop over the registry, eval and the CLI included -- and at most 3
    string constants outside engines/ name a serving engine other than the reference (whose name, transformers, is
    also the package every module imports and reads the version of). Every registered engine, its port and its run
    adapter live in its own package."""
    from rope_extend.engines.registry import serving_engines

    rooms = {f"rope_extend.engines.{engine.__module__.split('.')[2]}" for engine in serving_engines()}
    outside = {name: path for name, path in _modules().items() if not any(name.startswith(r) for r in rooms)}
    offenders = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in outside.values()
                 for line in engine_name_comparisons(path.read_text())]
    assert not offenders, offenders
    names = {n.lower() for engine in serving_engines() if engine.ported for n in (engine.name, engine.title)}
    constants = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for name, path in _modules().items()
                 if not name.startswith("rope_extend.engines")
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.lower() in names]
    assert len(constants) <= 3, constants
    for engine in serving_engines():
        package = type(engine).__module__.rsplit(".", 1)[0]
        assert package.count(".") == 2 and package.startswith("rope_extend.engines."), engine  # a package of its own
        assert (PACKAGE / "engines" / package.split(".")[2] / "__init__.py").is_file()
        if engine.ported:
            assert (PACKAGE / "engines" / package.split(".")[2] / "port.py").is_file(), engine
        if engine.run is not None:
            assert type(engine.run).__module__.startswith(package + "."), engine


def test_the_engine_name_check_sees_the_forms_it_forbids():
    caught = ['x = engine == "vllm"', 'x = engine != "transformers"', 'x = name in ("vllm", "sglang")',
              'x = row.engine.startswith("transformers")', 'x = "vLLM" == hint.engine', 'x = e not in {"SGLang"}']
    for source in caught:
        assert engine_name_comparisons(source) == [1], source
    for source in ('x = hints["vLLM"]', 'x = {"vllm": "offline"}', 'f("--engine vllm")', 'x = kind == "port"'):
        assert engine_name_comparisons(source) == [], source


def test_a_new_probe_is_registered_in_one_place():
    """`register_probe` alone makes a probe a needle task the suite accepts and expands into cases, that prompts and
    scores dispatch to, that lm-eval's glue writes data for and that an interleaved run places with its section."""
    from rope_extend.eval import lm_tasks, probes
    from rope_extend.eval.jobs import section_rank
    from rope_extend.eval.suite import Suite

    made = []

    def make(tokenizer, length, depth, index=0, seed=0, num_needles=4, haystack=None):
        made.append((length, depth, index, num_needles, haystack))
        return probes.ProbeSample("echo", length, None, index, list(range(length)), [str(num_needles)], [0])

    class Tokenizer:
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    probes.register_probe(probes.Probe("echo", "needle", make, probes.first_number, answer_tokens=5, spread=True,
                                       needles=True, per_needle=True))
    try:
        suite = Suite.from_dict({"short_context": [32], "needle": {"tasks": ["echo"], "lengths": [64], "samples": 2,
                                                                   "depths": [0.1, 0.9], "num_needles": 3}})
        cases = suite.cases(64)
        assert [(c.kind, c.length, c.depth, c.params) for c in cases] == (
            [("echo", 32, None, {"num_needles": 3, "haystack": "filler"})] * 4
            + [("echo", 64, None, {"num_needles": 3, "haystack": "filler"})] * 4)
        sample = probes.make_probe(Tokenizer(), "echo", 64, 0.5, index=1, num_needles=3, haystack="filler")
        assert made[-1] == (64, 0.5, 1, 3, "filler") and sample.task == "echo"
        assert probes.score(sample, "3 tokens") == 1.0 and probes.score(sample, "4") == 0.0
        assert "echo" in lm_tasks.all_tasks()
        docs = lm_tasks.build_docs(Tokenizer(), "echo", [16], depths=[0.2, 0.8], num_needles=5)
        assert [(d["task"], d["length"], d["depth"], d["target"]) for d in docs] == [("echo", 16, -1.0, "5")]
        assert probes.get_probe("echo").max_new_tokens(5) == 25 and lm_tasks.max_answer_tokens(5) >= 25
        assert section_rank("echo") == section_rank("niah_single") > section_rank("passkey")
    finally:
        del probes.PROBES["echo"]


def test_a_new_method_is_registered_in_one_place():
    """A method registered with its advice alone joins the closed forms tune searches by default, compares at
    their defaults (held-out) and `inspect --plot` draws: no list of method names outside methods/ to extend."""
    from transformers import AutoConfig

    from rope_extend.inspect.plot import method_curves
    from rope_extend.methods import closed_forms, registry, tune_methods
    from rope_extend.methods.linear import Linear
    from rope_extend.tune.heldout import default_variants
    from rope_extend.tune.space import Geometry, closed_form_grid

    class Half(Linear):
        name = "toy-half"
        aliases = ()

    class HalfAdvice(registry.Advice):
        closed_form = 99
        tune_rank = 99

    registry.register(Half(), advice=HalfAdvice)
    try:
        assert closed_forms()[-1] == closed_forms(static=True)[-1] == tune_methods()[-1] == "toy-half"
        assert "toy-half x2" in [v.name for v in default_variants(2.0)]
        assert "toy-half x2" in [c.name for c in closed_form_grid(Geometry(16, 10000.0, 64, 128))]
        config = AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=4, num_hidden_layers=1,
                                      intermediate_size=64, vocab_size=32, max_position_embeddings=64)
        assert "toy-half" in method_curves(config, 2.0)
    finally:
        for table in (registry._REGISTRY, registry.GGUF_RULES, registry.ADVICE):
            del table["toy-half"]


def test_the_private_name_check_sees_both_forms(tmp_path):
    """`from .record import _walk` and `record._walk` through an imported module are caught; a module's own private
    names, dunders and other packages' private names are not."""
    package = tmp_path / "rope_extend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "record.py").write_text("def _walk():\n    pass\n\n\ndef walk():\n    return _walk()\n")
    (package / "recheck.py").write_text("from . import record\nfrom .record import _walk, walk\n"
                                        "from os import _exit\n\n\ndef f():\n    return record._walk(), record.__name__\n")
    modules = {_module_name(path, package): path for path in package.rglob("*.py")}
    assert private_names_crossing_modules(modules) == ["recheck.py:2 uses _walk of rope_extend.record",
                                                       "recheck.py:7 uses _walk of rope_extend.record"]


MAX_FUNCTION_LINES = 80  # a function a reader can hold: a short sequence of named steps (issue 67 item 3)
# Functions still over it, each being split (issue 67 item 3): nothing else may join this list, and each leaves it
# when it is split.
LONG_FUNCTIONS_LEFT: set[str] = set()


def function_lengths(package: Path = PACKAGE) -> dict[str, int]:
    """``{"rope_extend/x.py::Class.method": lines}`` for every function and method of the package (nested ones
    too, named after their parents), counted from its `def` (or first decorator) to its last line."""
    lengths = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([child.lineno, *(d.lineno for d in child.decorator_list)])
                lengths[f"{path}::{prefix}{child.name}"] = child.end_lineno - first + 1
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, f"{prefix}{child.name}." if isinstance(child, ast.ClassDef) else prefix)

    for file in sorted(package.rglob("*.py")):
        visit(ast.parse(file.read_text()), file.relative_to(package.parent).as_posix(), "")
    return lengths


def long_functions(limit: int = MAX_FUNCTION_LINES, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """The functions of the package longer than `limit` lines, longest first."""
    return sorted(((name, n) for name, n in function_lengths(package).items() if n > limit), key=lambda x: -x[1])


def test_no_function_over_80_lines():
    """No function of rope_extend/ is longer than 80 lines (`python tests/test_layout.py` lists them)."""
    found = {name for name, _ in long_functions()}
    assert not found - LONG_FUNCTIONS_LEFT, sorted(found - LONG_FUNCTIONS_LEFT)
    assert not LONG_FUNCTIONS_LEFT - found, f"split: remove {sorted(LONG_FUNCTIONS_LEFT - found)} from LONG_FUNCTIONS_LEFT"


def test_the_length_check_counts_decorators_methods_and_nested_functions(tmp_path):
    package = tmp_path / "rope_extend"
    package.mkdir()
    body = "\n".join(f"x{i} = {i}" for i in range(79))
    (package / "long.py").write_text(
        f"@decorated\ndef top():\n{textwrap.indent(body, '    ')}\n\n\nclass Room:\n    def short(self):\n"
        f"        pass\n\n    def method(self):\n        def inner():\n            pass\n{textwrap.indent(body, ' ' * 8)}\n")
    assert function_lengths(package) == {"rope_extend/long.py::top": 81, "rope_extend/long.py::Room.short": 2,
                                         "rope_extend/long.py::Room.method": 82,
                                         "rope_extend/long.py::Room.method.inner": 2}
    assert long_functions(package=package) == [("rope_extend/long.py::Room.method", 82),
                                               ("rope_extend/long.py::top", 81)]


if __name__ == "__main__":  # python tests/test_layout.py [LINES]: the functions over LINES lines, longest first
    import sys

    for name, lines in long_functions(int(sys.argv[1]) if len(sys.argv) > 1 else MAX_FUNCTION_LINES):
        print(f"{lines:5d}  {name}")
