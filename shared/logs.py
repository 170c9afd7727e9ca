"""Structured JSON logs on stdout for every service (structlog over the standard library)."""

from __future__ import annotations

import logging
import re
import sys
from typing import TextIO
from urllib.parse import unquote_plus

import structlog


def configure(service: str, level: str = "INFO", stream: TextIO | None = None) -> None:
    """One JSON object a line on ``stream`` (stdout unless given), each naming its service; the
    standard library's loggers and Python's warnings too."""
    shared_processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared_processors, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared_processors,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.EventRenamer("message"),
            _add_service(service),
            _redact,
            structlog.processors.JSONRenderer(),
        ],
    )
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Python's warnings (a library's deprecation, PyJWT's on a short development secret) as log
    # lines too, not as bare text on stderr.
    logging.captureWarnings(True)
    for noisy in ("aiormq", "aio_pika"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


# A query parameter of a logged URL: its name (as sent, percent-encoded or not) and value.
_QUERY_PARAMETER = re.compile(r"([?&])([^=&\s\"']*)=([^&\s\"']+)")


def _redacted_parameter(match: re.Match[str]) -> str:
    name = match.group(2)
    if unquote_plus(name).lower() != "token":
        return match.group(0)
    return f"{match.group(1)}{name}=[redacted]"


# The query of a WebSocket's URL as uvicorn logs it (``"WebSocket /v1/ws?…" [accepted]``), to
# the closing quote: a request target holds no space.
_SOCKET_QUERY = re.compile(r'("WebSocket [^?"\s]*)\?\S*?(?=" |"$|$)')


def _redact(
    _logger: object, _name: str, event: structlog.typing.EventDict
) -> structlog.typing.EventDict:
    """Credentials never reach a log: uvicorn logs a WebSocket's URL, and with it ``?token=``,
    whose name a client may also write percent-encoded (``%74oken``, which Starlette decodes
    and takes): every parameter whose decoded name is ``token`` has its value redacted, and of a
    WebSocket's URL the whole query (the socket reads ``token`` alone: anything else is a
    client's mistake, such as a misspelt ``?tokn=`` or a bare ``?<key>``, that carries a key
    all the same)."""
    message = event.get("message")
    if isinstance(message, str) and '"WebSocket /' in message:
        event["message"] = _SOCKET_QUERY.sub(r"\1?[redacted]", message)
    elif isinstance(message, str) and "=" in message and ("?" in message or "&" in message):
        event["message"] = _QUERY_PARAMETER.sub(_redacted_parameter, message)
    return event


def _add_service(service: str) -> structlog.typing.Processor:
    def add(
        _logger: object, _name: str, event: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        event.setdefault("service", service)
        return event

    return add
