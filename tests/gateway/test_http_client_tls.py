"""The HTTP/1.1 client over TLS (how it reaches commercial providers, and nodes behind https): the
server's certificate and host name are verified, the host name goes out as SNI, and connections
are kept alive as over TCP. A throwaway CA and a certificate for `localhost` are made with the
openssl command for each test session; the server is a raw asyncio TLS server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvloop

from gateway.http import ConnectError, ConnectionPool, Origin, default_ssl_context

JSON_OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 12\r\n\r\n{"ok": true}'
REQUEST = b"POST /x HTTP/1.1\r\nhost: localhost\r\ncontent-length: 2\r\n\r\n{}"

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(params=["asyncio", "uvloop"], scope="module")
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Both loops: uvloop brings its own TLS transport."""
    return uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA's certificate, to trust
    chain: Path  # the server's certificate (for DNS:localhost only)
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    work = tmp_path_factory.mktemp("tls")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "3",
        "-subj", "/CN=Meridian test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
        cwd=work,
    )  # fmt: skip
    _openssl("req", *ec, "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost", cwd=work)
    (work / "server.ext").write_text(
        "subjectAltName=DNS:localhost\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "3", "-extfile", "server.ext",
        cwd=work,
    )  # fmt: skip
    return Certificates(work / "ca.pem", work / "server.pem", work / "server.key")


@dataclass
class TLSServer:
    port: int = 0
    server_names: list[str | None] = field(default_factory=list)  # SNI of each handshake
    connections: int = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(2)  # REQUEST's body
                writer.write(JSON_OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def tls_server(certificates: Certificates) -> AsyncIterator[TLSServer]:
    server = TLSServer()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certificates.chain, certificates.key)
    context.sni_callback = lambda _socket, name, _context: server.server_names.append(name)
    listening = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
    server.port = listening.sockets[0].getsockname()[1]
    yield server
    listening.close()


async def test_https_verifies_the_certificate_sends_the_host_name_and_keeps_the_connection(
    tls_server: TLSServer, certificates: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))  # the one CA this deployment trusts
    pool = ConnectionPool(connect_timeout_s=5.0, ssl_context=default_ssl_context())
    try:
        for _ in range(3):
            response = await pool.request(Origin("https", "localhost", tls_server.port), REQUEST, timeout_s=5)
            assert (response.status, response.body) == (200, b'{"ok": true}')
    finally:
        await pool.aclose()
    assert tls_server.server_names == ["localhost"]
    assert tls_server.connections == 1


async def test_https_refuses_a_certificate_from_a_ca_it_does_not_trust(tls_server: TLSServer) -> None:
    pool = ConnectionPool(connect_timeout_s=5.0)  # the system's CAs and certifi's: not the test CA
    try:
        with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await pool.request(Origin("https", "localhost", tls_server.port), REQUEST, timeout_s=5)
    finally:
        await pool.aclose()


async def test_https_refuses_a_certificate_for_another_host(
    tls_server: TLSServer, certificates: Certificates, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificates.ca))
    pool = ConnectionPool(connect_timeout_s=5.0, ssl_context=default_ssl_context())
    try:
        with pytest.raises(ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            # The certificate names localhost only.
            await pool.request(Origin("https", "127.0.0.1", tls_server.port), REQUEST, timeout_s=5)
    finally:
        await pool.aclose()
