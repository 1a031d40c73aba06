"""--stream: a stream is whole only when the server says why it ended, and it is read as it arrived.

The fake plays the faults measured on other servers (a stream ended early with [DONE] and no
finish_reason; streams without usage), and scripted handlers cut the bytes of a stream where a reader
can go wrong (an event, a `data:` line or a UTF-8 character split across reads, one byte at a time).
"""

import json
import re
import socket
import statistics
import sys
import time

import pytest

import carico
from aiuti import VELOCE, letto_tutto

INTERROTTA = "errore: il server ha interrotto la risposta dopo 4 chunk (nessun finish_reason)"


# A stream the server cut is a failure #########################################################

def test_flusso_chiuso_con_done_senza_finish_reason_e_fallito(fake, carica, tmp_path):
    """As llama-cpp-python ends a stream when another request waits: role chunk, three tokens, [DONE].
    Every such request is a failure with its own reason, counted apart, in neither latency nor throughput."""
    server = fake(n_slot=2, s_per_token=0.002, flusso_interrotto_dopo=3)
    rc, out, err = carica(server.url, "--stream", "--dettagli", "--richieste", "4", "--token", "8",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 1, out + err
    righe = out.splitlines()
    assert [r.split(" s ", 1)[1].strip() for r in righe[1:5]] == [INTERROTTA] * 4, out
    assert "richieste fallite: 4 su 4 (nessuna riuscita: niente da riassumere)" in righe
    assert ("  di cui interrotte dal server a metà risposta: 4 (nessun chunk con finish_reason: fuori da latenze "
            "e throughput)") in righe
    assert "tempo totale" in out and "latenza media n/d, max n/d" in out
    assert "  fallite per tipo: 4 il server ha interrotto la risposta" in righe
    prova = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    assert (prova["vllm"]["completed"], prova["vllm"]["failed"]) == (0, 4)
    assert prova["riepilogo"]["interrotte"] == 4 and prova["riepilogo"]["token"] is None


def test_flussi_interrotti_fuori_dalle_latenze(fake, carica, tmp_path):
    """Every other request cut after 3 of 8 tokens (one at a time, so the fake's setting can flip between
    them): the summary's latencies are those of the whole answers only, the cut ones counted apart."""
    server = fake(n_slot=1, s_per_token=0.01)
    tagli = iter([None, 3] * 2)

    def a_volte_tronca(h, corpo):
        server.config.flusso_interrotto_dopo = next(tagli)
        h.stream(json.loads(corpo))

    server.override["/v1/chat/completions"] = a_volte_tronca
    rc, out, err = carica(server.url, "--stream", "--richieste", "4", "--parallele", "1", "--token", "8",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 1, out + err
    prova = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    intere = [r for r in prova["richieste"] if r["errore"] is None]
    assert [r["indice"] for r in intere] == [0, 2]
    assert [r["errore"] for r in prova["richieste"] if r["indice"] in (1, 3)] == [INTERROTTA[len("errore: "):]] * 2
    s = prova["riepilogo"]
    assert s["latenza_media"] == pytest.approx(statistics.mean(r["latenza_s"] for r in intere))
    assert s["token"] == 16 and s["interrotte"] == 2
    assert "richieste fallite: 2 su 4 (il riepilogo conta solo le 2 riuscite)" in out


def test_flusso_chiuso_senza_finish_reason_ne_done(fake, carica):
    """The connection closed after two chunks with text, before any finish_reason: the same failure."""
    from fakeserver import flusso_scritto

    eventi = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'] * 2
    server = fake(override={"/v1/chat/completions": flusso_scritto(*eventi, finito=True)})
    rc, out, _ = carica(server.url, "--stream", "--richieste", "1", *VELOCE)
    assert rc == 1
    assert out.splitlines()[1].endswith("errore: il server ha interrotto la risposta dopo 2 chunk (nessun finish_reason)")


# A stream without usage: tokens from its chunks, said as an estimate ###########################

def test_flusso_senza_usage_token_stimati(fake, carica, tmp_path):
    server = fake(n_slot=2, s_per_token=0.002, usage_nei_flussi=False)
    rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--token", "5",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    for riga in out.splitlines()[1:3]:
        assert re.match(r"  req \d: +[\d.]+ s +~5 token  \(n/d t/s nel proprio slot\)  primo token [\d.]+ s$", riga), out
    (throughput,) = [r for r in out.splitlines() if r.startswith("throughput aggregato")]
    assert re.match(r"throughput aggregato ~[\d.]+ token/s  \(~10 token generati: stima, un token per chunk con "
                    r"testo\)$", throughput), throughput
    assert ("I loro token (segnati ~) sono una stima: uno per chunk con testo, ma un chunk può portarne più "
            "d'uno") in err
    prova = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    assert [(r["token"], r["token_stimati"]) for r in prova["richieste"]] == [(5, True)] * 2
    assert prova["riepilogo"]["token_stimati"] is True


def test_flusso_con_usage_non_e_una_stima(fake, carica):
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--token", "5", *VELOCE)
    assert rc == 0, out + err
    assert "~" not in out and "stima" not in err
    assert "(10 token generati)" in out


# The stream read in blocks: wherever the bytes are cut, the same answer ########################

EVENTI = [b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}\n\n',
          b'data: {"choices":[{"index":0,"delta":{"content":"caff\xc3\xa8 "}}]}\n\n',  # two bytes for one character
          b'data: {"choices":[{"index":0,"delta":{"content":"\xe2\x82\xac"}}]}\n\n',  # three bytes for the euro sign
          b': keep-alive\n\n',
          b'data: {"choices":[{"index":0,"delta":{"content":"!"}}]}\r\n\r\n',  # CRLF endings are SSE too
          b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"length"}],"timings":{"predicted_n":3}}\n\n',
          b'data: {"choices":[],"usage":{"completion_tokens":3,"prompt_tokens":9}}\n\n',
          b"data: [DONE]\n\n"]
