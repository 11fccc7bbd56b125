"""Which source the committed build of our lab extension came from (CI has no Node to rebuild it).

`make labextension` builds course_tools/labextension/ into course_tools/jupyter_data/ and then
runs `python -m course_tools.labextension_stamp write`; a test compares the recorded hash with
the source's, so an edit to the source without a rebuild fails CI instead of shipping stale code.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "labextension"
SOURCE_FILES = ("package.json", "tsconfig.json", "src/*.ts", "style/*.css")
BUILT = Path(__file__).resolve().parent / "jupyter_data" / "labextensions" / "@attention-course" / "validate"
STAMP = BUILT / "source.sha256"


def current() -> str:
    """sha256 over the source files, names included, in a fixed order."""
    digest = hashlib.sha256()
    for pattern in SOURCE_FILES:
        for path in sorted(SOURCE.glob(pattern)):
            digest.update(path.relative_to(SOURCE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def recorded() -> str:
    return STAMP.read_text().strip() if STAMP.exists() else "(no build)"


if __name__ == "__main__":
    if sys.argv[1:] != ["write"]:
        sys.exit("usage: python -m course_tools.labextension_stamp write   (after building the lab extension)")
    STAMP.write_text(current() + "\n")
    print(f"{STAMP.relative_to(Path.cwd()) if STAMP.is_relative_to(Path.cwd()) else STAMP.name}: {current()}")
