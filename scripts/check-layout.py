#!/usr/bin/env python3
"""The layout rules ARCHITECTURE.md states, checked (run by scripts/test.sh):

1. No .rs file of the workspace is over MAX_LINES lines, unit tests
   counted (a crate's big test blocks live in *_tests.rs beside the code,
   and those files obey the same limit).
2. One name per concept: a type (struct, enum, trait, type alias) is
   declared once in the code that ships and the harness (tests aside).
3. Within one crate no two modules share a name (no `liveness` twice).
4. No helper (a top-level fn that is not a test) is declared in two
   files of e2e/tests/: one helper per job, in the harness when shared.
5. Every crate folder X is the package sticky-X, whose lib has the same
   name (plugin/ carries the product's name, sticky-macvlan; the others
   name sticky-cni `cni` as a dependency, the protocol's own name).

"""
import collections
import pathlib
import re
import sys

MAX_LINES = 600
CRATES = ["cni", "ipam", "ops", "plugin", "e2e"]
PACKAGE = {c: f"sticky-{c}" for c in CRATES} | {"plugin": "sticky-macvlan"}


def sources(crate):
    return sorted(p for p in pathlib.Path(crate).rglob("*.rs") if "target" not in p.parts)


def is_test_file(p):
    return p.name.endswith("_tests.rs") or p.name == "tests.rs" or "tests" in p.parts


def main():
    problems = []
    types = collections.defaultdict(list)
    for crate in CRATES:
        toml = pathlib.Path(crate, "Cargo.toml").read_text()
        name = re.search(r'^name = "([^"]+)"', toml, re.M).group(1)
        if name != PACKAGE[crate]:
            problems.append(f"{crate}/Cargo.toml: package {name!r}, expected {PACKAGE[crate]!r}")
        if re.search(r"^\[lib\][^\[]*^name =", toml, re.M):
            problems.append(f"{crate}/Cargo.toml: the lib is renamed; it keeps the package's name")
        modules = collections.defaultdict(list)
        for p in sources(crate):
            text = p.read_text()
            lines = text.count("\n")
            if lines > MAX_LINES:
                problems.append(f"{p}: {lines} lines (at most {MAX_LINES}): split it by concern")
            if is_test_file(p):
                continue
            shipped = text.split("#[cfg(test)]")[0]
            for m in re.finditer(r"^\s*pub(?:\([a-z]+\))? (?:struct|enum|trait|type) ([A-Z][A-Za-z0-9]*)", shipped, re.M):
                types[m.group(1)].append(str(p))
            if "bin" in p.parts or p.name in ("lib.rs", "main.rs"):
                continue
            stem = p.parent.name if p.name == "mod.rs" else p.stem
            modules[stem].append(str(p))
        for stem, where in modules.items():
            if len(where) > 1:
                problems.append(f"crate {crate}: module {stem!r} twice: {', '.join(where)}")
    helpers = collections.defaultdict(list)
    for p in sorted(pathlib.Path("e2e/tests").rglob("*.rs")):
        text = p.read_text()
        for m in re.finditer(r"^(?:pub )?fn (\w+)", text, re.M):
            attrs = text[: m.start()].rstrip().rsplit("\n", 3)[-3:]
            if not any(a.strip() == "#[test]" for a in attrs):
                helpers[m.group(1)].append(str(p))
    for name, where in sorted(helpers.items()):
        if len(where) > 1:
            problems.append(f"helper {name}() declared in {len(where)} test files: {', '.join(where)}; share one")
    for name, where in types.items():
        if len(where) > 1:
            problems.append(f"type {name} declared {len(where)} times: {', '.join(where)}")
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"layout: no file over {MAX_LINES} lines, every type, module and test helper named once")


if __name__ == "__main__":
    main()