FLUSSO = b"".join(EVENTI)


def letto(blocchi):
    dati, tempi, fine = letto_tutto(blocchi)
    return dati["choices"][0], dati.get("usage"), tempi, fine


def test_ogni_chunk_col_suo_tempo_oltre_un_pezzo():
    """More events than one json.loads parses (PEZZO) and more than one slice's work: each chunk with the time
    of its own read, the text whole, the end's time the [DONE]'s."""
    n = 3 * carico.PEZZO + 5
    testo = [b'data: {"choices":[{"index":0,"delta":{"content":"%d "}}]}\n\n' % i for i in range(n)]
    blocchi = [(float(i), evento) for i, evento in enumerate(testo)] + [(float(n), b"".join(EVENTI[5:]))]
    scelta, usage, tempi, fine = letto(blocchi)
    assert tempi == [float(i) for i in range(n)] and fine == float(n)
    assert scelta["message"]["content"] == "".join(f"{i} " for i in range(n)) and usage["completion_tokens"] == 3


def test_il_done_cercato_nella_coda_del_corpo():
    """[DONE] without the last chunk (a connection the server keeps open): a whole `data: [DONE]` line is the
    end, the same bytes inside an event's text are not; and it is looked for in the body's last bytes, not in
    all of it (a long answer joined whole at its end held the reader): 100 times the body, not 100 times the
    time."""

    def tempo_del_done(n):
        a, b = socket.socketpair()
        with a, b:
            flusso = carico.Flusso(a, 0.0)
            flusso.blocchi = [(0.0, EVENTI[1])] * n + [(0.0, b'data: {"choices":[{"delta":{"content":"[DONE]"}}]}\n\n')]
            assert not flusso._fatto(flusso.blocchi[-1][1])  # the text "[DONE]" is not the end
            flusso.blocchi.append((0.0, b"data: [DONE]\n\n"))
            inizio = time.perf_counter()
            fatto = flusso._fatto(b"data: [DONE]\n\n")
            return fatto, time.perf_counter() - inizio

    assert tempo_del_done(3)[0] and tempo_del_done(100)[0]
    breve = min(tempo_del_done(1000)[1] for _ in range(5))
    lungo = min(tempo_del_done(100000)[1] for _ in range(5))
    assert lungo < 10 * breve, (breve, lungo)


def test_un_taglio_ovunque_nel_flusso():
    """Two reads, cut at every byte: inside an event, a `data:` line, a UTF-8 character, the usage event,
    [DONE]. The same answer each time; each chunk with text at the read that completed its line."""
    fine_righe = [FLUSSO.index(b"\n", FLUSSO.index(e)) + 1 for e in EVENTI[1:3] + EVENTI[4:5]]
    for taglio in range(1, len(FLUSSO)):
        scelta, usage, tempi, fine = letto([(1.0, FLUSSO[:taglio]), (2.0, FLUSSO[taglio:])])
        assert scelta == {"finish_reason": "length", "message": {"role": "assistant", "content": "caffè €!"}}, taglio
        assert usage == {"completion_tokens": 3, "prompt_tokens": 9}, taglio
        assert tempi == [1.0 if taglio >= f else 2.0 for f in fine_righe], taglio
        assert fine == (1.0 if taglio >= len(FLUSSO) - 1 else 2.0), taglio  # [DONE]'s line ends at its first "\n"


