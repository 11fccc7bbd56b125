"""The bounded copy of a student's outputs that feedback shows back to them (the trusted side keeps
it in cell metadata; nbgrader's preprocessor, plugins.TrustedVerdicts, puts it back). Nothing here
runs anything: it chooses which outputs, and how much of them, may be shown, and makes a student's
HTML inert (safe_markdown, safe_html: formgrader shows it on the Jupyter server's origin)."""
from __future__ import annotations

import html
import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")

FEEDBACK_OUTPUTS = "attn_feedback_outputs"  # cell metadata: {"outputs": [...], "execution_count": n}
CELL_OUTPUT_LIMIT = 200_000  # characters of outputs per cell shown in feedback
NOTEBOOK_OUTPUT_LIMIT = 1_000_000  # ... and per notebook
NOTEBOOK_MARKUP_LIMIT = 1_000_000  # characters of a notebook's markdown and raw cells, parsed as HTML for its pages
TOO_LARGE = "[output too large for feedback]"
_KEPT_DATA = ("text/plain", "text/html", "text/markdown", "image/png", "image/jpeg")  # never scripts, SVG, widgets
_ACTIVE = {"text/html": lambda v: safe_html(v), "text/markdown": lambda v: safe_markdown(v)}  # kept made inert
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
                if value is not None and mime in _ACTIVE and len(value) > min(CELL_OUTPUT_LIMIT, budget) - size:
                    return [new_output("stream", name="stdout", text=TOO_LARGE + "\n")], 0  # never parsed
                if value is not None and mime in _ACTIVE:
                    value = _ACTIVE[mime](value)
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


# --------------------------------------------------------------------------- the student's HTML, made inert
# A student's markdown cells and HTML/markdown outputs are shown on formgrader's page, on the Jupyter
# server's origin with the instructor's session: active HTML there runs as the instructor. What may
# stay: ordinary formatting, tables, links (http, https, mailto, in-page) and images (http(s), or PNG,
# JPEG, GIF, WebP data URIs). A cell that renders to nothing else is kept as it is (the course's own,
# `<pad>` in prose included); one that does not is cleaned by bleach, as feedback's SanitizeHTML does;
# what bleach cannot make safe (a markdown link to javascript:) is shown as its source, in a code block.
SAFE_TAGS = frozenset("""a abbr acronym b blockquote br caption center cite code col colgroup dd del details dfn
    div dl dt em figcaption figure font h1 h2 h3 h4 h5 h6 hr i img ins kbd li mark ol p pre q s samp small span strike
    strong sub summary sup table tbody td tfoot th thead tr tt u ul var""".split())
# No `id` (formgrader finds each score box by its grade id: a student's element of that id came first, and
# the instructor's score was never saved) and only a few classes (a student's `nbgrader_cell` or `full-credit`
# made formgrader controls of their own; `modal-backdrop` a full-page overlay).
SAFE_CLASSES = frozenset({"alert", "alert-info", "alert-warning", "alert-success", "alert-danger", "alert-block"})


def _code_classes() -> frozenset:
    """The classes a code block in markdown is drawn with (pygments' short token names, `highlight`)."""
    from pygments.token import STANDARD_TYPES

    return frozenset(STANDARD_TYPES.values()) | {"highlight", "hll"}
_SAFE_ATTRIBUTES = {"*": {"class", "title", "align"}, "a": {"href"}, "img": {"src", "alt", "width", "height"},
                    "td": {"colspan", "rowspan", "style"}, "th": {"colspan", "rowspan", "scope", "style"},
                    "ol": {"start", "type"}, "font": {"color", "size", "face"},
                    }
_INERT_UNKNOWN = re.compile(r"[a-z][a-z0-9]*")  # `<pad>`: no element of HTML's, no custom element (no '-')
_SCHEME = re.compile(r"([a-z][a-z0-9+.\-]*):")
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif|webp);base64,[a-z0-9+/=]*")
_ALIGNED = re.compile(r"\s*text-align\s*:\s*(left|center|right)\s*;?\s*", re.I)  # markdown's aligned table columns
SOURCE_SHOWN = "*[the grader shows this cell as its source: it held HTML that could run on the grader's page]*"
# The browser's own rule over the pages that show a student's work (a Content-Security-Policy), below the
# cleaning above: pictures come from the page's own server or from data URIs only, so a picture from another
# host (`![](https://tracker/...)`) is never fetched and never tells its host when, or from where, an
# instructor opened the submission. formgrader's server sends it as a header (course_tools.cli and
# hub_formgrader); the feedback page, which loads no script at all, carries a stricter one of its own.
# A student's link that is followed tells its host nothing either: no Referer (REFERRER_POLICY), which would
# name the page it was clicked on (formgrader's address, its token in the query where the instructor opened
# it so; a feedback page's place on a course's web server).
FORMGRADER_POLICY = "frame-ancestors 'self'; img-src 'self' data:"
REFERRER_POLICY = "no-referrer"


