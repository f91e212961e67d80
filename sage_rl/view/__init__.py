"""``sage-rl view``: one self-contained HTML page of a train, eval or collect run folder (issue 15).

``read.py`` reads the folder through the project's types; ``chains.py`` and ``collected.py`` turn
its records into what the page shows (``model.py``); ``overview.py`` and ``plots.py`` make the
Overview tab; ``compare.py`` the Compare tab; ``page.py`` renders the Jinja2 templates in
``templates/``. See docs/viewer.md.
"""

from sage_rl.view.page import build_html
from sage_rl.view.read import ViewError, read_run

__all__ = ["ViewError", "build_html", "read_run"]