def test_un_byte_per_lettura():
    scelta, usage, tempi, _ = letto([(float(i), FLUSSO[i:i + 1]) for i in range(len(FLUSSO))])
    assert scelta["message"]["content"] == "caffè €!" and usage["completion_tokens"] == 3
    assert tempi == sorted(tempi) and len(tempi) == 3


def test_gli_eventi_di_una_lettura_hanno_il_suo_tempo():
    """Everything one read brought shares its time: two reads, two times, whatever they carried."""
    _, _, tempi, fine = letto([(5.0, FLUSSO[:len(b"".join(EVENTI[:3]))]), (7.0, FLUSSO[len(b"".join(EVENTI[:3])):])])
    assert tempi == [5.0, 5.0, 7.0] and fine == 7.0


def scritto_a_pezzi(pezzi, pausa=0.0):
    """A scripted handler that sends a whole streamed answer (status, headers, chunked body) as raw bytes,
    in the pieces given, each written on its own (with `pausa` s between them): where the reads fall."""
    import socket as _socket
    import time as _time

    def handler(h, _corpo):
        h.connection.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        for pezzo in pezzi:
            h.wfile.write(pezzo)
            h.wfile.flush()
            if pausa:
                _time.sleep(pausa)
        h.close_connection = True
    return handler


def risposta_a_pezzi(eventi, finito=True):
    from fakeserver import chunk

    return (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"".join(chunk(e) for e in eventi) + (chunk(b"") if finito else b""))


def test_un_server_che_manda_un_byte_alla_volta(fake, carica, tmp_path):
    """The whole answer, headers, chunk sizes and events, one byte a write: read right all the same."""
    corpo = risposta_a_pezzi(EVENTI)
    server = fake(override={"/v1/chat/completions": scritto_a_pezzi([corpo[i:i + 1] for i in range(len(corpo))])})
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--dettagli", "--json", str(tmp_path / "r.json"))
    assert rc == 0, out + err
    (r,) = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    assert (r["token"], r["finish_reason"], len(r["chunk_s"]), r["token_stimati"]) == (3, "length", 3, False)


def test_un_flusso_tagliato_a_meta_evento(fake, carica):
    """The connection closes in the middle of the third event's line: two whole events before it."""
    corpo = risposta_a_pezzi(EVENTI, finito=False)
    taglio = corpo.index(b"\\u20ac") if b"\\u20ac" in corpo else corpo.index(b"\xe2\x82\xac") + 1
    server = fake(override={"/v1/chat/completions": scritto_a_pezzi([corpo[:taglio]])})
    rc, out, _ = carica(server.url, "--stream", "--richieste", "1")
    assert rc == 1
    assert out.splitlines()[1].endswith("errore: il server ha interrotto la risposta dopo 2 chunk (nessun finish_reason)")


def test_una_scrittura_una_lettura_un_tempo(fake, carica, tmp_path):
    """Three events in one write, 60 ms later three more in another: the three of a read share its time
    exactly, and the gap between the writes is between the groups."""
    testo = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'] * 3
    fine = [b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n', b"data: [DONE]\n\n"]
    testa = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
    corpo = b"".join(testo) * 2 + b"".join(fine)
    server = fake(override={"/v1/chat/completions": scritto_a_pezzi(
        [testa % len(corpo) + b"".join(testo), b"".join(testo) + b"".join(fine)], pausa=0.06)})
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--json", str(tmp_path / "r.json"))
    assert rc == 0, out + err
    (r,) = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    c = r["chunk_s"]
    assert c[0] == c[1] == c[2] and c[3] == c[4] == c[5], c
    assert c[3] - c[2] >= 0.055, c
    assert r["latenza_s"] == c[5]  # the end came in the same read as the last chunk with text


def test_primo_token_dall_invio(fake, carica, tmp_path, monkeypatch):
    """A connection that takes 0.5 s to open (a slow network, a full accept queue): TTFT and latency
    are timed from the send, so neither holds that wait. Each answer takes a few ms; the bound, 0.4 s, leaves
    a loaded machine's hiccups room (0.2 s failed there) and stays below the wait."""
    server = fake(n_slot=1, s_per_token=0.001)
    originale = carico.Client._connetti

    def lenta(self, scadenza):
        if scadenza - time.monotonic() > carico.TIMEOUT_INFO:  # a chat request's: /health and /slots stay quick
            time.sleep(0.5)
        return originale(self, scadenza)

    monkeypatch.setattr(carico.Client, "_connetti", lenta)
    rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--parallele", "1", "--token", "4",
                          "--json", str(tmp_path / "r.json"))
    assert rc == 0, out + err
    prima, seconda = json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]
    # The first one's connection was opened before the clock; the second's inside the run, after the first.
    assert seconda["inizio_s"] >= prima["inizio_s"] + prima["latenza_s"] + 0.5, (prima, seconda)
    for r in (prima, seconda):  # (a late read brings the 4 chunks at once, with one time: TTFT = latency)
        assert r["primo_token_s"] <= r["latenza_s"] < 0.4, r


