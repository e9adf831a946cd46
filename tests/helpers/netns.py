"""A two-machine LAN inside this host for end-to-end tests: two network namespaces joined by a veth pair.

`Lan` creates `chr_st_<tag>` (the "server", 10.213.7.1) and `chr_phone_<tag>` (the "phone", 10.213.7.2);
the veth ends are created directly inside the namespaces, so no address or interface ever appears in
the host's own namespace, and the namespaces have no other interface: nothing they send can leave.
Each side has a default route over the veth, so a program that tries any other address sends a frame
onto the veth instead of failing before any packet: `Capture` (a packet socket on the server's end,
both directions) records every frame, and a test asserts that only the two LAN addresses appear.

Code of the test process reaches a namespace through `Lan.call` (a thread that joins it with
setns(2): a socket made there stays there); programs run in one through `Lan.prefix`.
Needs root and iproute2 (`ip`); `unavailable()` says why not.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
SUBNET = "10.213.7.0/24"
ST_ADDR = "10.213.7.1"
PHONE_ADDR = "10.213.7.2"
ETH_P_ALL = 0x0003


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "network namespaces need iproute2's `ip`"
    if not hasattr(socket, "AF_PACKET"):
        return "no packet sockets on this system"
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Lan:
    """The two namespaces and the veth between them; `down()` removes everything (idempotent)."""

    def __init__(self, tag: str | int | None = None) -> None:
        tag = str(tag if tag is not None else os.getpid())
        self.st = f"chr_st_{tag}"
        self.phone = f"chr_phone_{tag}"

    def up(self) -> "Lan":
        """Create both namespaces, the veth pair inside them, addresses, routes; IPv6 off (no chatter)."""
        self.down()  # a leftover of a killed run with the same pid
        for ns in (self.st, self.phone):
            _ip("netns", "add", ns)
            self._sysctl(ns, "net/ipv6/conf/all/disable_ipv6", "1")
            self._sysctl(ns, "net/ipv6/conf/default/disable_ipv6", "1")
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", "name", "chr0", "netns", self.st, "type", "veth", "peer", "name", "chr1", "netns", self.phone)
        for ns, dev, addr in ((self.st, "chr0", ST_ADDR), (self.phone, "chr1", PHONE_ADDR)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            # Every other address "on the wire": an attempt shows in the capture instead of failing silently.
            _ip("-n", ns, "route", "add", "default", "dev", dev)
        return self

    @staticmethod
    def _sysctl(ns: str, key: str, value: str) -> None:
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", f"echo {value} > /proc/sys/{key}"],
                       check=False, capture_output=True, timeout=30)

    def down(self) -> None:
        """Delete both namespaces (their veth goes with them)."""
        for ns in (self.st, self.phone):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)

    def prefix(self, ns: str) -> list[str]:
        """The command prefix that runs a program inside namespace `ns`."""
        return ["ip", "netns", "exec", ns]

    def call(self, ns: str, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` in a thread that joined namespace `ns`; its result or its exception."""
        out: dict[str, Any] = {}

        def run() -> None:
            try:
                _join(ns)
                out["value"] = fn(*args)
            except BaseException as error:  # handed to the caller's thread
                out["error"] = error

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join()
        if "error" in out:
            raise out["error"]
        return out["value"]

    def wrapper(self, folder: Path, ns: str, program: str) -> Path:
        """An executable script that runs `program` inside `ns` (for Playwright's executable_path)."""
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / f"in-{ns}.sh"
        script.write_text(f'#!/bin/sh\nexec ip netns exec {ns} {program} "$@"\n')
        script.chmod(0o755)
        return script


def _join(ns: str) -> None:
    """setns(2) the calling thread into namespace `ns` (Python 3.11 has no os.setns)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
    finally:
        os.close(fd)


class Capture:
    """Every frame on the server's veth end (both directions), summarised by address."""

    def __init__(self, lan: Lan, dev: str = "chr0") -> None:
        self.frames: list[tuple[str, str, str]] = []  # (kind, source, destination)
        self._stop = threading.Event()
        self._sock = lan.call(lan.st, self._open, dev)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    @staticmethod
    def _open(dev: str) -> socket.socket:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        sock.bind((dev, 0))
        sock.settimeout(0.2)
        return sock

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                frame = self._sock.recv(65535)
            except socket.timeout:
                continue
            except OSError:
                return
            self.frames.append(summarise(frame))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self._sock.close()

    def foreign(self, allowed: tuple[str, ...] = (ST_ADDR, PHONE_ADDR)) -> list[tuple[str, str, str]]:
        """Frames naming any address but the allowed ones (or of another kind than IPv4 and ARP)."""
        return [f for f in self.frames if f[0] not in ("ipv4", "arp") or f[1] not in allowed or f[2] not in allowed]


def summarise(frame: bytes) -> tuple[str, str, str]:
    """(kind, source, destination) of an Ethernet frame: IPv4 addresses, ARP sender and target."""
    kind = struct.unpack("!H", frame[12:14])[0]
    if kind == 0x0800 and len(frame) >= 34:
        return "ipv4", socket.inet_ntoa(frame[26:30]), socket.inet_ntoa(frame[30:34])
    if kind == 0x0806 and len(frame) >= 42:
        return "arp", socket.inet_ntoa(frame[28:32]), socket.inet_ntoa(frame[38:42])
    return f"ethertype {kind:#06x}", "", ""
