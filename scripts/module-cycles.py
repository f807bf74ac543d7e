#!/usr/bin/env python3
"""Lists each top-level module of a crate with the other top-level modules it uses
(`crate::name`, `use crate::{a, b}`), and fails on a cycle between them.

    python3 scripts/module-cycles.py [SRC_DIR]    (default: cli/src)
"""
import re
import sys
from pathlib import Path

src = Path(sys.argv[1] if len(sys.argv) > 1 else "cli/src")
mods = {p.stem: p for p in src.glob("*.rs") if p.stem not in ("main", "lib")}
mods.update({p.name: p for p in src.iterdir() if p.is_dir()})


def files_of(name):
    path = mods[name]
    return [path] if path.is_file() else sorted(path.rglob("*.rs"))


def uses(name):
    found = set()
    for f in files_of(name):
        text = f.read_text()
        found.update(re.findall(r"crate::([a-z_][a-z0-9_]*)", text))
        for group in re.findall(r"crate::\{([^}]*)\}", text):
            found.update(re.findall(r"\b([a-z_][a-z0-9_]*)", group))
    return sorted(m for m in found if m in mods and m != name)


graph = {name: uses(name) for name in sorted(mods)}
for name, deps in graph.items():
    print(f"{name:10} -> {', '.join(deps) if deps else '(none)'}")

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
for cycle in cycles:
    print("cycle: " + " -> ".join(cycle))
print(f"{len(cycles)} cycle(s) between the top-level modules of {src}")
sys.exit(1 if cycles else 0)
