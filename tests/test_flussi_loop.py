"""--stream read by one thread for all streams (LettoreFlussi): what that loop must keep true.

Every stream's socket is waited on by one thread, which reads each as its bytes come and wakes the
stream's worker once, at its end. So: the reads all happen on that thread; a stream that stalls, or runs
out its --timeout, does not hold the others; a late loop does not move the figures (the kernel's receive
time, on Linux); TLS streams go through it too, timed by the read; the thread ends when the streams do.
"""

import concurrent.futures
import contextlib
import json
import re
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest

import carico
from aiuti import VELOCE, letto_tutto
from fakeserver import chunk

TESTO = b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
FINE = [b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}\n\n',
        b'data: {"choices":[],"usage":{"completion_tokens":%d,"prompt_tokens":5}}\n\n', b"data: [DONE]\n\n"]
TESTA = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def a_tempo(pause, scritti=None, chiudi=True, testo=TESTO):
    """A scripted streamed answer: one text chunk (`testo`) after each pause of `pause` (seconds; None: wait
    until the client closes), then the end. Each text chunk's write times (perf_counter, just before and just
    after the write) go into `scritti`. With `chiudi` False the connection stays open after [DONE], without
    the last chunk."""
    def handler(h, _corpo):
        h.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tempi = []
        try:
            h.wfile.write(TESTA)
            h.wfile.flush()
            for pausa in pause:
                if pausa is None:
                    h.connection.recv(1)  # until the client gives up and closes
                    return
                time.sleep(pausa)
                prima = time.perf_counter()
                h.wfile.write(chunk(testo))
                h.wfile.flush()
                tempi.append((prima, time.perf_counter()))
            h.wfile.write(b"".join(chunk(e.replace(b"%d", b"%d" % len(pause))) for e in FINE))
            if chiudi:
                h.wfile.write(chunk(b""))
            h.wfile.flush()
            if not chiudi:
                h.connection.recv(1)
        except OSError:  # the client closed first
            pass
        finally:
            if scritti is not None:
                scritti.append(tempi)
            h.close_connection = True
    return handler


def per_richiesta(*handler):
    """The n-th request that arrives gets the n-th handler."""
    coda, lock = list(handler), threading.Lock()

    def smista(h, corpo):
        with lock:
            scelto = coda.pop(0)
        scelto(h, corpo)
    return smista


