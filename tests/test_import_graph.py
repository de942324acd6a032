"""The project's import graph (docs/design.md: imports point down only): no import cycle among the project's modules,
and the layering — the core ``stare_lab`` imports none of its callers; ``simulators``, ``trainer`` and ``analysis``
import only the core, never each other. Read from the source with ``ast`` (every import statement, also those
inside functions), so a cycle hidden behind a lazy import counts too."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("stare_lab", "simulators", "analysis", "trainer")
#: Cycles allowed for now (none: issue 14 opened the last one). A listed cycle that is gone fails the test too.
KNOWN_CYCLES: list[list[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, modules: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from pkg import sub`` counts as ``pkg.sub`` when that is a module)."""
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in modules else mod for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:  # `import a.b.c` of a package path: the deepest project module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = project_modules()
    return {n: imports_of(n, p, set(mods)) for n, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_projects_modules():
    g = graph()
    assert len(g) > 40 and "simulators.tabular.runner" in set().union(*g.values())
    found = cycles(g)
    assert [c for c in found if c not in KNOWN_CYCLES] == []
    assert [c for c in KNOWN_CYCLES if c not in found] == [], "a known cycle is gone: remove it from KNOWN_CYCLES"


def test_imports_point_down_only():
    allowed = {"stare_lab": {"stare_lab"}, "simulators": {"stare_lab", "simulators"},
               "analysis": {"stare_lab", "analysis"}, "trainer": {"stare_lab", "trainer"}}
    bad = sorted(f"{a} imports {b}" for a, targets in graph().items() for b in targets
                 if b.split(".")[0] not in allowed[a.split(".")[0]])
    assert bad == []


def public_modules() -> dict[str, set[str]]:
    """Rooms (sub-packages that declare ``PUBLIC_MODULES`` in their ``__init__.py``) → their public modules (dotted)."""
    out = {}
    for init in sorted(ROOT.glob("*/*/__init__.py")):
        room = module_name(init)
        for node in ast.parse(init.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "PUBLIC_MODULES" for t in node.targets):
                out[room] = {f"{room}.{m}" for m in ast.literal_eval(node.value)}
    return out


def room_of(module: str, rooms: set[str]) -> str | None:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 and ".".join(parts[:2]) in rooms else None


def cross_room_violations(g: dict[str, set[str]], public: dict[str, set[str]]) -> list[str]:
    """An import into a room from outside it must target one of the room's public modules (or the room itself)."""
    rooms = set(public)
    bad = []
    for a, targets in g.items():
        for b in targets:
            rb = room_of(b, rooms)
            if rb is not None and room_of(a, rooms) != rb and b not in public[rb]:
                bad.append(f"{a} imports {b}, not a public module of {rb} ({sorted(public[rb])})")
    return sorted(bad)


def test_the_room_checker_finds_a_private_import():
    public = {"trainer.run": {"trainer.run.loop"}, "trainer.step": {"trainer.step.runner"}}
    g = {"trainer.run.loop": {"trainer.step.runner", "trainer.run.checkpoint"},
         "trainer.step.runner": {"trainer.run.checkpoint"}, "trainer.cli": {"trainer.step.batch", "trainer.run"}}
    assert cross_room_violations(g, public) == [
        "trainer.cli imports trainer.step.batch, not a public module of trainer.step (['trainer.step.runner'])",
        "trainer.step.runner imports trainer.run.checkpoint, not a public module of trainer.run (['trainer.run.loop'])",
    ]


def test_rooms_import_each_other_only_through_public_modules():
    """docs/design.md §3: the trainer's rooms (run, step, engines, grading, tools, evaluation, planning) each name
    their public modules; every other module of a room is private to it."""
    public = public_modules()
    assert {"trainer.run", "trainer.step", "trainer.engines", "trainer.grading", "trainer.tools",
            "trainer.evaluation", "trainer.planning"} <= set(public)
    g = graph()
    assert all(m in g for ms in public.values() for m in ms), "a PUBLIC_MODULES entry names no module"
    assert cross_room_violations(g, public) == []
