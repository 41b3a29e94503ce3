"""The workbook package's modules import each other without a circle: hardware facts and the
simulator's pieces are leaves that the modules using them import, never the other way round. Every
import counts, those inside functions too (a late import only hides a circle)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "workbook"


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports():
    """{module: the workbook modules it imports}, a package's own __init__ not counted for its
    submodules (importing a.b runs a's __init__ first: that is not a dependency of a.b on a)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                for alias in node.names:
                    found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[name] = {m for m in found if m in modules and m != name and not name.startswith(m + ".")}
    return graph


def test_no_import_circle_in_the_package():
    graph, circles = imports(), []

    def walk(start, node, path):
        for following in graph[node]:
            if following == start:
                circles.append(" -> ".join(path + [start]))
            elif following not in path and following > start:  # each circle found once, from its least module
                walk(start, following, path + [following])

    for module in graph:
        walk(module, module, [module])
    assert not circles, "modules that import each other:\n" + "\n".join(circles)