def test_ogni_lettura_e_del_lettore_dei_flussi(fake, carica, monkeypatch, tmp_path):
    """Six streams at once: every read of their sockets is made by one thread, the reader, none by the
    workers; and every chunk is there."""
    letture = []
    originale = carico.LettoreFlussi._leggi

    def contata(lettore, *argomenti):
        letture.append(threading.current_thread().name)
        return originale(lettore, *argomenti)

    monkeypatch.setattr(carico.LettoreFlussi, "_leggi", contata)
    server = fake(n_slot=6, s_per_token=0.005)
    rc, out, err = carica(server.url, "--stream", "--richieste", "6", "--parallele", "6", "--token", "8",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    assert set(letture) == {"flussi"}, set(letture)
    richieste = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert [len(r["chunk_s"]) for r in richieste] == [8] * 6


def test_un_flusso_fermo_non_ferma_gli_altri(fake, carica, tmp_path):
    """Four streams on the one reader; the first stalls 0.5 s after its first token. The other three
    keep their 20 ms rhythm meanwhile and end long before it."""
    fermo = [0.0, 0.5, 0.02, 0.02]
    scorre = [0.0] + [0.02] * 5
    server = fake(override={"/v1/chat/completions": per_richiesta(
        a_tempo(fermo), a_tempo(scorre), a_tempo(scorre), a_tempo(scorre))})
    rc, out, err = carica(server.url, "--stream", "--richieste", "4", "--parallele", "4",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    richieste = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    lento = max(richieste, key=lambda r: r["latenza_s"])
    altri = [r for r in richieste if r is not lento]
    assert len(lento["chunk_s"]) == 4 and lento["chunk_s"][1] - lento["chunk_s"][0] >= 0.4, lento
    for r in altri:
        assert len(r["chunk_s"]) == 6, r
        assert r["inizio_s"] + r["latenza_s"] < lento["inizio_s"] + lento["chunk_s"][1], (r, lento)
        assert max(b - a for a, b in zip(r["chunk_s"], r["chunk_s"][1:])) < 0.25, r  # never waited for the stalled one


def test_scadenza_di_un_flusso_mentre_gli_altri_scorrono(fake, carica, tmp_path):
    """One stream stops after its first token and never goes on; --timeout 1: it fails at 1 s, said as
    an answer not complete, while the other two, flowing meanwhile, are whole. The run ends with it."""
    scorre = [0.0] + [0.05] * 9
    server = fake(override={"/v1/chat/completions": per_richiesta(
        a_tempo([0.0, None]), a_tempo(scorre), a_tempo(scorre))})
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--stream", "--richieste", "3", "--parallele", "3", "--timeout", "1",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    durata = time.monotonic() - inizio
    assert rc == 1, out + err
    richieste = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    fallite = [r for r in richieste if r["errore"]]
    assert [r["errore"] for r in fallite] == ["risposta non completa entro 1 s"], richieste
    assert 0.95 <= fallite[0]["latenza_s"] < 2.0, fallite
    assert sorted(len(r["chunk_s"]) for r in richieste if not r["errore"]) == [10, 10]
    assert durata < 4, durata


def test_done_su_una_connessione_che_resta_aperta(fake, carica):
    """A server that sends [DONE] and then neither ends the body nor closes: the answer is whole at
    [DONE], not when --timeout runs out."""
    server = fake(override={"/v1/chat/completions": a_tempo([0.0, 0.01, 0.01], chiudi=False)})
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--timeout", "20", *VELOCE)
    assert rc == 0, out + err
    assert re.match(r"  req 0: +0\.\d\d s +3 token", out.splitlines()[1]), out
    assert time.monotonic() - inizio < 10


def done_diviso(h, _corpo):
    """[DONE] cut between two writes 50 ms apart, and the connection kept open after it (no last chunk)."""
    h.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        h.wfile.write(TESTA + chunk(TESTO) + chunk(TESTO))
        h.wfile.flush()
        fine = b"".join(chunk(e.replace(b"%d", b"2")) for e in FINE)
        taglio = fine.index(b"[DONE]") + 3
        h.wfile.write(fine[:taglio])
        h.wfile.flush()
        time.sleep(0.05)
        h.wfile.write(fine[taglio:])
        h.wfile.flush()
        h.connection.recv(1)  # until the client closes
    except OSError:
        pass
    finally:
        h.close_connection = True


def test_done_tagliato_fra_due_letture_su_una_connessione_aperta(fake, carica):
    """The end of a stream whose [DONE] comes in two reads, on a connection the server keeps open: seen at the
    second read, not when --timeout runs out (the tail of [DONE] is a read too short to tell)."""
    server = fake(override={"/v1/chat/completions": done_diviso})
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--timeout", "5", *VELOCE)
    assert rc == 0 and re.search(r"^  req 0: +[\d.]+ s +2 token", out, re.M), out + err
    assert time.monotonic() - inizio < 4


def test_nessuna_cornice_mentre_il_flusso_scorre(fake, carica, monkeypatch, tmp_path):
    """While a stream flows the reader only keeps its reads: the framing, the stamps and the JSON wait until
    a read may have ended it. Ten chunks 30 ms apart: framed at the headers and at the end, not a read at a time."""
    inquadrate, originale = [], carico.Flusso.inquadra

    def contata(flusso, *scade):
        inquadrate.append(len(flusso.letture))
        return originale(flusso, *scade)

    monkeypatch.setattr(carico.Flusso, "inquadra", contata)
    server = fake(override={"/v1/chat/completions": a_tempo([0.03] * 10)})
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    (richiesta,) = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert len(richiesta["chunk_s"]) == 10 and richiesta["chunk_s"][-1] - richiesta["chunk_s"][0] >= 0.25, richiesta
    assert len(inquadrate) <= 3 and sum(inquadrate) >= 3 * 4, inquadrate  # reads framed together (3 entries a read)


@pytest.mark.parametrize("chiude", [True, False], ids=["con-l-ultimo-chunk", "aperta-dopo-done"])
def test_la_fine_di_una_risposta_lunga_non_ferma_il_lettore(fake, carica, monkeypatch, tmp_path, chiude):
    """A long answer that ends while another streams: framed and parsed a slice at a time (FETTA), the reader
    reads the other stream between the slices. 20,000 chunks in one go (in one piece, some 0.2-0.5 s of work
    for the reader) while the other's chunks come 20 ms apart: each of those with its own time, none two to a
    read (they would share the later one's time), and the long one's work done in many slices. Also when its
    end is only [DONE], on a connection left open: [DONE] looked for in the body's tail, not in all of it."""
    fette, originale = [], carico.Flusso.inquadra
    def a_fette(flusso, *scade):  # the framing of a stream's end, a slice (a deadline) at a time
        fette.extend(scade)
        return originale(flusso, *scade)

    monkeypatch.setattr(carico.Flusso, "inquadra", a_fette)
    n = 20000
    lunga = TESTA + b"".join([chunk(TESTO)] * n + [chunk(e.replace(b"%d", b"%d" % n)) for e in FINE]
                             + [chunk(b"")] * chiude)
    scritti, breve = [], a_tempo([0.1] + [0.02] * 30)

    def risponde(h, corpo):
        if json.loads(corpo)["messages"][-1]["content"] != carico.prompt_per(0):
            return breve(h, corpo)
        time.sleep(0.3)  # the other stream is flowing by then
        h.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        h.wfile.write(lunga)
        h.wfile.flush()
        if not chiude:
            with contextlib.suppress(OSError):
                h.connection.recv(1)  # until the client closes

    server = fake(override={"/v1/chat/completions": risponde})
    # On a shared machine a busy core may hold any read now and then; the defect guarded against (the reader held
    # for the whole framing) merges chunks in every run. Up to three runs: one with none merged is enough.
    for prova in range(3):
        fette.clear()
        rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--parallele", "2", "--json",
                              str(tmp_path / f"r{prova}.json"), *VELOCE)
        assert rc == 0, out + err
        lunga_, breve_ = json.loads((tmp_path / f"r{prova}.json").read_text())["prove"][0]["richieste"]
        assert len(lunga_["chunk_s"]) == n and len(breve_["chunk_s"]) == 31, (lunga_["token"], breve_)
        assert lunga_["chunk_s"][-1] < breve_["chunk_s"][-1], "the long answer ends while the other streams"
        assert len(fette) >= 5, fette  # the long one's framing in slices (its 1.8 MB come in reads of up to 64 KB)
        intervalli = [b - a for a, b in zip(breve_["chunk_s"], breve_["chunk_s"][1:])]
        if min(intervalli) > 0.005:
            break
    assert min(intervalli) > 0.005, intervalli  # 20 ms apart: none read together with the next


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's receive time is Linux's")
def test_le_letture_dei_pezzi_per_la_via_breve(fake, carica, monkeypatch, tmp_path):
    """A chunked body on a socket the kernel stamps: once the headers are read, each chunk's read goes the short
    way (kept, nothing else), not through leggi_con_tempo and Flusso.letto; and every chunk is there."""
    generali = []
    originale = carico.leggi_con_tempo
    monkeypatch.setattr(carico, "leggi_con_tempo", lambda flusso: generali.append(1) or originale(flusso))
    server = fake(override={"/v1/chat/completions": a_tempo([0.02] * 8)})
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    (richiesta,) = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert len(richiesta["chunk_s"]) == 8 and len(generali) <= 2, (richiesta, generali)  # the headers' read(s)


@pytest.mark.parametrize("testo", [b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\r\n\r\n',
                                   b'data: {"choices":[{"index":0,"delta":{"content":"[DONE]"}}]}\n\n'],
                         ids=["eventi-chiusi-da-crlf", "done-nel-testo"])
def test_letture_che_sembrano_la_fine(fake, carica, tmp_path, testo):
    """Reads that look like an answer's end and are not: events closed by CRLF (each read then ends as the
    last chunk does), a token whose text is "[DONE]". Framed, the answer is still open: read on, every chunk
    counted, each with its own time."""
    server = fake(override={"/v1/chat/completions": a_tempo([0.02] * 6, testo=testo)})
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    (richiesta,) = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert len(richiesta["chunk_s"]) == 6 and richiesta["chunk_s"][-1] - richiesta["chunk_s"][0] >= 0.08, richiesta


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's receive time is Linux's")
def test_un_lettore_in_ritardo_non_sposta_i_tempi(fake, monkeypatch):
    """Two streams, a token every 250 ms each, both at about the same time; the one reader of both is made
    100 ms late at every third read (as a reader waiting for the interpreter's lock is): the other stream's
    chunk waits in the kernel, and the next ones are 150 ms away (a loaded machine would have to add that much
    to bring two chunks in one read, and give them one time). Every chunk's time is when the fake wrote it all
    the same: the kernel's stamp, between the fake's clock just before and just after the write, not the late
    read's time."""
    from test_flussi import coppia_tcp

    # Linux turns stamping on for the whole system a moment after the first socket asks, and off a moment
    # after the last one closes: this pair keeps it on until the test ends.
    a, b = coppia_tcp()
    carico.stampi_del_kernel(a)
    for _ in range(200):
        b.sendall(b"x")
        if a.recvmsg(1, socket.CMSG_SPACE(16))[1]:
            break
        time.sleep(0.01)
    letture, originale = [], carico.forse_la_fine

    def in_ritardo(dati):  # called by the reader at every read of a chunked body, right after the read
        letture.append(time.perf_counter())
        if len(letture) % 3 == 0:
            time.sleep(0.1)
        return originale(dati)

    monkeypatch.setattr(carico, "forse_la_fine", in_ritardo)
    scritti = []
    server = fake(override={"/v1/chat/completions": a_tempo([0.0] + [0.25] * 3, scritti)})
    client = carico.Client(server.url)
    domanda = carico.domanda_chat("ciao", carico.Piano()) | {"stream": True}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        risultati = list(pool.map(lambda i: carico.ricevi_flusso(client, i, domanda, 5.0, 0.0), range(2)))
    assert len(letture) >= 6, letture  # some reads were late...
    visti = [[r.inizio + c for c in carico.oltre(r).chunk_s] for r in risultati]
    assert [len(v) for v in visti] == [len(tempi) for tempi in scritti] == [4, 4]

    def dentro(flusso, tempi):  # give or take 2 ms of the clocks' conversion
        return all(prima - 0.002 <= v <= dopo + 0.002 for v, (prima, dopo) in zip(flusso, tempi))
    try:  # ... and no chunk's time is the read's: each within its write, for one handler or the other
        assert (dentro(visti[0], scritti[0]) and dentro(visti[1], scritti[1])) or (
            dentro(visti[0], scritti[1]) and dentro(visti[1], scritti[0])), (visti, scritti)
    finally:
        a.close()
        b.close()


def test_i_flussi_in_https(tmp_path):
    """TLS: no kernel stamp (the bytes are decrypted in user space), the time of the read instead; the
    same reader, the same answer. Three tokens, then 80 ms, then three more: two reads, two times."""
    chiave, certificato = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(chiave), "-out", str(certificato), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    contesto = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    contesto.load_cert_chain(str(certificato), str(chiave))
    ascolto = socket.socket()
    ascolto.bind(("127.0.0.1", 0))
    ascolto.listen(1)

    def servi():
        conn, _ = ascolto.accept()
        with contesto.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)
            tls.sendall(TESTA + chunk(TESTO) * 3)
            time.sleep(0.08)
            tls.sendall(chunk(TESTO) * 3 + b"".join(chunk(e.replace(b"%d", b"6")) for e in FINE) + chunk(b""))

    servitore = threading.Thread(target=servi)
    servitore.start()
    try:
        client = carico.Client(f"https://127.0.0.1:{ascolto.getsockname()[1]}")
        client.tls = ssl.create_default_context(cafile=str(certificato))
        r = carico.ricevi_flusso(client, 0, carico.domanda_chat("ciao", carico.Piano()) | {"stream": True}, 5.0, 0.0)
    finally:
        servitore.join(5)
        ascolto.close()
    c = carico.oltre(r).chunk_s
    assert (r.errore, r.token, len(c)) == (None, 6, 6), r
    assert c[0] == c[1] == c[2] < c[3] == c[4] == c[5] and r.latenza >= 0.08, c  # each group at its read's time


