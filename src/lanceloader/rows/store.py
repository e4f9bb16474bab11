"""Object stores: which URIs are one, the options and timeouts Lance gets for them, what a
failed request most likely means (a hint named in the error), and whether the store answers at
all, so a gone store fails a read in seconds, not after Lance's retries."""

from __future__ import annotations

import os
import socket
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

# Object-store requests Lance makes give up after these (given as storage_options where the user
# set none of them): a request may take 30 s, its retries 30 s more. Without them, opening a
# dataset on a server that accepts connections but never answers had not ended after 400 s
# (pylance 14); Lance repeats a failed request several times itself, so with them it ends in an
# error after a few minutes, as the loop's stall_timeout would.
OBJECT_STORE_TIMEOUTS = {"connect_timeout": "5s", "timeout": "30s", "client_retry_timeout": "30"}


# While a Lance call on an object store runs longer than this, its store is probed each time: a
# gone store (refused connections, a name that does not resolve) ends the call with an error
# within seconds, where Lance's retries of every request took minutes (226 s measured).
STORE_PROBE_S = 1.0


def is_object_store(uri: str) -> bool:
    """Whether ``uri`` names an object store (``s3://``, ``gs://``, ``az://``, ...), not a path.

    >>> is_object_store("s3://bucket/d.lance"), is_object_store("file:///d.lance")
    (True, False)
    """
    return "://" in uri and not uri.startswith("file://")


def object_store_hint(message: str, uri: str, storage_options: dict[str, str] | None) -> str:
    """The likely cause of an object-store error ``message`` (Lance's), or ``''``.

    >>> object_store_hint("... 404 Not Found: <Code>NoSuchBucket</Code> ...", "s3://b/d.lance",
    ...                   {"endpoint": "http://127.0.0.1:9000"})
    "the bucket 'b' does not exist at http://127.0.0.1:9000: check the bucket's name (and the account or region it belongs to)"
    """
    if not is_object_store(uri):
        return ""
    options = {k.lower(): v for k, v in (storage_options or {}).items()}
    endpoint = (
        options.get("endpoint") or options.get("aws_endpoint") or "the store's default endpoint"
    )
    bucket = uri.split("://", 1)[1].split("/", 1)[0]
    if "NoSuchBucket" in message:
        return (
            f"the bucket {bucket!r} does not exist at {endpoint}: check the bucket's name "
            "(and the account or region it belongs to)"
        )
    if any(
        s in message
        for s in (
            "PermanentRedirect",
            "AuthorizationHeaderMalformed",
            "IllegalLocationConstraint",
            "301 Moved",
        )
    ):
        return (
            f"the bucket {bucket!r} is in another region than "
            f"{options.get('region') or options.get('aws_region') or 'the default one'}: "
            "set storage_options region= to the bucket's region"
        )
    if any(
        s in message
        for s in (
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
            "403 Forbidden",
            "ExpiredToken",
            "InvalidToken",
        )
    ):
        return (
            "the store refused the credentials: check access_key_id / secret_access_key "
            "(or session_token) in storage_options, or the environment's AWS_* variables "
            "and the machine's role"
        )
    if any(
        s in message
        for s in (
            "error sending request",
            "Connection refused",
            "dns error",
            "refuses connections",
            "does not resolve",
            "connect error",
            "timed out",
            "operation timed out",
        )
    ):
        return (
            f"could not reach {endpoint}: check endpoint= (with allow_http='true' for an "
            "http:// endpoint), the network or proxy, and that the server is running"
        )
    return ""


def object_store_options(uri: str, storage_options: dict[str, str] | None) -> dict[str, str] | None:
    """``storage_options`` with :data:`OBJECT_STORE_TIMEOUTS` added for an object-store URI when
    the user gave no timeout of their own.

    >>> object_store_options("s3://bucket/data.lance", None)
    {'connect_timeout': '5s', 'timeout': '30s', 'client_retry_timeout': '30'}
    >>> object_store_options("/data/local.lance", None) is None
    True
    """
    given = storage_options or {}
    if not is_object_store(uri) or any(k.lower() in OBJECT_STORE_TIMEOUTS for k in given):
        return storage_options
    return {**OBJECT_STORE_TIMEOUTS, **given}


