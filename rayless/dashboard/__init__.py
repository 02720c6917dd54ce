"""``rayless dashboard``: one live page of a running cluster, served by this command's own
process (the head serves no HTTP).

    rayless dashboard                    http://127.0.0.1:8265/?key=...
    rayless dashboard --port 0           any free port (printed)

The command joins the cluster with its token (named as for ``rayless status``) and serves,
on 127.0.0.1 unless ``--host`` says otherwise:

* ``/`` the page (plain HTML and JavaScript shipped in the package, no CDN): nodes with their
  GPUs, actors (state, restarts, node, pid, last error, calls in flight and done), store
  partitions (samples, consumption per task) and units (rows, bytes), weight syncs (version,
  relays) and the last minute of the timeline (unless ``RAYLESS_TIMELINE=0``); it refreshes every
  second;
* ``/api/snapshot`` the same as JSON; ``/metrics`` the Prometheus text of
  ``rayless status --prometheus``.

Every request needs the key printed with the URL (``?key=``, then a cookie): the page shows
what the cluster runs to anyone who can reach the port, and other users of the host can reach
127.0.0.1. Needs the ``dashboard`` extra (aiohttp).
"""

from __future__ import annotations

from rayless.dashboard.server import add_arguments, run

__all__ = ["add_arguments", "run"]
