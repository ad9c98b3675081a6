"""Authenticated HTTP key-value store used for rendezvous.

The launcher (``horovodrun``) or a test harness runs a :class:`RendezvousServer`; workers reach it
with a :class:`RendezvousClient` at ``HOROVOD_GLOO_RENDEZVOUS_ADDR`` and
``HOROVOD_GLOO_RENDEZVOUS_PORT``.
Keys live under ``/<scope>/<key>`` (exactly two path segments; the client percent-encodes scope and
key, so they may hold any character).

Authentication (our addition to the protocol; upstream's store accepts anyone):

* the job has one secret of :data:`SECRET_LENGTH` random bytes (:func:`make_secret_key`); workers
  receive it hex-encoded in the environment variable :data:`SECRET_ENV`;
* every request carries a timestamp (seconds since the epoch), a random nonce and
  ``HMAC-SHA256(secret, method | path | timestamp | nonce | sha256(body))``;
* the server refuses, without touching the store, a request whose signature is missing or wrong
  (401), whose timestamp is more than :data:`MAX_CLOCK_SKEW_S` away from the server's clock (403),
  or whose nonce it has already accepted (403);
* every response to an accepted request carries
  ``HMAC-SHA256(secret, status | nonce | sha256(body))``, bound to the request's nonce; the
  client checks it before it looks at the body, so nothing unauthenticated is ever handed on (or
  unpickled by a caller).

This module needs only the standard library: it must work before the compiled core is built.
"""

import hashlib
import hmac
import http.client
import http.server
import os
import secrets
import socket
import threading
import time
import urllib.parse
from typing import Dict, Optional, Set, Tuple

SECRET_ENV = "_HOROVOD_SECRET_KEY"
SECRET_LENGTH = 32
MAX_CLOCK_SKEW_S = 60.0
PUT_READ_TIMEOUT_S = 3.0
# Reading a request line and headers; an idle connection is closed after this.
REQUEST_READ_TIMEOUT_S = 30.0
MAX_BODY_BYTES = 1 << 30
POLL_INTERVAL_S = 0.01
CONNECT_ATTEMPTS = 3
CONNECT_RETRY_DELAY_S = 0.5

HEADER_TIMESTAMP = "X-Horovod-Timestamp"
HEADER_NONCE = "X-Horovod-Nonce"
HEADER_SIGNATURE = "X-Horovod-Signature"

GLOBAL_SCOPE = "global"
LOCAL_SCOPE_PREFIX = "local_"
CROSS_SCOPE_PREFIX = "cross_"

# Secrets of servers started in this process, keyed by port, so that a client created in the same
# process (the launcher itself, tests, elastic notification) needs no secret argument.
_registry: Dict[int, bytes] = {}
_registry_lock = threading.Lock()


def make_secret_key() -> bytes:
    """Return a new per-job secret: :data:`SECRET_LENGTH` (32) cryptographically random bytes."""
    return secrets.token_bytes(SECRET_LENGTH)