def store_address(uri: str, storage_options: dict[str, str] | None) -> tuple[str, int] | None:
    """The host and port an object-store ``uri`` is served from (the ``endpoint`` option, or the
    store's public endpoint), or None when unknown or reached through a proxy (then only Lance's
    own timeouts apply).

    >>> store_address("s3://b/d.lance", {"endpoint": "http://127.0.0.1:9000"})
    ('127.0.0.1', 9000)
    >>> store_address("gs://b/d.lance", None)
    ('storage.googleapis.com', 443)
    >>> store_address("/data/d.lance", None) is None
    True
    """
    if not is_object_store(uri):
        return None
    options = {k.lower(): v for k, v in (storage_options or {}).items()}
    if any(k.endswith("proxy_url") for k in options) or any(
        os.environ.get(k)
        for k in (
            "HTTPS_PROXY",
            "https_proxy",
            "HTTP_PROXY",
            "http_proxy",
            "ALL_PROXY",
            "all_proxy",
        )
    ):
        return None
    scheme = uri.split("://", 1)[0].lower()
    endpoint = (
        options.get("endpoint")
        or options.get("aws_endpoint")
        or (
            os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT")
            if scheme in ("s3", "s3a")
            else None
        )
    )
    if endpoint is None:
        region = (
            options.get("region")
            or options.get("aws_region")
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1"
        )
        endpoint = {
            "s3": f"https://s3.{region}.amazonaws.com",
            "s3a": f"https://s3.{region}.amazonaws.com",
            "gs": "https://storage.googleapis.com",
        }.get(scheme)
        if endpoint is None:
            return None
    parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    if not parsed.hostname:
        return None
    try:
        port = parsed.port or (80 if parsed.scheme == "http" else 443)
    except ValueError:
        return None
    return parsed.hostname, port


def store_unreachable(address: tuple[str, int], timeout: float = 2.0) -> str | None:
    """Why the store at ``address`` is certainly unreachable (its name does not resolve, or it
    refuses connections), or None when a connection opened or the answer is not certain (a
    connect that times out may be a slow network: Lance's own timeouts decide)."""
    host, port = address
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"the store's host name {host!r} does not resolve ({exc.strerror})"
    refused = None
    for family, kind, proto, _, where in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.settimeout(timeout)
                probe.connect(where)
            return None
        except ConnectionRefusedError:
            refused = f"{host}:{port} refuses connections (no server listens there)"
        except OSError:
            return None
    return refused


class StoreUnreachable(ConnectionError):
    """A call to the object store was abandoned: the store is certainly gone."""


def reaching_store(
    call: Callable[[], Any],
    uri: str,
    storage_options: dict[str, str] | None,
    probe_every_s: float | None = None,
) -> Any:
    """``call()`` (a Lance read of ``uri``), ended within seconds when the store is gone.

    For a local ``uri`` it is simply called. For an object store it runs on a daemon thread
    while this thread waits; every ``probe_every_s`` (:data:`STORE_PROBE_S`) it is still
    running, the store's address is probed (:func:`store_unreachable`): a host name that does
    not resolve or a refused connection raises :class:`StoreUnreachable` (a ``ConnectionError``,
    which the read makes a ``ReadError``) at once, leaving the call to end by itself in the
    background (Lance retries each failed request, so a gone store took minutes to fail). A
    server that accepts connections keeps Lance's timeouts (:data:`OBJECT_STORE_TIMEOUTS`).

    >>> reaching_store(lambda: 42, "/data/d.lance", None)
    42
    """
    address = store_address(uri, storage_options)
    if address is None:
        return call()
    every = STORE_PROBE_S if probe_every_s is None else probe_every_s
    done, outcome = threading.Event(), {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # re-raised in the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="lanceloader-store-call", daemon=True).start()
    while not done.wait(every):
        why = store_unreachable(address)
        if why is not None and not done.is_set():
            raise StoreUnreachable(
                f"could not reach {uri!r}: {why}; the request was abandoned "
                "instead of waiting for Lance's retries"
            )
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