def formgrader_policy_option() -> str:
    """The `jupyter server` option that sends FORMGRADER_POLICY and REFERRER_POLICY with every page."""
    import json

    headers = {"Content-Security-Policy": FORMGRADER_POLICY, "Referrer-Policy": REFERRER_POLICY}
    return "--ServerApp.tornado_settings=" + json.dumps({"headers": headers})


def _safe_url(tag: str, name: str, value: str) -> bool:
    """A link to http(s), mailto or a place on the page; an image from http(s), a relative path, a notebook
    attachment or a data URI of a picture (an image's address loads a picture, it runs nothing)."""
    url = re.sub(r"[\x00-\x20\x7f]+", "", html.unescape(value)).lower()
    scheme = _SCHEME.match(url)
    if tag == "img":  # a relative picture stays below the page's folder: no '/...', '//host' or '..' (a GET as the instructor)
        if not scheme:
            return not url.startswith("/") and ".." not in url and "?" not in url
        return scheme.group(1) in ("http", "https", "attachment") or bool(_DATA_IMAGE.fullmatch(url))
    return not scheme or scheme.group(1) in ("http", "https", "mailto")


def _safe_attribute(tag: str, name: str, value: str) -> bool:
    """bleach's test (and ours) of one attribute: named for its tag, and any URL in it harmless."""
    if name not in _SAFE_ATTRIBUTES["*"] | _SAFE_ATTRIBUTES.get(tag, set()):
        return False
    if name == "style":
        return bool(_ALIGNED.fullmatch(value))
    if name == "class":
        return set(value.split()) <= SAFE_CLASSES | _code_classes()
    return _safe_url(tag, name, value) if name in ("href", "src") else True


def _html_elements() -> frozenset:
    from bleach.html5lib_shim import HTML_TAGS

    return frozenset(HTML_TAGS) | {"script", "style", "template", "svg", "math", "portal", "fencedframe", "search",
                                   "dialog", "slot", "image", "noembed", "noframes", "xmp", "plaintext", "listing"}


PARSE_LIMIT = 100_000  # characters of one markdown cell or HTML output the grader parses as HTML
NESTING_LIMIT = 40  # elements open at once in it (html5lib's work grows with the nesting: each tag scans the open ones)
TAG_LIMIT = 5_000  # tags in it (a table's rows cost html5lib more the more there are: 10,000 took 5 s)
_TAG = re.compile(r"<(/?)([a-zA-Z][^\s/>]*)(?:[^>\"']|\"[^\"]*\"|'[^']*')*>")  # quoted '<' and '>' inside a tag
_CODE = re.compile(r"(`{3,}|~{3,})[\s\S]*?(?:\1|$)|(`+)[^`]*?\2")  # markdown's code: shown as text, never elements
_CLOSED_BY_SIBLINGS = frozenset("p li dt dd tr td th option optgroup rb rt rtc rp thead tbody tfoot colgroup caption "
                                "head body html".split())  # an unclosed one is closed by the next of its kind
_VOID = frozenset("area base br col embed hr img input link meta param source track wbr".split())


def too_costly(text: str) -> str:
    """Why the grader will not parse this markdown or HTML ("" when it will): longer than PARSE_LIMIT, more than
    TAG_LIMIT tags, or more than NESTING_LIMIT elements open at once (counted as a browser keeps them: an end tag closes the
    element it names and those opened inside it, and one that names no open element closes nothing). A red team's
    48,000 nested `<ul>` took 2 minutes a pass in html5lib, and a 2 MB cell hours, with every other student's grade
    waiting; a reviewer's `<div></i>` repeated, and `<svg>` with stray end tags, took 9 and 45 s. Markdown's code
    (`<bos>` in backticks) is text, not elements. No honest cell or output comes near."""
    if len(text) > PARSE_LIMIT:
        return f"{len(text):,} characters, more than the {PARSE_LIMIT:,} the feedback page shows"
    stack: list[str] = []
    tags = _TAG.findall(_CODE.sub(" ", text))
    if len(tags) > TAG_LIMIT:
        return f"{len(tags):,} HTML tags, more than the {TAG_LIMIT:,} the feedback page shows"
    for closing, name in tags:
        name = name.lower()
        if name in _VOID or name in _CLOSED_BY_SIBLINGS:
            continue
        if not closing:
            stack.append(name)
            if len(stack) > NESTING_LIMIT:
                return f"HTML elements nested more than {NESTING_LIMIT} deep"
        elif name in stack:
            del stack[len(stack) - 1 - stack[::-1].index(name):]
    return ""


def not_shown(kind: str, why: str) -> str:
    """What the feedback page shows in place of markdown or HTML the grader would not parse."""
    return f"*[the grader does not show this {kind}: {why}]*"


