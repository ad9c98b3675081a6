"""Tests of the authenticated rendezvous store (horovod.common.rendezvous), over real sockets."""

import http.client
import http.server
import os
import secrets
import subprocess
import sys
import threading
import time
import types

import pytest

from horovod.common import rendezvous as rdv


def _plan(hosts):
    """Slot objects for ``hosts`` = [(hostname, slots), ...], filled host by host."""
    slots = []
    size = sum(n for _, n in hosts)
    rank = 0
    for host, n in hosts:
        for local_rank in range(n):
            cross_members = [h for h, m in hosts if m > local_rank]
            slots.append(types.SimpleNamespace(
                hostname=host, rank=rank, local_rank=local_rank,
                cross_rank=cross_members.index(host), size=size, local_size=n,
                cross_size=len(cross_members)))
            rank += 1
    return slots


@pytest.fixture
def server():
    srv = rdv.RendezvousServer()
    srv.start()
    srv.init(_plan([("hostA", 2)]))
    yield srv
    srv.stop()


def _raw(port, method, path, body=b"", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), response.getheader(rdv.HEADER_SIGNATURE)
    finally:
        conn.close()


def _signed_headers(secret, method, path, body=b"", timestamp=None, nonce=None):
    timestamp = repr(time.time()) if timestamp is None else timestamp
    nonce = secrets.token_hex(16) if nonce is None else nonce
    return {
        rdv.HEADER_TIMESTAMP: timestamp,
        rdv.HEADER_NONCE: nonce,
        rdv.HEADER_SIGNATURE: rdv.request_signature(secret, method, path, timestamp, nonce, body),
    }


def test_secret_is_32_random_bytes():
    a, b = rdv.make_secret_key(), rdv.make_secret_key()
    assert isinstance(a, bytes) and len(a) == 32
    assert a != b


def test_put_get_delete(server):
    client = rdv.RendezvousClient("127.0.0.1", server.port)
    assert client.try_get("myscope", "k") is None
    client.set("myscope", "k", b"\x00value\xff")
    assert client.get("myscope", "k") == b"\x00value\xff"
    client.set("myscope", "k", b"v2")
    assert client.get("myscope", "k") == b"v2"
    client.set("myscope", "other", b"o")
    client.delete("myscope", "k")
    assert client.try_get("myscope", "k") is None
    assert client.try_get("myscope", "other") == b"o"


def test_any_characters_in_scope_and_key(server):
    client = rdv.RendezvousClient("127.0.0.1", server.port)
    client.set("elastic/scope", "host-1:0 ?#%", b"v")
    assert client.get("elastic/scope", "host-1:0 ?#%") == b"v"
    assert client.try_get("elastic", "scope") is None


def test_missing_key_is_404(server):
    path = "/myscope/absent"
    status, body, signature = _raw(server.port, "GET", path,
                                   headers=_signed_headers(server.secret, "GET", path))
    assert status == 404
    assert signature is not None


def test_bad_path_is_400(server):
    path = "/only_one_segment"
    status, _, _ = _raw(server.port, "GET", path,
                        headers=_signed_headers(server.secret, "GET", path))
    assert status == 400


def test_launcher_scope_cleared_once_all_members_deleted(server):
    client = rdv.RendezvousClient("127.0.0.1", server.port)
    client.set("global", "0", b"a")
    client.set("global", "1", b"b")
    client.delete("global", "0")
    # One of two members finished: the scope stays readable for the other.
    assert client.get("global", "0") == b"a"
    assert client.get("global", "1") == b"b"
    client.delete("global", "1")
    assert client.try_get("global", "0") is None
    assert client.try_get("global", "1") is None


def test_init_records_scope_sizes_and_clears_store(server):
    client = rdv.RendezvousClient("127.0.0.1", server.port)
    client.set("custom", "k", b"v")
    server.init(_plan([("hostA", 1), ("hostB", 2)]))
    assert client.try_get("custom", "k") is None
    # local_hostB has two members; cross_0 has two hosts; cross_1 only hostB.
    client.set("local_hostB", "x", b"1")
    client.delete("local_hostB", "0")
    assert client.get("local_hostB", "x") == b"1"
    client.delete("local_hostB", "1")
    assert client.try_get("local_hostB", "x") is None
    client.set("cross_1", "y", b"2")
    client.delete("cross_1", "0")
    assert client.try_get("cross_1", "y") is None


