"""The house rules of docs/architecture.md ("House rules"), checked over the source tree: small
modules, short functions, settings read in one place, and docs that point only into the
repository. These read files; they start nothing."""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("services", "shared", "sim", "bench", "scripts")
SOURCE_SUFFIXES = (".py", ".lua", ".js", ".sh")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80

# Where a function starts and ends in the project's own Lua, JavaScript and shell: every one is
# declared at the start of a line and closed either on that line or by a line that starts with
# its closing word.
_OPENERS = {
    ".lua": (re.compile(r"^(?:local )?function ([\w.:]+)"), re.compile(r"^end\b")),
    ".js": (re.compile(r"^(?:async )?function (\w+)"), re.compile(r"^}")),
    ".sh": (re.compile(r"^(\w[\w-]*)\(\) *\{"), re.compile(r"^}")),
}
_ONE_LINERS = {
    ".lua": re.compile(r"\bend\s*$"),
    ".js": re.compile(r"}\s*;?\s*$"),
    ".sh": re.compile(r"}\s*$"),
}


def tracked(*paths: str) -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / name for name in names]


def sources() -> list[Path]:
    return [p for p in tracked(*SOURCE_DIRS) if p.suffix in SOURCE_SUFFIXES]


def functions(path: Path) -> Iterator[tuple[str, int]]:
    """Each function of ``path`` with its length in lines, its signature and end included."""
    text = path.read_text()
    if path.suffix == ".py":
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                yield node.name, node.end_lineno - node.lineno + 1
        return
    opener, closer = _OPENERS[path.suffix]
    name, start = "", 0
    for number, line in enumerate(text.splitlines(), start=1):
        if not name and (found := opener.match(line)):
            if _ONE_LINERS[path.suffix].search(line):
                yield found.group(1), 1
            else:
                name, start = found.group(1), number
        elif name and closer.match(line):
            yield name, number - start + 1
            name = ""


def test_the_source_tree_is_found() -> None:
    found = {p.suffix for p in sources()}
    assert found == set(SOURCE_SUFFIXES), found


def test_no_source_file_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in sources()
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert not long


def test_no_function_is_over_80_lines() -> None:
    long = {
        f"{p.relative_to(ROOT)}:{name}": n
        for p in sources()
        for name, n in functions(p)
        if n > MAX_FUNCTION_LINES
    }
    assert not long


def test_every_lua_function_is_seen() -> None:
    # The Lua library is read as text above: each of its functions must have been found, or a
    # long one could hide behind a declaration the pattern misses.
    lua = [p for p in sources() if p.suffix == ".lua"]
    declared = sum(len(re.findall(r"^(?:local )?function ", p.read_text(), re.M)) for p in lua)
    seen = sum(1 for p in lua for _ in functions(p))
    assert declared == seen > 0


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = [
        str(p.relative_to(ROOT))
        for p in sources()
        if p.suffix == ".py" and re.search(r"\bos\.(environ|getenv|putenv)\b", p.read_text())
    ]
    # service_env.py copies the LADDER_* variables into a service's environment as it starts
    # (make up, deploy/supervisord.conf): it moves environments, and reads no setting.
    assert readers == ["scripts/service_env.py", "shared/settings.py"]


# What points out of the repository: files kept beside it (a bare name, not a path inside it),
# a sibling folder, and numbered issues of a tracker the repository does not hold.
OUTSIDE = re.compile(
    r"(?<![\w/])(API|DESIGN|FACTS|STYLE)\.md|\.\./shared|(?i:\bissues?\s+#?\d+|\bissue\s+#)"
)


@pytest.mark.parametrize(
    ("line", "outside"),
    [
        ("the figures of FACTS.md", True),
        ("as STYLE.md says", True),
        ("see API.md, section 4", True),
        ("from ../shared/keys.py", True),
        ("a target (issue 14)", True),
        ("Issue #3 names it", True),
        ("issues 13 and 14", True),
        ("docs/api.md section 4", False),
        ("[docs/api.md](docs/API.md)", False),
        ("BENCHMARKS.md, the run of 09:15", False),
        ("Issue short-lived tokens.", False),
        ("the performance targets in BENCHMARKS.md", False),
    ],
)
def test_the_outside_pattern(line: str, outside: bool) -> None:
    assert bool(OUTSIDE.search(line)) is outside


@pytest.mark.parametrize("place", [*SOURCE_DIRS, "docs", "README.md", "BENCHMARKS.md", "tests"])
def test_references_point_into_the_repository(place: str) -> None:
    read = [
        p
        for p in tracked(place)
        if p.suffix in (*SOURCE_SUFFIXES, ".md", ".html") and p != Path(__file__)
    ]
    assert read, place  # a place that holds nothing to read would pass unread
    found = [
        f"{p.relative_to(ROOT)}:{number}"
        for p in read
        for number, line in enumerate(p.read_text().splitlines(), start=1)
        if OUTSIDE.search(line)
    ]
    assert not found
