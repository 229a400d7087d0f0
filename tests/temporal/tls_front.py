"""Test-only: a TLS front for the Temporal dev server (which has no TLS option), so that mTLS and
API-key logins are tested against a server that requires them. Not shipped.

``make_certs(dir)`` makes a throwaway CA, a server certificate for 127.0.0.1/localhost and a client
certificate with the ``openssl`` command (Python's ssl module cannot make certificates), plus a
second, foreign CA with its own client certificate.

``TlsFront`` is a gRPC server (grpcio) on loopback with TLS (``require_client_auth`` for mTLS) that
forwards every unary call, as raw bytes, to the dev server over plain gRPC: the same method path,
deadline and metadata, the answer's status, details and trailing metadata (Temporal's typed errors
travel in ``grpc-status-details-bin``). With ``api_key`` set it refuses (UNAUTHENTICATED) every
call whose ``authorization`` header is not ``Bearer <api_key>`` (and forwards the header, as a
cluster's frontend hands it to its authorizer). Every Temporal frontend call is unary (the long
polls too), so nothing else is needed.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc

OPENSSL = shutil.which("openssl")
MAX_MESSAGE_BYTES = 128 * 1024 * 1024
THREADS = 64  # each worker holds ~10 long polls open; a full pool would stall calls for a poll's minute
_DROPPED = {"user-agent", "te", "content-type"}  # the channel sets its own

_CNF = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = unused
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    """A CA that signed neither the server's nor the client's certificate."""
    other_client_cert: Path
    """A client certificate signed by ``other_ca`` (the front does not trust it)."""
    other_client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    out = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"openssl {' '.join(args)}: {out.stderr[-2000:]}"


def _key_and_csr(d: Path, name: str, cn: str, cnf: Path) -> None:
    _openssl(
        "req",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
        "-config",
        str(cnf),
        "-subj",
        f"/CN={cn}",
        cwd=d,
    )


def _ca(d: Path, name: str, cnf: Path) -> None:
    _openssl(
        "req",
        "-x509",
        "-new",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
        "-days",
        "2",
        "-config",
        str(cnf),
        "-extensions",
        "ca",
        "-subj",
        f"/CN=ctl test {name}",
        cwd=d,
    )


def _sign(d: Path, name: str, ca: str, section: str, cnf: Path) -> None:
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.pem",
        "-CAkey",
        f"{ca}.key",
        "-set_serial",
        str(secrets.randbits(63)),
        "-days",
        "2",
        "-out",
        f"{name}.pem",
        "-extfile",
        str(cnf),
        "-extensions",
        section,
        cwd=d,
    )


def make_certs(d: Path) -> Certs:
    assert OPENSSL, "no openssl command"
    d.mkdir(parents=True, exist_ok=True)
    cnf = d / "openssl.cnf"
    cnf.write_text(_CNF)
    _ca(d, "ca", cnf)
    _ca(d, "other-ca", cnf)
    for name, cn, ca, section in (
        ("server", "localhost", "ca", "server"),
        ("client", "ctl worker", "ca", "client"),
        ("other-client", "intruder", "other-ca", "client"),
    ):
        _key_and_csr(d, name, cn, cnf)
        _sign(d, name, ca, section, cnf)
    return Certs(
        d / "ca.pem",
        d / "server.pem",
        d / "server.key",
        d / "client.pem",
        d / "client.key",
        d / "other-ca.pem",
        d / "other-client.pem",
        d / "other-client.key",
    )


class TlsFront:
    """A TLS (optionally mTLS, optionally API-key) gRPC front on 127.0.0.1 for the plain ``upstream``."""

    def __init__(self, upstream: str, certs: Certs, *, require_client_cert: bool, api_key: str | None = None):
        self.api_key = api_key
        self.refused = 0  # calls refused for a missing or wrong API key
        self.forwarded = 0
        self._lock = threading.Lock()
        options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ]
        self._channel = grpc.insecure_channel(upstream, options=options)
        self._server = grpc.server(ThreadPoolExecutor(max_workers=THREADS), handlers=[_Forward(self)], options=options)
        creds = grpc.ssl_server_credentials(
            [(certs.server_key.read_bytes(), certs.server_cert.read_bytes())],
            root_certificates=certs.ca.read_bytes() if require_client_cert else None,
            require_client_auth=require_client_cert,
        )
        self.port = self._server.add_secure_port("127.0.0.1:0", creds)
        assert self.port > 0, "the front could not bind a port"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "TlsFront":
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(grace=0)
        self._channel.close()  # cancels the long polls still forwarded

    def _count(self, what: str) -> None:
        with self._lock:
            setattr(self, what, getattr(self, what) + 1)

    def forward(self, method: str, request: bytes, context) -> bytes:
        metadata = context.invocation_metadata()
        if self.api_key is not None:
            given = [v for k, v in metadata if k == "authorization"]
            if given != [f"Bearer {self.api_key}"]:
                self._count("refused")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid API key")
        forwarded = [(k, v) for k, v in metadata if k not in _DROPPED and not k.startswith((":", "grpc-"))]
        remaining = context.time_remaining()
        try:
            response, call = self._channel.unary_unary(method).with_call(request, timeout=remaining, metadata=forwarded)
        except grpc.RpcError as e:
            context.set_trailing_metadata(tuple(e.trailing_metadata() or ()))
            context.abort(e.code(), e.details() or "")
        self._count("forwarded")
        trailing = call.trailing_metadata()
        if trailing:
            context.set_trailing_metadata(tuple(trailing))
        return response


class _Forward(grpc.GenericRpcHandler):
    """The generic handler: every method, raw bytes in and out (no (de)serializers)."""

    def __init__(self, front: TlsFront):
        self.front = front

    def service(self, handler_call_details):
        method = handler_call_details.method
        return grpc.unary_unary_rpc_method_handler(
            lambda request, context: self.front.forward(method, request, context)
        )
