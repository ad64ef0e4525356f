"""The server's edge, before a request reaches the app: its limits, connection deadlines, body size and read
time, requests at once, a log that a flood cannot fill (README: Failure behaviour)."""

from __future__ import annotations

import asyncio
import collections
import hmac
import logging
import re
import time
from dataclasses import dataclass

from fastapi.responses import JSONResponse

log = logging.getLogger("aiayn")
connections_log = logging.getLogger("aiayn.connections")  # refused connections, rate-limited by the server


@dataclass
class Limits:
    """What one request may ask and what the server holds at once (README: Failure behaviour)."""

    max_sentences: int = 64  # per request (413 above)
    max_chars: int = 1000  # per sentence (413 above)
    max_subwords: int = 0  # per sentence (413 above); 0: the model's training length, data.max_len - 1
    max_beam: int = 16
    max_queue: int = 1024  # sentences waiting or being translated (503 above)
    max_work: int = 1 << 20  # rows x positions (Batcher.price) summed over waiting sentences (503 above)
    client_share: float = 0.25  # of max_work, what one client's requests may hold (429 above; 413 for one request)
    chunk_s: float = 1.0  # about how long the worker works in one go before it looks at other requests
    chunk_work: int = 1 << 14  # and at most this much work
    chunk_bytes: int = 1 << 30  # and the key/value memory that work may take (a smaller chunk for a large model)
    max_attention_subwords: int = 100  # /attention: its maps grow as the square of the length (413 above)
    timeout_s: float = 60.0  # per request, queueing included (504 past it)
    read_timeout_s: float = 10.0  # to receive a request's body (408 past it)
    header_timeout_s: float = 10.0  # from accept, or the last response, to a request's complete headers
    limit_concurrency: int = 256  # connections and requests at once; uvicorn answers 503 above it
    allowed_hosts: tuple[str, ...] = ("*",)  # Host headers answered (400 otherwise); `serve` narrows it
    token: str | None = None  # with it, /translate and /attention need "Authorization: Bearer TOKEN" (401)
    keep_alive_s: float = 5.0  # an idle keep-alive connection is closed after this

    @property
    def max_body_bytes(self) -> int:
        """Room for max_sentences sentences of max_chars characters, each escaped as \\uXXXX."""
        return self.max_sentences * (6 * self.max_chars + 8) + 4096


LOCAL = ("127.0.0.1", "::1", "::ffff:127.0.0.1")  # this machine's own clients (a proxy in front of it): no share


class ConnectionCount:
    """The connections open now and the table's size (reported by /health: "degraded" when full);
    with `per_address`, what one client address may hold of it (LOCAL addresses aside): a connection
    past its address's share is closed as it is accepted, so one address cannot fill the table."""

    def __init__(self, limit: int | None = None, per_address: int | None = None) -> None:
        self.open, self.limit, self.per_address = 0, limit, per_address
        self.by_address: collections.Counter[str] = collections.Counter()
        self.refused = 0

    def full(self) -> bool:
        """Whether uvicorn refuses new requests now (it answers 503 at `limit` connections)."""
        return self.limit is not None and self.open >= self.limit

    def admit(self, address: str | None) -> bool:
        """Count a new connection from `address`, unless that address holds its share already."""
        if self.per_address is not None and address is not None and address not in LOCAL:
            if self.by_address[address] >= self.per_address:
                self.refused += 1
                return False
            self.by_address[address] += 1
        self.open += 1
        return True

    def release(self, address: str | None) -> None:
        self.open -= 1
        if address in self.by_address:
            self.by_address[address] -= 1
            if self.by_address[address] <= 0:
                del self.by_address[address]


def _admitted(proto, count: ConnectionCount, transport) -> bool:
    """Count a new connection by its address; one whose address holds its share of the table is
    closed at once (logged, rate-limited by the server)."""
    peer = transport.get_extra_info("peername")
    proto._address = peer[0] if isinstance(peer, tuple) and peer else None
    proto._counted = count.admit(proto._address)
    if not proto._counted:
        connections_log.warning("closed a connection from %s: it holds %d connections, an address's share",
                                proto._address, count.per_address)
        transport.close()
    return proto._counted


