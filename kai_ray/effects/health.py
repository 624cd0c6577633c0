"""Health and readiness endpoints for the operator's probes, on their own port.

`/healthz` answers 200 while the scheduling loop and its watches are alive;
`/readyz` answers 200 once every watched kind has been listed (and the operator
says the admission webhook listens, when it serves one). Each answer's
body says which check failed, then the `details` lines (the Ray placement
backend's state, when it was used: lost or not, it fails neither check, since
placement goes on locally). Runs in a daemon thread; no other I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Check = Callable[[], bool]


def serve_health(
    host: str, port: int, alive: Check, ready: Check, details: Callable[[], str] | None = None
) -> ThreadingHTTPServer:
    """Start the endpoints; the returned server is stopped with `shutdown()`."""
    checks = {"/healthz": alive, "/readyz": ready}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            check = checks.get(self.path.split("?")[0])
            if check is None:
                self.send_error(404)
                return
            ok = check()
            extra = details() if details is not None else ""
            body = ("ok\n" if ok else f"{self.path} failed\n").encode()
            body += f"{extra}\n".encode() if extra else b""
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return None  # probes every few seconds would drown the log

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
