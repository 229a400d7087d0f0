"""How to reach a Temporal cluster: address, namespace, task queue, TLS, API key (no temporalio import).

The API key is a secret: it is read from ``$CTL_TEMPORAL_API_KEY`` (never a command-line flag, which
``ps`` would show), kept out of ``repr``, and only ever handed to the SDK's connection as the
``Authorization`` header. It never enters a workflow's input, result or history.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
DEFAULT_TASK_QUEUE = "durable-train"
API_KEY_ENV = "CTL_TEMPORAL_API_KEY"
_ADDRESS = re.compile(r"^[A-Za-z0-9._\-\[\]:]+:\d{1,5}$")


class ConfigError(ValueError):
    """A malformed address, a missing TLS file, half a client certificate pair."""


@dataclass(frozen=True)
class TemporalConfig:
    address: str = DEFAULT_ADDRESS
    namespace: str = DEFAULT_NAMESPACE
    task_queue: str = DEFAULT_TASK_QUEUE
    tls_cert: str | None = None
    """Client certificate (PEM file) for mTLS; needs ``tls_key``."""
    tls_key: str | None = None
    tls_ca: str | None = None
    """The server's root CA (PEM file); default: the system's roots."""
    tls: bool | None = None
    """None: TLS when a TLS file or an API key is given; True/False: forced."""
    api_key: str | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _ADDRESS.match(self.address or ""):
            raise ConfigError(f"bad Temporal address {self.address!r}: expected HOST:PORT, e.g. localhost:7233")
        for what, value in (("namespace", self.namespace), ("task queue", self.task_queue)):
            if not value or not value.strip() or len(value) > 255:
                raise ConfigError(f"bad Temporal {what} {value!r}")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("--tls-cert and --tls-key go together (a client certificate and its key)")
        for flag, path in (("--tls-cert", self.tls_cert), ("--tls-key", self.tls_key), ("--tls-ca", self.tls_ca)):
            if path and not Path(path).is_file():
                raise ConfigError(f"{flag} {path}: no such file")

    @classmethod
    def from_env(cls, **given: object) -> "TemporalConfig":
        """``given`` (None values dropped) over the defaults; the API key from ``$CTL_TEMPORAL_API_KEY``."""
        kwargs = {k: v for k, v in given.items() if v is not None}
        key = os.environ.get(API_KEY_ENV) or None
        return cls(**kwargs, api_key=key)  # type: ignore[arg-type]

    @property
    def uses_tls(self) -> bool:
        if self.tls is not None:
            return self.tls
        return bool(self.tls_cert or self.tls_ca or self.api_key)

    def describe(self) -> str:
        """One line for humans (never the key itself)."""
        extra = []
        if self.uses_tls:
            extra.append("TLS")
        if self.api_key:
            extra.append("API key")
        tail = f" ({', '.join(extra)})" if extra else ""
        return f"Temporal {self.address} namespace {self.namespace} task queue {self.task_queue}{tail}"


_STATUS_MESSAGE = re.compile(r'message: "([^"]{0,200})"')
# how the SDK's core words a connection the server ended during the first call (it varies with timing)
_CLOSED = ("close_notify", "connection closed", "broken pipe", "connection reset", "unexpectedeof", "transport error")


def explain_connect_error(text: str, cfg: TemporalConfig) -> str:
    """What a failed connection (the SDK's error text) means for the user, in a few words (no secret).

    The SDK's core reports TLS and login failures as Rust debug text; the cases a user meets when a
    cluster requires TLS, a client certificate or an API key are named here, with the option to check.
    "" when the text is none of them.
    """
    status = _STATUS_MESSAGE.search(text)
    said = f": {status.group(1)}" if status else ""
    lower = text.lower()
    closed = any(c in lower for c in _CLOSED)
    if "ConnectionRefused" in text:
        return f"nothing listens at {cfg.address} (connection refused)"
    if "Unauthenticated" in text:
        fix = "check $CTL_TEMPORAL_API_KEY" if cfg.api_key else f"it needs an API key (${API_KEY_ENV})"
        return f"the cluster refused the login (Unauthenticated{said}): {fix}"
    if not cfg.uses_tls:
        return "the server ended the connection: it may require TLS (--tls-ca, --tls, or an API key)" if closed else ""
    if "UnknownIssuer" in text:
        where = (
            f"--tls-ca {cfg.tls_ca}" if cfg.tls_ca else "the system's root CAs (name the cluster's CA with --tls-ca)"
        )
        return f"the server's TLS certificate is not signed by a CA trusted here: {where}"
    if "InvalidContentType" in text:
        return "the server does not speak TLS on this port (use --no-tls, or the cluster's TLS address)"
    if closed:
        if cfg.tls_cert:
            return (
                f"the server ended the TLS connection: it does not accept the client certificate "
                f"--tls-cert {cfg.tls_cert} (signed by a CA it does not trust?)"
            )
        return "the server ended the TLS connection: it may require a client certificate (--tls-cert and --tls-key)"
    return ""