def test_start_with_plan_keeps_a_put_that_arrived_as_the_port_opened():
    """A bare Slurm step's tasks PUT as soon as rank 0's port listens: start(host_alloc_plan=...)
    records the scope sizes before it reads a request, so that PUT is served after the init and
    kept (an init() after start() could clear it). The init here takes 0.3 s, with the PUT
    waiting in the listening socket's backlog: a server that read requests before its init ends
    would serve the PUT without the plan and then clear it."""
    import socket
    seen = []

    class SlowInit(rdv.RendezvousServer):
        def init(self, host_alloc_plan):
            time.sleep(0.3)
            super().init(host_alloc_plan)

    class Recording(rdv.RendezvousHandler):
        def handle_put(self, scope, key, value):
            seen.append(dict(self.server.scope_size))
            return super().handle_put(scope, key, value)

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    secret = rdv.make_secret_key()
    client = rdv.RendezvousClient("127.0.0.1", port, secret=secret)
    done = threading.Event()
    answers = []

    def put_as_soon_as_it_listens():
        # Knocks every millisecond (RendezvousClient retries only every 0.5 s), so that the PUT
        # is sent as the port starts to listen.
        body = b"address of rank 1"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                answers.append(_raw(port, "PUT", "/global/rank_1", body,
                                    _signed_headers(secret, "PUT", "/global/rank_1", body))[0])
                break
            except ConnectionRefusedError:
                time.sleep(0.001)
        done.set()

    thread = threading.Thread(target=put_as_soon_as_it_listens)
    thread.start()
    srv = SlowInit(secret=secret)
    try:
        time.sleep(0.05)  # the client is knocking already
        srv.start(Recording, port=port, host_alloc_plan=_plan([("hostA", 2)]))
        assert done.wait(10)
        assert answers == [200]
        assert seen == [{"global": 2, "local_hostA": 2, "cross_0": 1, "cross_1": 1}]
        assert client.get("global", "rank_1", timeout_s=5) == b"address of rank 1"
    finally:
        thread.join()
        srv.stop()


def _assert_refused(server, status, expected_status):
    assert status == expected_status
    assert server._httpd.store.get("myscope", {}).get("k") == b"original"


@pytest.fixture
def stored(server):
    rdv.RendezvousClient("127.0.0.1", server.port).set("myscope", "k", b"original")
    return server


def test_missing_hmac_refused(stored):
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"evil")
    _assert_refused(stored, status, 401)
    headers = _signed_headers(stored.secret, "PUT", "/myscope/k", b"evil")
    del headers[rdv.HEADER_SIGNATURE]
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"evil", headers)
    _assert_refused(stored, status, 401)


def test_wrong_hmac_refused(stored):
    # Signed for a different body than the one sent.
    headers = _signed_headers(stored.secret, "PUT", "/myscope/k", b"innocent")
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"evil", headers)
    _assert_refused(stored, status, 401)
    # Signed for a different path.
    headers = _signed_headers(stored.secret, "DELETE", "/myscope/other")
    status, _, _ = _raw(stored.port, "DELETE", "/myscope/k", b"", headers)
    _assert_refused(stored, status, 401)


def test_wrong_secret_refused(stored):
    headers = _signed_headers(rdv.make_secret_key(), "PUT", "/myscope/k", b"evil")
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"evil", headers)
    _assert_refused(stored, status, 401)

    intruder = rdv.RendezvousClient("127.0.0.1", stored.port, secret=rdv.make_secret_key())
    with pytest.raises(PermissionError, match="refused"):
        intruder.set("myscope", "k", b"evil")
    with pytest.raises(PermissionError, match="refused"):
        intruder.get("myscope", "k")
    assert stored._httpd.store["myscope"]["k"] == b"original"


def test_stale_timestamp_refused(stored):
    old = repr(time.time() - 2 * rdv.MAX_CLOCK_SKEW_S)
    headers = _signed_headers(stored.secret, "PUT", "/myscope/k", b"evil", timestamp=old)
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"evil", headers)
    _assert_refused(stored, status, 403)
    future = repr(time.time() + 2 * rdv.MAX_CLOCK_SKEW_S)
    headers = _signed_headers(stored.secret, "PUT", "/myscope/k", b"evil", timestamp=future)
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"evil", headers)
    _assert_refused(stored, status, 403)


def test_replayed_nonce_refused(stored):
    headers = _signed_headers(stored.secret, "PUT", "/myscope/k", b"first")
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"first", headers)
    assert status == 200
    stored._httpd.store["myscope"]["k"] = b"original"
    status, _, _ = _raw(stored.port, "PUT", "/myscope/k", b"first", headers)
    _assert_refused(stored, status, 403)


def test_nonces_are_forgotten_only_after_the_replay_window():
    cache = rdv._NonceCache()
    now = 1000.0
    assert cache.add("n1", now)
    assert not cache.add("n1", now + 2 * rdv.MAX_CLOCK_SKEW_S)
    assert cache.add("n2", now + 2 * rdv.MAX_CLOCK_SKEW_S + 2 * cache.BUCKET_S)
    # n1 arrived more than 2 * skew + one bucket ago: forgotten (its replay is stale anyway).
    assert cache.add("n1", now + 2 * rdv.MAX_CLOCK_SKEW_S + 2 * cache.BUCKET_S)