# The kernel's receive time ####################################################################

def coppia_tcp():
    ascolto = socket.socket()
    ascolto.bind(("127.0.0.1", 0))
    ascolto.listen(1)
    client = socket.create_connection(ascolto.getsockname())
    server, _ = ascolto.accept()
    ascolto.close()
    return client, server


@pytest.mark.parametrize("opzione", [carico.SO_TIMESTAMPNS, 987654], ids=["SO_TIMESTAMPNS", "opzione che manca"])
def test_il_tempo_e_quando_i_byte_sono_arrivati(monkeypatch, opzione):
    del_kernel = opzione == carico.SO_TIMESTAMPNS and sys.platform.startswith("linux")
    """A read made 100 ms after the bytes arrived (a thread that waited for the interpreter's lock) is
    given the arrival time on Linux; where the option is missing, cleanly, the time of the read."""
    monkeypatch.setattr(carico, "SO_TIMESTAMPNS", opzione)
    client, server = coppia_tcp()
    try:
        flusso = carico.Flusso(client, time.monotonic() + 5)
        if del_kernel:  # Linux turns stamping on for the whole system a moment later, from a work queue
            for _ in range(200):
                server.sendall(b"x")
                if client.recvmsg(1, socket.CMSG_SPACE(16))[1]:
                    break
                time.sleep(0.01)
        flusso.inviata = time.perf_counter()
        client.sendall(b"GET / HTTP/1.1\r\n\r\n")
        server.sendall(risposta_a_pezzi(EVENTI))
        arrivati = time.perf_counter()
        time.sleep(0.1)
        flusso.scarto = carico.scarto_orologi()
        flusso.letto(*carico.leggi_con_tempo(flusso))  # the headers' read: the body framed at once or kept
        flusso.inquadra()  # (as the reader frames the kept reads when it has a moment)
        assert flusso.status == 200
        ((t, _),) = flusso.blocchi[:1]
        letto = time.perf_counter()
        if del_kernel:
            # the stamp converted to perf_counter's clock, within quando_arrivati's own 1 ms (measured under load:
            # 0.5 ms before the send)
            assert flusso.inviata - 0.001 <= t <= arrivati + 0.02 and letto - t >= 0.09, (t - arrivati, letto - t)
        else:
            assert t >= arrivati + 0.09
    finally:
        client.close()
        server.close()


def test_un_flusso_che_non_risponde_mai(fake, carica):
    """A server that takes the request and never sends its headers: --timeout, said as no answer at all."""
    import threading

    fermo = threading.Event()
    server = fake(override={"/v1/chat/completions": lambda h, _c: fermo.wait(5)})
    try:
        rc, out, _ = carica(server.url, "--stream", "--richieste", "1", "--timeout", "0.5")
    finally:
        fermo.set()
    assert rc == 1
    assert re.match(r"  req 0: +0\.\d\d s   errore: nessuna risposta entro 0.5 s$", out.splitlines()[1]), out


# On the real server ###########################################################################

@pytest.mark.reale
def test_ogni_intervallo_sul_server_reale(llama, tmp_path):
    """-np 2, 4 streams of 24 tokens: from each request's first chunk to its last is the slot's own
    predicted_ms (each chunk timed when its bytes arrived; measured here: within 0.15 ms in 7 streams of
    8, the server's own sending jitter beyond that). Every stream carried a finish_reason: none failed
    as cut, and no token count is an estimate."""
    import subprocess

    from aiuti import CARICO

    server = llama(2)
    dati = tmp_path / "r.json"
    uscita = subprocess.run([sys.executable, CARICO, "--url", server.url, "--stream", "--token", "24",
                             "--json", str(dati)], capture_output=True, text=True, timeout=300)
    assert uscita.returncode == 0, uscita.stdout + uscita.stderr
    for r in json.loads(dati.read_text())["prove"][0]["richieste"]:
        chunk = r["chunk_s"]
        assert (r["finish_reason"], r["token_stimati"], len(chunk)) == ("length", False, 24), r
        assert abs((chunk[-1] - chunk[0]) - r["predicted_ms"] / 1000) < 0.005 + 0.02 * r["predicted_ms"] / 1000, r
