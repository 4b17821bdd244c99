"""The documentation's figures and their results files: every file under benchmarks/results/ is
named in full by some page, script or test, and every results file that the README or a guide
cites exists and records a clean tree (its commit, no uncommitted changes), so that a figure a
user reads can be traced to a committed state of the code.

A results file records a clean tree in one of these forms:
- JSON (benchmarks/provenance.py's `stamp()`): a top-level "commit" string and "clean": true;
  JSON lines: one such object among the lines;
- markdown or text: a line "Commit: HASH, clean tree" (provenance.py's `stamp_line()`), or
  bench_peers.py's version line "aiayn VERSION (HASH)" with nothing after the hash (a dirty
  run's reads "(HASH+changes)" or "(HASH (with uncommitted changes))").
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from helpers import REPO

RESULTS = REPO / "benchmarks" / "results"
TEXT_SUFFIXES = {".md", ".py", ".sh", ".json", ".csv", ".txt", ".toml", ".cfg"}

# a results file cited by path (a link or a code span), or by a bare dated name
BY_PATH = re.compile(r"benchmarks/(results/[\w.+-]+[\w+-]|RESULTS\.md)")
BY_NAME = re.compile(r"(?<![\w/.-])([\w+-]*\d{4}-\d{2}-\d{2}[\w.+-]*\.(?:jsonl|json|md|txt))\b")
CLEAN_LINE = re.compile(r"^Commit: [0-9a-f]{7,40}, clean tree\b|\baiayn \S+ \([0-9a-f]{7,40}\)",
                        re.MULTILINE)


def citing_pages() -> list[Path]:
    """Where a results file may be named: the README, every page under docs/, benchmarks/'s
    pages and scripts, tools/ and tests/ (this file excepted: it names none)."""
    pages = [REPO / "README.md", REPO / "benchmarks" / "README.md", REPO / "benchmarks" / "RESULTS.md"]
    pages += [p for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".sh")]
    for top in ("docs", "tools", "tests"):
        pages += [p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    return [p for p in pages if p.resolve() != Path(__file__).resolve()]


def records_clean(path: Path) -> bool:
    """Whether the results file `path` records a commit and a tree without uncommitted changes."""
    text = path.read_text(encoding="utf-8", errors="replace")

    def stamped(obj) -> bool:
        return isinstance(obj, dict) and isinstance(obj.get("commit"), str) and obj.get("clean") is True

    if path.suffix == ".json":
        try:
            return stamped(json.loads(text))
        except ValueError:
            return False
    if path.suffix == ".jsonl":
        for line in text.splitlines():
            try:
                if stamped(json.loads(line)):
                    return True
            except ValueError:
                continue
        return False
    return CLEAN_LINE.search(text) is not None


def cited(line: str) -> set[str]:
    """The results files a line cites, as paths under benchmarks/."""
    names = {m.group(1) for m in BY_PATH.finditer(line)}
    names |= {"results/" + m.group(1) for m in BY_NAME.finditer(line)
              if not any(n.endswith("/" + m.group(1)) for n in names)}
    return names


def test_every_results_file_is_named_in_full_by_a_page():
    text = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in citing_pages())
    unnamed = sorted(p.name for p in RESULTS.iterdir() if p.is_file() and p.name not in text)
    assert not unnamed, ("results files no page, script or test names in full (a brace or suffix "
                         "abbreviation does not count):\n" + "\n".join(unnamed))


def test_readme_and_guides_cite_only_existing_clean_results():
    pages = [REPO / "README.md", *sorted((REPO / "docs" / "guides").glob("*.md"))]
    bad = []
    for page in pages:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for name in sorted(cited(line)):
                path = REPO / "benchmarks" / name
                state = ("missing" if not path.is_file() else None if records_clean(path)
                         else "dirty (no clean-tree record)")
                if state:
                    bad.append(f"{page.relative_to(REPO)}:{number} cites {name}: {state}")
    assert not bad, ("figures in the README and the guides need a results file of a clean tree "
                     "(move the figure to docs/experiments/ or cite a clean file):\n" + "\n".join(bad))


def test_the_checks_read_each_form_of_record(tmp_path):
    """The clean-tree forms above, and dirty or missing records, on made-up files."""
    def write(name: str, text: str) -> Path:
        (tmp_path / name).write_text(text, encoding="utf-8")
        return tmp_path / name

    assert records_clean(write("a.json", json.dumps({"commit": "abc1234", "clean": True})))
    assert not records_clean(write("b.json", json.dumps({"commit": "abc1234", "clean": False})))
    assert not records_clean(write("c.json", json.dumps({"rows": []})))  # written before the field
    assert not records_clean(write("d.json", "[1, 2]"))
    assert records_clean(write("e.jsonl", 'x\n{"system": "matmul", "commit": "abc1234", "clean": true}\n'))
    assert not records_clean(write("f.jsonl", '{"system": "matmul"}\n'))
    assert records_clean(write("g.md", "- Versions: torch 2.13.0+cpu, aiayn 0.1.0 (7563014), x\n"))
    assert not records_clean(write("h.md", "- Versions: torch 2, aiayn 0.1.0 (f4fb7d0+changes), x\n"))
    assert not records_clean(write("i.md", "aiayn 0.1.0 (425cdbe (with uncommitted changes))\n"))
    assert records_clean(write("j.md", "GPU: x\nCommit: 6b47231, clean tree; machine: y\n"))
    assert not records_clean(write("k.md", "Commit: 6b47231, with uncommitted changes; machine: y\n"))
    assert not records_clean(write("l.txt", "no record at all\n"))

    line = ("[the table](../../benchmarks/results/train-gpu-2026-11-27-h100.md), "
            "`translate-e2e-2026-12-01-zen5.json`, [harness](../../benchmarks/RESULTS.md); "
            "not DIR/report/results.json or runs/x-2026-01-01/model")
    assert cited(line) == {"results/train-gpu-2026-11-27-h100.md",
                           "results/translate-e2e-2026-12-01-zen5.json", "RESULTS.md"}


# a markdown link's target: ](path) or ](path#anchor); URLs and in-page anchors are not files
LINK = re.compile(r"\]\(([^)\s]+)\)")


def broken_links(page: Path) -> list[str]:
    """The relative links of a markdown page whose file does not exist."""
    out = []
    for m in LINK.finditer(page.read_text(encoding="utf-8")):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        if not (page.parent / target.split("#")[0]).exists():
            out.append(target)
    return out


def test_every_relative_link_of_the_pages_exists():
    pages = [REPO / "README.md", REPO / "benchmarks" / "README.md", REPO / "tools" / "README.md"]
    pages += sorted((REPO / "docs").rglob("*.md"))
    broken = {str(p.relative_to(REPO)): b for p in pages if (b := broken_links(p))}
    assert not broken, broken


def test_the_link_check_finds_a_missing_file(tmp_path):
    (tmp_path / "there.png").write_bytes(b"")
    page = tmp_path / "p.md"
    page.write_text("[a](there.png) [b](gone.md#x) [c](https://x.org) [d](#here) ![e](gone.png)")
    assert broken_links(page) == ["gone.md#x", "gone.png"]
