"""Faults a real server cannot stage on demand: scripted answers from the fake server."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import threading
import tracemalloc
import urllib.request

import pytest

import carico
from fakeserver import flusso_scritto, risposta_grezza
from aiuti import CARICO, FAKE, VELOCE, latenze, porta_libera, porta_piena, risponde, valore


def chat_rotta(handler_rotto, quale=1):
    """An override of the chat path: request number `quale` (known by its prompt) gets
    `handler_rotto`, the others a normal answer from the fake."""
    def handler(h, corpo):
        body = json.loads(corpo)
        if body["messages"][0]["content"] == carico.prompt_per(quale):
            return handler_rotto(h, corpo)
        h.send_json(*h.server.fake.completa(body))

    return handler


def chiudi_di_colpo(h, _corpo):
    """Connection reset: RST instead of an answer."""
    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    h.connection.close()
    h.close_connection = True


def appeso(h, _corpo):
    time.sleep(5)


GUASTI = [
    (risposta_grezza(500, b'{"error":{"code":500,"message":"boom","type":"server_error"}}', "application/json"),
     "errore: HTTP 500 server_error: boom"),
    (risposta_grezza(200, b"<html>non json</html>"), "errore: risposta non JSON dal server"),
    (risposta_grezza(200, b'{"choices": [', "application/json", lunghezza=500),
     "errore: risposta troncata: la connessione si è chiusa a metà"),
    (chiudi_di_colpo, "errore: connessione chiusa dal server prima della risposta"),
    (risposta_grezza(200, b'{"foo": 1}', "application/json"),
     "errore: risposta non valida: la risposta non è un completamento di chat (manca choices)"),
    (risposta_grezza(503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}',
                     "application/json"), "errore: HTTP 503 unavailable_error: Loading model"),
    (appeso, "errore: nessuna risposta entro 1 s"),
]


@pytest.mark.parametrize("rotto,atteso", GUASTI, ids=["500", "non-json", "troncata", "reset", "non-chat", "503", "timeout"])
def test_una_richiesta_guasta_sulla_sua_riga(fake, carica, rotto, atteso):
    server = fake(n_slot=4, s_per_token=0.003, override={"/v1/chat/completions": chat_rotta(rotto)})
    rc, out, err = carica(server.url, "--timeout", "1", *VELOCE)
    assert rc == 1, out + err
    righe = out.splitlines()
    assert righe[2].startswith("  req 1: ") and righe[2].endswith(atteso), righe[2]
    assert len(latenze(out)) == 3
    assert "richieste fallite: 1 su 4 (il riepilogo conta solo le 3 riuscite)" in out
    assert "(96 token generati)" in out
    assert "Traceback" not in err


def test_redirect_non_seguito(fake, carica):
    altro = fake()

    def handler(h, corpo):
        h.send_response(307)
        h.send_header("Location", altro.url + "/v1/chat/completions")
        h.send_header("Content-Length", "0")
        h.end_headers()

    server = fake(n_slot=2, override={"/v1/chat/completions": handler})
    rc, out, _ = carica(server.url, "--richieste", "2", *VELOCE)
    assert rc == 1
    assert "errore: HTTP 307" in out
    assert altro.bodies == [] and altro.richieste_ricevute == []


def test_host_sconosciuto(carica):
    rc, out, err = carica("http://host-che-non-esiste.invalid:8080")
    assert rc == 1 and out == ""
    assert "host sconosciuto" in err and "host-che-non-esiste.invalid" in err


def test_host_che_non_accetta_la_connessione(carica):
    """A listening socket whose backlog is full: the connect never completes."""
    with porta_piena() as porta:
        inizio = time.monotonic()
        rc, out, err = carica(f"http://127.0.0.1:{porta}", "--timeout", "1")
        assert rc == 1 and out == ""
        assert "nessuna risposta entro 1 s" in err
        assert time.monotonic() - inizio < 8


@pytest.mark.parametrize("richieste,parallele", [(1, 1), (1, 8), (3, 10)])
def test_parallele_oltre_le_richieste(fake, carica, richieste, parallele):
    server = fake(n_slot=4, s_per_token=0.01)
    rc, out, _ = carica(server.url, "--richieste", str(richieste), "--parallele", str(parallele), "--token", "20",
                        *VELOCE)
    assert rc == 0
    assert len(latenze(out)) == richieste
    assert f"richieste={richieste} parallele={parallele} slot=4" in out
    assert valore(out, "picco slot occupati insieme") == str(richieste)


@pytest.mark.parametrize("dati,attesi", [
    ([{"id": 0, "is_processing": True}, {"id": 1, "is_processing": False}], 1),
    ([{"id": 0, "state": 1}, {"id": 1, "state": 0}, {"id": 2, "state": 1}], 2),  # older servers
    ([{"id": 0, "is_processing": True, "nuovo_campo": {"x": 1}}], 1),  # newer fields are ignored
    ({"slots": [{"id": 0, "is_processing": True}, {"id": 1, "is_processing": True}]}, 2),
    ({"id": 0, "n_ctx": 512, "is_processing": True}, 1),  # one slot as a bare object
    ([{"id": 0}], None), ({"stato": "ok"}, None), ("testo", None), (None, None), ([1, 2], None),
])
def test_slots_di_altre_versioni(dati, attesi):
    assert carico.conta_occupati(dati) == attesi


def test_slots_con_state_dal_server(fake, carica):
    server = fake(n_slot=2, s_per_token=0.01)

    def slots_vecchi(h, _corpo):
        vecchi = [{"id": s["id"], "n_ctx": s["n_ctx"], "state": int(s["is_processing"])} for s in server.json_slots()]
        h.send_json(200, vecchi)

    server.override["/slots"] = slots_vecchi
    rc, out, _ = carica(server.url, "--token", "20", *VELOCE)
    assert rc == 0
    assert out.splitlines()[0] == "server: 2 slot, n_ctx per slot = 1024"
    assert valore(out, "picco slot occupati insieme") == "2"


def test_grande_carico_memoria_limitata_e_campionamento_regolare():
    """The fake in its own process: the memory traced is the client's alone, and the fake's 1000 answers take
    no CPU from tracemalloc nor the GIL from the workers (in-process, the test cost twice the CPU)."""
    porta = porta_libera()
    url = f"http://127.0.0.1:{porta}"
    server = subprocess.Popen([sys.executable, FAKE, "serve", "--port", str(porta), "-np", "64", "-c", str(64 * 512),
                               "--s-per-token", "0"], stdout=subprocess.DEVNULL)
    try:
        limite = time.monotonic() + 30
        while not risponde(url) and time.monotonic() < limite:
            time.sleep(0.02)
        client = carico.Client(url)
        tracemalloc.start()
        try:
            esecuzione = carico.esegui_carico(client, carico.Piano(1000, 64, 1, 0.25, 60),
                                              carico.InfoServer(64, 512, True))
            _, picco_memoria = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    finally:
        server.terminate()
        server.wait()
    assert len(esecuzione.risultati) == 1000
    assert all(r.riuscita for r in esecuzione.risultati)
    assert picco_memoria < 50 * 1024 * 1024
    tempi = [c.t for c in esecuzione.campioni]
    assert len(tempi) >= 3, tempi
    # The readings went on while 64 workers were busy (their schedule: test_campionatore_a_orario_fisso;
    # here a loaded machine stretches the fake's answers).
    assert tempi == sorted(tempi) and tempi[-1] > tempi[0], tempi


def campiona_su_un_orologio_finto(durate):
    """The sampler at 0.25 s on a clock of the test's own, each reading taking the next of `durate` (s):
    (the waits between readings, the readings' times)."""
    orologio, letture, attese = [0.0], iter(durate), []

    class ClientLento:
        timeout_info = 10.0

        def chiama(self, metodo, percorso, timeout=None):
            orologio[0] += next(letture)
            return carico.Risposta(200, b'[{"id": 0, "n_ctx": 512, "is_processing": true}]')

    class Fermo:  # the sampler's stop event, on the same clock: stops after the last reading
        def wait(self, secondi):
            attese.append(round(secondi, 6))
            orologio[0] += secondi
            return len(attese) == len(durate)

    campionatore = carico.Campionatore(ClientLento(), 0.25, carico.InfoServer(1, 512, True), timer=lambda: orologio[0])
    campionatore._stop = Fermo()
    campionatore._ciclo()
    assert all(c.occupati == 1 for c in campionatore.campioni)
    return attese, [c.t for c in campionatore.campioni]


@pytest.mark.parametrize("durate, attese, tempi", [
    # a reading that takes 0.2 s of a period: a wait of 0.05 s, not 0.25 (a slow reading does not stretch the
    # period); one that takes longer than the period: no wait at all (it catches up, once)
    ([0.2, 0.0, 0.2, 0.0, 0.4, 0.0, 0.0, 0.0], [0.05, 0.25, 0.05, 0.25, 0.0, 0.1, 0.25, 0.25],
     [0.2, 0.25, 0.7, 0.75, 1.4, 1.4, 1.5, 1.75]),
    # a reading that takes four periods (a server stalled): one reading at once, then the schedule; the three
    # it missed are not made back to back against a server that just recovered
    ([0.0, 1.0, 0.0, 0.0, 0.0], [0.25, 0.0, 0.25, 0.25, 0.25], [0.0, 1.25, 1.25, 1.5, 1.75]),
], ids=["periodo-fisso", "dopo-una-lettura-lunga"])
def test_campionatore_a_orario_fisso(durate, attese, tempi):
    visti = campiona_su_un_orologio_finto(durate)
    assert visti[0] == attese and visti[1] == pytest.approx(tempi), visti


def test_un_errore_di_carico_non_e_colpa_del_server(fake, carica, monkeypatch):
    """A bug in carico.py while reading an answer says so, and never blames the server."""
    def rotta(*_):
        raise RuntimeError("bug di prova")

    monkeypatch.setattr(carico, "cifre_completamento", rotta)
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--richieste", "2", "--token", "2", *VELOCE)
    assert rc == 1
    assert out.count("errore: errore interno: RuntimeError: bug di prova") == 2
    assert "risposta non valida" not in out and "Traceback" not in err


def test_flusso_troncato_a_meta(fake, carica):
    """A chunked stream whose connection closes before the last chunk."""
    tronca = flusso_scritto(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n')
    server = fake(override={"/v1/chat/completions": tronca})
    rc, out, _ = carica(server.url, "--stream", "--richieste", "1", *VELOCE)
    assert rc == 1
    assert "  req 0: " in out and out.splitlines()[1].endswith(
        "errore: il server ha interrotto la risposta dopo 1 chunk (nessun finish_reason)")


def test_il_nome_dell_host_si_cerca_una_volta(fake, monkeypatch):
    """A name is looked up once per client, not once per request: a slow resolver must not slow the run."""
    server = fake()
    cercati = []
    originale = socket.getaddrinfo

    def registra(host, *args, **kw):
        cercati.append(host)
        return originale(host, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", registra)
    client = carico.Client(server.url.replace("127.0.0.1", "localhost"))
    for _ in range(3):
        assert client.chiama("GET", "/health").status == 200
    assert cercati.count("localhost") == 1
    assert {h["Host"] for _, h in server.richieste_ricevute} == {server.url.replace("http://127.0.0.1", "localhost")}


def test_https_verso_un_server_in_chiaro(fake, carica):
    """https:// against a server that speaks plain http (as llama serve does by default): the error says so,
    and does not tell to start a server that is running."""
    server = fake()
    inizio = time.monotonic()
    rc, out, err = carica(server.url.replace("http://", "https://"))
    assert rc == 1 and out == ""
    assert (f"carico.py: errore: su {server.url.replace('http://', 'https://')} risponde un server in http semplice, "
            f"non in https: usa --url {server.url}") in err.splitlines()
    assert "Avvia il server" not in err
    assert time.monotonic() - inizio < 8


def test_ctrl_c_durante_una_connessione_in_corso():
    """Ctrl+C while a connect hangs (a host whose backlog is full): carico.py ends within a second, not
    after --timeout."""
    with porta_piena() as porta:
        proc = subprocess.Popen([sys.executable, CARICO, "--url", f"http://127.0.0.1:{porta}", "--timeout", "60"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        limite = time.monotonic() + 30
        while not connette(proc.pid, porta) and time.monotonic() < limite:  # its first connect hangs
            time.sleep(0.02)
        inizio = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        durata = time.monotonic() - inizio
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert durata < 1.5, durata


def connette(pid, porta):
    """Whether process `pid` has a TCP connect in progress (SYN_SENT) to `porta` (Linux's /proc)."""
    try:
        cartella = f"/proc/{pid}/fd"
        socket_suoi = {os.readlink(f"{cartella}/{fd}")[8:-1] for fd in os.listdir(cartella)
                       if os.readlink(f"{cartella}/{fd}").startswith("socket:[")}
        with open(f"/proc/{pid}/net/tcp") as f:
            righe = [r.split() for r in f.readlines()[1:]]
    except OSError:  # not started yet, or gone
        return False
    return any(r[2].endswith(f":{porta:04X}") and r[3] == "02" and r[9] in socket_suoi for r in righe)


def test_il_cronometro_parte_alla_prima_richiesta(fake):
    """What comes before the first request is not in `tempo totale`: a /slots that takes 0.3 s to answer
    (read at the start of the run, beside the requests) delays no send."""
    def slots_lento(h, _corpo):
        time.sleep(0.3)
        h.send_json(200, h.server.fake.json_slots())

    server = fake(n_slot=4, s_per_token=0.001, override={"/slots": slots_lento})
    esecuzione = carico.esegui_carico(carico.Client(server.url), carico.Piano(4, 4, 2, 0.05, 30),
                                      carico.InfoServer(4, 512, True))
    assert min(r.inizio for r in esecuzione.risultati) < 0.1
    assert carico.riassumi(esecuzione).tempo_totale < max(r.latenza for r in esecuzione.risultati) + 0.1


def test_server_gia_al_lavoro_prima_della_prova(fake, carica):
    """A slot busy before the run (a request another client left generating): said on stderr, with how many;
    the run goes on, its lines unchanged, and --spiega's queue says whose requests it counts. On an idle server:
    nothing said."""
    server = fake(n_slot=1, s_per_token=0.002, metrics=True)
    rc, out, err = carica(server.url, "--richieste", "1", "--token", "2", "--spiega", *VELOCE)
    assert rc == 0 and "sta già lavorando" not in err and "aveva già" not in err + out, out + err
    assert "anche dal server stesso" not in err and "Il server ne contava " not in out, out + err
    def un_altro_client():
        richiesta = urllib.request.Request(server.url + "/v1/chat/completions", json.dumps(
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 250}).encode(),
            {"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(richiesta, timeout=30).read()
        except OSError:  # the fake closed at the end of the test
            pass

    def attendi_un_altro_client():
        threading.Thread(target=un_altro_client, daemon=True).start()
        limite = time.monotonic() + 10
        while server.occupati() == 0 and time.monotonic() < limite:
            time.sleep(0.01)

    attendi_un_altro_client()
    arrivate = len(server.arrivi)
    threading.Thread(target=un_altro_client, daemon=True).start()  # a second one, waiting for the slot
    limite = time.monotonic() + 10
    while len(server.arrivi) == arrivate and time.monotonic() < limite:
        time.sleep(0.01)
    rc, out, err = carica(server.url, "--richieste", "3", "--token", "20", "--spiega", *VELOCE)
    assert rc == 0 and out.startswith("server: 1 slot"), out
    assert ("carico.py: attenzione: il server sta già lavorando (1 slot su 1 occupati e 1 richiesta in coda prima "
            "della prova") in err, err
    # what the server's timings prove counts this run's requests alone: said, and the wait that was real
    assert ("il server aveva già 1 slot occupato prima della prova. I tempi del server (slot occupati insieme, "
            "coda, attesa in coda) contano solo le richieste di questa prova") in err, err
    frase = re.search(r"Il server aveva già altre richieste prima della prova, invisibili nei suoi tempi\. Dall'invio "
                      r"allo slot la più lenta, la req \d, ha aspettato ([\d.]+) s su [\d.]+ s di latenza", out)
    assert frase and float(frase.group(1)) > 0.2, out  # behind the foreign requests' 0.5 s each, not this run's own queue
    assert "la più sfortunata" not in out, out
    assert "Il server ne contava " in out and "di una prova interrotta" in out, out  # Little's law
    attendi_un_altro_client()
    rc, out, err = carica(server.url, "--richieste", "1", "--token", "10", "--spiega", *VELOCE)  # alone behind it
    assert rc == 0 and "Nessuna richiesta ha aspettato" not in out and "(--parallele 1)" not in out, out
    assert re.search(r"È partita una sola richiesta su 1 slot", out), out
    assert re.search(r"Dall'invio allo slot la più lenta, la req 0, ha aspettato [\d.]+ s", out), out
    server.close()


def test_un_server_che_prende_la_connessione_e_tace():
    """The tour: a port that accepts connections and never answers gave 10 s of silence, then the error. After
    2 s it says it is waiting, and for how long; then the same clear error (here after 2.5 s)."""
    import io

    ascolto = socket.socket()
    ascolto.bind(("127.0.0.1", 0))
    ascolto.listen(4)  # never accepted: the kernel takes the connection, nobody answers
    stderr = io.StringIO()
    try:
        client = carico.Client(f"http://127.0.0.1:{ascolto.getsockname()[1]}", timeout_info=2.5)
        with pytest.raises(carico.ErroreUtente, match="nessuna risposta entro 2.5 s"):
            carico.aspetta_pronto(client, 60, stderr)
    finally:
        ascolto.close()
    assert stderr.getvalue() == f"il server {client.base} non risponde ancora: attendo fino a 2.5 s...\n"


def test_ctrl_c_mentre_si_avviano_i_lavoratori():
    """The tour: Ctrl+C while the pool's 200 workers were being started (before the clock) hung carico for
    good: the workers already started waited on the start's barrier, and the run's end on them. A Ctrl+C
    anywhere there breaks the barrier: every worker started returns at once."""
    import concurrent.futures

    vero = concurrent.futures.ThreadPoolExecutor(4)

    class Esecutore:  # the pool, with the Ctrl+C arriving at its third submit
        futuri: list = []

        def submit(self, funzione):
            if len(self.futuri) == 2:
                raise KeyboardInterrupt
            self.futuri.append(vero.submit(funzione))
            return self.futuri[-1]

    with pytest.raises(KeyboardInterrupt):
        carico.avvia_i_lavoratori(Esecutore(), 4)
    finiti, fermi = concurrent.futures.wait(Esecutore.futuri, timeout=5)
    vero.shutdown(wait=not fermi)
    assert not fermi and all(isinstance(f.exception(), threading.BrokenBarrierError) for f in finiti)


def test_ctrl_c_mentre_si_leggono_le_opzioni(monkeypatch, capsys):
    """The tour: Ctrl+C in the first half second (the flags and their files being read) printed a traceback
    ending in KeyboardInterrupt. Now as any Ctrl+C: one line, exit 130."""
    def interrotta(argv):
        raise KeyboardInterrupt

    monkeypatch.setattr(carico, "analizza_argomenti", interrotta)
    assert carico.main(["--richieste", "4"]) == 130
    assert capsys.readouterr().err == "carico.py: interrotto\n"


def test_la_coda_di_un_altro_client_detta(fake, carica):
    """The tour: 2 requests on 2 slots printed 'picco richieste in coda (requests_deferred)=4', another client's
    queue, as if it were this run's. requests_deferred above what this run could queue is said; a run that
    could queue so many says nothing."""
    server = fake(n_slot=2, metrics=True, s_per_token=0.01)
    vera = server.testo_metrics
    server.testo_metrics = lambda: vera().replace("llamacpp:requests_deferred 0", "llamacpp:requests_deferred 4")
    rc, out, err = carica(server.url, "--richieste", "2", "--parallele", "2", "--token", "20", "--intervallo", "0.05")
    assert rc == 0 and "picco richieste in coda (requests_deferred)=4" in out, out
    assert ("requests_deferred ha visto 4 richieste in coda, questa prova al più 0: le altre erano di un altro "
            "client") in err, err
    rc, out, err = carica(server.url, "--richieste", "6", "--parallele", "6", "--token", "20", "--intervallo", "0.05")
    assert rc == 0 and "requests_deferred ha visto" not in err, err
