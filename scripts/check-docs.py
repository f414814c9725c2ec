#!/usr/bin/env python3
"""The manual's links hold: every relative link in the top-level Markdown
files and in docs/src names a file that exists, and every #anchor a heading
of that file (GitHub's slugs); every page of docs/src is in SUMMARY.md; the
README stays a front page (at most 150 lines).

    python3 scripts/check-docs.py        exit 1 with one line per fault
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 150


def without_code(text):
    """The text outside fenced code blocks and inline code spans."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path):
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def main():
    faults = []
    docs = sorted((ROOT / "docs/src").rglob("*.md"))
    files = [ROOT / n for n in ("README.md", "ARCHITECTURE.md", "CHANGELOG.md", "BENCHMARKS.md")] + docs
    for md in files:
        rel = md.relative_to(ROOT)
        for target in LINK.findall(without_code(md.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            name, _, anchor = target.partition("#")
            dest = (md.parent / name).resolve() if name else md
            if not dest.exists():
                faults.append(f"{rel}: link to {target}: {name} does not exist")
                continue
            if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                faults.append(f"{rel}: link to {target}: {dest.relative_to(ROOT)} has no heading #{anchor}")
    summary = (ROOT / "docs/src/SUMMARY.md").read_text()
    listed = {(ROOT / "docs/src" / t).resolve() for t in LINK.findall(summary)}
    for page in docs:
        if page.name != "SUMMARY.md" and page.resolve() not in listed:
            faults.append(f"{page.relative_to(ROOT)}: not in docs/src/SUMMARY.md, so the book leaves it out")
    lines = (ROOT / "README.md").read_text().count("\n")
    if lines > README_MAX_LINES:
        faults.append(f"README.md: {lines} lines, over {README_MAX_LINES}: move the detail into docs/src")
    for f in faults:
        print(f"check-docs: {f}", file=sys.stderr)
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
