"""The docs hold together: every relative link in the Markdown files resolves to a file
of the repository (and its #anchor to a heading there), and every document a code
comment cites is in the repository (a comment citing a note nobody can open is a claim
nobody can check)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted(
    [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")]
)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(md: Path) -> set[str]:
    out = set()
    fence = False
    for line in md.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        m = None if fence else re.match(r"^#{1,6} (.+)$", line)
        if m:
            a = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(a)
    return out


def test_every_relative_link_resolves() -> None:
    broken = []
    for md in DOCS:
        for target in LINK.findall(md.read_text()):
            if re.match(r"^[a-z]+:", target):
                continue  # https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{md.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_document_a_comment_cites_is_in_the_repository() -> None:
    cited = re.compile(r"\b((?:docs/)?[\w./-]*\w\.md)\b")
    missing = []
    for src in sorted(
        [*(ROOT / "spool").rglob("*.py"), *(ROOT / "spoold").rglob("*.py"), *(ROOT / "tools").glob("*")]
    ):
        if not src.is_file() or src.suffix not in (".py", ""):
            continue
        for name in cited.findall(src.read_text(errors="replace")):
            if not (ROOT / name).exists() and not (ROOT / "docs" / name).exists():
                missing.append(f"{src.relative_to(ROOT)}: {name}")
    assert missing == []


def test_every_command_but_watch_and_serve_takes_json_as_the_docs_say() -> None:
    """docs/SPEC.md section 10 and docs/jobs.md: every command takes --json but the two
    whose output is for a person (a live terminal view, the page)."""
    import click
    import typer.main

    from spool import cli

    def walk(c: click.Command, path: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
        if isinstance(c, click.Group):
            for name, sub in c.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield " ".join(path), c

    commands = dict(walk(typer.main.get_command(cli.app)))
    without = {name for name, c in commands.items() if not any("--json" in p.opts for p in c.params)}
    assert len(commands) > 20 and without == {"watch", "serve"}
    for doc in (ROOT / "docs" / "SPEC.md", ROOT / "docs" / "jobs.md"):
        assert "but `watch`" in doc.read_text(), doc
