"""The worker's web server (/metrics, /readyz) on a socket bound at start (:func:`app.listen.hold_listen`).

Faust's aiohttp driver binds ``web_bind``:``web_port`` only once the app has started its consumers; a port taken
in between crashed the worker with a page of traceback. :func:`serve_on` hands the driver the socket the worker
bound before it asked the broker anything, so the port is this worker's from its first line.
"""

from __future__ import annotations

import socket

import faust
from aiohttp.web import BaseSite, SockSite
from faust.web.drivers.aiohttp import Web


class HeldSocketWeb(Web):
    """Faust's aiohttp web driver serving on an already bound, listening socket (closed with the server)."""

    def __init__(self, app: faust.App, sock: socket.socket) -> None:
        super().__init__(app)
        self._held = sock

    def _new_transport_tcp(self) -> BaseSite:
        return SockSite(self._runner, self._held)


def serve_on(app: faust.App, sock: socket.socket) -> None:
    """Have ``app``'s web server (when web is enabled) serve on ``sock`` instead of binding its own."""
    app.web = HeldSocketWeb(app, sock)  # type: ignore[misc]  # faust's cached property takes a value
