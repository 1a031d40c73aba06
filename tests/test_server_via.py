"""A server that goes away mid-run, and --durata kept as a promise under the --parallele cap.

The fake stages the stop as llama serve does it on Ctrl+C (measured, ../shared/llama-server-api.md):
its listener closes at once and the requests in flight are never answered, their connections left
open; or as a killed server: their connections reset. Every load shape goes through one mechanism
(carico.Sentinella): the run ends within seconds, exit 1, what was measured is reported and saved."""

import io
import json
import re
import signal
import subprocess
import sys
import time

import pytest

import carico
from aiuti import CARICO, VELOCE
from fakeserver import chiudi_di_colpo


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_server_fermato_con_richieste_in_volo(fake, carica, tmp_path, stream):
    """The listener closes while request 1 is in flight (never answered): /slots is refused, the run
    ends long before --timeout, request 1 is marked, 2 and 3 are never sent, the one answer is kept.
    The same with --stream, whose requests carico reads with its own reader, not http.client."""
    server = fake(n_slot=1, s_per_token=0.01, spegni_dopo=2)
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--richieste", "4", "--parallele", "1", "--token", "10", "--timeout", "60",
                          "--json", str(tmp_path / "p.json"), *(["--stream"] if stream else []), *VELOCE)
    durata = time.monotonic() - inizio
    assert rc == 1, out + err
    assert durata < 20, durata  # a third of --timeout: it used to wait all of it for request 1
    righe = out.splitlines()
    assert re.match(r"  req 0: +[\d.]+ s +10 token", righe[1]), out
    assert re.match(r"  req 1: +[\d.]+ s   errore: in volo quando il server ha smesso di rispondere: nessuna "
                    r"risposta$", righe[2]), out
    assert righe[3] == "  req 2-3: 2 richieste non inviate: il server non rispondeva più", out
    assert "richieste fallite: 1 su 4 (il riepilogo conta solo 1 riuscita)" in righe
    assert "richieste non completate: 2 su 4 (il server non rispondeva più)" in righe
    (andato,) = [r for r in righe if r.startswith("il server ha smesso di rispondere")]
    # A /slots reading the listener took just before it closed is closed, not refused (a loaded machine): said so.
    assert re.fullmatch(r"il server ha smesso di rispondere \(accertato a [\d.]+ s\): invii fermati, 1 richiesta in volo "
                        r"rimasta senza risposta\. Connessione (chiusa o )?rifiutata 3 volte di fila, su /slots, e la "
                        r"porta non è più in ascolto", andato), andato
    assert f"carico.py: errore: il server {server.url} ha smesso di rispondere durante la prova" in err
    assert "Traceback" not in err
    prova = json.loads((tmp_path / "p.json").read_text())["prove"][0]  # what was measured, saved
    assert [r["errore"] for r in prova["richieste"]] == [None, carico.IN_VOLO]
    assert prova["riepilogo"]["n_riuscite"] == 1 and prova["riepilogo"]["token"] == 10
    assert re.match(r"connessione (chiusa o )?rifiutata 3 volte", prova["server_andato"]["perche"])


