#!/usr/bin/env python3
"""Lists each top-level module of a crate with the other top-level modules it uses
(`crate::name`, `use crate::{a, b}`), and fails on a cycle between them.

    python3 scripts/module-cycles.py [SRC_DIR...]

With no directory, checks the `src` of every member of the workspace (CI runs it so).
"""
import re
import sys
from pathlib import Path


def modules_of(src):
    mods = {p.stem: p for p in src.glob("*.rs") if p.stem not in ("main", "lib")}
    mods.update({p.name: p for p in src.iterdir() if p.is_dir()})
    return mods


def uses(mods, name):
    path = mods[name]
    found = set()
    for f in [path] if path.is_file() else sorted(path.rglob("*.rs")):
        text = f.read_text()
        found.update(re.findall(r"crate::([a-z_][a-z0-9_]*)", text))
        for group in re.findall(r"crate::\{([^}]*)\}", text):
            found.update(re.findall(r"\b([a-z_][a-z0-9_]*)", group))
    return sorted(m for m in found if m in mods and m != name)


def cycles_in(graph):
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        for dep in graph[node]:
            if state.get(dep) == "open":
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for name in graph:
        if name not in state:
            visit(name, [name])
    return cycles


def check(src, verbose):
    mods = modules_of(src)
    graph = {name: uses(mods, name) for name in sorted(mods)}
    if verbose:
        for name, deps in graph.items():
            print(f"{name:10} -> {', '.join(deps) if deps else '(none)'}")
    cycles = cycles_in(graph)
    for cycle in cycles:
        print(f"{src}: cycle: " + " -> ".join(cycle))
    print(f"{len(cycles)} cycle(s) between the top-level modules of {src}")
    return len(cycles)


def workspace_sources():
    root = Path(__file__).resolve().parent.parent
    # The members line of the workspace's Cargo.toml (no TOML parser before 3.11).
    line = re.search(r"^members\s*=\s*\[([^\]]*)\]", (root / "Cargo.toml").read_text(), re.M)
    members = re.findall(r'"([^"]+)"', line.group(1))
    return [root / m / "src" for m in members if (root / m / "src").is_dir()]


dirs = [Path(a) for a in sys.argv[1:]]
found = sum(check(src, verbose=bool(dirs)) for src in dirs or workspace_sources())
sys.exit(1 if found else 0)