def _body_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def request_signature(secret: bytes, method: str, path: str, timestamp: str, nonce: str,
                      body: bytes) -> str:
    """Hex HMAC-SHA256 that authenticates one request (see the module docstring)."""
    message = "\n".join([method, path, timestamp, nonce, _body_digest(body)]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def response_signature(secret: bytes, status: int, nonce: str, body: bytes) -> str:
    """Hex HMAC-SHA256 that authenticates the response to the request that carried ``nonce``."""
    message = "\n".join(["response", str(status), nonce, _body_digest(body)]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class _NonceCache:
    """Nonces of the requests accepted in the last ``2 * MAX_CLOCK_SKEW_S`` seconds.

    A request accepted at server time ``now`` carries a timestamp within ``now +- skew``, so a
    replay of it passes the timestamp check only until ``now + 2 * skew``: a nonce has to be
    remembered that long and no longer. Nonces are kept in sets per ``BUCKET_S`` seconds of
    arrival, so forgetting old ones drops whole sets. Only authenticated requests get here.
    """

    BUCKET_S = 10.0

    def __init__(self):
        self._lock = threading.Lock()
        self._buckets: Dict[int, Set[str]] = {}

    def add(self, nonce: str, now: float) -> bool:
        """Record ``nonce``; return False if it was already recorded (a replay)."""
        current = int(now // self.BUCKET_S)
        oldest_kept = current - int(2 * MAX_CLOCK_SKEW_S // self.BUCKET_S) - 1
        with self._lock:
            for bucket in [b for b in self._buckets if b < oldest_kept]:
                del self._buckets[bucket]
            if any(nonce in seen for seen in self._buckets.values()):
                return False
            self._buckets.setdefault(current, set()).add(nonce)
            return True


class KVStoreHTTPServer(http.server.ThreadingHTTPServer):
    """Threaded HTTP server holding the store: ``{scope: {key: bytes}}`` guarded by ``lock``."""

    daemon_threads = True

    def __init__(self, address, handler_cls, secret: bytes, verbose: int = 0):
        super().__init__(address, handler_cls)
        self.secret = secret
        self.verbose = verbose
        self.lock = threading.Lock()
        self.store: Dict[str, Dict[str, bytes]] = {}
        self.nonces = _NonceCache()


class RendezvousHTTPServer(KVStoreHTTPServer):
    """KV store server that also knows the size of each launcher-defined scope."""

    def __init__(self, address, handler_cls, secret: bytes, verbose: int = 0):
        super().__init__(address, handler_cls, secret, verbose)
        self.scope_size: Dict[str, int] = {}
        self.finished: Dict[str, Set[str]] = {}

    def reset(self, scope_size: Dict[str, int]):
        with self.lock:
            self.store.clear()
            self.finished.clear()
            self.scope_size = dict(scope_size)


class KVStoreHandler(http.server.BaseHTTPRequestHandler):
    """Authenticated GET/PUT of ``/<scope>/<key>``.

    Subclasses change the meaning of a verb by overriding ``handle_get``/``handle_put``/
    ``handle_delete``, which run only for authenticated requests and return
    ``(status, body)``.
    """

    server: KVStoreHTTPServer
    timeout = REQUEST_READ_TIMEOUT_S

    def handle_get(self, scope: str, key: str) -> Tuple[int, bytes]:
        with self.server.lock:
            value = self.server.store.get(scope, {}).get(key)
        if value is None:
            return 404, b""
        return 200, value

    def handle_put(self, scope: str, key: str, value: bytes) -> Tuple[int, bytes]:
        with self.server.lock:
            self.server.store.setdefault(scope, {})[key] = value
        return 200, b""

    def handle_delete(self, scope: str, key: str) -> Tuple[int, bytes]:
        return 405, b"DELETE is not supported by a plain KV store"

    def do_GET(self):
        self._serve("GET")

    def do_PUT(self):
        self._serve("PUT")

    def do_DELETE(self):
        self._serve("DELETE")

    def _serve(self, method: str):
        body = b""
        if method == "PUT":
            try:
                length = int(self.headers.get("Content-Length", "0"))
                if not 0 <= length <= MAX_BODY_BYTES:
                    self._reply(413, b"body larger than %d bytes" % MAX_BODY_BYTES, None)
                    return
                self.connection.settimeout(PUT_READ_TIMEOUT_S)
                body = self.rfile.read(length)
                if len(body) != length:
                    raise socket.timeout("short body")
            except (socket.timeout, ValueError):
                self._reply(408, b"timed out reading the request body", None)
                return

        refusal = self._authenticate(method, body)
        if refusal is not None:
            status, reason = refusal
            if self.server.verbose:
                self.log_message("refused %s %s: %s", method, self.path, reason)
            self._reply(status, reason.encode(), None)
            return

        nonce = self.headers[HEADER_NONCE]
        parts = self.path.split("/")
        if len(parts) != 3 or parts[0] != "" or not parts[1] or not parts[2]:
            self._reply(400, b"path must be /<scope>/<key>", nonce)
            return
        scope, key = urllib.parse.unquote(parts[1]), urllib.parse.unquote(parts[2])
        if method == "GET":
            status, payload = self.handle_get(scope, key)
        elif method == "PUT":
            status, payload = self.handle_put(scope, key, body)
        else:
            status, payload = self.handle_delete(scope, key)
        self._reply(status, payload, nonce)

    def _authenticate(self, method: str, body: bytes) -> Optional[Tuple[int, str]]:
        """Return None for an authentic request, else ``(status, reason)``."""
        timestamp = self.headers.get(HEADER_TIMESTAMP)
        nonce = self.headers.get(HEADER_NONCE)
        signature = self.headers.get(HEADER_SIGNATURE)
        if not timestamp or not nonce or not signature:
            return 401, "missing authentication headers"
        expected = request_signature(self.server.secret, method, self.path, timestamp, nonce, body)
        if not hmac.compare_digest(expected, signature):
            return 401, "invalid request signature"
        try:
            sent = float(timestamp)
        except ValueError:
            return 401, "invalid timestamp"
        now = time.time()
        if abs(now - sent) > MAX_CLOCK_SKEW_S:
            return 403, "stale request (timestamp outside the allowed clock skew)"
        if not self.server.nonces.add(nonce, now):
            return 403, "replayed request (nonce already used)"
        return None

    def _reply(self, status: int, body: bytes, nonce: Optional[str]):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if nonce is not None:
            self.send_header(HEADER_SIGNATURE,
                             response_signature(self.server.secret, status, nonce, body))
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, format, *args):
        if self.server.verbose:
            super().log_message(format, *args)


class RendezvousHandler(KVStoreHandler):
    """KV store plus DELETE with the scope-completion rule of the rendezvous protocol.

    For a launcher-defined scope (``global``, ``local_<host>``, ``cross_<local_rank>``) a DELETE
    records the key as finished; once every member of the scope has finished, the scope is
    cleared so that the next ``init()`` round can reuse it. In any other scope the key is deleted,
    and the scope with it when it becomes empty.
    """

    server: RendezvousHTTPServer

    def handle_delete(self, scope: str, key: str) -> Tuple[int, bytes]:
        server = self.server
        with server.lock:
            size = server.scope_size.get(scope)
            if size is not None:
                finished = server.finished.setdefault(scope, set())
                finished.add(key)
                if len(finished) >= size:
                    server.store.pop(scope, None)
                    server.finished.pop(scope, None)
            else:
                values = server.store.get(scope)
                if values is not None:
                    values.pop(key, None)
                    if not values:
                        del server.store[scope]
        return 200, b""


def _register(port: int, secret: bytes):
    with _registry_lock:
        _registry[port] = secret


def _unregister(port: int):
    with _registry_lock:
        _registry.pop(port, None)


class _ServerBase:
    _server_cls = KVStoreHTTPServer
    _default_handler = KVStoreHandler

    def __init__(self, verbose: int = 0, secret: Optional[bytes] = None):
        self.verbose = verbose
        self.secret = secret if secret is not None else make_secret_key()
        self.port: Optional[int] = None
        self._httpd = None
        self._thread = None

    def _start(self, handler_cls, port: int = 0, before_serving=None) -> int:
        if self._httpd is not None:
            raise RuntimeError("the server is already running on port %d" % self.port)
        # Port 0: the kernel picks a free ephemeral port; "" binds every interface.
        self._httpd = self._server_cls(("", port), handler_cls or self._default_handler,
                                       self.secret, self.verbose)
        self.port = self._httpd.server_address[1]
        # The socket listens from here on: a client's connection waits in the backlog, and its
        # request is read only once the thread below serves.
        if before_serving is not None:
            before_serving()
        _register(self.port, self.secret)
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.1,),
                                        name="horovod-rendezvous-%d" % self.port, daemon=True)
        self._thread.start()
        if self.verbose:
            print("Rendezvous server listening on port %d" % self.port, flush=True)
        return self.port

    def _stop(self):
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()
        _unregister(self.port)
        self._httpd = None
        self._thread = None


class RendezvousServer(_ServerBase):
    """The launcher's rendezvous store.

    Args:
        verbose: log requests (and refusals) to stderr when non-zero.
        secret: the job secret (bytes); a new one from :func:`make_secret_key` when None.

    Attributes:
        secret: the job secret (bytes). Give it to workers hex-encoded in :data:`SECRET_ENV`.
        port: the TCP port once started, else None.
    """

    _server_cls = RendezvousHTTPServer
    _default_handler = RendezvousHandler

    def start(self, handler_cls=None, port: int = 0, *, host_alloc_plan=None) -> int:
        """Start serving on all interfaces at ``port`` (default 0: a free port the kernel
        picks) and return the port.

        ``handler_cls`` defaults to :class:`RendezvousHandler`; a subclass may override its
        ``handle_*`` methods. With ``host_alloc_plan``, :meth:`init` runs before the first
        request is read, for workers that may reach the port as soon as it listens (a ``PUT``
        between ``start()`` and a later ``init()`` would be cleared by it). Raises
        ``RuntimeError`` if already started, ``OSError`` when ``port`` cannot be bound (e.g.
        in use).
        """
        before = None if host_alloc_plan is None else (lambda: self.init(host_alloc_plan))
        return self._start(handler_cls, port, before)

    def init(self, host_alloc_plan):
        """Clear the store and record the size of every launcher-defined scope.

        ``host_alloc_plan`` is a sequence of slot objects with attributes ``hostname``,
        ``rank``, ``local_rank``, ``cross_rank``, ``size``, ``local_size`` and ``cross_size``.
        Raises ``RuntimeError`` if the server was not started.
        """
        if self._httpd is None:
            raise RuntimeError("RendezvousServer.init() called before start()")
        sizes: Dict[str, int] = {}
        for slot in host_alloc_plan:
            sizes[GLOBAL_SCOPE] = slot.size
            sizes[LOCAL_SCOPE_PREFIX + slot.hostname] = slot.local_size
            sizes[CROSS_SCOPE_PREFIX + str(slot.local_rank)] = slot.cross_size
        self._httpd.reset(sizes)

    def stop(self):
        """Stop serving and release the port. Does nothing if not running."""
        self._stop()


class KVStoreServer(_ServerBase):
    """A plain authenticated KV store (GET and PUT only), e.g. for shipping a function to workers.

    Args:
        verbose: log requests to stderr when non-zero.
        secret: the job secret (bytes); a new one when None.
    """

    def start_server(self) -> int:
        """Start serving on all interfaces at a free port and return the port."""
        return self._start(None)

    def shutdown_server(self):
        """Stop serving and release the port. Does nothing if not running."""
        self._stop()


def _resolve_secret(port: int, secret: Optional[bytes]) -> bytes:
    if secret is not None:
        return secret
    with _registry_lock:
        registered = _registry.get(port)
    if registered is not None:
        return registered
    encoded = os.environ.get(SECRET_ENV)
    if encoded:
        try:
            return bytes.fromhex(encoded)
        except ValueError:
            raise ValueError("environment variable %s must hold the rendezvous secret as hex"
                             % SECRET_ENV) from None
    raise ValueError(
        "no secret for the rendezvous server on port %d: pass secret=..., create the client in "
        "the process that started the server, or set %s to the job secret (hex); horovodrun sets "
        "it for every worker" % (port, SECRET_ENV))


class RendezvousClient:
    """Client of a :class:`RendezvousServer` or :class:`KVStoreServer`.

    Args:
        addr: server host name or IP address.
        port: server TCP port.
        secret: the job secret (bytes). When None it is taken from a server started in this
            process on ``port``, else from the hex value of the environment variable
            :data:`SECRET_ENV`; if neither exists, ``ValueError`` is raised.
        timeout_s: default time limit of :meth:`get` in seconds, and the socket timeout of one
            request.

    Every method raises ``PermissionError`` at once when the server refuses the request's
    authentication or a response fails it, ``ConnectionError`` when the server cannot be reached
    after :data:`CONNECT_ATTEMPTS` attempts :data:`CONNECT_RETRY_DELAY_S` seconds apart, and
    ``RuntimeError`` for any other unexpected HTTP status.
    """

    def __init__(self, addr: str, port: int, secret: Optional[bytes] = None,
                 timeout_s: float = 30.0):
        self.addr = addr
        self.port = int(port)
        self.timeout_s = timeout_s
        self._secret = _resolve_secret(self.port, secret)

    def set(self, scope: str, key: str, value: bytes):
        """Store ``value`` (bytes) under ``scope``/``key``, replacing any previous value."""
        status, _ = self._request("PUT", scope, key, bytes(value))
        self._expect(status, "PUT", scope, key)

    def get(self, scope: str, key: str, timeout_s: Optional[float] = None) -> bytes:
        """Return the value of ``scope``/``key``, polling every 10 ms until it is present.

        ``timeout_s`` (seconds) defaults to the client's ``timeout_s``. Raises ``TimeoutError``
        naming the key, the server and ``HOROVOD_GLOO_TIMEOUT_SECONDS`` when it stays absent.
        """
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while True:
            value = self.try_get(scope, key)
            if value is not None:
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    "timed out after %.1f s waiting for key '%s/%s' on the rendezvous server "
                    "%s:%d; a worker may have failed to start or died. Raise the limit with "
                    "HOROVOD_GLOO_TIMEOUT_SECONDS (or horovodrun --gloo-timeout-seconds)"
                    % (limit, scope, key, self.addr, self.port))
            time.sleep(POLL_INTERVAL_S)

    def try_get(self, scope: str, key: str) -> Optional[bytes]:
        """Return the value of ``scope``/``key``, or None if it is absent."""
        status, body = self._request("GET", scope, key, b"")
        if status == 404:
            return None
        self._expect(status, "GET", scope, key)
        return body

    def delete(self, scope: str, key: str):
        """Delete ``scope``/``key`` (rendezvous semantics: see :class:`RendezvousHandler`)."""
        status, _ = self._request("DELETE", scope, key, b"")
        self._expect(status, "DELETE", scope, key)

    def _expect(self, status: int, method: str, scope: str, key: str):
        if status != 200:
            raise RuntimeError("rendezvous server %s:%d answered %s /%s/%s with HTTP status %d"
                               % (self.addr, self.port, method, scope, key, status))

    def _request(self, method: str, scope: str, key: str, body: bytes) -> Tuple[int, bytes]:
        path = "/%s/%s" % (urllib.parse.quote(scope, safe=""), urllib.parse.quote(key, safe=""))
        last_error = None
        for attempt in range(CONNECT_ATTEMPTS):
            if attempt:
                time.sleep(CONNECT_RETRY_DELAY_S)
            try:
                return self._request_once(method, path, body)
            except PermissionError:
                raise
            except (OSError, http.client.HTTPException) as e:
                last_error = e
        raise ConnectionError("cannot reach the rendezvous server at %s:%d (%s %s) after %d "
                              "attempts: %s" % (self.addr, self.port, method, path,
                                                CONNECT_ATTEMPTS, last_error))

    def _request_once(self, method: str, path: str, body: bytes) -> Tuple[int, bytes]:
        timestamp = repr(time.time())
        nonce = secrets.token_hex(16)
        headers = {
            HEADER_TIMESTAMP: timestamp,
            HEADER_NONCE: nonce,
            HEADER_SIGNATURE: request_signature(self._secret, method, path, timestamp, nonce, body),
            "Content-Length": str(len(body)),
        }
        conn = http.client.HTTPConnection(self.addr, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            payload = response.read()
            status = response.status
            signature = response.getheader(HEADER_SIGNATURE)
        finally:
            conn.close()
        if status == 408:
            raise ConnectionError("the server timed out reading the request body")
        if status in (401, 403):
            raise PermissionError(
                "the rendezvous server %s:%d refused %s %s (HTTP %d: %s); the secret in use does "
                "not match the job's (check %s)" % (self.addr, self.port, method, path, status,
                                                   payload.decode(errors="replace"), SECRET_ENV))
        expected = response_signature(self._secret, status, nonce, payload)
        if signature is None or not hmac.compare_digest(expected, signature):
            raise PermissionError("the response of %s:%d to %s %s failed authentication; it was "
                                  "discarded" % (self.addr, self.port, method, path))
        return status, payload
