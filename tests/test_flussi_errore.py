"""--stream: the client's own error, measured on every streamed run (docs/flussi.md).

How late the reader was (each read's time against the kernel's arrival stamp), how many chunks of a stream
came in one read with an earlier one, and a bound on how far that moved each percentile: said in a note only
when a bound passes 1 ms and 5% of its figure. The reader is held back on purpose (a sleep before each read),
or left alone on a slow stream; without the kernel's stamp (TLS, macOS) the lateness is n/d. The machine is
shared: the tolerances are tenths of a second, the streams' gaps longer still.
"""

import json
import random
import re
import socket
import time

import pytest

import carico
from aiuti import VELOCE
from fakeserver import chunk

TESTO = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
FINE = (b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":5,"prompt_tokens":5}}\n\n' b"data: [DONE]\n\n")
TESTA = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
TRATTENUTO = 0.25  # the reader's sleep before each read
NOTA = "carico ha letto i flussi in ritardo"


def a_gruppi(gruppi, pausa=0.6):
    """Groups of text chunks, each chunk its own write (its own TCP segment), the groups `pausa` s apart."""
    def handler(h, _corpo):
        h.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h.wfile.write(TESTA)
        h.wfile.flush()
        for n in gruppi:
            for _ in range(n):
                h.wfile.write(chunk(TESTO))
                h.wfile.flush()
            time.sleep(pausa)
        h.wfile.write(chunk(FINE) + chunk(b""))
        h.wfile.flush()
        h.close_connection = True
    return handler


def senza_stampo(monkeypatch):
    """As on TLS or macOS: no socket gets the kernel's arrival time."""
    monkeypatch.setattr(carico, "SO_TIMESTAMPNS", 987654)


def trattieni(monkeypatch):
    originale = carico.LettoreFlussi._leggi

    def in_ritardo(self, *argomenti):
        time.sleep(TRATTENUTO)
        return originale(self, *argomenti)

    monkeypatch.setattr(carico.LettoreFlussi, "_leggi", in_ritardo)


def corri(carica, url, tmp_path, *flag):
    rc, out, err = carica(url, "--stream", "--richieste", "1", "--dettagli", "--json", str(tmp_path / "r.json"),
                          *flag, *VELOCE)
    assert rc == 0, out + err
    return out, err, json.loads((tmp_path / "r.json").read_text())["prove"][0]


@pytest.mark.parametrize("stampo", [True, False], ids=["stampo-del-kernel", "senza-stampo"])
def test_un_lettore_trattenuto(fake, carica, monkeypatch, tmp_path, stampo):
    """Three chunks written back to back, then two, each group read in one read the reader made 0.25 s late:
    the lateness 0.25 s (within -0.02/+0.15 s) with the kernel's stamp, n/d without; 2 + 1 chunks read with an
    earlier one, exactly; the note fires either way, and the bound it states holds the TTFT's true error."""
    if not stampo:
        senza_stampo(monkeypatch)
    trattieni(monkeypatch)
    server = fake(override={"/v1/chat/completions": a_gruppi([3, 2])})
    out, err, prova = corri(carica, server.url, tmp_path, "--spiega")
    d = prova["dettagli"]
    assert d["chunk_letti_insieme"] == 3, d
    if stampo:
        for chiave in ("ritardo_lettore_p50_ms", "ritardo_lettore_p99_ms", "ritardo_lettore_max_ms"):
            assert TRATTENUTO * 1000 - 20 <= d[chiave] <= TRATTENUTO * 1000 + 150, (chiave, d)
    else:
        assert (d["ritardo_lettore_p50_ms"], d["ritardo_lettore_p99_ms"], d["ritardo_lettore_max_ms"]) == (None,) * 3
    (r,) = prova["richieste"]
    c = r["chunk_s"]
    assert c[0] == c[1] == c[2] != c[3] == c[4], c
    # the first chunk came within a few ms of the send (written at once), the reader's sleep later
    assert c[0] - d["spostamento_ms"]["primo token p50"] / 1000 <= 0.1, (c, d["spostamento_ms"])
    assert NOTA in err and "ITL fino a" in err and ("primo token fino a" in err or stampo), err  # (TTFT: a read's)
    assert re.search(rf"lettore dei flussi: \d+ chunk letti insieme a uno prima, letture dopo i loro ultimi byte "
                     rf"{'p50' if stampo else 'n/d'}", out), out
    assert "3 chunk letti insieme a uno prima, " in out and ": cifre spostate al più di" in out, out
    assert ". Cifre spostate al più di" in out and "vedi la nota." in out, out


@pytest.mark.parametrize("stampo", [True, False], ids=["stampo-del-kernel", "senza-stampo"])
def test_un_lettore_in_tempo(fake, carica, monkeypatch, tmp_path, stampo):
    """Chunks 0.3 s apart, the reader free: the lateness within 100 ms of zero (n/d without the stamp), no chunk
    read with another, no figure moved and no note."""
    if not stampo:
        senza_stampo(monkeypatch)
    server = fake(override={"/v1/chat/completions": a_gruppi([1] * 4, pausa=0.3)})
    out, err, prova = corri(carica, server.url, tmp_path, "--spiega")
    d = prova["dettagli"]
    assert d["chunk_letti_insieme"] == 0 and set(d["spostamento_ms"].values()) == {0.0}, d
    if stampo:
        assert 0 <= d["ritardo_lettore_p50_ms"] <= d["ritardo_lettore_max_ms"] <= 100, d
    else:
        assert d["ritardo_lettore_max_ms"] is None, d
    assert NOTA not in err, err
    assert "0 chunk letti insieme a uno prima, " in out and ": nessuna cifra spostata" in out, out
    assert re.search(r"Il lettore dei flussi di carico: \d+ chunk letti insieme a uno prima, letture dopo i loro", out), out


def test_nulla_di_nuovo_senza_flussi(fake, carica, tmp_path):
    """A run without --stream: no reader, nothing of it in --dettagli nor in --json."""
    server = fake(n_slot=2)
    rc, out, err = carica(server.url, "--richieste", "2", "--token", "4", "--dettagli", "--json",
                          str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    d = json.loads((tmp_path / "r.json").read_text())["prove"][0]["dettagli"]
    assert "lettore" not in out and "chunk_letti_insieme" not in d and NOTA not in err


def percentile_vero(valori, p):
    return carico.percentile(valori, p)


@pytest.mark.parametrize("seme", range(40))
def test_il_limite_contiene_l_errore(seme):
    """Any values, each moved by at most its own error (most by none, a few by much): every percentile of
    the moved values is within the stated bound of the true one."""
    caso = random.Random(seme)
    n = caso.choice([2, 3, 10, 100, 1000])
    veri = [caso.choice([0.02, 0.05, caso.uniform(0, 0.1)]) for _ in range(n)]
    quota = caso.choice([0.0, 0.001, 0.01, 0.1, 0.5, 1.0])
    errori = [caso.uniform(0, 0.2) if caso.random() < quota else 0.0 for _ in range(n)]
    letti = [v + caso.uniform(-e, e) for v, e in zip(veri, errori)]
    for p in (1, 10, 50, 90, 99, 99.9):
        limite = carico.spostamento(letti, errori, p)
        assert abs(percentile_vero(letti, p) - percentile_vero(veri, p)) <= limite + 1e-12, (n, p, limite)
        assert limite <= max(errori) + 1e-12


def test_pochi_errori_grandi_non_spostano_la_mediana():
    """One value in a thousand off by up to 50 ms: the median may move by the gap to its neighbours, not by 50 ms."""
    valori = [0.020 + i * 1e-6 for i in range(1000)]
    errori = [0.0] * 999 + [0.05]
    assert carico.spostamento(valori, errori, 50) <= 2e-6
    assert carico.spostamento(valori, errori, 100) == 0.05  # the max: nothing beyond it to lean on
    assert carico.spostamento(valori, [0.0] * 1000, 99) == 0.0


def test_quali_chunk_sono_incerti():
    """Reads at 1, 2 (0.5 s late) and 3 s: the second chunk shares its read with the third, so it came after
    the read before (1 s) and may be 1 s off; the last, read with the end in a stream that had that, may be off
    by its read's time less the read before (2.5 s). Without any chunk read together, the end's read is exact."""
    class Letto:
        inviata, ritardi = 0.0, {1.0: 0.0, 2.0: 0.5, 3.0: 0.1}

    assert carico.incerti([1.0, 2.0, 2.0, 3.0], 3.0, Letto) == ((1, 1.0), (3, 0.5))
    assert carico.incerti([1.0, 2.0, 3.0], 3.0, Letto) == ()