def edge_protocol(count: ConnectionCount, header_timeout_s: float) -> type:
    """uvicorn's HTTP/1.1 protocol (h11) with a deadline and /health's exemption.

    Deadline: uvicorn starts no timer when a connection opens, and any byte cancels its keep-alive
    timer (uvicorn issues #160, #1192), so silent connections and ones that send half a request
    line stayed open for ever and held its connection table full. Here a connection must complete
    its request's headers within `header_timeout_s` of being accepted or of its last response, or
    it is closed (the body then has BodyLimit's read timeout, the request the server's time limit).
    Exemption: above the connection limit uvicorn answers 503 before the app sees the path, so a
    health check arriving during a flood would be refused too; /health is let through."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class EdgeProtocol(H11Protocol):
        @property  # read by uvicorn after it has set the request's scope, before it applies the limit
        def limit_concurrency(self) -> int | None:
            scope = getattr(self, "scope", None)
            return None if scope is not None and scope.get("path") == "/health" else self._limit

        @limit_concurrency.setter
        def limit_concurrency(self, value: int | None) -> None:
            self._limit = value

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if _admitted(self, count, transport):
                self._arm()

        def connection_lost(self, exc) -> None:
            if getattr(self, "_counted", False):
                count.release(self._address)
                self._counted = False
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()  # the headers are in: the request's own limits take over

        def on_response_complete(self) -> None:
            super().on_response_complete()  # may start a pipelined request, which keeps the deadline off
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout_s, self._expire)

        def _disarm(self) -> None:
            handle = getattr(self, "_deadline", None)
            if handle is not None:
                handle.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

    return EdgeProtocol


class BodyLimit:
    """ASGI middleware: the request body is read here, in full, before the app sees it: 413 past
    `limit` bytes (before reading when Content-Length says so), 408 when it has not arrived within
    `timeout_s` (a client that sends half a body frees its connection)."""

    def __init__(self, app, limit: int, timeout_s: float = 10.0):
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            detail = f"request body of {length.decode(errors='replace')[:30]} bytes; the limit is {self.limit}"
            return await _reply(scope, receive, send, 413, detail, close=True)  # its body is never read
        try:
            messages = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except asyncio.TimeoutError:
            return await _reply(scope, receive, send, 408, f"request body not received within {self.timeout_s:g} s",
                                close=True)
        if messages is None:
            return await _reply(scope, receive, send, 413, f"request body over {self.limit} bytes", close=True)
        queued = collections.deque(messages)

        async def replay():
            return queued.popleft() if queued else await receive()

        return await self.app(scope, replay, send)

    async def _read(self, receive) -> list[dict] | None:
        messages, received = [], 0
        while True:
            message = await receive()
            messages.append(message)
            received += len(message.get("body", b""))
            if received > self.limit:
                return None
            if message["type"] != "http.request" or not message.get("more_body", False):
                return messages


class BearerToken:
    """ASGI middleware: /translate and /attention answer only requests that carry
    "Authorization: Bearer TOKEN" (401 otherwise); the page and /health stay open."""

    OPEN = ("/", "/health")

    def __init__(self, app, token: str):
        self.app, self.token = app, token.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") in self.OPEN:
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if not hmac.compare_digest(given, b"Bearer " + self.token):  # closed at once: its body is never read
            return await JSONResponse({"detail": "a valid 'Authorization: Bearer TOKEN' header is needed"},
                                      status_code=401, headers={"WWW-Authenticate": "Bearer", "Connection": "close"}
                                      )(scope, receive, send)
        return await self.app(scope, receive, send)


class TrustedHosts:
    """ASGI middleware: requests whose Host header names none of `allowed` ("*", a name, an address,
    "*.example.com") get 400 and the connection is closed at once, its body never read (a page on
    another site that points a name at 127.0.0.1, DNS rebinding, sends its own Host)."""

    def __init__(self, app, allowed: list[str]):
        self.app, self.allowed = app, [a.lower() for a in allowed]

    def ok(self, host: str) -> bool:
        host = host.lower()
        if host.startswith("[") and "]" in host:  # [::1]:8000: IPv6's brackets and the port are not the name
            host = host[1:host.index("]")]
        elif host.count(":") == 1:  # name:port
            host = host.rsplit(":", 1)[0]
        return any(a == "*" or a == host or (a.startswith("*.") and host.endswith(a[1:])) for a in self.allowed)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if not self.ok(host):
            return await _reply(scope, receive, send, 400, "Invalid host header", close=True)
        return await self.app(scope, receive, send)


class Concurrency:
    """ASGI middleware: at most `limit` requests in progress (503 with Retry-After above it), not
    counting /health, so a health check answers while the server is full."""

    def __init__(self, app, limit: int):
        self.app, self.limit, self.active = app, limit, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("path") == "/health":
            return await self.app(scope, receive, send)
        if self.active >= self.limit:
            return await JSONResponse({"detail": f"the server is busy: {self.active} requests in progress (limit "
                                                 f"{self.limit})"}, status_code=503,
                                      headers={"Retry-After": "1", "Connection": "close"})(scope, receive, send)
        self.active += 1
        try:
            return await self.app(scope, receive, send)
        finally:
            self.active -= 1


async def _reply(scope, receive, send, status: int, detail: str, close: bool = False) -> None:
    headers = {"Connection": "close"} if close else None
    await JSONResponse({"detail": detail}, status_code=status, headers=headers)(scope, receive, send)


class RateLimited(logging.Filter):
    """At most one record a second of each kind of message (its text with the numbers in it, such as
    ports and counts, made alike), and `most_per_s` records a second in all: a flood of "Too many open
    files" or of access lines must not fill the disk. What was held back is counted, and the count
    is logged on a line of its own when that kind of message next passes (uvicorn's access lines
    are formatted from their arguments, so a count appended to the message would be lost)."""

    def __init__(self, per_s: float = 1.0, most_per_s: int = 20):
        super().__init__()
        self.per_s, self.most_per_s = per_s, most_per_s
        self.last: dict[tuple[str, str], float] = {}
        self.held: collections.Counter[tuple[str, str]] = collections.Counter()
        self.second, self.passed = 0, 0

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: key on the format
            text = str(record.msg)
        key = (record.name, re.sub(r"\d+", "#", text)[:200])
        now = time.monotonic()
        if int(now) != self.second:
            self.second, self.passed = int(now), 0
        if now - self.last.get(key, -1e9) < 1.0 / self.per_s or self.passed >= self.most_per_s:
            self.held[key] += 1
            return False
        if len(self.last) > 10_000:  # many kinds of message (hostile paths): forget the old ones
            self.last.clear()
        self.last[key], self.passed = now, self.passed + 1
        if self.held[key]:
            log.warning("%d more log lines like this one were held back: %s", self.held.pop(key), key[1][:120])
        return True


