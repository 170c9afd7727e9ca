"""The image's build context: both builders see the same few files (BuildKit reads
deploy/Dockerfile.dockerignore, the classic builder /.dockerignore)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _rules(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip() and not line.startswith("#")]


def test_both_builders_ignore_the_same() -> None:
    assert _rules(ROOT / ".dockerignore") == _rules(ROOT / "deploy" / "Dockerfile.dockerignore")


def test_the_context_is_only_what_the_image_copies() -> None:
    rules = _rules(ROOT / ".dockerignore")
    assert rules[0] == "*", "everything is left out but what is named"
    for needed in ("pyproject.toml", "README.md", "shared", "services", "deploy/healthcheck.py"):
        assert f"!{needed}" in rules, needed
