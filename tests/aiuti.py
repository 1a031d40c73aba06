"""What the test modules share: paths, the patterns of the lab's lines, small helpers."""

import contextlib
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


def letto_tutto(blocchi):
    """carico.leggi_flusso run to its end (the reader runs it a slice at a time): what it returns."""
    lavoro = carico.leggi_flusso(iter(blocchi))
    while True:
        try:
            next(lavoro)
        except StopIteration as fatto:
            return fatto.value


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


@contextlib.contextmanager
def porta_piena():
    """The port of a listening socket whose backlog is full: a connect to it never completes."""
    ascolto = socket.socket()
    ascolto.bind(("127.0.0.1", 0))
    ascolto.listen(0)
    riempitivi = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(ascolto.getsockname())
            riempitivi.append(s)
        yield ascolto.getsockname()[1]
    finally:
        for s in riempitivi:
            s.close()
        ascolto.close()


def griglia_np_token(out, np, token):
    """The checks of an --avvia --np A,B --token X,Y run: every block headed with both values, then for
    each answer length the np B / np A ratio, and the sentence on whether the advantage grew. Returns
    the ratios, in token order, and that sentence."""
    intestazioni = [f"punto {k} di 4: np={n}, token={t}" for k, (n, t) in enumerate(
        ((n, t) for n in np for t in token), 1)]
    assert re.findall(r"^punto .*$", out, re.M) == intestazioni, out
    rapporti = re.findall(rf"^throughput a token=(\d+): np {np[1]} / np {np[0]} ×([\d.]+)(?: \(indicativo: una prova "
                          r"per punto; con --ripeti 3 si misura anche il rumore\))?$", out, re.M)
    assert [int(t) for t, _ in rapporti] == list(token), out
    (esito,) = [r for r in out.splitlines() if r.startswith("con risposte più lunghe")]
    return [float(x) for _, x in rapporti], esito


def rifiutata(server, capsys, argomenti):
    """carico.py run with flags it must refuse: exit 2 before any request reaches `server`; the error line."""
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--url", server.url, *argomenti])
    assert uscita.value.code == 2
    assert server.richieste_ricevute == []
    return capsys.readouterr().err.splitlines()[-1]
