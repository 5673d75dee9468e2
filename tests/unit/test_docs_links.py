"""The README and the pages under docs/ hold together: every relative link resolves to a file of
the repository (and an anchor to a heading of that page), nothing points outside the
repository, each page says first what it is for, and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ops.template import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 350
PENDING = {"docs/groups.md", "docs/api-performance.md"}
"""Pages written on other branches at the same time: linked from the docs map already, so a
link to one is accepted while it is not here yet (once merged, it is checked like any)."""

FENCE = re.compile(r"^```.*?^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\n]|\][^(\n])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def prose(page: Path) -> str:
    """The page without its code blocks and code spans (their brackets are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lower-cased, punctuation dropped, spaces as -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for heading in HEADING.findall(text):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(page))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # https:, mailto:
    ]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
            continue
        relative = file.relative_to(ROOT).as_posix()
        if relative in PENDING and not file.exists():
            continue
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {relative}")
    assert broken == [], f"{name(page)}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_nothing_points_at_files_outside_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    outside = re.findall(r"\.\./shared\S*|/work/\S*|\.\./\.\./\S*", text)
    assert outside == [], f"{name(page)} points outside the repository: {outside}"


@pytest.mark.parametrize("page", PAGES, ids=name)
def test_each_page_opens_with_its_title_and_what_it_is_for(page: Path) -> None:
    lines = [line for line in page.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert lines[0].startswith("# "), f"{name(page)} does not open with a title"
    opening = lines[1]
    assert re.match(r"^[A-Z`*\[]", opening) and not opening.startswith(("```", "|", "- ")), (
        f"{name(page)}: the line after the title is not a sentence: {opening!r}"
    )


def test_the_readme_fits_in_350_lines() -> None:
    count = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert count <= README_MAX_LINES, f"README.md has {count} lines"


def test_the_readme_maps_every_page_under_docs() -> None:
    readme = set(links(ROOT / "README.md"))
    pages = {f"docs/{page.name}" for page in PAGES[1:]} | PENDING
    missing = sorted(page for page in pages if page not in {t.partition("#")[0] for t in readme})
    assert missing == [], f"the README's docs map leaves out {missing}"


def test_the_link_reader_finds_links_and_anchors(tmp_path: Path) -> None:
    assert slug("Local stack (`make run`)") == "local-stack-make-run"
    assert slug("Production-like parts: `REDIS_SHARDS`, `DYNAMODB`") == (
        "production-like-parts-redis_shards-dynamodb"
    )
    sample = "see [a](docs/a.md#x), ![b](b.png) and `[c](not-a-link)`\n```\n[d](e)\n```\n"
    page = tmp_path / "sample.md"
    page.write_text(sample, encoding="utf-8")
    assert links(page) == ["docs/a.md#x", "b.png"]
