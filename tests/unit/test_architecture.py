"""The house keeps its shape: the project's import graph (function-local imports included) has no cycle, no
module imports another module's `_private` name, and the library never asks which model family it holds."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pipeline", "flows")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]):
    """(imported project module, imported name or None) for every import anywhere in the file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            pairs = [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base) if node.level else node.module
            pairs = [(module, alias.name) for alias in node.names]
        else:
            continue
        for module, imported in pairs:
            target = f"{module}.{imported}" if imported and f"{module}.{imported}" in modules else module
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target, None if target.endswith(f".{imported}") else imported


def _graph():
    modules = _modules()
    edges, private = defaultdict(set), []
    for name, path in modules.items():
        for target, imported in _imports(name, path, modules):
            edges[name].add(target)
            if imported and imported.startswith("_") and not imported.startswith("__"):
                private.append(f"{name} imports {target}.{imported}")
    return modules, edges, private


def _cycles(nodes, edges) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                found.append(sorted([v, *component]))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_cycle():
    modules, edges, _ = _graph()
    assert len(modules) > 40 and sum(len(t) for t in edges.values()) > 100  # the walk really saw the project
    assert _cycles(modules, edges) == []


def test_a_cycle_would_be_found():
    edges = defaultdict(set, {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert _cycles(["a", "b", "c", "d"], edges) == [["a", "b", "c"]]


def test_no_module_imports_another_modules_private_name():
    assert _graph()[2] == []


def test_imports_point_down_from_the_flows_to_the_library():
    modules, edges, _ = _graph()
    upward = [
        f"{m} imports {t}"
        for m in modules
        if m.startswith("pipeline")
        for t in edges[m]
        if t.startswith("flows")
    ]
    assert upward == []


def test_only_the_family_registry_knows_the_families_by_name():
    """Stages and serving hold a family and call it; the classes are named only where families are picked."""
    allowed = {ROOT / "pipeline/families/__init__.py"}
    named = [
        str(path.relative_to(ROOT))
        for path in (ROOT / "pipeline").rglob("*.py")
        if path not in allowed
        and not path.is_relative_to(ROOT / "pipeline/families")
        and any(
            word in path.read_text() for word in ("LayaFamily", "JointFamily", "LoadedJoint", "LoadedModel")
        )
    ]
    assert named == []


FAMILY_PACKAGES = ("pipeline.families.laya", "pipeline.families.joint")
RUNTIMES_PACKAGE = "pipeline.families.runtimes"  # where a served encoder runs besides torch: not a family


def _family_of(module: str) -> str | None:
    return next((p for p in FAMILY_PACKAGES if module == p or module.startswith(p + ".")), None)


def test_no_module_outside_families_imports_a_familys_modules():
    """A third family touches only `families/`: stages, serving, the CLI and the flows reach a family through
    the interface (`pipeline.families`), never through its own modules. No exception is needed."""
    modules, edges, _ = _graph()
    reached = [
        f"{m} imports {t}"
        for m in modules
        if not m.startswith("pipeline.families")
        for t in edges[m]
        if _family_of(t)
    ]
    assert reached == []


def test_sibling_families_do_not_import_each_other():
    """What both families read (the Laya layout, layer plans, forward-pass helpers) sits below both."""
    modules, edges, _ = _graph()
    across = [
        f"{m} imports {t}"
        for m in modules
        if _family_of(m)
        for t in edges[m]
        if _family_of(t) and _family_of(t) != _family_of(m)
    ]
    assert across == []


def test_the_family_packages_are_those_of_the_registered_families():
    """The rules above guard the packages the registry's families live in: a third family is guarded once it
    is registered, and `families/runtimes/` is not one."""
    from pipeline.families import FAMILIES

    packages = {type(family).__module__.rpartition(".")[0] for family in FAMILIES.values()}
    assert packages == set(FAMILY_PACKAGES) and RUNTIMES_PACKAGE not in packages


def test_the_encoder_runtimes_sit_below_both_families():
    """Either family's served encoder runs on `families/runtimes/`: it reads the family interface, never a
    family's own modules."""
    modules, edges, _ = _graph()
    runtimes = [m for m in modules if m == RUNTIMES_PACKAGE or m.startswith(RUNTIMES_PACKAGE + ".")]
    reached = [f"{m} imports {t}" for m in runtimes for t in edges[m] if _family_of(t)]
    assert len(runtimes) > 1 and reached == []


def test_the_family_interface_declares_what_the_cli_and_stages_read():
    """Names, methods (default first) and the training description come from each family, not from lists kept
    elsewhere."""
    from pipeline.families import FAMILIES
    from pipeline.families.base import DecisionFamily

    assert (
        "methods" in DecisionFamily.__annotations__
        and "describe_training" in DecisionFamily.__abstractmethods__
    )
    for name, family in FAMILIES.items():
        assert family.name == name and family.methods and family.default_method == family.methods[0]
    cli = "".join(path.read_text() for path in (ROOT / "pipeline/cli").glob("*.py"))
    assert 'choices=["laya"' not in cli and 'choices=["head"' not in cli
