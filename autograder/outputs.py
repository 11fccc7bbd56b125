"""The bounded copy of a student's outputs that feedback shows back to them (the trusted side keeps
it in cell metadata; nbgrader's preprocessor, plugins.TrustedVerdicts, puts it back). Nothing here
runs or renders anything: it only chooses which outputs, and how much of them, may be shown."""
from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

FEEDBACK_OUTPUTS = "attn_feedback_outputs"  # cell metadata: {"outputs": [...], "execution_count": n}
CELL_OUTPUT_LIMIT = 200_000  # characters of outputs per cell shown in feedback
NOTEBOOK_OUTPUT_LIMIT = 1_000_000  # ... and per notebook
TOO_LARGE = "[output too large for feedback]"
_KEPT_DATA = ("text/plain", "text/html", "text/markdown", "image/png", "image/jpeg")  # never scripts, SVG, widgets
_BASE64 = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_EVALUE_LIMIT = 2_000


def _text(value) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return None


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 10**9


def student_outputs(raw, budget: int) -> tuple[list, int]:
    """The outputs of one submitted code cell as feedback may show them, and their size.

    Only streams, rich displays (text, sanitized HTML/markdown, PNG/JPEG) and errors (type and
    message, never the traceback) are kept, without their metadata; a cell whose outputs are
    larger than CELL_OUTPUT_LIMIT, or than the `budget` left to its notebook, shows TOO_LARGE instead.
    """
    from nbformat.v4 import new_output

    kept, size = [], 0
    for out in raw if isinstance(raw, list) else []:
        if not isinstance(out, dict):
            continue
        kind = out.get("output_type")
        if kind == "stream":
            text = _text(out.get("text"))
            if text is None:
                continue
            new = new_output("stream", name="stderr" if out.get("name") == "stderr" else "stdout", text=text)
            n = len(text)
        elif kind in ("display_data", "execute_result"):
            data = out.get("data") if isinstance(out.get("data"), dict) else {}
            shown = {}
            for mime in _KEPT_DATA:
                value = _text(data.get(mime))
                if value is not None and mime.startswith("image/"):
                    value = "".join(value.split())
                    value = value if _BASE64.fullmatch(value) else None
                if value is not None:
                    shown[mime] = value
            if not shown:
                continue
            if kind == "execute_result":
                count = out.get("execution_count")
                new = new_output(kind, data=shown, execution_count=count if _is_count(count) else None)
            else:
                new = new_output(kind, data=shown)
            n = sum(len(v) for v in shown.values())
        elif kind == "error":
            ename, evalue = _text(out.get("ename")), _text(out.get("evalue"))
            ename = _ANSI.sub("", ename or "Error")[:200]
            evalue = _ANSI.sub("", evalue or "")[:_EVALUE_LIMIT]
            new = new_output("error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])
            n = len(ename) + len(evalue)
        else:
            continue
        size += n + 50  # an empty output still costs something: no million empty outputs
        if size > min(CELL_OUTPUT_LIMIT, budget):
            return [new_output("stream", name="stdout", text=TOO_LARGE + "\n")], 0
        kept.append(new)
    return kept, size