def test_server_fermato_con_una_lettura_di_slots_in_volo(fake, carica):
    """The server stops while a /slots reading is in flight (it is never answered, as on the real server
    where it was measured: 10 s lost to that reading's timeout). The reading gives up after a few periods,
    the port is knocked at, and the run ends well within the 10 s a reading used to wait."""
    letture = []

    def slots_che_si_ferma(h, _corpo):
        fake_ = h.server.fake
        letture.append(1)
        if len(letture) == 5:
            fake_.spegni()
            fake_.chiuso.wait()  # never answered
            return None
        return h.send_json(200, fake_.json_slots())

    server = fake(n_slot=1, s_per_token=0.01, override={"/slots": slots_che_si_ferma})
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--richieste", "3", "--parallele", "1", "--token", "100", "--timeout", "60",
                          *VELOCE)
    assert time.monotonic() - inizio < 0.7 * carico.TIMEOUT_INFO, out
    assert rc == 1, out + err
    assert re.search(r"^il server ha smesso di rispondere \(accertato a [\d.]+ s\): invii fermati, 1 richiesta "
                     r"in volo", out, re.M), out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_server_ucciso_sotto_durata_non_martellato(fake, carica, stream):
    """Killed 3 requests into --durata 30 --parallele 1 (the closed loop): it used to send thousands of
    requests into the closed port, one line each, for the whole 30 s. Now: a few refusals, one line. /slots
    read every 0.5 s: at every 0.05 s, on a loaded machine the readings were refused 3 times in a row before the
    killed request's reset reached the client, and no request was ever refused."""
    server = fake(n_slot=1, s_per_token=0.002, spegni_dopo=3, spegni_uccidendo=True)
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--durata", "30", "--parallele", "1", "--token", "4", "--silenzioso",
                          *(["--stream"] if stream else []), "--intervallo", "0.5")
    assert time.monotonic() - inizio < 10, out  # a third of --durata
    assert rc == 1, out + err
    richieste = [r for r in out.splitlines() if r.startswith("  req ")]
    assert len(richieste) <= 4, out  # two answered, the one in flight (reset), one summary line of the refused
    assert sum("rifiutat" in r for r in richieste) <= 1, out
    for riga in [r for r in richieste if "rifiutat" in r]:
        n = int(re.search(r"(\d+) richieste rifiutate", riga).group(1)) if "richieste" in riga else 1
        assert 1 <= n <= carico.RIFIUTI_DI_FILA, riga
    assert re.search(r"in 30 s \(--durata\): inviate \d+ richieste, 2 con risposta", out), out
    assert "il server ha smesso di rispondere (accertato a " in out
    assert "Traceback" not in err


def test_un_server_vivo_che_chiude_le_connessioni_non_e_andato(fake, carica):
    """Every request reset by a server that still listens (and answers /slots): not gone, each request
    keeps its own line, no sentence about a server that stopped answering (the rule stays silent)."""
    server = fake(n_slot=4, override={"/v1/chat/completions": lambda h, _corpo: chiudi_di_colpo(h)})
    rc, out, err = carica(server.url, "--richieste", "6", "--parallele", "6", *VELOCE)
    assert rc == 1, out + err
    errori = [r for r in out.splitlines() if r.startswith("  req ")]
    assert len(errori) == 6 and all(r.endswith("errore: connessione chiusa dal server prima della risposta")
                                    for r in errori), out
    assert "smesso di rispondere" not in out + err
    assert "richieste fallite: 6 su 6" in out


def test_il_ritmo_si_ferma_quando_il_server_va_via(fake, carica):
    """--ritmo (the open loop) against a server stopped as with Ctrl+C: the schedule stops too."""
    server = fake(n_slot=2, s_per_token=0.01, spegni_dopo=3)
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--ritmo", "5", "--durata", "30", "--token", "50", "--arrivi", "costanti",
                          "--silenzioso", *VELOCE)
    assert time.monotonic() - inizio < 10, out
    assert rc == 1
    assert "il server ha smesso di rispondere (accertato a " in out
    assert len([r for r in out.splitlines() if r.startswith("  req ")]) <= 6, out


def test_la_riga_dal_vivo_lo_dice():
    """The live line says the server does not answer while it happens, then that sending stops."""
    sentinella = carico.Client("http://127.0.0.1:9").sentinella
    diretta = carico.Diretta(io.StringIO(), 1, sentinella)
    diretta.seguendo([], carico.Piano())
    campione = carico.Campione(2.5, None)
    assert "slot occupati n/d/1" in diretta.riga(campione, None)
    sentinella.di_fila = 2
    assert diretta.riga(campione, None) == "[0/4] il server non risponde (2 rifiuti di fila)  2.5 s"
    sentinella.andato = (0.0, "perché")
    assert diretta.riga(campione, None) == "[0/4] il server ha smesso di rispondere: fermo gli invii  2.5 s"


