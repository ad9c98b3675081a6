"""Authenticated request/response services over TCP, used by the launcher's driver and tasks.

A service (:class:`BasicService`) listens on every IPv4 interface at a free port and answers
pickled request objects with pickled response objects. Every frame is authenticated with the
job secret (see :class:`Wire`), so nothing is unpickled that the secret did not sign. A client
(:class:`BasicClient`) first probes all the addresses a service published and keeps those that
answer with the service's name: that is how the launcher learns which interfaces connect two
hosts.
"""

import queue
import socket
import socketserver
import struct
import threading
import time

import cloudpickle
import psutil

from horovod.runner.common.util import secret

_LENGTH = struct.Struct("!I")
# A frame larger than this is refused before it is read (a request or response is small).
MAX_FRAME_BYTES = 64 * 1024 * 1024
# Requests older than this (sender's clock) are refused as replays.
MAX_REQUEST_AGE_S = 300.0


class NoValidAddressesFound(Exception):
    """No published address of a service answered, or no interface matched the allowed ones."""


class SecurityError(Exception):
    """A frame's digest did not match: the peer does not hold the job secret."""


class PingRequest:
    pass


class PingResponse:
    """Answer to :class:`PingRequest`: the service's name and the caller's address as seen."""

    def __init__(self, service_name, source_address):
        self.service_name = service_name
        self.source_address = source_address


class AckResponse:
    """A request was carried out."""


class AckStreamResponse:
    """A request was accepted and the rest of the connection carries a stream."""


class _ErrorResponse:
    def __init__(self, message):
        self.message = message


class Wire:
    """Frames of ``HMAC-SHA256(key, body) | length (4 bytes, big endian) | body``.

    ``body`` is the cloudpickle of ``(sent_at, obj)`` (``sent_at``: the sender's clock, seconds
    since the epoch); :meth:`read` checks the digest in constant time before unpickling and raises
    :class:`SecurityError` on a mismatch or on a frame older than ``MAX_REQUEST_AGE_S``.
    """

    def __init__(self, key: bytes):
        if not key:
            raise ValueError("the wire needs the job secret (bytes), got %r" % (key,))
        self._key = key

    def write(self, obj, wfile):
        body = cloudpickle.dumps((time.time(), obj))
        wfile.write(secret.compute_digest(self._key, body) + _LENGTH.pack(len(body)) + body)
        wfile.flush()

    def read(self, rfile):
        digest = _read_exactly(rfile, secret.DIGEST_LENGTH)
        (length,) = _LENGTH.unpack(_read_exactly(rfile, _LENGTH.size))
        if length > MAX_FRAME_BYTES:
            raise SecurityError("security error: frame of %d bytes refused" % length)
        body = _read_exactly(rfile, length)
        if not secret.check_digest(self._key, body, digest):
            raise SecurityError("security error: digest did not match the message; the peer "
                                "does not hold this job's secret")
        sent_at, obj = cloudpickle.loads(body)
        if abs(time.time() - sent_at) > MAX_REQUEST_AGE_S:
            raise SecurityError("security error: a message %.0f s old was refused"
                                % (time.time() - sent_at))
        return obj


def _read_exactly(rfile, size):
    data = rfile.read(size)
    if data is None or len(data) != size:
        raise EOFError("connection closed after %d of %d bytes" % (len(data or b""), size))
    return data


def local_ipv4_addresses(nics=None):
    """``{interface: [ipv4, ...]}`` of this host, restricted to ``nics`` (a set) unless it is None
    or empty."""
    found = {}
    for name, addrs in psutil.net_if_addrs().items():
        if nics and name not in nics:
            continue
        ips = [a.address for a in addrs if a.family == socket.AF_INET]
        if ips:
            found[name] = ips
    return found


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class BasicService:
    """A TCP service answering authenticated requests; subclasses override :meth:`_handle`.

    Args:
        service_name: the name :class:`PingResponse` carries (clients check it).
        key: the job secret (bytes).
        nics: interface names (a set) to publish addresses of, or None for all.

    Raises:
        NoValidAddressesFound: none of ``nics`` has an IPv4 address on this host.
    """

    def __init__(self, service_name, key, nics=None):
        self._service_name = service_name
        self._wire = Wire(key)
        self._nics = set(nics) if nics else None
        self._addresses = {
            intf: ips for intf, ips in local_ipv4_addresses(self._nics).items()}
        if not self._addresses:
            raise NoValidAddressesFound(
                "%s: no IPv4 address on the network interface(s) %s of host %s (this host has: "
                "%s)" % (service_name, ", ".join(sorted(self._nics or [])), socket.gethostname(),
                         ", ".join(sorted(local_ipv4_addresses()))))
        service = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                service._serve_connection(self)

        self._server = _Server(("0.0.0.0", 0), Handler)
        self._port = self._server.server_address[1]
        self._inflight = 0
        self._inflight_cond = threading.Condition()
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,),
                                        name=service_name, daemon=True)
        self._thread.start()

    def _serve_connection(self, handler):
        try:
            request = self._wire.read(handler.rfile)
        except (EOFError, OSError, SecurityError, struct.error):
            return
        with self._inflight_cond:
            self._inflight += 1
        try:
            try:
                response = self._handle(request, handler.client_address)
            except Exception as e:  # reported to the caller rather than lost in this thread
                response = _ErrorResponse("%s: %s" % (type(e).__name__, e))
            try:
                self._wire.write(response, handler.wfile)
            except OSError:
                return
            if isinstance(response, AckStreamResponse):
                self._stream(request, handler.wfile)
        finally:
            with self._inflight_cond:
                self._inflight -= 1
                self._inflight_cond.notify_all()

    def _handle(self, req, client_address):
        if isinstance(req, PingRequest):
            return PingResponse(self._service_name, client_address[0])
        raise NotImplementedError("%s does not handle %s" % (self._service_name,
                                                             type(req).__name__))

    def _stream(self, req, wfile):
        raise NotImplementedError

    def addresses(self):
        """``{interface: [(ip, port), ...]}`` at which this service can be reached."""
        return {intf: [(ip, self._port) for ip in ips] for intf, ips in self._addresses.items()}

    def get_port(self):
        return self._port

    def shutdown(self):
        """Stop accepting requests and wait for the ones being answered."""
        self._server.shutdown()
        self._server.server_close()
        with self._inflight_cond:
            self._inflight_cond.wait_for(lambda: self._inflight == 0, timeout=10)


