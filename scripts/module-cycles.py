#!/usr/bin/env python3
"""Lists the modules of a crate at each level (the top-level modules, and the
submodules of each module directory, such as cli/src/doctor/*.rs) with the sibling
modules each uses, and fails on a cycle between siblings.

A module uses a sibling when its files name it: `crate::name` or `crate::{a, b}` at
the top level; below, `super::name`, `super::{a, b}` (one `super` per level between
the file and the siblings' parent) or the full path (`crate::doctor::name`). A
module and its parent (`mod.rs` naming its children, children naming `super::Item`)
are not siblings: only siblings must depend one way.

    python3 scripts/module-cycles.py [SRC_DIR...]

With no directory, checks the `src` of every member of the workspace (CI runs it so).
"""
import re
import sys
from pathlib import Path

NAME = r"[a-z_][a-z0-9_]*"


def modules_of(level):
    """The modules declared at a level: its `.rs` files and its module directories."""
    mods = {}
    for p in level.glob("*.rs"):
        if p.stem not in ("main", "lib", "mod"):
            mods.setdefault(p.stem, []).append(p)
    for p in level.iterdir():
        if p.is_dir() and any(p.rglob("*.rs")):
            mods.setdefault(p.name, []).extend(sorted(p.rglob("*.rs")))
    return mods


def levels(src):
    """(directory, the path its modules are named by from the crate root)."""
    yield src, "crate"
    for d in sorted(p for p in src.rglob("*") if p.is_dir()):
        yield d, "::".join(["crate", *d.relative_to(src).parts])


def group_items(text, start):
    """The leading names of the comma-separated items of the `{...}` at `start`."""
    depth, item, items = 0, "", []
    for ch in text[start:]:
        if ch == "{":
            depth += 1
            if depth == 1:
                continue
        elif ch == "}":
            depth -= 1
            if depth == 0:
                break
        if ch == "," and depth == 1:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    return [m.group(0) for m in (re.match(NAME, i.strip()) for i in items) if m]


def named_after(text, prefix):
    """The names that follow `prefix::`, alone or in a `{...}` group."""
    found = set(re.findall(rf"(?<![a-z0-9_:]){re.escape(prefix)}::({NAME})", text))
    for m in re.finditer(rf"(?<![a-z0-9_:]){re.escape(prefix)}::\{{", text):
        found.update(group_items(text, m.end() - 1))
    return found


def prefixes(level, path, f):
    """How the file `f` of a module at `level` names the level's modules."""
    yield path
    if path == "crate":
        return
    # One `super` for each module between the file and the level.
    parts = f.relative_to(level).parts
    depth = len(parts) - (1 if parts[-1] == "mod.rs" else 0)
    yield "::".join(["super"] * depth)


def uses(level, path, mods, name):
    found = set()
    for f in mods[name]:
        text = f.read_text()
        for prefix in prefixes(level, path, f):
            found.update(named_after(text, prefix))
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
    found = 0
    for level, path in levels(src):
        mods = modules_of(level)
        if len(mods) < 2:
            continue
        graph = {name: uses(level, path, mods, name) for name in sorted(mods)}
        if verbose:
            print(f"{level}:")
            for name, deps in graph.items():
                print(f"  {name:10} -> {', '.join(deps) if deps else '(none)'}")
        for cycle in cycles_in(graph):
            print(f"{level}: cycle: " + " -> ".join(cycle))
            found += 1
    print(f"{found} cycle(s) between the modules of {src}")
    return found


def workspace_sources():
    root = Path(__file__).resolve().parent.parent
    # The members line of the workspace's Cargo.toml (no TOML parser before 3.11).
    line = re.search(r"^members\s*=\s*\[([^\]]*)\]", (root / "Cargo.toml").read_text(), re.M)
    members = re.findall(r'"([^"]+)"', line.group(1))
    return [root / m / "src" for m in members if (root / m / "src").is_dir()]


dirs = [Path(a) for a in sys.argv[1:]]
found = sum(check(src, verbose=bool(dirs)) for src in dirs or workspace_sources())
sys.exit(1 if found else 0)
