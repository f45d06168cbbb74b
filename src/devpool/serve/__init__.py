"""The host page: `devpool serve`, a read-only live view of the lock folder and the runs.

views.py reads what devpool already writes (lock folder, run records, history, quarantine)
into plain data; pages.py renders it as HTML; app.py is the Starlette app (token, events,
run files); command.py is the subcommand. cluster.py and queue_view.py ask a Ray cluster
and the shared queue's database in the background (queue_page.py renders the queue's
section). Starlette and uvicorn come with `devpool[serve]`, psycopg with `devpool[queue]`.
"""

from __future__ import annotations

from devpool.serve.command import add_serve_command

__all__ = ["add_serve_command"]
