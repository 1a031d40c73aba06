"""What the test modules share: paths, the patterns of the lab's lines, small helpers."""

import os
import re
import socket

import pytest

import carico

QUI = os.path.dirname(os.path.abspath(__file__))
RADICE = os.path.dirname(QUI)
CARICO = os.path.join(RADICE, "carico.py")
FAKE = os.path.join(QUI, "fakeserver.py")

RIGA_REQ = re.compile(r"^  req +(\d+): +([\d.]+) s +(\d+) token  \(([\d.]+) t/s nel proprio slot\)$")
VELOCE = ("--intervallo", "0.05")  # the fake answers in tenths of a second: sample it often


def latenze(out):
    """The latencies of the `req` lines of an output, in order."""
    return [float(m.group(2)) for m in map(RIGA_REQ.match, out.splitlines()) if m]


def valore(out, etichetta):
    """What follows `etichetta=` in an output, e.g. valore(out, "picco slot occupati insieme")."""
    m = re.search(re.escape(etichetta) + r"=(\S+)", out)
    return m.group(1) if m else None


def porta_libera():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def risponde(url):
    """Whether a server answers /health at url."""
    try:
        carico.Client(url, timeout_info=1).chiama("GET", "/health")
        return True
    except carico.ErroreRete:
        return False


def reale_non_disponibile(motivo):
    """The real server or model is missing: a failure, except on a developer's machine that asked
    for the fake server only (CARICO_SOLO_FAKE=1, never in CI)."""
    if os.environ.get("CI") == "true" or os.environ.get("CARICO_SOLO_FAKE") != "1":
        pytest.fail(f"real server unavailable: {motivo}")
    pytest.skip(f"CARICO_SOLO_FAKE=1 and {motivo}")
