"""A free TCP port, for the servers the tools and tests start on this machine."""
from __future__ import annotations

import socket


def free_port(ip: str = "127.0.0.1") -> int:
    """A port nothing listens on at `ip` now (OSError: `ip` is not an address of this machine).
    Another program may take it before it is used: callers start their server on it at once."""
    with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET) as sock:
        sock.bind((ip, 0))
        return sock.getsockname()[1]
