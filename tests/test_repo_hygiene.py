"""The repository cites only what is in it: no file outside it, no design notes it does not hold.

Code comments and docs cite the repository's own ``docs/`` pages (docs/architecture.md lists them).
A reference to a note kept outside the repository is one a newcomer cannot follow, so these tests read
every tracked file (``git ls-files``) and name each offending line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Names of notes that live outside the repository, and the ways they used to be cited. Written as
# regular expressions so that this file does not match them itself.
OUTSIDE_REFERENCES = re.compile(
    r"design\s*§"  # a numbered section of a design note the repository does not hold, in either case
    r"|\.\./shared|shared[/]docs|/work[/]shared"
    r"|(?<![\w-])(?:design|lessons|pulsar-broker|oxia|style)\.md",
    re.IGNORECASE,
)
# A repository doc cited by path: it must exist (relative links inside docs/ are checked too).
DOC_PATH = re.compile(r"(?<![\w./-])docs/([A-Za-z0-9_-]+\.md)")
DOC_LINK = re.compile(r"\]\(([A-Za-z0-9_-]+\.md)(?:#[^)]*)?\)")


def tracked_text_files() -> list[tuple[str, str]]:
    """(path, text) of every tracked file that exists and is UTF-8 text."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"cannot list the repository's files with `git ls-files` in {REPO}: {exc}")
    files = []
    for name in listing.decode().split("\0"):
        path = REPO / name
        if not name or not path.is_file():
            continue
        try:
            files.append((name, path.read_text(encoding="utf-8")))
        except UnicodeDecodeError:
            continue  # binary (images, jars): cites nothing
    assert files, "git ls-files listed no readable file"
    return files


def test_no_reference_to_files_outside_the_repository() -> None:
    found = [
        f"{name}:{number}: {line.strip()}"
        for name, text in tracked_text_files()
        for number, line in enumerate(text.splitlines(), start=1)
        if OUTSIDE_REFERENCES.search(line)
    ]
    assert not found, (
        "these lines cite notes outside the repository; cite the repository's docs/ instead "
        "(docs/architecture.md, docs/semantics.md, docs/pulsar-protocol.md, docs/record-layout.md, "
        "docs/oxia-client.md, …):\n" + "\n".join(found)
    )


def test_cited_docs_exist() -> None:
    files = tracked_text_files()
    tracked = {name for name, _ in files}
    missing = []
    for name, text in files:
        for number, line in enumerate(text.splitlines(), start=1):
            cited = [f"docs/{doc}" for doc in DOC_PATH.findall(line)]
            if name.startswith("docs/"):
                cited += [f"docs/{doc}" for doc in DOC_LINK.findall(line)]
            missing += [f"{name}:{number}: {doc} is not in the repository: {line.strip()}"
                        for doc in cited if doc not in tracked]
    assert not missing, "these lines cite docs the repository does not hold:\n" + "\n".join(missing)


def test_the_patterns_catch_what_they_are_for() -> None:
    # The checks above pass on a clean tree; this shows they would not pass on the old citations.
    # Spelled in pieces so that the file itself holds none of them.
    md = ".md"
    for old in ("(design" + " §4)", "Design" + " §7. Three pieces", "see /work/" + "shared/x", "oxia" + md + " §2",
                "docs/oxia" + md, "(lessons" + md + ": …)", "docs/style" + md + ", point 5"):
        assert OUTSIDE_REFERENCES.search(old), old
    for fine in ("docs/oxia-client.md", "docs/semantics.md §2", "docs/record-layout.md", "pip/pip-473.md"):
        assert not OUTSIDE_REFERENCES.search(fine), fine
    assert DOC_PATH.findall("see docs/semantics.md §2 and ./docs/x.md") == ["semantics.md"]
    assert DOC_LINK.findall("[s](semantics.md#x) and [u](https://a/b.md)") == ["semantics.md"]


def test_the_readme_module_table_lists_every_package() -> None:
    # It had left out client/, auth/ and participants/, and named bench/ as the home of the wire-level client.
    readme = (REPO / "README.md").read_text()
    start = readme.index("## Architecture (one screen)")
    table = readme[start:readme.index("## Configuration", start)]
    packages = sorted(p.name for p in (REPO / "tc_server").iterdir()
                      if (p / "__init__.py").exists() and not p.name.startswith("_"))
    assert not [p for p in packages if f"`tc_server/{p}/`" not in table], table
