"""Words from evidence (issue 37, the third instructor's tour): a killed server's requests are in flight,
not refused; --parallele above --richieste said; the server's API key never printed nor saved; one list of
exit codes; --confronta's label of a shared buffer; what a Ctrl+C leaves the server doing; "insieme"."""

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import carico
from aiuti import CARICO, FAKE, VELOCE, latenze, porta_libera, risponde


# A killed server: its requests were taken, not refused #########################################

def test_server_ucciso_le_richieste_prese_sono_in_volo(fake, carica, tmp_path):
    """SIGKILL as the fake stages it (every connection reset) with the four requests in its hands, one in its
    slot and three in its queue: 1.7.2 said "req 0-2: 3 richieste rifiutate: connessione rifiutata o chiusa
    dal server" beside "1 richiesta in volo rimasta senza risposta". All four were sent and taken: in flight."""
    server = fake(n_slot=1, s_per_token=0.01, spegni_dopo=4, spegni_uccidendo=True)
    rc, out, err = carica(server.url, "--richieste", "4", "--parallele", "4", "--token", "50",
                          "--csv", str(tmp_path / "p.csv"), *VELOCE)
    assert rc == 1, out + err
    assert "rifiutat" not in out, out
    righe = [r for r in out.splitlines() if r.startswith("  req ")]
    assert len(righe) == 4 and all(re.search(r"errore: (connessione chiusa dal server prima della risposta|"
                                             + re.escape(carico.IN_VOLO) + ")$", r) for r in righe), out
    (andato,) = [r for r in out.splitlines() if r.startswith("il server ha smesso di rispondere")]
    assert "): invii fermati, 4 richieste in volo rimaste senza risposta. Connessione " in andato, andato
    assert "Traceback" not in err


def test_rifiutata_solo_la_connessione_rifiutata():
    """Refused is a connect that nothing listened to; a reset after the request was sent is in flight."""
    rifiuto = carico.descrivi_errore_rete(ConnectionRefusedError(), 0)
    reset = carico.descrivi_errore_rete(ConnectionResetError(), 0)
    risultati = [carico.Risultato(0, 0.0, 1.0, token=8, tps=10.0), carico.Risultato(1, 0.0, 1.0, errore=reset),
                 carico.Risultato(2, 0.0, 1.0, errore=carico.IN_VOLO), carico.Risultato(3, 1.0, 1.1, errore=rifiuto),
                 carico.Risultato(4, 1.1, 1.2, errore=rifiuto)]
    esecuzione = carico.Esecuzione(risultati, [], 6, server_andato=(1.2, "porta chiusa"))
    prova = carico.Prova(carico.InfoServer(1, 2048, True), esecuzione, carico.Piano(6, 2, 8))
    righe = carico.rapporto(prova)
    assert righe[1].endswith("errore: connessione chiusa dal server prima della risposta"), righe
    assert righe[2].endswith("errore: " + carico.IN_VOLO), righe
    assert righe[3] == "  req 3-4: 2 richieste rifiutate: nessun server in ascolto", righe
    assert righe[4] == "  req 5: non inviata: il server non rispondeva più", righe
    assert "invii fermati, 2 richieste in volo rimaste senza risposta. " in righe[-1], righe


