"""Credentials (docs/api.md section 2): server keys, admin keys and player JWTs."""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from typing import Literal

import jwt
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.errors import Forbidden, Unauthorized, problem_response
from shared.events import USER_ID_PATTERN
from shared.settings import LadderSettings

Kind = Literal["admin", "server", "player", "anonymous"]

_USER_ID = re.compile(USER_ID_PATTERN)
# An ``exp`` later than this is taken as this: it is as good as never, and fits in a float.
_LAST_EXP = 2**53


def key_id(key: str) -> str:
    """A key as logs and rate buckets name it: ``key:`` and 16 hex digits of its SHA-256, which
    tell keys apart without giving one away."""
    return "key:" + hashlib.sha256(key.encode()).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Principal:
    kind: Kind
    user_id: str | None = None
    # A player token's ``exp`` (seconds since the epoch); None for keys and anonymous. A socket
    # opened with the token is closed once it is past it (push/ws.py).
    expires_at: float | None = None
    # A server or admin key's own text, for :attr:`who` alone: never shown, never compared.
    key: str | None = field(default=None, repr=False, compare=False)

    @property
    def who(self) -> str:
        """Who acts, as an admin action's log line names it: the key's :func:`key_id`, the
        player's ``player:<user id>``, or ``anonymous``."""
        if self.key is not None:
            return key_id(self.key)
        return f"player:{self.user_id}" if self.kind == "player" else self.kind

    @property
    def is_server(self) -> bool:
        """Server and admin keys may act for any user."""
        return self.kind in ("server", "admin")

    def may_act_for(self, user_id: str) -> bool:
        return self.is_server or (self.kind == "player" and self.user_id == user_id)

    def require_user(self, user_id: str) -> None:
        if self.kind == "anonymous":
            raise Unauthorized("A credential is required.")
        if not self.may_act_for(user_id):
            raise Forbidden("A player token may act only for its own user.")

    def require_server(self) -> None:
        if self.kind == "anonymous":
            raise Unauthorized("A server key is required.")
        if not self.is_server:
            raise Forbidden("This needs a server or admin key.")

    def require_admin(self) -> None:
        if self.kind == "anonymous":
            raise Unauthorized("An admin key is required.")
        if self.kind != "admin":
            raise Forbidden("This needs an admin key.")


ANONYMOUS = Principal("anonymous")


def _matches(candidate: str, keys: frozenset[str]) -> bool:
    # Compare against every key so the time taken does not tell which one nearly matched.
    found = False
    for key in keys:
        found |= hmac.compare_digest(candidate.encode(), key.encode())
    return found


EXP_NOT_A_NUMBER = "The player token's exp is not a number (seconds since the epoch)."
SUBJECT_NOT_A_USER = "The player token's subject is not a user id."


def _numeric_date(value: object) -> bool:
    """Whether a claim is a NumericDate: a JSON number (RFC 7519 section 2). PyJWT also reads a
    string of digits, and ``true`` as 1, which is not one."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _refusal(exc: jwt.InvalidTokenError, settings: LadderSettings, credential: str) -> str:
    """The 401's detail for a token PyJWT refused: what is wrong where it is a player token's
    claim, so that an issuer can tell (a clock ahead, an audience); else that the credential is
    neither a key nor a token, which says nothing of how near it came."""
    leeway = settings.jwt_leeway_seconds
    if isinstance(exc, jwt.ExpiredSignatureError):
        # Its signature held (PyJWT checks it first); an exp of true read as 1 is no date.
        claims = jwt.decode(credential, options={"verify_signature": False})
        if not _numeric_date(claims["exp"]):
            return EXP_NOT_A_NUMBER
        return "The player token has expired."
    if isinstance(exc, jwt.ImmatureSignatureError):
        return (
            "The player token is not valid yet: its nbf or iat is more than "
            f"{leeway:g} s ahead of the server's clock."
        )
    if isinstance(exc, jwt.InvalidAudienceError):
        return "The player token names an audience (aud); Ladder takes tokens that name none."
    if isinstance(exc, jwt.exceptions.InvalidSubjectError):
        return SUBJECT_NOT_A_USER
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"The player token has no {exc.claim} claim."
    if isinstance(exc, jwt.DecodeError) and "(exp)" in str(exc):
        return EXP_NOT_A_NUMBER
    return "The credential is not a valid key or player token."


def authenticate(credential: str | None, settings: LadderSettings) -> Principal:
    """The principal a credential names; ``None`` is anonymous; a bad one raises 401."""
    if credential is None:
        return ANONYMOUS
    if _matches(credential, settings.effective_admin_keys):
        return Principal("admin", key=credential)
    if _matches(credential, settings.effective_server_keys):
        return Principal("server", key=credential)
    try:
        claims = jwt.decode(
            credential,
            settings.effective_jwt_secret,
            algorithms=["HS256"],
            options={"require": ["exp", "sub"]},
            leeway=settings.jwt_leeway_seconds,
        )
    except jwt.InvalidTokenError as exc:
        raise Unauthorized(_refusal(exc, settings, credential)) from exc
    subject = claims.get("sub")
    if not isinstance(subject, str) or not _USER_ID.fullmatch(subject):
        raise Unauthorized(SUBJECT_NOT_A_USER)
    expires = claims["exp"]
    if not _numeric_date(expires):
        raise Unauthorized(EXP_NOT_A_NUMBER)
    expires_at = float(min(int(expires), _LAST_EXP))
    return Principal("player", subject, expires_at)


def authorization(scope: Scope) -> str | None:
    """The request's ``Authorization`` header, as ``request.headers.get`` gives it (the first,
    decoded as Latin-1), without making the request's Headers."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            return str(value.decode("latin-1"))
    return None


def bearer(header: str | None) -> str | None:
    """The credential of an ``Authorization: Bearer`` header, or ``None`` without the header.
    A header that is there but empty or blank is a credential that is not valid (401), not an
    anonymous call."""
    if header is None:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("Use 'Authorization: Bearer <credential>'.")
    return value.strip()


# What a client may do without a credential: read, and only while reads are public.
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class CredentialFirst:
    """Turns away an anonymous request to the API (``/v1/``) that needs a credential, before
    routing, before its body is read or validated and before its board is looked up: every
    write, and every read while ``LADDER_PUBLIC_READS=false``. It answers 401 whatever the rest
    of the request holds, so that who may not call learns nothing of which boards exist or of
    what a valid body is, and costs nothing to parse (docs/security.md, "Authenticate first").

    Only the presence of a credential is checked here; the routes check its worth (401 for a
    bad one) before they look at anything else of the request. The WebSocket is left to its
    own handshake.
    """

    def __init__(self, app: ASGIApp, public_reads: bool) -> None:
        self.app = app
        self.public_reads = public_reads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"].startswith("/v1/")
            and (scope["method"] not in _READ_METHODS or not self.public_reads)
            and not any(
                name == b"authorization" and value.strip() for name, value in scope["headers"]
            )
        ):
            refusal = Unauthorized(
                "A credential is required: Authorization: Bearer <server key | admin key | "
                "player token>."
            )
            await problem_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)