def is_safe_html(fragment: str) -> bool:
    """Whether a browser would find only SAFE_TAGS (or inert unknown ones like `<pad>`) with safe attributes
    in this HTML, parsed by html5lib as a browser parses it (bleach's parser): no comment, SVG or MathML.
    HTML too costly to parse (`too_costly`) is not safe."""
    from bleach.html5lib_shim import BleachHTMLParser, getTreeWalker

    if too_costly(fragment):
        return False

    parser = BleachHTMLParser(tags=None, strip=False, consume_entities=False, namespaceHTMLElements=False)
    known = _html_elements()
    for token in getTreeWalker("etree")(parser.parseFragment(fragment)):
        kind = token["type"]
        if kind in ("Comment", "Doctype") or (kind in ("StartTag", "EmptyTag", "EndTag") and token.get("namespace")):
            return False
        if kind not in ("StartTag", "EmptyTag"):
            continue
        tag, attributes = token["name"], token["data"]
        if tag not in SAFE_TAGS and (tag in known or not _INERT_UNKNOWN.fullmatch(tag) or attributes):
            return False
        if any(space or not _safe_attribute(tag, name, value) for (space, name), value in attributes.items()):
            return False
    return True


def clean_html(fragment: str) -> str:
    """bleach over HTML (or markdown source): other tags escaped (shown as text), comments and unsafe attributes dropped."""
    from bleach.sanitizer import Cleaner

    cleaner = Cleaner(tags=SAFE_TAGS, attributes=_safe_attribute, protocols={"http", "https", "mailto", "data"},
                      strip=False, strip_comments=True)
    return cleaner.clean(fragment)


def render_markdown(source: str, attachments: dict | None = None) -> str:
    """Markdown as formgrader's page renders it (nbconvert's HTMLExporter.markdown2html, with the course's
    settings: headings without anchors, nbgrader_config.py). A picture the cell no longer carries (a
    pasted image: the normalized notebook keeps no attachments) stays an `attachment:` address, which
    shows nothing, instead of nbconvert's InvalidNotebook (which failed the whole grading of the notebook)."""
    from nbconvert.filters.markdown_mistune import IPythonRenderer, MarkdownWithMath

    class Renderer(IPythonRenderer):
        def _embed_image_or_attachment(self, src: str) -> str:
            name = src[len("attachment:"):] if src.startswith("attachment:") else None
            return src if name is not None and name not in self.attachments else super()._embed_image_or_attachment(src)

    renderer = Renderer(escape=False, attachments=attachments or {}, embed_images=False, path="",
                        anchor_link_text="¶", exclude_anchor_links=True)
    return MarkdownWithMath(renderer=renderer).render(source)


def safe_html(fragment: str) -> str | None:
    """HTML (a raw cell, a text/html output) kept when safe, else cleaned; None when still not safe, or too costly
    to parse (`too_costly`)."""
    if too_costly(fragment):
        return None
    if is_safe_html(fragment):
        return fragment
    cleaned = clean_html(fragment)
    return cleaned if is_safe_html(cleaned) else None


def safe_markdown(source: str, attachments: dict | None = None) -> str:
    """Markdown kept when it renders to safe HTML, else cleaned by bleach; shown as its source in a
    code block when even the cleaned text renders unsafe (a markdown link to javascript:, say); replaced by a note
    when too costly to parse (`too_costly`: then not even its source is shown, which every later reader would parse)."""
    why = too_costly(source)
    if why:
        return not_shown("markdown cell", why)
    if _renders_safe(source, attachments):
        return source
    cleaned = clean_html(source)
    if _renders_safe(cleaned, attachments):
        return cleaned
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", source)), default=0))
    return f"{SOURCE_SHOWN}\n\n{fence}text\n{source}\n{fence}\n"


def _renders_safe(source: str, attachments: dict | None) -> bool:
    """Whether markdown renders to safe HTML; a renderer's failure on the student's text is 'not safe'
    (the cell is then shown as its source), never the grader's failure."""
    try:
        return is_safe_html(render_markdown(source, attachments))
    except Exception:  # noqa: BLE001 - any markdown a student can write
        return False


def safe_raw(source: str) -> str:
    """A raw cell (nbconvert's HTML page puts one without a format in as HTML): kept when safe, else escaped."""
    why = too_costly(source)
    if why:
        return html.escape(not_shown("raw cell", why))
    return safe_html(source) or html.escape(source)


def page_outputs(outputs: list) -> list:
    """A code cell's outputs as formgrader may show them, from a notebook any grader version wrote:
    streams and errors (the page escapes them), text, PNG/JPEG as base64, HTML/markdown made inert;
    no other data (scripts, SVG, widgets) and no output metadata (the page writes it into attributes)."""
    from nbformat.v4 import new_output

    shown = []
    for out in outputs if isinstance(outputs, list) else []:
        kind = out.get("output_type") if isinstance(out, dict) else None
        if kind == "stream" and _text(out.get("text")) is not None:
            shown.append(new_output("stream", name="stderr" if out.get("name") == "stderr" else "stdout",
                                    text=_text(out.get("text"))))
        elif kind == "error":
            trace = out.get("traceback")
            shown.append(new_output("error", ename=_text(out.get("ename")) or "Error", evalue=_text(out.get("evalue")) or "",
                                    traceback=[t for t in trace if isinstance(t, str)] if isinstance(trace, list) else []))
        elif kind in ("display_data", "execute_result"):
            shown.extend(student_outputs([out], NOTEBOOK_OUTPUT_LIMIT)[0])  # TOO_LARGE when it is
    return shown
