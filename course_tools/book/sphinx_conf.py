"""Sphinx configuration of the course's book (copied as conf.py into the staging folder that
`course_tools.book.build_book` lays out; book_settings.json beside it says what differs per build).

Nothing here loads anything from the network: the notebooks' committed outputs are reused (never
executed), MathJax is served from the site's own _static/mathjax/ (the copy that the
jupyter-server-mathjax package ships), myst-nb is given no widget scripts to load, and the theme's
assets are local.
"""
import json
from pathlib import Path

_settings = json.loads((Path(__file__).resolve().parent / "book_settings.json").read_text(encoding="utf-8"))

project = "Attention, step by step"
author = "the course's authors"
copyright = "the course's authors (MIT licence)"
language = "en"

extensions = ["myst_nb"]
root_doc = "index"
exclude_patterns = ["_build", "**.ipynb_checkpoints", "book_settings.json"]

# --- the notebooks: committed outputs, never executed
nb_execution_mode = "off"
nb_merge_streams = True
nb_ipywidgets_js = {}  # no require.js nor widget manager from a CDN (the scrubber drops widget outputs too)
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3

# --- math: MathJax 2 from this site's _static/mathjax/, the configuration Jupyter's classic
# notebook uses (HTML-CSS output, the STIX web fonts that come with this copy)
myst_update_mathjax = False
mathjax_path = _settings["mathjax_path"]
mathjax2_config = {
    "tex2jax": {"inlineMath": [["\\(", "\\)"]], "displayMath": [["\\[", "\\]"]],
                "processEscapes": False, "processEnvironments": False},
    "displayAlign": "center",
    "messageStyle": "none",
    "showMathMenu": True,
    "menuSettings": {"zoom": "None"},
    "config": _settings["mathjax_config"],
    "HTML-CSS": {"availableFonts": [], "imageFont": None, "preferredFont": None, "webFont": "STIX-Web", "scale": 92,
                 "linebreaks": {"automatic": True}},
}

# --- pages
html_theme = "sphinx_book_theme"
html_title = project
html_static_path = ["_static"]
html_css_files = ["book.css"]
html_last_updated_fmt = None
html_show_sphinx = False
html_copy_source = True  # the .ipynb download button: the scrubbed notebook
html_theme_options = {
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    "search_bar_text": "Search the course…",
}

_repository = _settings.get("repository")
if _repository:
    # "Open in Colab" / Binder on every chapter: the solved notebook (what the page shows); the
    # banner under each chapter's title links the student version too.
    html_theme_options.update({
        "repository_url": f"https://github.com/{_repository}",
        "repository_branch": _settings["ref"],
        "path_to_docs": "solutions",
        "use_repository_button": True,
        "launch_buttons": {"colab_url": "https://colab.research.google.com",
                           "binderhub_url": "https://mybinder.org",
                           "notebook_interface": "jupyterlab"},
    })