def test_riga_dal_vivo_in_un_terminale(fake, tmp_path):
    """carico.py on a pseudo-terminal: the live line, then its end, while the listener is closed."""
    pty = pytest.importorskip("pty")
    server = fake(n_slot=1, s_per_token=0.02, spegni_dopo=1)
    padrone, servo = pty.openpty()
    proc = subprocess.Popen([sys.executable, CARICO, "--url", server.url, "--richieste", "2", "--parallele", "1",
                             "--intervallo", "0.2"], stdout=subprocess.PIPE, stderr=servo)
    import os

    os.close(servo)
    visto = b""
    try:
        out, _ = proc.communicate(timeout=30)
    finally:
        os.set_blocking(padrone, False)
        try:
            while True:
                pezzo = os.read(padrone, 65536)
                if not pezzo:
                    break
                visto += pezzo
        except OSError:
            pass
        os.close(padrone)
    assert proc.returncode == 1, out
    assert "il server non risponde (" in visto.decode("utf-8", "replace"), visto


# --durata is a promise ##########################################################################

def test_durata_mantenuta_sotto_il_tetto(fake, carica):
    """--ritmo 10 --parallele 1 --durata 1 on a server that takes ~0.5 s a request: the cap holds most of
    the schedule. Sending stops at --durata (it used to go on for all 10, ~5 s), what the cap kept from
    leaving is counted (sent + not sent = the schedule's 10), and --spiega says who waited in the client."""
    server = fake(n_slot=1, s_per_token=0.02)
    rc, out, err = carica(server.url, "--ritmo", "10", "--arrivi", "costanti", "--parallele", "1", "--durata", "1",
                          "--token", "25", "--spiega", "--dettagli", "--silenzioso", *VELOCE)
    assert rc == 0, out + err
    m = re.search(r"in 1 s \(--durata\): inviate (\d+) richieste, \d+ con risposta\. (\d+) del programma non inviate "
                  r"\(il tetto di --parallele 1 era pieno fino alla fine\)\. L'ultimo invio a ([\d.]+) s", out)
    assert m, out
    inviate, non_inviate, ultimo = int(m.group(1)), int(m.group(2)), float(m.group(3))
    assert inviate + non_inviate == 10 and non_inviate >= 5, out
    assert ultimo < 1.0, out  # no send after --durata
    assert len(server.arrivi) == inviate
    assert "Nessuna richiesta ha aspettato" not in out  # the cap's wait is a wait
    assert re.search(r"\d+ richiest[ae] su \d+ (ha|hanno) aspettato nel client un posto \(tetto di "
                     r"--parallele: 1 in volo\)\. La req \d+ è partita [\d.]+ s dopo l'orario previsto\. Contando "
                     r"quell'attesa", out), out
    assert out.count("altre non sono partite") == 0, out  # the block's line and stderr say it
    assert re.search(r"^  attesa del tetto \(s\)", out, re.M), out
    assert f"altre non sono partite prima della fine di --durata" in err, err


def test_durata_senza_tetto_pieno_non_dice_nulla(fake, carica):
    """The same schedule with room under the cap: nothing held, nothing unsent, no sentence about it."""
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "10", "--arrivi", "costanti", "--parallele", "8", "--durata", "1",
                          "--token", "4", "--spiega", "--silenzioso", *VELOCE)
    assert rc == 0, out + err
    assert "in 1 s (--durata): inviate 10 richieste, 10 con risposta. L'ultimo invio" in out, out
    assert "non inviate" not in out and "nel client" not in out and "prima della fine di --durata" not in err


# The real server ###############################################################################

