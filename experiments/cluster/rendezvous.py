"""Horovod's Gloo rendezvous server, bound to one address.

The stock `RendezvousServer.start` listens on all interfaces (''); the launcher must only listen
on the emulated cluster's bridge (its subnet's .254) or loopback, so this subclass binds
explicitly and otherwise reuses Horovod's handler, HTTP server and port search unchanged.
"""
from __future__ import annotations

from horovod.runner.http.http_server import (RendezvousHandler, RendezvousHTTPServer,
                                             RendezvousServer)
from horovod.runner.util.network import find_port
from horovod.runner.util.threads import in_thread


class BoundRendezvousServer(RendezvousServer):
    """A RendezvousServer that listens on `bind_address` only."""

    def __init__(self, bind_address: str, verbose: int = 0):
        super().__init__(verbose)
        self.bind_address = bind_address

    def start(self, handler_cls=RendezvousHandler) -> int:
        """Binds a free port on `bind_address`, serves in a daemon thread, returns the port."""
        self._httpd, port = find_port(
            lambda addr: RendezvousHTTPServer((self.bind_address, addr[1]), handler_cls,
                                              self._verbose))
        self._listen_thread = in_thread(target=self._httpd.serve_forever)
        return port
