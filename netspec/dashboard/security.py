"""The checks every request to the dashboard passes, as ASGI middleware in front of the app.

- The token: reads need it when the dashboard listens beyond this machine,
  state-changing requests (anything but GET and HEAD) always.  It comes as
  ``?token=`` (the URL the command prints) or in the cookie the first such
  request sets (HttpOnly, SameSite=Strict), compared in constant time.
  Browsers send a host's cookies to all its ports, and count its other ports
  as the same site: the cookie's path is the dashboard's secret prefix
  (:func:`new_prefix`, every page lies under it), so a server on another port
  of this machine never receives it, and its name holds the dashboard's port
  (:func:`cookie_name`), so two dashboards never take each other's.
- Same origin: a state-changing request's Origin (else Referer) must name the
  Host it was sent to, so another site's page cannot post to the dashboard.
- Host: listening on loopback only, the Host header must be a loopback name,
  so a page whose name is re-pointed at 127.0.0.1 (DNS rebinding) is refused.
- Request bodies beyond ``max_body`` bytes (``uploads[path]`` for the paths taking files) are refused
  (413) before the app reads them.
- Every response says: no sniffing of types, scripts and styles from the
  dashboard itself only, no framing, no Referer sent to other sites.
"""

from __future__ import annotations

import ipaddress
import secrets
import urllib.parse

from starlette.requests import Request
from starlette.responses import PlainTextResponse

COOKIE = "netspec_dashboard_token"  # the cookie's name, before the port (cookie_name)
MAX_BODY = 1024 * 1024
MAX_UPLOAD = 16 * 1024 * 1024  # an uploaded image file
SAFE_METHODS = ("GET", "HEAD")
LOOPBACK_NAMES = ("localhost",)
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; "
                                 b"frame-ancestors 'none'; form-action 'self'; base-uri 'none'"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 perhaps in brackets) is this machine's loopback."""
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cookie_name(request: Request) -> str:
    """The name of the token's cookie for the port ``request`` was sent to (80 or 443 when its Host names none)."""
    return f"{COOKIE}_{request.url.port or (443 if request.url.scheme == 'https' else 80)}"


def new_token() -> str:
    """A fresh random token (32 bytes, URL-safe)."""
    return secrets.token_urlsafe(32)


def new_prefix() -> str:
    """A fresh random path prefix for one launch of the dashboard (12 bytes, URL-safe)."""
    return secrets.token_urlsafe(12)


class Guard:
    """ASGI middleware enforcing the module's rules; ``token_required`` guards reads as well as changes; ``base``
    is the path every page lies under (``/PREFIX``, or empty), where the cookie is sent."""

    def __init__(self, app, token: str, token_required: bool, base: str = "", max_body: int = MAX_BODY,
                 uploads: dict[str, int] | None = None):
        self.app, self.token, self.token_required, self.max_body = app, token, token_required, max_body
        self.base, self.uploads = base, uploads or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        refusal = self.refusal(request)
        send = self._with_headers(send, cookie_name(request) if refusal is None and self._token_in_query(request)
                                  else None)
        if refusal is not None:
            await PlainTextResponse(refusal[1], status_code=refusal[0])(scope, receive, send)
            return
        if request.method not in SAFE_METHODS:
            limit = self.uploads.get(request.url.path, self.max_body)
            body = await self._body(request, receive, limit)
            if body is None:
                await PlainTextResponse(f"request body over {limit} bytes", status_code=413)(scope, receive, send)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send)

    def refusal(self, request: Request) -> tuple[int, str] | None:
        """``(status, message)`` when the request breaks a rule, else None."""
        host = request.headers.get("host", "")
        if not self.token_required and not is_loopback(urllib.parse.urlsplit(f"//{host}").hostname or ""):
            return 403, f"Host {host!r} refused: this dashboard answers to localhost / 127.0.0.1 only"
        safe = request.method in SAFE_METHODS
        if (self.token_required or not safe) and not self._token_given(request):
            return 403, ("this request needs the dashboard's token: open the URL `netspec dashboard` printed "
                         "(it ends in ?token=...)")
        if not safe and not same_origin(request):
            return 403, "cross-origin request refused: its Origin (or Referer) must be this dashboard"
        return None

    def _token_given(self, request: Request) -> bool:
        given = request.query_params.get("token") or request.cookies.get(cookie_name(request)) or ""
        return secrets.compare_digest(given.encode(), self.token.encode())

    def _token_in_query(self, request: Request) -> bool:
        return "token" in request.query_params

    def _with_headers(self, send, cookie: str | None):
        """``send`` adding the security headers (and the token's cookie of the name ``cookie``) to the response's
        start."""
        extra = list(HEADERS)
        if cookie:
            extra.append((b"set-cookie",
                          f"{cookie}={self.token}; Path={self.base}/; HttpOnly; SameSite=Strict".encode()))

        async def sending(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        return sending

    async def _body(self, request: Request, receive, limit: int) -> bytes | None:
        """The whole request body, or None when it is (or says it will be) longer than ``limit``."""
        declared = request.headers.get("content-length", "0")
        if not declared.isdigit() or int(declared) > limit:
            return None
        body = b""
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return body
            body += message.get("body", b"")
            if len(body) > limit:
                return None
            if not message.get("more_body", False):
                return body


def same_origin(request: Request) -> bool:
    """Whether the request's Origin header (else its Referer) names the host and port it was sent to."""
    source = request.headers.get("origin") or request.headers.get("referer") or ""
    host = request.headers.get("host", "")
    return bool(host) and source != "null" and urllib.parse.urlsplit(source).netloc.lower() == host.lower()


def _replay(body: bytes, receive):
    """A ``receive`` that gives the app the body already read, then what the client sends next (a disconnect)."""
    given = False

    async def replaying():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replaying