@pytest.mark.reale
def test_server_fermato_con_ctrl_c_reale(llama, tmp_path):
    """SIGINT (Ctrl+C in its terminal) to the real llama serve mid-run: its port closes at once and the
    requests in flight are never answered (measured). carico.py ends within seconds, not after --timeout:
    exit 1, the requests in flight marked, the line that says it, the report saved."""
    from conftest import CIFRE

    server = llama(1)
    proc = subprocess.Popen([sys.executable, CARICO, "--url", server.url, "--richieste", "4", "--parallele", "4",
                             "--token", "128", "--timeout", "120", "--json", str(tmp_path / "p.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limite = time.monotonic() + 60
    while not server.get_json("/slots")[0]["is_processing"] and time.monotonic() < limite:
        time.sleep(0.05)
    server.proc.send_signal(signal.SIGINT)
    fermato = time.monotonic()
    out, err = proc.communicate(timeout=150)
    dopo = time.monotonic() - fermato
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err
    assert dopo < 30, (dopo, out)  # a quarter of --timeout, which it used to wait whole
    in_volo = [r for r in out.splitlines() if r.endswith("errore: " + carico.IN_VOLO)]
    assert in_volo, out
    assert re.search(r"^il server ha smesso di rispondere \(accertato a [\d.]+ s\): invii fermati.*\. Connessione "
                     r"rifiutata( o scaduta)? \d volte di fila, su /slots", out, re.M), out
    assert "ha smesso di rispondere durante la prova" in err
    prova = json.loads((tmp_path / "p.json").read_text())["prove"][0]
    assert prova["server_andato"] is not None and len(prova["richieste"]) == 4 - out.count("non inviat")
    server.proc.wait(timeout=30)  # its connections closed, the server could finish exiting
    CIFRE.append(("server fermato con SIGINT a metà prova: carico.py finito dopo", f"{dopo:.1f} s"))


def test_avvia_server_che_si_ferma_codice_e_log(capsys):
    """--avvia: the server stopped as with Ctrl+C mid-run: the error line has its exit code and its log's tail."""
    from aiuti import FAKE, porta_libera

    url = f"http://127.0.0.1:{porta_libera()}"
    inizio = time.monotonic()
    rc = carico.main(["--url", url, "--avvia", f"{sys.executable} {FAKE} serve -c 2048 --s-per-token 0.01 "
                      "--spegni-dopo 2", "--np", "1,2", "--token", "20", "--timeout", "60", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 1, out + err
    assert time.monotonic() - inizio < 30, err
    assert "il server ha smesso di rispondere (accertato a " in out
    assert "il server (-np 1) si è fermato durante la prova (codice 0); ultime righe del suo log:" in err, err
    assert "cleaning up before exit..." in err
    assert "punto 2 di 2" not in out  # the session stopped: no second server


def test_rifiutate_non_contigue_non_sono_un_intervallo():
    """The tour of 1.6.0: requests 0, 2 and 4 refused were said "req 0-4: 3 richieste rifiutate", a range that
    holds 1 and 3, listed above it with their own lines. A range only where it holds every number in it."""
    assert carico.numeri_in_tratti([0, 2, 4]) == "0, 2, 4"
    assert carico.numeri_in_tratti([3, 4, 5, 8]) == "3-5, 8"
    rifiuto = carico.descrivi_errore_rete(ConnectionRefusedError(), 0)
    risultati = [carico.Risultato(i, 0.0, 1.0, **({"errore": rifiuto} if i % 2 == 0 else {"token": 8, "tps": 10.0}))
                 for i in range(5)]
    esecuzione = carico.Esecuzione(risultati, [], 5, server_andato=(1.0, "porta chiusa"))
    prova = carico.Prova(carico.InfoServer(2, 1024, True), esecuzione, carico.Piano(5, 4, 8))
    righe = carico.righe_server_andato(prova, 1, "4")
    assert righe[0] == "  req 0, 2, 4: 3 richieste rifiutate: nessun server in ascolto"
