"""Ports on the loopback address, for the servers the workbook starts on this machine (Flower's SuperLink and
SuperNodes, JupyterLab, Voila): a free port, and whether something listens on one."""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "free_port", "listening"]

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def listening(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    """Whether a TCP server accepts connections at ``host``:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0