class BasicClient:
    """Client of a :class:`BasicService` at the addresses it published.

    Args:
        service_name: the name the service must answer with.
        addresses: ``{interface: [(ip, port), ...]}`` as returned by
            :meth:`BasicService.addresses`.
        key: the job secret (bytes).
        verbose: print probe results when >= 2.
        match_intf: keep only addresses reached through a local interface of the same name as
            the service's (this drops paths through NAT and differently named networks).
        probe_timeout: seconds allowed per probe connection.
        attempts: how often a request is retried on a connection error.

    Raises:
        NoValidAddressesFound: no address answered as ``service_name``.
    """

    def __init__(self, service_name, addresses, key, verbose=0, match_intf=False,
                 probe_timeout=20, attempts=3):
        self._service_name = service_name
        self._wire = Wire(key)
        self._verbose = verbose
        self._match_intf = match_intf
        self._probe_timeout = probe_timeout
        self._attempts = attempts
        self._addresses = self._probe_all(addresses)
        if not self._addresses:
            raise NoValidAddressesFound(
                "Horovod was unable to connect to the %s on any of the following addresses: %s. "
                "One possible cause of this problem is that horovod currently requires every host "
                "to have at least one routable network interface with the same name across all "
                "of the hosts. You can run \"ifconfig -a\" on every host and check for the common "
                "routable interface. To fix the problem, you can rename interfaces on Linux."
                % (service_name, addresses))

    def _probe_all(self, addresses):
        results = queue.Queue()
        threads = []
        for intf, intf_addresses in addresses.items():
            for address in intf_addresses:
                thread = threading.Thread(target=lambda i=intf, a=address: results.put(
                    (i, a, self._probe(i, a))), daemon=True)
                thread.start()
                threads.append(thread)
        for thread in threads:
            thread.join(self._probe_timeout + 1)
        reached = {}
        while not results.empty():
            intf, address, ok = results.get()
            if ok:
                reached.setdefault(intf, []).append(tuple(address))
        if self._verbose >= 2:
            print("%s reachable at %s" % (self._service_name, reached), flush=True)
        return reached

    def _probe(self, intf, address):
        try:
            response = self._call(tuple(address), PingRequest(), timeout=self._probe_timeout)
        except (OSError, EOFError, SecurityError, struct.error):
            return False
        if not isinstance(response, PingResponse) or response.service_name != self._service_name:
            return False
        if self._match_intf:
            # The address this host connected from must belong to a local interface named like
            # the service's interface.
            return response.source_address in local_ipv4_addresses().get(intf, [])
        return True

    def _call(self, address, req, timeout=None, stream=None):
        with socket.create_connection(address, timeout=timeout) as sock:
            sock.settimeout(timeout)
            rfile = sock.makefile("rb")
            wfile = sock.makefile("wb")
            try:
                self._wire.write(req, wfile)
                response = self._wire.read(rfile)
                if isinstance(response, AckStreamResponse) and stream is not None:
                    stream(rfile)
                return response
            finally:
                rfile.close()
                wfile.close()

    def _send(self, req, stream=None):
        """Send ``req`` and return the response; retried on connection errors.

        Raises the service's exception as ``RuntimeError``, and ``ConnectionError`` when no
        address could be reached within ``attempts`` tries.
        """
        last = None
        for attempt in range(self._attempts):
            for addresses in self._addresses.values():
                for address in addresses:
                    try:
                        response = self._call(address, req, stream=stream)
                    except (OSError, EOFError, struct.error) as e:
                        last = e
                        continue
                    if isinstance(response, _ErrorResponse):
                        raise RuntimeError("%s failed: %s" % (self._service_name,
                                                              response.message))
                    return response
            time.sleep(min(0.2 * (attempt + 1), 1.0))
        raise ConnectionError("cannot reach the %s at %s: %s"
                              % (self._service_name, self._addresses, last))

    def addresses(self):
        """The addresses that answered the probe (``{interface: [(ip, port)]}``)."""
        return dict(self._addresses)
