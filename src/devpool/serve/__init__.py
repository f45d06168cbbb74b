"""The host page: `devpool serve`, a read-only live view of the lock folder and the runs.

device_views.py (lock folder) and views.py (run records, history, quarantine) read what
devpool already writes into plain data; pages.py renders it as HTML; app.py is the
Starlette app (token, events, run files); command.py is the subcommand. cluster.py and
queue_view.py ask a Ray cluster and the shared queue's database in the background
(ray_page.py and queue_page.py render their sections). Starlette and uvicorn come with
`devpool[serve]`, psycopg with `devpool[queue]`.
"""

from __future__ import annotations

from devpool.serve.command import add_serve_command

__all__ = ["add_serve_command"]