@pytest.mark.reale
def test_server_ucciso_reale_in_volo_non_rifiutate(llama):
    """SIGKILL to the real -np 1 server while its slot works on the first of four requests (the other three
    deferred): every connection is closed with no answer (measured). Not one of them is called refused."""
    server = llama(1)
    proc = subprocess.Popen([sys.executable, CARICO, "--url", server.url, "--richieste", "4", "--parallele", "4",
                             "--token", "128"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limite = time.monotonic() + 60
    while not server.get_json("/slots")[0]["is_processing"] and time.monotonic() < limite:
        time.sleep(0.05)
    time.sleep(0.3)
    server.proc.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err
    assert "rifiutat" not in out, out
    risposte = len(latenze(out))
    assert re.search(rf"\): invii fermati, {4 - risposte} (richiesta in volo rimasta|richieste in volo rimaste) "
                     r"senza risposta\.", out, re.M), out


# --parallele above --richieste ##################################################################

def test_parallele_oltre_le_richieste_detto_una_volta(fake, carica):
    """--parallele 8 with 4 requests: at most 4 can be in flight, none waits in the client's queue; said once
    on stderr, the lab's lines as they are."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--richieste", "4", "--parallele", "8", "--token", "4", *VELOCE)
    assert rc == 0, err
    assert "richieste=4 parallele=8 slot=2  picco slot occupati insieme=2" in out
    note = [r for r in err.splitlines() if "--parallele 8" in r]
    assert note == ["carico.py: nota: --parallele 8 è più di --richieste 4: partono solo 4 richieste, quindi al più 4 "
                    "in volo insieme (per 8, --richieste 8)"], err
    assert len(note[0]) - len("carico.py: nota: ") <= 160
    rc, out, err = carica(server.url, "--richieste", "4", "--parallele", "1,2,4,8,16", "--token", "4", *VELOCE)
    assert rc == 0, err
    assert [r for r in err.splitlines() if "è più di --richieste" in r] == [
        "carico.py: nota: --parallele 8, 16 è più di --richieste 4: partono solo 4 richieste, quindi al più 4 in volo "
        "insieme (per 16, --richieste 16)"], err
    for flag in (("--richieste", "8", "--parallele", "8"), ("--durata", "0.5", "--parallele", "8")):
        rc, _, err = carica(server.url, *flag, "--token", "4", *VELOCE)
        assert rc == 0 and "è più di --richieste" not in err, err


# The API key: masked wherever a command is echoed, a log shown, a run saved ####################

SEGRETO = "SEGRETO123xyz"


@pytest.mark.parametrize("forma", ["--api-key SEGRETO123xyz", "--api-key=SEGRETO123xyz", "ambiente"])
def test_avvia_non_stampa_ne_salva_la_chiave(capsys, tmp_path, monkeypatch, forma):
    """--avvia "llama serve ... --api-key K": 1.7.2 echoed `avvio: ... --api-key K ...` on every start. Masked
    there, in the log tail of a server that logs its own arguments, and absent from every file saved."""
    url = f"http://127.0.0.1:{porta_libera()}"
    if forma == "ambiente":
        monkeypatch.setenv("LLAMA_API_KEY", SEGRETO)
    chiave = "" if forma == "ambiente" else " " + forma
    file = [tmp_path / f"p.{e}" for e in ("json", "csv", "svg")]
    rc = carico.main(["--url", url, "--avvia", f"{sys.executable} {FAKE} serve --s-per-token 0.002 --eco{chiave}",
                      "--np", "1,2", "--token", "4", "--json", str(file[0]), "--csv", str(file[1]),
                      "--svg", str(file[2]), *(["--api-key", SEGRETO] if chiave else []), *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    avvii = [r for r in err.splitlines() if r.startswith("avvio: ")]
    assert len(avvii) == 2 and all(("--api-key=***" if "=" in forma else "--api-key ***") in r or not chiave
                                   for r in avvii), avvii
    assert SEGRETO not in out + err
    for f in file:
        assert SEGRETO not in f.read_text(), f
    # A server that fails at start: the tail of its log, which holds its command line and its key.
    rc = carico.main(["--url", url, "--avvia", f"{sys.executable} {FAKE} serve --eco --fallisci{chiave}"])
    out, err = capsys.readouterr()
    assert rc == 1 and "ultime righe del suo log" in err and "argv:" in err, err
    assert SEGRETO not in out + err, err
    assert not risponde(url)


def test_chiavi_nel_comando(monkeypatch):
    """llama serve takes a comma-separated list in --api-key, and LLAMA_API_KEY: each key is hidden."""
    monkeypatch.setenv("LLAMA_API_KEY", "dall-ambiente")
    comando = ["llama", "serve", "--api-key", "uno,due", "--api-key=tre", "--api-key-file", "chiavi.txt"]
    assert carico.chiavi_api(comando) == ["dall-ambiente", "uno,due", "due", "tre", "uno"]
    assert carico.nascoste(" ".join(comando) + " | due", carico.chiavi_api(comando)) == (
        "llama serve --api-key *** --api-key=*** --api-key-file chiavi.txt | ***")


# Smaller ######################################################################################

CODICI = {0, 1, 2, 3, 130, 141, 143}  # every exit: Sessione.codice(), main's 130, argparse's 2


def codici_in(testo: str) -> set:
    return {int(c) for c in re.findall(r"(?<![\w.,-])(\d{1,3})(?=[\s,;:/|])", testo)}


def aiuto(capsys) -> str:
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--help"])
    assert uscita.value.code == 0
    return capsys.readouterr().out


def test_aiuto_una_lista_di_codici_di_uscita(capsys):
    """--help printed two lists of exit codes that disagreed (one without 3, one without 141): one list, the
    same in --help (the docstring), in README.md and in docs/guasti.md's table."""
    out = aiuto(capsys)
    assert out.count("Codici di uscita") == 1 and carico.__doc__.count("Codici di uscita") == 1, out
    lista = out[out.index("Codici di uscita"):]
    assert codici_in(lista[:lista.index("\n\n")]) == CODICI, lista
    readme = (Path(CARICO).parent / "README.md").read_text(encoding="utf-8")
    assert readme.count("Exit codes:") == 1
    lista = readme[readme.index("Exit codes:"):]
    assert codici_in(lista[:lista.index("\n\n")]) == CODICI, lista
    guasti = (Path(CARICO).parent / "docs" / "guasti.md").read_text(encoding="utf-8")
    tabella = re.findall(r"^\| ([\d /]+) \|", guasti[guasti.index("## Exit codes"):], re.M)
    assert {int(c) for riga in tabella for c in riga.split("/")} == CODICI, tabella


def test_aiuto_breve_e_con_ogni_opzione(capsys, monkeypatch):
    """--help fits a terminal's scroll: at most 120 lines at 80 columns, every flag named in it, and its
    examples are commands the parser takes."""
    monkeypatch.setenv("COLUMNS", "80")
    out = aiuto(capsys)
    assert len(out.splitlines()) <= 120, len(out.splitlines())
    nomi = ["--url", "--richieste", "--parallele", "--token",
            *(n for _, _, opzioni in carico.OPZIONI_OLTRE for nomi, _ in opzioni for n in nomi.split())]
    assert [n for n in nomi if not re.search(rf"^  (-\S+, )?{n}\b", out, re.M)] == []
    esempi = [r.split("carico.py ", 1)[1] for r in out[out.index("esempi:"):].splitlines() if "carico.py" in r]
    assert len(esempi) >= 5
    for esempio in esempi:
        if "--confronta" not in esempio:  # it reads its files while parsing
            carico.analizza_argomenti(shlex.split(esempio))



def test_confronta_dice_il_buffer_condiviso(fake, carica, capsys, tmp_path):
    """Two servers by hand with -np 4, one with --kv-unified: 1.7.2 labelled both "np 4". The label says what
    each file holds: the context of a slot, and kv where the run showed the shared buffer."""
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for percorso, kv in ((a, False), (b, True)):
        server = fake(n_slot=4, n_ctx=2048, kv_unified=kv, s_per_token=0.001)
        rc, _, err = carica(server.url, "--token", "4", "--json", str(percorso), *VELOCE)
        assert rc == 0, err
    dati = json.loads(b.read_text())
    dati["prove"][0]["server"]["kv_unificata"] = True  # as a run that met the shared buffer's 500 keeps it
    b.write_text(json.dumps(dati))
    rc = carico.main(["--confronta", str(a), str(b)])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.splitlines()[0] == (f"confronto: A = {a} (np 4, n_ctx per slot 512, parallele 4, token 4: 1 prova), "
                                   f"B = {b} (np 4 kv, n_ctx per slot 2048, parallele 4, token 4: 1 prova)"), out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_dopo_ctrl_c_il_server_continua(fake, stream):
    """Ctrl+C with requests in flight and no --stream: one sentence says the server may go on generating them
    (measured on llama.cpp b11434: cancelled a second after the client went, when no other result postpones its
    check, and the slot busy until the decode in flight ends: 1-6 s on a loaded 2-core machine). With --stream
    llama.cpp stops a stream whose client went away: nothing to say."""
    server = fake(n_slot=1, s_per_token=0.02)
    proc = subprocess.Popen([sys.executable, CARICO, "--url", server.url, *VELOCE, *(["--stream"] if stream else [])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    limite = time.monotonic() + 30
    while server.tokens_predicted_total < 32 and time.monotonic() < limite:
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    frasi = [r for r in err.splitlines() if "lasciat" in r]
    assert frasi == ([] if stream else [
        "carico.py: nota: senza --stream il server può continuare a generare 3 richieste lasciate in volo (una per slot "
        "alla volta, finché non le cancella). Aspetta qualche secondo prima di ripetere, o la prossima prova ne sarà falsata"]), err
    assert all(len(frase) <= 160 for f in frasi for frase in f.split(". "))


def test_spiega_parallele_alla_volta(fake, carica):
    """--parallele 2 with 8 requests: 1.7.2 said "Sono partite 2 richieste insieme"; they went two at a time."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--richieste", "8", "--parallele", "2", "--token", "4", "--spiega", *VELOCE)
    assert rc == 0, err
    assert "Le richieste sono partite 2 alla volta (--parallele 2) su 2 slot" in out, out
    assert "Sono partite 2 richieste insieme" not in out
    rc, out, err = carica(server.url, "--richieste", "4", "--parallele", "4", "--token", "4", "--spiega", *VELOCE)
    assert rc == 0, err
    assert "Sono partite 4 richieste insieme su 2 slot" in out, out


@pytest.mark.parametrize("chiave", ["ab'cd", "e", "80"])
def test_la_chiave_nascosta_anche_con_un_apice_o_corta(chiave):
    """The review: a key with a quote was joined (and re-quoted) before it was masked, and shown; a short key was
    masked inside other words ('llama-s***rv***r', '--port ***80'). Each argument masked as a word of its own."""
    comando = ["llama-server", "--api-key", chiave, "--port", "8080"]
    server = carico.ServerAvviato(comando, carico.Configurazione(1), "http://127.0.0.1:9", 1.0, io.StringIO())
    mostrati = [carico.nascoste(a, server.chiavi) for a in server.argomenti]
    assert mostrati[:5] == ["llama-server", "--api-key", "***", "--port", "8080"], mostrati
    assert carico.nascoste(f"  | args: --api-key {chiave} --port 8080", server.chiavi) == (
        "  | args: --api-key *** --port 8080")
