"""A fault-injecting HTTP proxy on 127.0.0.1, between Lance and the test S3 server.

It forwards each request to the server and can, per request: add latency, cap the bandwidth
of response bodies, answer ``503 SlowDown`` (or ``500``) instead, reset the connection in the
middle of a body, stall a body forever, or refuse connections for a while (a restarting
server). Faults are set on the live proxy (``proxy.set(...)``) and apply to the requests that
come after; ``proxy.requests`` counts what it saw.

In a process of its own (``python tests/faultproxy.py UPSTREAM`` prints its port and serves
until its stdin closes; :class:`ProxyProcess` drives it), it takes no GIL from the process it
measures: what benchmarks need. ``PUT /__faults__?latency_s=0.02`` sets its faults.

>>> proxy = FaultProxy("http://127.0.0.1:1")          # doctest: +SKIP
>>> proxy.set(latency_s=0.02, fail_every=5)            # doctest: +SKIP
"""

from __future__ import annotations

import http.client
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlencode, urlparse

CONTROL_PATH = "/__faults__"

SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class Faults:
    latency_s: float = 0.0  # added before each request is forwarded
    bandwidth: float = 0.0  # bytes/s of response bodies; 0: unlimited
    fail_every: int = 0  # every n-th request gets fail_status instead of an answer
    fail_status: int = 503
    reset_every: int = 0  # every n-th GET with a body is cut in the middle (RST)
    stall_every: int = 0  # every n-th GET with a body stops in the middle, forever
    down_until: float = 0.0  # time.monotonic() before which connections are refused


class FaultProxy:
    """The proxy, serving on ``self.endpoint`` until ``stop()``."""

    def __init__(self, upstream: str) -> None:
        target = urlparse(upstream)
        self.faults = Faults()
        self.requests = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                if self.path.startswith(CONTROL_PATH):
                    proxy.set(**{k: float(v) for k, v in parse_qsl(urlparse(self.path).query)})
                    self.send_response(200)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                with proxy._lock:
                    proxy.requests += 1
                    n, f = proxy.requests, proxy.faults
                if time.monotonic() < f.down_until:
                    self._reset()
                    return
                if f.latency_s:
                    time.sleep(f.latency_s)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if f.fail_every and n % f.fail_every == 0:
                    payload = SLOW_DOWN if f.fail_status == 503 else b"internal error"
                    self.send_response(f.fail_status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                upstream_conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    headers["Host"] = f"{target.hostname}:{target.port}"
                    upstream_conn.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream_conn.getresponse()
                    data = answer.read()
                finally:
                    upstream_conn.close()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "date",
                        "server",
                    ):
                        self.send_header(key, value)
                # A HEAD answer has no body but the object's length.
                length = (
                    answer.getheader("Content-Length", "0")
                    if self.command == "HEAD"
                    else str(len(data))
                )
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command == "HEAD" or not data:
                    return
                cut = self.command == "GET" and len(data) > 1
                if cut and f.reset_every and n % f.reset_every == 0:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self._reset()
                    return
                if cut and f.stall_every and n % f.stall_every == 0:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    proxy._stop.wait()  # until the proxy stops
                    self._reset()
                    return
                self._send(data, f.bandwidth)

            def _send(self, data: bytes, bandwidth: float) -> None:
                if not bandwidth:
                    self.wfile.write(data)
                    return
                step = max(1024, int(bandwidth / 50))
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    time.sleep(len(data[i : i + step]) / bandwidth)

            def _reset(self) -> None:
                """Close with RST, as a crashed or restarted server's connection ends."""
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.close_connection = True
                self.connection.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True, name="fault-proxy").start()

    def set(self, **faults: float) -> None:
        """Replace the faults (unnamed ones off); ``down_s`` refuses connections that long."""
        down_s = faults.pop("down_s", 0.0)
        for name in ("fail_every", "fail_status", "reset_every", "stall_every"):
            if name in faults:
                faults[name] = int(faults[name])
        with self._lock:
            self.faults = Faults(**faults)
            if down_s:
                self.faults.down_until = time.monotonic() + down_s

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()


class ProxyProcess:
    """A :class:`FaultProxy` in a process of its own, driven over HTTP."""

    def __init__(self, upstream: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, __file__, upstream],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.endpoint = f"http://127.0.0.1:{int(self._process.stdout.readline())}"

    def set(self, **faults: float) -> None:
        url = f"{self.endpoint}{CONTROL_PATH}?{urlencode(faults)}"
        urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=30).read()

    def stop(self) -> None:
        self._process.stdin.close()
        self._process.wait(10)


if __name__ == "__main__":
    served = FaultProxy(sys.argv[1])
    print(served.endpoint.rsplit(":", 1)[1], flush=True)
    sys.stdin.read()
    served.stop()
