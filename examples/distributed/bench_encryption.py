"""What encrypting the link costs per audio chunk: one-way latency of an audio-sized message over loopback TCP,
plain and with mutually authenticated TLS 1.3 (AES-GCM, certificates made here with ``cryptography``), the two
alternating in one run so that load on the machine hits both alike.

    python examples/distributed/bench_encryption.py --rounds 300

Each round sends one message (4-byte length + float32 samples) and waits for a 1-byte acknowledgement; the one-way
figure is half the round trip. Sizes: 0.3, 1 and 2 s of 32 kHz float32 audio (38, 128, 256 KB), the range of the
node's streamed chunks. dora 1.1's Zenoh has no TLS link (see cluster_keys.py), so this measures the cost of the
encryption itself, which WireGuard (ChaCha20-Poly1305 in the kernel) pays in the same order of magnitude.
"""

from __future__ import annotations

import argparse
import datetime as dt
import socket
import ssl
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path

SECONDS = (0.3, 1.0, 2.0)
RATE = 32000


def make_certs(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and one certificate (used by both ends) signed by it: (ca, cert, key) PEM files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench-ca")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


def _recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 20))
        if not part:
            raise ConnectionError("closed")
        buf += part
    return bytes(buf)


def _serve(listener: socket.socket, context: ssl.SSLContext | None) -> None:
    conn, _ = listener.accept()
    if context is not None:
        conn = context.wrap_socket(conn, server_side=True)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            (n,) = struct.unpack("!I", _recv_exact(conn, 4))
            _recv_exact(conn, n)
            conn.sendall(b"k")
    except (ConnectionError, OSError):
        pass
    finally:
        conn.close()


def connect(context_server: ssl.SSLContext | None, context_client: ssl.SSLContext | None):
    listener = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=_serve, args=(listener, context_server), daemon=True)
    thread.start()
    sock = socket.create_connection(listener.getsockname())
    if context_client is not None:
        sock = context_client.wrap_socket(sock, server_hostname="localhost")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, listener


def one_way_ms(sock, payload: bytes) -> float:
    t0 = time.perf_counter()
    sock.sendall(struct.pack("!I", len(payload)) + payload)
    _recv_exact(sock, 1)
    return (time.perf_counter() - t0) * 500


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ca, cert, key = make_certs(Path(tmp))
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
        server.load_cert_chain(cert, key)
        server.verify_mode = ssl.CERT_REQUIRED  # mutual: the client must show a certificate of the CA
        server.minimum_version = ssl.TLSVersion.TLSv1_3
        client = ssl.create_default_context(cafile=str(ca))
        client.load_cert_chain(cert, key)
        plain, plain_l = connect(None, None)
        tls, tls_l = connect(server, client)
        print(f"TLS: {tls.version()} {tls.cipher()[0]}; {args.rounds} rounds per size, plain and TLS alternating")
        for seconds in SECONDS:
            payload = bytes(int(seconds * RATE) * 4)
            times = {"plain": [], "tls": []}
            for i in range(args.rounds):
                order = (("plain", plain), ("tls", tls)) if i % 2 else (("tls", tls), ("plain", plain))
                for name, sock in order:
                    times[name].append(one_way_ms(sock, payload))
            med = {k: statistics.median(v) for k, v in times.items()}
            p90 = {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()}
            print(f"{seconds:.1f} s chunk ({len(payload) // 1024} KB): one-way median plain {med['plain']:.3f} ms, "
                  f"TLS {med['tls']:.3f} ms (+{med['tls'] - med['plain']:.3f} ms); p90 {p90['plain']:.3f} / "
                  f"{p90['tls']:.3f} ms")
        for sock, listener in ((plain, plain_l), (tls, tls_l)):
            sock.close()
            listener.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
