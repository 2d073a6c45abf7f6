"""The architecture's rules, checked on the source: no module imports another module's private
(underscore-prefixed) names, no in-band sentinels are decoded, the Beam-free cores import no
Beam."""
from __future__ import annotations

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("transforms", "pipelines", "benchmarks", "tests")


def modules():
    for package in PACKAGES:
        for folder, _, files in os.walk(os.path.join(ROOT, package)):
            for name in sorted(files):
                if name.endswith(".py"):
                    yield os.path.relpath(os.path.join(folder, name), ROOT)


def private_imports(path):
    """(line, text) of every import of an underscore-prefixed name or module from another
    module (`from m import _x`, `import m._x`, `from m import _x as y`)."""
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            parts = (node.module or "").split(".")
            names = [alias.name for alias in node.names]
            if any(p.startswith("_") and not p.startswith("__") for p in parts) or any(
                    n.startswith("_") and not n.startswith("__") for n in names):
                found.append((node.lineno, f"from {node.module} import {', '.join(names)}"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if any(p.startswith("_") and not p.startswith("__")
                       for p in alias.name.split(".")):
                    found.append((node.lineno, f"import {alias.name}"))
    return found


def test_the_rule_catches_private_imports(tmp_path):
    """The checker itself can fail (negative control)."""
    sample = tmp_path / "sample.py"
    sample.write_text("from transforms.stages import _ReleaseKeysFn\nimport os._x\n"
                      "from transforms import validation\n")
    rel = os.path.relpath(sample, ROOT)
    assert [line for line, _ in private_imports(rel)] == [1, 2]


@pytest.mark.parametrize("path", list(modules()))
def test_no_module_imports_another_modules_private_names(path):
    assert private_imports(path) == []


def test_no_in_band_sentinels_are_decoded():
    pattern = re.compile(r"isinstance\(value, str\)|HALT_VALUE|zero_noise_for_tests|== \"zero\"")
    hits = [f"{path}:{i}" for path in modules() if not path.startswith("tests")
            for i, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1)
            if pattern.search(line)]
    assert hits == []


# the Beam-free core: the mechanisms, the difference streams, and the release as a value (its
# spec and plan, the statistics' truncations, the per-key state machine) with what they use
BEAM_FREE = ["transforms/mechanisms", "transforms/streams", "transforms/release_plan.py",
             "transforms/truncations.py", "transforms/key_state.py", "transforms/registry.py",
             "transforms/release.py", "transforms/calibration.py", "transforms/accountant.py",
             "transforms/validation.py", "transforms/steps.py"]


def _project_imports(path):
    tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())
    return [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names] + \
        [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]


@pytest.mark.parametrize("package", BEAM_FREE)
def test_beam_free_cores_import_no_beam(package):
    """No module of the core imports Beam, nor a project module outside the core."""
    inside = {p[:-3].replace("/", ".") for p in BEAM_FREE if p.endswith(".py")}
    paths = [package] if package.endswith(".py") else [
        os.path.relpath(os.path.join(folder, name), ROOT)
        for folder, _, files in os.walk(os.path.join(ROOT, package))
        for name in files if name.endswith(".py")]
    for path in paths:
        imported = _project_imports(path)
        assert not any(m.startswith("apache_beam") for m in imported), path
        outside = [m for m in imported if m.startswith(("transforms.", "pipelines."))
                   and m not in inside and not m.startswith(("transforms.mechanisms",
                                                             "transforms.streams"))]
        assert outside == [], (path, outside)


def generated_table(name):
    """The table between `<!-- NAME:start -->` and `<!-- NAME:end -->` in the one page of
    README.md and docs/*.md that has it."""
    from pipelines import reference
    start, end = f"<!-- {name}:start -->\n", f"\n<!-- {name}:end -->"
    texts = [open(os.path.join(ROOT, path), encoding="utf-8").read()
             for path in reference.documents(ROOT)]
    pages = [text for text in texts if start in text]
    assert len(pages) == 1, f"{name} table in {len(pages)} pages"
    return pages[0].split(start, 1)[1].split(end, 1)[0]


def test_docs_config_reference_is_the_registry():
    from transforms import registry
    assert generated_table("registry") == registry.config_reference()


def test_readme_transform_table_is_the_registry():
    from transforms import registry
    assert generated_table("transforms") == registry.transform_table()


def product_imports():
    """{module: the product modules it imports, at any depth of its body (lazy imports too)}
    for transforms/ and pipelines/ (relative imports resolved)."""
    graph = {}
    for path in modules():
        if not path.startswith(("transforms", "pipelines")):
            continue
        name = path[:-3].replace(os.sep, ".")
        if name.endswith(".__init__"):
            name = name[:-len(".__init__")]
        package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
        tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read(), path)
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = found
    return {name: {other for other in found if other in graph and other != name}
            for name, found in graph.items()}


def cycles(graph):
    """Module cycles (a module importing one that imports it back, at any distance), as
    lists; packages' __init__ re-exports are not edges into their own submodules."""
    found, state = [], {}

    def visit(name, trail):
        state[name] = "open"
        for other in sorted(graph.get(name, ())):
            if name.startswith(other + "."):
                continue  # a submodule naming its package (the package's __init__)
            if state.get(other) == "open":
                found.append(trail[trail.index(other):] + [other])
            elif other not in state:
                visit(other, trail + [other])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return found


def test_the_cycle_check_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_product_module_imports_one_that_imports_it_back():
    assert cycles(product_imports()) == []


def test_no_product_module_dispatches_on_a_problem_class():
    pattern = re.compile(r"type\([^)]*\) is (not )?\w*Problem|isinstance\([^)]*, \w*Problem\)")
    hits = [f"{path}:{i}" for path in modules() if path.startswith("transforms")
            for i, line in enumerate(open(os.path.join(ROOT, path), encoding="utf-8"), 1)
            if pattern.search(line)]
    assert hits == []


def unexplained_local_imports(path):
    """(line, text) of every import of a project module inside a function that does not say
    why on its line (a trailing comment: e.g. it keeps a module Beam-free until needed)."""
    source = open(os.path.join(ROOT, path), encoding="utf-8").read()
    lines = source.split("\n")
    found = []
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    names = [inner.module or ""] if isinstance(inner, ast.ImportFrom) else \
                        [alias.name for alias in inner.names]
                    if any(n.split(".")[0] in PACKAGES for n in names) and \
                            "#" not in lines[inner.end_lineno - 1]:
                        found.append((inner.lineno, lines[inner.lineno - 1].strip()))
    return sorted(set(found))


def test_the_local_import_rule_can_fail(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from transforms import registry\n"
                      "    from pipelines import gate  # Beam: only when asked\n"
                      "    import json\n")
    assert unexplained_local_imports(os.path.relpath(sample, ROOT)) == [
        (2, "from transforms import registry")]


@pytest.mark.parametrize("path", [p for p in modules()
                                  if p.split(os.sep)[0] in ("transforms", "pipelines")])
def test_a_product_import_inside_a_function_says_why(path):
    assert unexplained_local_imports(path) == []


@pytest.mark.parametrize("path", [p for p in modules()
                                  if p.split(os.sep)[0] in ("transforms", "pipelines")])
def test_no_product_module_is_over_650_lines(path):
    """One thing per module: a module that grows past this is split by what it does."""
    assert len(open(os.path.join(ROOT, path), encoding="utf-8").read().splitlines()) <= 650