def test_il_lettore_finisce_con_i_flussi(fake, carica, monkeypatch):
    """The reader's thread starts with the first stream and ends after the last (here after 0.05 s idle):
    none is left behind a run."""
    monkeypatch.setattr(carico.LettoreFlussi, "RIPOSO", 0.05)
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--token", "4", *VELOCE)
    assert rc == 0, out + err
    limite = time.monotonic() + 5
    while any(t.name == "flussi" for t in threading.enumerate()) and time.monotonic() < limite:
        time.sleep(0.01)
    assert not any(t.name == "flussi" for t in threading.enumerate())


def test_gli_eventi_letti_tutti_insieme_come_uno_alla_volta():
    """The events' JSON is parsed in one call for the whole stream: what one event at a time would say,
    whatever they hold. `null` is JSON and skipped; `1,2` is not one JSON value (an array of the whole
    stream would take it as two); an error event is said before a later event that is not JSON."""
    from test_flussi import EVENTI

    def con(*altri):
        return [(1.0, b"".join(EVENTI[:2] + list(altri) + EVENTI[2:]))]

    dati, tempi, _ = letto_tutto(con(b"data: null\n\n"))
    assert dati["choices"][0]["message"]["content"] == "caffè €!" and len(tempi) == 3
    with pytest.raises(carico.ErroreNelFlusso, match="^evento non JSON nel flusso$"):
        letto_tutto(con(b"data: 1,2\n\n"))
    with pytest.raises(carico.ErroreNelFlusso, match="^evento non JSON nel flusso$"):
        letto_tutto(con(b'data: {"a": "\xff"}\n\n'))
    errore = b'data: {"error":{"code":500,"message":"finito","type":"server_error"}}\n\n'
    with pytest.raises(carico.ErroreNelFlusso) as e:
        letto_tutto(con(errore, b"data: {\n\n"))
    assert "finito" in str(e.value)


