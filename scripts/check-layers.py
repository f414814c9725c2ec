#!/usr/bin/env python3
"""Fails if the modules of a crate import each other in a circle.

Reads every `use crate::...` of each top-level module of ipam/src (a
module is a file `x.rs` or a directory `x/`), builds the graph between
top-level modules and prints any cycle. Run by scripts/test.sh.
"""
import pathlib
import re
import sys

def imports(root: pathlib.Path):
    graph = {}
    for path in root.rglob("*.rs"):
        rel = path.relative_to(root)
        if rel.parts[0] in ("lib.rs", "main.rs", "bin"):
            continue
        module = rel.parts[0].removesuffix(".rs")
        if path.name.endswith("_tests.rs") or path.name == "test_support.rs":
            continue
        # Unit tests may reach across layers; what ships may not.
        text = path.read_text().split("#[cfg(test)]")[0]
        targets = graph.setdefault(module, set())
        for block in re.findall(r"use crate::(\{[^;]*\}|[A-Za-z_]+)", text):
            names = re.findall(r"(?:^|[{,\s])([a-z_]+)(?=::|[,}\s]|$)", block.strip("{}")) if block.startswith("{") else [block]
            for name in names:
                if name != module:
                    targets.add(name)
        for name in re.findall(r"crate::([a-z_]+)::", text):
            if name != module:
                targets.add(name)
    return graph

def cycles(graph):
    found, state = [], {}
    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in graph:
                continue
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2
    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found

def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "ipam/src")
    found = cycles(imports(root))
    for c in found:
        print("import circle in", root, ":", " -> ".join(c))
    if found:
        sys.exit(1)
    print(f"no import circle between the modules of {root}")

main()
