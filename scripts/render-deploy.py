#!/usr/bin/env python3
"""deploy/ is the chart rendered, never a second copy kept by hand.

Each template charts/sticky-macvlan/templates/X renders to deploy/X, with
the chart's default values in kube-system, and the optional
PrometheusRule switched on (deploy/optional/ is for those who apply
without helm). helm puts a file's documents in its install order (by
kind), so a deploy file lists them in that order.

    python3 scripts/render-deploy.py          write deploy/
    python3 scripts/render-deploy.py --check  exit 1 when deploy/ differs

helm is target/cluster/bin/helm (scripts/cluster.sh build) unless $HELM
names another.
"""
import difflib
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CHART = ROOT / "charts/sticky-macvlan"
SOURCE = re.compile(r"^# Source: sticky-macvlan/templates/(\S+)\n", re.M)
# What deploy/ is rendered with, besides the defaults.
VALUES = ["--set", "prometheusRule.enabled=true"]


def rendered():
    helm = os.environ.get("HELM", str(ROOT / "target/cluster/bin/helm"))
    out = subprocess.run(
        [helm, "template", "sticky-macvlan", str(CHART), "--namespace", "kube-system", *VALUES],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    files = {}
    for doc in out.split("\n---\n"):
        doc = doc.removeprefix("---\n")
        m = SOURCE.search(doc)
        if not m:
            continue
        body = SOURCE.sub("", doc).strip("\n")
        files.setdefault(m.group(1), []).append(body)
    return {name: "\n---\n".join(docs) + "\n" for name, docs in files.items()}


def main():
    check = sys.argv[1:] == ["--check"]
    faults = 0
    want = rendered()
    for name, text in sorted(want.items()):
        path = ROOT / "deploy" / name
        have = path.read_text() if path.exists() else ""
        if have == text:
            continue
        if check:
            faults += 1
            diff = difflib.unified_diff(
                have.splitlines(), text.splitlines(), f"deploy/{name}", "rendered", lineterm="", n=1
            )
            print("\n".join(list(diff)[:40]))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote deploy/{name}")
    stale = [
        p.relative_to(ROOT / "deploy").as_posix()
        for p in (ROOT / "deploy").rglob("*.yaml")
        if p.relative_to(ROOT / "deploy").as_posix() not in want
    ]
    for name in stale:
        faults += 1
        print(f"deploy/{name}: no template renders it; remove it or add charts/sticky-macvlan/templates/{name}")
    if check and faults:
        print("deploy/ differs from the chart: run python3 scripts/render-deploy.py")
    sys.exit(1 if faults else 0)


if __name__ == "__main__":
    main()