def test_la_cornice_a_pezzi_tagliata_ovunque():
    """The chunked framing undone by the reader, with chunks that split the events (7 bytes each), and the
    answer cut into two reads at every byte, headers included: the same body each time, each piece with the
    time of its read; the end known at the `data: [DONE]` line, or at the last chunk."""
    from test_flussi import FLUSSO

    corpo = b"".join(chunk(FLUSSO[i:i + 7]) for i in range(0, len(FLUSSO), 7)) + chunk(b"")
    risposta = TESTA + corpo
    for taglio in range(1, len(risposta)):
        flusso = carico.Flusso(socket.socket(), 0.0)
        try:
            primo = flusso.arrivati(1.0, risposta[:taglio])
            davanti = flusso.corpo()
            assert primo == (b"data: [DONE]\n" in davanti), taglio  # a line counts once it has ended
            assert primo or flusso.arrivati(2.0, risposta[taglio:]), taglio
        finally:
            flusso.sock.close()
        assert flusso.status == 200 and FLUSSO.startswith(flusso.corpo()), taglio
        assert flusso.corpo() == (davanti if primo else FLUSSO), taglio
        assert b"".join(b for t, b in flusso.blocchi if t == 1.0) == davanti, taglio
        assert all(t == 2.0 for t, _ in flusso.blocchi[len([1 for t, _ in flusso.blocchi if t == 1.0]):]), taglio
        if taglio >= len(TESTA) + 4 + 7:  # past the first chunk's data: the first read gave it
            assert davanti, taglio


