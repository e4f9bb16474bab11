"""A real S3 server for the tests: moto's server mode on 127.0.0.1, in a process of its own.

``python tests/s3server.py`` prints the port it listens on, serves until its stdin closes (so it
never outlives the test process that started it), and counts the requests it answers:
``GET /__requests__`` returns ``{"GET": n, "PUT": m, ...}`` (that path itself not counted) and
``DELETE /__requests__`` resets the counts.
"""

from __future__ import annotations

import collections
import json
import sys
import threading

COUNT_PATH = "/__requests__"


def counting(app):
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def wrapped(environ, start_response):
        if environ.get("PATH_INFO") == COUNT_PATH:
            with lock:
                if environ["REQUEST_METHOD"] == "DELETE":
                    counts.clear()
                body = json.dumps(dict(counts)).encode()
            start_response(
                "200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
            )
            return [body]
        with lock:
            counts[environ["REQUEST_METHOD"]] += 1
        return app(environ, start_response)

    return wrapped


def main() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request on stderr
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    app = counting(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()  # until the test process closes our stdin, or dies
    server.shutdown()


if __name__ == "__main__":
    main()
