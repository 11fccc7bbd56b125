"""formgrader without a network: its submission pages load MathJax from a CDN (nbgrader's template calls nbconvert's
`mathjax()` with no address), and offline the page's script stops at `MathJax.loaded`, before it binds formgrader's
keys (Tab, Esc, Ctrl-.), and the math shows as TeX. This server extension (`attn-course formgrader` loads it) points
those pages at the MathJax that jupyter_server_mathjax serves on the same server."""
from __future__ import annotations

from tornado.web import OutputTransform

CDN = b"https://cdnjs.cloudflare.com/ajax/libs/mathjax/2.7.7/latest.js?config=TeX-AMS_CHTML-full,Safe"
LOCAL_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"  # the configurations jupyter_server_mathjax ships


def local_mathjax(base_url: str) -> bytes:
    """The address of the server's own MathJax, with a configuration it ships."""
    return f"{base_url.rstrip('/')}/static/jupyter_server_mathjax/MathJax.js?config={LOCAL_CONFIG}".encode()


def offline(chunk: bytes, base_url: str) -> bytes:
    """A page with the CDN's MathJax pointed at the server's own."""
    return chunk.replace(CDN, local_mathjax(base_url)) if CDN in chunk else chunk


class OfflineMathJax(OutputTransform):
    """Rewrites the MathJax address in the server's HTML pages (the first chunk holds the page's head)."""

    base_url = "/"

    def transform_first_chunk(self, status_code, headers, chunk, finishing):
        if str(headers.get("Content-Type", "")).startswith("text/html") and CDN in chunk:
            chunk = offline(chunk, self.base_url)
            if "Content-Length" in headers:
                headers["Content-Length"] = str(len(chunk))
        return status_code, headers, chunk


def _jupyter_server_extension_points():
    return [{"module": "course_tools.formgrader_offline"}]


def _load_jupyter_server_extension(serverapp):
    OfflineMathJax.base_url = serverapp.base_url
    serverapp.web_app.add_transform(OfflineMathJax)


load_jupyter_server_extension = _load_jupyter_server_extension  # the older name, for older servers