BREVE = {"solita": TESTA, "maiuscole": TESTA.replace(b"Transfer-Encoding: chunked", b"TRANSFER-ENCODING: Chunked")}
GENERALE = {"gzip, chunked": TESTA.replace(b"chunked", b"gzip, chunked"), "503": TESTA.replace(b"200 OK", b"503 Busy"),
            "HTTP/1.0": TESTA.replace(b"HTTP/1.1", b"HTTP/1.0"), "100 Continue": b"HTTP/1.1 100 Continue\r\n\r\n" + TESTA}


@pytest.mark.parametrize("testa", [*BREVE.values(), *GENERALE.values()], ids=[*BREVE, *GENERALE])
def test_la_prima_lettura_per_la_via_breve(testa):
    """A first read that brings the usual headers whole, on a socket the kernel stamps, takes them off at once
    and leaves the body to be framed with the later reads (a thousand streams start together); any other
    takes the general way. Cut into two reads at every byte: the same status, body and times as the general
    way gives."""
    from test_flussi import FLUSSO

    risposta = testa + b"".join(chunk(FLUSSO[i:i + 7]) for i in range(0, len(FLUSSO), 7)) + chunk(b"")
    for taglio in range(1, len(risposta)):
        breve, generale = carico.Flusso(socket.socket(), 0.0), carico.Flusso(socket.socket(), 0.0)
        breve.stampi = True
        try:
            breve.letto(1.0, b"", risposta[:taglio])
            per_la_breve = testa in BREVE.values() and taglio >= len(testa)  # (else framed at once: nothing kept)
            assert (breve.status, bool(breve.letture), breve.blocchi) == (
                200, taglio > len(testa), []) if per_la_breve else not breve.letture, taglio
            breve.letto(2.0, b"", risposta[taglio:])
            breve.inquadra()
            generale.arrivati(1.0, risposta[:taglio]) or generale.arrivati(2.0, risposta[taglio:])
        finally:
            breve.sock.close()
            generale.sock.close()
        assert (breve.status, breve.fine_trovata, breve.blocchi) == (generale.status, True, generale.blocchi), taglio