def test_oversized_body_refused(stored):
    headers = _signed_headers(stored.secret, "PUT", "/myscope/k", b"")
    headers["Content-Length"] = str(rdv.MAX_BODY_BYTES + 1)
    conn = http.client.HTTPConnection("127.0.0.1", stored.port, timeout=5)
    try:
        conn.putrequest("PUT", "/myscope/k")
        for name, value in headers.items():
            conn.putheader(name, value)
        conn.endheaders()
        assert conn.getresponse().status == 413
    finally:
        conn.close()
    assert stored._httpd.store["myscope"]["k"] == b"original"


def test_response_is_authenticated(stored):
    path = "/myscope/k"
    headers = _signed_headers(stored.secret, "GET", path)
    status, body, signature = _raw(stored.port, "GET", path, headers=headers)
    assert status == 200 and body == b"original"
    nonce = headers[rdv.HEADER_NONCE]
    assert signature == rdv.response_signature(stored.secret, 200, nonce, body)
    assert signature != rdv.response_signature(stored.secret, 200, nonce, b"tampered")


class _ImpostorHandler(http.server.BaseHTTPRequestHandler):
    """Answers every request with 200 and a pickle, signed with a key it does not have."""

    def do_GET(self):
        body = b"\x80\x04evil pickle"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header(rdv.HEADER_SIGNATURE, "00" * 32)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        pass


def test_client_rejects_unauthenticated_response():
    impostor = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ImpostorHandler)
    thread = threading.Thread(target=impostor.serve_forever, daemon=True)
    thread.start()
    try:
        client = rdv.RendezvousClient("127.0.0.1", impostor.server_address[1],
                                      secret=rdv.make_secret_key())
        with pytest.raises(PermissionError, match="failed authentication"):
            client.try_get("s", "k")
    finally:
        impostor.shutdown()
        impostor.server_close()


def test_get_timeout_message(server):
    client = rdv.RendezvousClient("127.0.0.1", server.port)
    start = time.monotonic()
    with pytest.raises(TimeoutError) as excinfo:
        client.get("myscope", "never", timeout_s=0.3)
    assert 0.3 <= time.monotonic() - start < 5
    message = str(excinfo.value)
    assert "myscope/never" in message
    assert "127.0.0.1:%d" % server.port in message
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" in message


def test_get_waits_for_late_value(server):
    client = rdv.RendezvousClient("127.0.0.1", server.port)
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import time, sys\n"
         "from horovod.common.rendezvous import RendezvousClient\n"
         "time.sleep(0.3)\n"
         "RendezvousClient('127.0.0.1', int(sys.argv[1])).set('late', 'k', b'here')\n",
         str(server.port)],
        env={**os.environ, rdv.SECRET_ENV: server.secret.hex()})
    try:
        assert client.get("late", "k", timeout_s=20) == b"here"
    finally:
        assert writer.wait(timeout=20) == 0


def test_secret_resolution(server, monkeypatch):
    monkeypatch.delenv(rdv.SECRET_ENV, raising=False)
    # Same process: found in the registry by port.
    assert rdv.RendezvousClient("localhost", server.port)._secret == server.secret
    server_port = server.port
    server.stop()
    with pytest.raises(ValueError, match=rdv.SECRET_ENV):
        rdv.RendezvousClient("localhost", server_port)
    monkeypatch.setenv(rdv.SECRET_ENV, "ab" * 32)
    assert rdv.RendezvousClient("localhost", server_port)._secret == bytes.fromhex("ab" * 32)
    monkeypatch.setenv(rdv.SECRET_ENV, "not hex")
    with pytest.raises(ValueError, match="hex"):
        rdv.RendezvousClient("localhost", server_port)


def test_unreachable_server_raises_connection_error():
    srv = rdv.KVStoreServer()
    port = srv.start_server()
    srv.shutdown_server()
    client = rdv.RendezvousClient("127.0.0.1", port, secret=b"s" * 32)
    start = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot reach"):
        client.try_get("s", "k")
    assert time.monotonic() - start >= 2 * rdv.CONNECT_RETRY_DELAY_S


def test_kvstore_has_no_delete():
    srv = rdv.KVStoreServer()
    port = srv.start_server()
    try:
        client = rdv.RendezvousClient("127.0.0.1", port)
        client.set("runfunc", "func", b"payload")
        with pytest.raises(RuntimeError, match="405"):
            client.delete("runfunc", "func")
        assert client.get("runfunc", "func") == b"payload"
    finally:
        srv.shutdown_server()


def test_server_listens_on_all_interfaces(server):
    assert server._httpd.server_address[0] == "0.0.0.0"
    assert 1024 <= server.port < 65536
