"""The package has no import cycle: every import statement counts, the lazy ones inside functions included (a
circle of lazy imports still ties the modules' concerns together). A package's __init__ is not counted as a target
of its own submodules (importing tinychat.engine.quant runs tinychat.engine's __init__ whatever the code says)."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tinychat"


def import_graph(pkg_dir: Path) -> dict[str, set[str]]:
    """{module: modules of the same package it imports}, from the source (nothing is imported)."""
    base = pkg_dir.parent
    mods = {}
    for f in sorted(pkg_dir.rglob("*.py")):
        parts = list(f.relative_to(base).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def owner(name: str) -> str | None:          # the longest known module a dotted name starts with
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        pkg = m.split(".") if f.name == "__init__.py" else m.split(".")[:-1]
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                here = ".".join(pkg[:len(pkg) - node.level + 1]) if node.level else ""
                b = ".".join(p for p in (here, node.module or "") if p)
                names = [f"{b}.{a.name}" if f"{b}.{a.name}" in mods else b for a in node.names]
            else:
                continue
            for n in names:
                t = owner(n)
                if t is None or t == m or (mods[t].name == "__init__.py" and m.startswith(t + ".")):
                    continue
                graph[m].add(t)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 40 and "tinychat.engine.cpu_step" in graph["tinychat.engine.decoder"]
    assert cycles(graph) == []


def test_a_cycle_through_a_lazy_import_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .low import f\n")
    (pkg / "top.py").write_text("from .sub import low\n")
    (pkg / "sub" / "low.py").write_text("def f():\n    from .. import top\n")
    (pkg / "alone.py").write_text("import os\nfrom . import top\n")
    graph = import_graph(pkg)
    assert graph["pkg.top"] == {"pkg.sub.low"} and graph["pkg.sub"] == {"pkg.sub.low"}
    assert cycles(graph) == [["pkg.sub.low", "pkg.top"]]