def test_una_lettura_un_pezzo_intero():
    """One whole chunk a read, as llama.cpp writes them: a size with an extension, CRLF inside the data, the
    last chunk on its own, each read's payload with its time; a size that is not hex is an error."""
    pezzi = [b"5\r\ndata:\r\n", b"A;x=1\r\n [1,\r\n2]\n\n\r\n", b"6\r\n\r\n\r\n\r\n\r\n", b"0\r\n\r\n"]
    uno, tutti = carico.Flusso(socket.socket(), 0.0), carico.Flusso(socket.socket(), 0.0)
    try:
        uno.arrivati(1.0, TESTA)
        finiti = [uno.arrivati(2.0 + i, p) for i, p in enumerate(pezzi)]
        assert tutti.arrivati(1.0, TESTA + b"".join(pezzi))
        assert finiti == [False, False, False, True] and uno.corpo() == tutti.corpo() == b"data: [1,\r\n2]\n\n\r\n\r\n\r\n"
        assert [t for t, _ in uno.blocchi] == [2.0, 3.0, 4.0]
    finally:
        uno.sock.close()
        tutti.sock.close()
    for sbagliato in (b"zz\r\nabc\r\n", b"5 \r\nabcde\r\n", b"-1\r\nabc\r\n"):
        flusso = carico.Flusso(socket.socket(), 0.0)
        try:
            flusso.arrivati(1.0, TESTA)
            if sbagliato.startswith(b"5 "):  # a size with a space after it is read as the general reader reads it
                flusso.arrivati(2.0, sbagliato)
                assert flusso.corpo() == b"abcde"
                continue
            with pytest.raises(carico.ErroreRete, match=r"^risposta HTTP non valida \(chunk\)$"):
                flusso.arrivati(2.0, sbagliato)
        finally:
            flusso.sock.close()


