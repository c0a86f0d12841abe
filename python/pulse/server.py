"""pulse.Server: serves a store over HTTP from threads of this process."""

import ctypes
import os
import weakref

from ._lib import Closing, ServerOpts, check, lib

# The servers of this process, so that a Publisher of the same store wakes
# them as soon as it moved the head (their watcher would notice later: a
# pull right after a publish could otherwise still get the older head).
_LIVE = weakref.WeakSet()


def notify_store(store_dir):
    """Wakes every server of this process that serves `store_dir`."""
    real = os.path.realpath(store_dir)
    for server in list(_LIVE):
        if server._real == real:
            server.notify()


class Server(Closing):
    """Serves the store folder `store_dir` (trainer_side/pulse_server.h) on
    `listen` ("HOST:PORT"; port 0 picks a free one). A publisher in this
    process or another is seen at once (the server watches head.json).
    `.url` is the base URL to give a Subscriber."""

    def __init__(self, store_dir, listen="127.0.0.1:0", *, threads=0):
        self._server = None
        host = ctypes.create_string_buffer(256)
        port = ctypes.c_uint16()
        check(lib.pulse_server_parse_listen(listen.encode(), host, len(host), ctypes.byref(port)))
        self._store = os.fsencode(os.fspath(store_dir))
        self._host = host.value
        self._opts = ServerOpts()
        self._opts.store_dir = self._store
        self._opts.host = self._host
        self._opts.port = port.value
        self._opts.threads = threads
        server = ctypes.c_void_p()
        check(lib.pulse_server_create(ctypes.byref(self._opts), ctypes.byref(server)))
        self._server = server
        self._real = os.path.realpath(os.fspath(store_dir))
        _LIVE.add(self)
        self.port = lib.pulse_server_port(server)
        name = self._host.decode() or "127.0.0.1"
        if ":" in name:
            name = f"[{name}]"
        self.url = f"http://{name}:{self.port}"

    def notify(self):
        """Re-reads the head and wakes the long-polls now (a Publisher of
        this process does it after each publish; a publisher elsewhere is
        noticed by the server's watcher)."""
        if self._server is not None:
            lib.pulse_server_notify(self._server, -1.0)

    def close(self):
        """Stops serving. Idempotent."""
        if self._server is not None:
            lib.pulse_server_free(self._server)
            self._server = None
