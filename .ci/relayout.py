"""One-off: the layout move of issue 21 (flat modules into plugin/, state/, status/ and
testing/fakeapi/), as a codemod for branches made before it.

Run it from the top of a checkout after merging main into such a branch:
``python3 .ci/relayout.py``. It is idempotent: it moves what is still at an old place
(``git mv``) and rewrites the old dotted names and paths wherever they are left (imports,
strings, docs), then ``ruff check --fix`` sorts the imports. To be deleted once no branch
needs it.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

# old dotted module -> new dotted module
MOVES: dict[str, str] = {
    "kubelet_dra.claims": "kubelet_dra.status.claims",
    "kubelet_dra.jsonpointer": "kubelet_dra.status.jsonpointer",
    "kubelet_dra.podjson": "kubelet_dra.status.podjson",
    "kubelet_dra.podstatus": "kubelet_dra.status.podstatus",
    "kubelet_dra.healthinfo": "kubelet_dra.state.healthinfo",
    "kubelet_dra.store": "kubelet_dra.state.store",
    "kubelet_dra.kubeletcheckpoint": "kubelet_dra.state.kubeletcheckpoint",
    "kubelet_dra.plugins": "kubelet_dra.plugin.plugins",
    "kubelet_dra.registration": "kubelet_dra.plugin.registration",
    "kubelet_dra.streams": "kubelet_dra.plugin.streams",
}
for _n in "builders cluster faults generic http ops patch status store watch".split():
    MOVES[f"kubelet_dra.testing._fakeapi_{_n}"] = f"kubelet_dra.testing.fakeapi._{_n}"
EXTRA = dict(a.split("=") for a in sys.argv[1:])  # more moves: old=new
MOVES.update(EXTRA)

# module files that become a package's __init__
PACKAGE_INIT = {"kubelet_dra.testing.fakeapi"}

INIT_DOCS = {
    "kubelet_dra.status": (
        "The pure status core: claims and their devices, the kubelet-exact pod status, pod JSON\n"
        "accessors and JSON pointers (the kubelet's ``pkg/kubelet/cm/dra`` claim info and\n"
        "``pkg/kubelet/kuberuntime`` status parts). Nothing here does I/O."
    ),
    "kubelet_dra.state": (
        "What survives a restart: the health cache, its SQLite store, and the readers of the\n"
        "kubelet's own checkpoints (``pkg/kubelet/cm/dra/state`` and ``healthinfo.go``)."
    ),
    "kubelet_dra.plugin": (
        "The drivers' side: the registration watcher and its validation, the plugin manager and\n"
        "the health streams (``pkg/kubelet/cm/dra/plugin``)."
    ),
}

TEXT_SUFFIXES = {".py", ".md", ".toml", ".ini", ".cfg", ".txt", ".yaml", ".yml", ".json", ""}


def path_of(dotted: str, package: bool = False) -> str:
    base = dotted.replace(".", "/")
    return f"{base}/__init__.py" if package else f"{base}.py"


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def move_files() -> None:
    for old, new in MOVES.items():
        src = Path(path_of(old))
        dst = Path(path_of(new))
        if not src.exists():
            continue
        for parent in reversed(dst.parents):
            if str(parent).startswith("kubelet_dra/") and not parent.exists():
                parent.mkdir()
            init = parent / "__init__.py"
            if str(parent).startswith("kubelet_dra/") and not init.exists():
                doc = INIT_DOCS.get(str(parent).replace("/", "."), "")
                init.write_text(f'"""{doc}"""\n' if doc else "")
                git("add", str(init))
        git("mv", str(src), str(dst))
    for pkg in PACKAGE_INIT:
        src = Path(path_of(pkg))
        dst = Path(path_of(pkg, package=True))
        if src.exists():
            dst.parent.mkdir(exist_ok=True)
            if dst.exists():  # an empty one made above
                git("rm", "-q", "-f", str(dst))
            git("mv", str(src), str(dst))


FROM_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<parent>[\w.]+) import (?P<names>\([^)]*\)|[^\n]*(?:\\\n[^\n]*)*)$",
    re.M,
)


def split_names(raw: str) -> list[str]:
    raw = raw.strip()
    if raw.startswith("("):
        raw = raw[1:-1]
    raw = raw.replace("\\\n", " ")
    raw = re.sub(r"#[^\n]*", "", raw)
    return [n.strip() for n in raw.replace("\n", " ").split(",") if n.strip()]


def rewrite_from(match: re.Match[str]) -> str:
    indent, parent, names = match["indent"], match["parent"], split_names(match["names"])
    groups: dict[str, list[str]] = {}
    changed = False
    for name in names:
        base = name.split(" as ")[0].strip()
        dotted = f"{parent}.{base}"
        if dotted in MOVES:
            new_parent, new_base = MOVES[dotted].rsplit(".", 1)
            alias = name.split(" as ")[1].strip() if " as " in name else base
            entry = new_base if alias == new_base else f"{new_base} as {alias}"
            groups.setdefault(new_parent, []).append(entry)
            changed = True
        else:
            groups.setdefault(parent, []).append(name)
    if not changed:
        return match.group(0)
    lines = [f"{indent}from {p} import {', '.join(ns)}" for p, ns in groups.items()]
    return "\n".join(lines)


def dotted_patterns() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for old, new in sorted(MOVES.items(), key=lambda kv: -len(kv[0])):
        out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w])"), new))
        out.append(
            (
                re.compile(rf"(?<![\w/]){re.escape(path_of(old))}"),
                path_of(new, new in PACKAGE_INIT),
            )
        )
        # paths given relative to the package, as docs often do: `healthinfo.py` stays,
        # but `testing/_fakeapi_http.py` and `kube/...` style prefixes are rewritten
        rel_old = path_of(old).removeprefix("kubelet_dra/")
        rel_new = path_of(new, new in PACKAGE_INIT).removeprefix("kubelet_dra/")
        if "/" in rel_old:
            out.append((re.compile(rf"(?<![\w/]){re.escape(rel_old)}"), rel_new))
    for pkg in PACKAGE_INIT:
        out.append((re.compile(rf"(?<![\w/]){re.escape(path_of(pkg))}"), path_of(pkg, True)))
        rel = path_of(pkg).removeprefix("kubelet_dra/")
        out.append(
            (
                re.compile(rf"(?<![\w/]){re.escape(rel)}"),
                path_of(pkg, True).removeprefix("kubelet_dra/"),
            )
        )
    return out


def rewrite_text(path: Path, patterns: list[tuple[re.Pattern[str], str]]) -> bool:
    try:
        text = path.read_text()
    except (UnicodeDecodeError, OSError):
        return False
    new = text
    if path.suffix == ".py":
        new = FROM_IMPORT.sub(rewrite_from, new)
    for pattern, repl in patterns:
        new = pattern.sub(repl, new)
    if new != text:
        path.write_text(new)
        return True
    return False


def main() -> None:
    move_files()
    patterns = dotted_patterns()
    files = [Path(p) for p in git("ls-files").splitlines()]
    changed = 0
    for f in files:
        if f.parts[0] in {".tox", "build"} or "_proto" in f.parts:
            continue
        if f.suffix not in TEXT_SUFFIXES or not f.is_file():
            continue
        if f.parts[0] == "tests" and f.parts[1:2] == ("fuzz",) and f.suffix == "":
            continue  # corpora
        if "corpus" in f.parts:
            continue
        changed += rewrite_text(f, patterns)
    print(f"rewrote {changed} files")


if __name__ == "__main__":
    main()