def test_ctrl_c_con_i_flussi_in_volo(fake):
    """Ctrl+C while two streams flow on the reader and two wait for a slot: what was measured is printed,
    the streams in flight are closed at once (the server sees them go), exit 130, no traceback. The first
    two answers end after 16 tokens; the later ones would take half a minute, so on a loaded machine Ctrl+C
    cannot come after they ended (it once did, with all six of 16 tokens: the server saw nothing go). Ctrl+C
    waits for carico's own end of the first two, not the server's: a loaded machine reads them late."""
    import signal

    from aiuti import CARICO

    arrivate, lucchetto = [], threading.Lock()

    def chat(h, corpo):
        body = json.loads(corpo)
        with lucchetto:
            arrivate.append(body)
            if len(arrivate) > 2:
                body["max_tokens"] = 2000
        return h.stream(body)

    server = fake(n_slot=2, s_per_token=0.02, override={"/v1/chat/completions": chat})
    proc = subprocess.Popen([sys.executable, CARICO, "--url", server.url, "--stream", "--richieste", "6",
                             "--parallele", "4", "--token", "16", *VELOCE], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    limite = time.monotonic() + 30
    while not (len(arrivate) == 6 and server.occupati() == 2) and time.monotonic() < limite:
        time.sleep(0.02)  # two done (their workers sent the last two: carico saw them end), two streaming
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert len(re.findall(r"^  req \d: +[\d.]+ s +16 token", out, re.M)) >= 2, out
    assert "non completata (interrotto)" in out and "tempo totale" in out, out
    limite = time.monotonic() + 5
    while (server.abbandonate == 0 or server.occupati()) and time.monotonic() < limite:
        time.sleep(0.02)
    assert server.abbandonate >= 1 and server.occupati() == 0


def test_flussi_al_ritmo_sullo_stesso_lettore(fake, carica, tmp_path):
    """--ritmo and --durata send streams by the clock, each sent by its worker and read by the one reader
    as it arrives: every stream whole, each with its chunks, TTFT before its end."""
    server = fake(n_slot=4, s_per_token=0.005)
    rc, out, err = carica(server.url, "--stream", "--ritmo", "20", "--arrivi", "costanti", "--durata", "0.5",
                          "--token", "6", "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    richieste = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert len(richieste) >= 5, richieste
    for r in richieste:
        assert (r["errore"], len(r["chunk_s"])) == (None, 6), r
        assert 0 < r["primo_token_s"] <= r["latenza_s"], r


def test_i_primi_flussi_partono_dal_lettore(fake, carica, monkeypatch, tmp_path):
    """The first --parallele requests are made ready before the clock and sent by the reader at the start,
    one after the other; those after them by their workers, as a slot frees. All timed from their send."""
    inviate = []
    originale = carico.LettoreFlussi._invia

    def contata(self, flusso):
        inviate.append(threading.current_thread().name)
        return originale(self, flusso)

    monkeypatch.setattr(carico.LettoreFlussi, "_invia", contata)
    server = fake(n_slot=4, s_per_token=0.005)
    rc, out, err = carica(server.url, "--stream", "--richieste", "10", "--parallele", "4", "--token", "4",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    assert inviate == ["flussi"] * 4
    richieste = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert [(r["errore"], len(r["chunk_s"])) for r in richieste] == [(None, 4)] * 10
    primi = sorted(r["inizio_s"] for r in richieste)[:4]
    assert 0 <= primi[0] and all(0 < r["primo_token_s"] <= r["latenza_s"] for r in richieste), richieste


@pytest.mark.parametrize("pieno", [BlockingIOError(11, "Resource temporarily unavailable"),
                                   ssl.SSLWantWriteError(3, "The operation did not complete (write)")],
                         ids=["BlockingIOError", "SSLWantWriteError"])
def test_una_richiesta_che_non_entra_in_una_sola_scrittura(fake, carica, monkeypatch, tmp_path, pieno):
    """At the start each request goes in one system call; one the socket takes only in part (larger than its
    buffer), or not at all yet (a TLS socket says so with SSLWantWriteError, and once failed so as an error
    of TLS), is sent whole all the same, within its deadline: the server reads every body whole, and every
    stream is timed."""
    originale, volte = socket.socket.send, []

    def in_parte(self, dati, *argomenti):
        if threading.current_thread().name != "flussi":
            return originale(self, dati, *argomenti)
        volte.append(len(dati))
        if len(volte) == 1:
            raise pieno
        return originale(self, dati[:len(dati) // 3], *argomenti)

    monkeypatch.setattr(socket.socket, "send", in_parte)
    corpi = []
    server = fake(n_slot=3, s_per_token=0.002, override={"/v1/chat/completions": lambda h, c: (
        corpi.append(json.loads(c)), h.stream(corpi[-1]))[1]})
    rc, out, err = carica(server.url, "--stream", "--richieste", "3", "--parallele", "3", "--token", "4",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    assert len(volte) == 3 and len(corpi) == 3 and all(c["stream"] for c in corpi), (volte, out)
    richieste = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert [(r["errore"], len(r["chunk_s"])) for r in richieste] == [(None, 4)] * 3


def test_dopo_un_ctrl_c_la_partenza_non_invia_nulla(fake):
    """A stream made ready before the start, when Ctrl+C came first: the reader sends nothing, and ends it as
    never sent (as the lab's path says such a request), its socket left as it was."""
    server = fake()
    client = carico.Client(server.url)
    sock = client._connetti(time.monotonic() + 5)
    flusso = carico.Flusso(sock, time.monotonic() + 5)
    flusso.richiesta, flusso.timeout = carico.richiesta_in_flusso(client, {"messages": [], "stream": True}), 5.0
    client.annullato.set()
    carico.oltre(client).flussi.segui(flusso)
    assert flusso.finito.wait(5)
    assert isinstance(flusso.eccezione, carico.NonInviata) and str(flusso.eccezione) == carico.NON_INVIATA
    assert flusso.inviata == 0.0 and flusso.richiesta and server.richieste_ricevute == []
    client.lascia(sock)


def test_ctrl_c_mentre_i_flussi_si_preparano(fake):
    """Ctrl+C while the first streams are made ready before the clock (two of four handed to the reader, the
    main thread waiting for the others): carico hung for good, its workers waiting for a start that never
    came. Now it ends as any run stopped before the clock: nothing sent, exit 130, within seconds."""
    from aiuti import CARICO

    server = fake(n_slot=4, s_per_token=0.002)
    codice = (f"import importlib.util, os, signal, sys\n"
              f"spec = importlib.util.spec_from_file_location('carico', {CARICO!r})\n"
              "carico = importlib.util.module_from_spec(spec); sys.modules['carico'] = carico; spec.loader.exec_module(carico)\n"
              "originale = carico.LettoreFlussi.segui\n"
              "def segui(self, flusso, partenza=None):\n"
              "    originale(self, flusso, partenza)\n"
              "    if partenza is not None and len(partenza.in_attesa) == 2:\n"
              "        os.kill(os.getpid(), signal.SIGINT)\n"
              "carico.LettoreFlussi.segui = segui\n"
              f"sys.exit(carico.main(['--url', {server.url!r}, '--stream', '--richieste', '4', '--parallele', '4']))\n")
    proc = subprocess.run([sys.executable, "-c", codice], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert [p for p, _ in server.richieste_ricevute if p == "/v1/chat/completions"] == [], proc.stdout


def test_connessioni_rifiutate_prima_della_partenza(fake, carica, monkeypatch):
    """The first streams cannot connect (refused, as by a server at its connection limit): they fail with
    the refusal at once, and the start does not wait for them (it used to wait --timeout-like seconds)."""
    server = fake(n_slot=2, s_per_token=0.002)
    originale = carico.Client._connetti

    def rifiuta_in_prova(self, scadenza):
        if self.sentinella.armata:  # only during the run: the checks before it connect as usual
            raise ConnectionRefusedError(111, "Connection refused")
        return originale(self, scadenza)

    monkeypatch.setattr(carico.Client, "_connetti", rifiuta_in_prova)
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--parallele", "2", *VELOCE)
    assert rc == 1, out + err
    assert time.monotonic() - inizio < carico.TIMEOUT_INFO / 2, out
    assert len(re.findall(r"^  req \d: .*errore: .*rifiutat", out, re.M)) == 2, out
