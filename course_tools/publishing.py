"""Where the course is published: the one setting, `[tool.attention-course] repository = "owner/name[@ref]"`
of pyproject.toml, read by the Colab install cells (course_tools.colab) and the book's launch buttons."""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

COLAB = "https://colab.research.google.com/github"
BINDER = "https://mybinder.org/v2/gh"


@dataclass(frozen=True)
class Repository:
    """Where the course is published on GitHub: owner/name and the ref (branch or tag) to open."""

    name: str
    ref: str = "main"

    def colab(self, path: str) -> str:
        return f"{COLAB}/{self.name}/blob/{self.ref}/{path}"

    def binder(self, path: str) -> str:
        return f"{BINDER}/{self.name}/{quote(self.ref, safe='')}?urlpath=lab/tree/{path}"


_REPOSITORY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9_.-]+?)(?:\.git)?(?:@(?P<ref>[^\s@]+))?$")


def parse_repository(text: str | None) -> Repository | None:
    """'owner/name' or 'owner/name@ref' (a GitHub URL too) -> Repository; None for nothing."""
    text = (text or "").strip()
    if not text:
        return None
    text = re.sub(r"^(?:https?://)?github\.com/", "", text).rstrip("/")
    m = _REPOSITORY.match(text)
    if not m:
        raise ValueError(f"repository {text!r}: expected owner/name or owner/name@ref (a GitHub repository)")
    return Repository(m.group("name"), m.group("ref") or "main")


def course_settings(root: Path) -> dict:
    """The course's `[tool.attention-course]` table of pyproject.toml ({} when it has none)."""
    path = Path(root) / "pyproject.toml"
    if not path.is_file():
        return {}
    return tomllib.loads(path.read_text()).get("tool", {}).get("attention-course", {})


def published(root: Path) -> tuple[str, str]:
    """(repository 'owner/name' or '', tag) of the course at `root`: the tag is the setting's @ref,
    else v<version> of pyproject.toml."""
    text = str(course_settings(root).get("repository", ""))
    repo = parse_repository(text)
    if repo is None:
        return "", ""
    version = tomllib.loads((Path(root) / "pyproject.toml").read_text())["project"]["version"]
    return repo.name, repo.ref if "@" in text else f"v{version}"
