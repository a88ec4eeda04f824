"""``--address``: a Ray cluster's address, checked in bounded time before ``ray.init``.

``ray.init(address=...)`` retries for minutes when nothing answers, and hangs for more than
150 s on a live port that is not Ray. :func:`check_address` connects with a timeout and sends
the HTTP/2 connection preface and an empty SETTINGS frame (gRPC, what Ray's GCS speaks), which
every HTTP/2 server answers with its own SETTINGS frame (RFC 9113 §3.4); anything else is
refused in one line within ``timeout_s``. No Ray import here: ``--dry-run`` uses it.
"""

from __future__ import annotations

import os
import socket

from moe_core.errors import UpcycleError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
SETTINGS = 0x04
TIMEOUT_S = 5.0


def split(address: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` or ``ray://HOST:PORT``, refused in one line otherwise."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UpcycleError(f"--address {address!r} must be auto, HOST:PORT or ray://HOST:PORT "
                           "(a port in 1..65535)")
    return host, int(port)


def speaks_http2(sock: socket.socket) -> bool:
    """Whether the peer answers the HTTP/2 preface with a SETTINGS frame (within the socket's
    timeout)."""
    sock.sendall(PREFACE)
    head = b""
    while len(head) < 9:
        chunk = sock.recv(9 - len(head))
        if not chunk:
            return False
        head += chunk
    # a frame header: length (3 bytes), type, flags, stream id (4 bytes; 0 for SETTINGS)
    return head[3] == SETTINGS and int.from_bytes(head[5:9], "big") & 0x7FFFFFFF == 0


def check_address(address: str | None, timeout_s: float | None = None) -> None:
    """Fail within ``timeout_s`` when ``address`` does not answer or does not speak gRPC (not a
    Ray head). ``auto`` and ``None`` are not network addresses: nothing to probe."""
    if address is None or address == "auto":
        return
    timeout_s = TIMEOUT_S if timeout_s is None else timeout_s
    host, port = split(address)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except OSError as e:
        raise UpcycleError(
            f"--address {address}: nothing answers at {host}:{port} ({e.strerror or e}); "
            "start the head there (ray start --head) or fix the address") from None
    try:
        if os.environ.get("RAY_USE_TLS", "0") in ("1", "true"):
            return  # a TLS handshake comes first: the TCP answer is what can be checked
        try:
            ok = speaks_http2(sock)
        except OSError as e:  # a timeout included
            why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e))
            ok, detail = False, f" ({why} within {timeout_s:g} s)"
        else:
            detail = ""
        if not ok:
            raise UpcycleError(
                f"--address {address}: {host}:{port} answers but is not a Ray head (it does not "
                f"speak gRPC{detail}); give the head's GCS port (ray status shows it, "
                "default 6379) or ray://HOST:10001")
    finally:
        sock.close()


def dry_run_address(address: str | None) -> str | None:
    """The address ``--dry-run`` checks the plan against. ``auto`` means ``RAY_ADDRESS`` (a
    Ray job's driver has it); without it ``ray.init(address="auto")`` would read this machine's
    shared address file (``/tmp/ray/ray_current_cluster``) and join whichever cluster was
    started last, maybe another user's, so the dry run checks this machine instead (None)."""
    if address != "auto":
        return address
    return os.environ.get("RAY_ADDRESS") or None
