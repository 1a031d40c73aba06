"""carico.py against the fake llama.cpp server: the lab's behaviour and every error path."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

import carico
from aiuti import CARICO, VELOCE, latenze, valore
from fakeserver import risposta_grezza


# The lab's runs ###############################################################################

def test_un_slot_serve_una_richiesta_alla_volta(fake, carica, tmp_path):
    """One slot: served one at a time, a staircase. Each request's latency holds its own time in the
    slot and that of every request served before it (the server's timings): a bound that a loaded
    machine, which only adds delays, cannot break."""
    server = fake(n_slot=1, n_ctx=2048, s_per_token=0.006)
    rc, out, err = carica(server.url, "--json", str(tmp_path / "p.json"), *VELOCE)
    assert rc == 0, err
    righe = out.splitlines()
    assert righe[0] == "server: 1 slot, n_ctx per slot = 2048"
    assert valore(out, "picco slot occupati insieme") == "1"
    assert "richieste=4 parallele=4 slot=1  " in out
    assert "(128 token generati)" in out
    richieste = sorted(json.loads((tmp_path / "p.json").read_text())["prove"][0]["richieste"],
                       key=lambda r: r["latenza_s"])
    servizi = [(r["prompt_ms"] + r["predicted_ms"]) / 1000 for r in richieste]
    for k, r in enumerate(richieste):
        assert r["latenza_s"] >= 0.95 * sum(servizi[:k + 1]), (k, r["latenza_s"], servizi)
    assert server.picco_occupati == 1


def test_un_slot_latenza_massima_vicina_alla_somma_dei_servizi(fake):
    server = fake(n_slot=1, s_per_token=0.006)
    client = carico.Client(server.url)
    esecuzione = carico.esegui_carico(client, carico.Piano(4, 4, 32, 0.05, 30), carico.InfoServer(1, 2048, True))
    servizi = [(r.prompt_ms + r.predicted_ms) / 1000 for r in esecuzione.risultati]
    massima = max(r.latenza for r in esecuzione.risultati)
    assert 0.9 * sum(servizi) < massima < 1.5 * sum(servizi) + 0.2


def test_quattro_slot_tutte_insieme(fake, carica):
    """Four slots, four requests: served together, nobody waited for a slot (the server's timings say
    so, however long the machine's load makes each request)."""
    server = fake(n_slot=4, n_ctx=2048, s_per_token=0.006)
    rc, out, err = carica(server.url, "--spiega", *VELOCE)
    assert rc == 0, err
    assert out.splitlines()[0] == "server: 4 slot, n_ctx per slot = 512"
    assert valore(out, "picco slot occupati insieme") == "4"
    assert "Nessuna richiesta ha aspettato uno slot" in out, out
    assert server.picco_occupati == 4


def test_due_slot_picco_due(fake, carica):
    server = fake(n_slot=2, n_ctx=2048, s_per_token=0.006)
    rc, out, _ = carica(server.url, *VELOCE)
    assert rc == 0
    assert out.splitlines()[0] == "server: 2 slot, n_ctx per slot = 1024"
    assert valore(out, "picco slot occupati insieme") == "2"


def test_throughput_e_il_totale_dei_token_sul_tempo_totale(fake, carica):
    server = fake(n_slot=4, s_per_token=0.004)
    rc, out, _ = carica(server.url, "--richieste", "6", "--parallele", "3", "--token", "10", *VELOCE)
    assert rc == 0
    totale = float(re.search(r"tempo totale ([\d.]+) s", out).group(1))
    thr = float(re.search(r"throughput aggregato ([\d.]+) token/s  \(60 token generati\)", out).group(1))
    # Both figures are printed rounded to 0.01: compare within that rounding.
    assert 60 / (totale + 0.005) - 0.005 <= thr <= 60 / (totale - 0.005) + 0.005
    assert "richieste=6 parallele=3 slot=4" in out
    # Never more requests in flight than --parallele.
    assert server.picco_occupati == 3
    assert all(b["max_tokens"] == 10 for b in server.bodies)


def test_picco_esatto_su_prove_brevi(fake, carica):
    """Runs of 0.2 s, shorter than one /slots reading: the peak of busy slots and of the queue come from
    the server's timings, exact every time, 10 runs in a row, and no note says the peak may be low."""
    server = fake(n_slot=2, s_per_token=0.008, metrics=True)
    durate = []
    for _ in range(10):
        rc, out, err = carica(server.url, "--token", "8")
        assert rc == 0, out + err
        assert valore(out, "picco slot occupati insieme") == "2", out
        assert re.search(r"picco richieste in coda \((requests_deferred|dai tempi del server)\)=2$", out, re.M), out
        durate.append(float(re.search(r"tempo totale ([\d.]+) s", out).group(1)))
        assert "sottostimato" not in err
    assert sorted(durate)[5] < 0.5, durate  # most runs shorter than one reading of /slots (0.5 s)


def test_senza_tempi_del_server_la_prova_breve_lo_dice(fake, carica):
    """A server that gives no timings: only the readings of /slots can see the peak, and a run shorter than
    two of them says the peak may be low."""
    def senza_timings(h, corpo):
        dati = h.server.fake.completa(json.loads(corpo))[1]
        del dati["timings"]
        h.send_json(200, dati)

    def slot_liberi(h, _corpo):  # its one reading sees fewer than all the slots at work (here none, every time)
        h.send_json(200, [{"id": i, "n_ctx": 512, "speculative": False, "is_processing": False} for i in range(4)])

    server = fake(n_slot=4, s_per_token=0.001, override={"/v1/chat/completions": senza_timings, "/slots": slot_liberi})
    rc, out, err = carica(server.url, "--token", "4", "--intervallo", "2")
    assert rc == 0
    assert "il picco di slot occupati può essere sottostimato" in err


def test_corpo_della_richiesta_come_il_lab(fake, carica):
    server = fake(n_slot=4)
    carica(server.url, *VELOCE)
    assert len(server.bodies) == 4
    for body in server.bodies:
        assert body["max_tokens"] == 32
        assert body["chat_template_kwargs"] == {"enable_thinking": False}
        assert [m["role"] for m in body["messages"]] == ["user"]


@pytest.mark.parametrize("richieste", [4, 8, 20])
def test_prompt_diversi_senza_prefisso_comune(fake, carica, richieste):
    server = fake(n_slot=4, s_per_token=0.001)
    rc, _, _ = carica(server.url, "--richieste", str(richieste), "--token", "2", *VELOCE)
    assert rc == 0
    prompts = server.prompts
    assert len(prompts) == richieste and len(set(prompts)) == richieste
    for i, a in enumerate(prompts):
        for b in prompts[i + 1:]:
            assert len(os.path.commonprefix([a, b])) <= 2, (a, b)
    # Among the first eight (the lab's own), even the first words differ.
    assert len({p.split()[0] for p in prompts[:8]}) == min(richieste, 8)


@pytest.mark.parametrize("suffisso", ["", "/", "/v1", "/v1/"])
def test_url_con_barra_o_v1(fake, carica, suffisso):
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, _ = carica(server.url + suffisso, "--richieste", "2", "--token", "2", *VELOCE)
    assert rc == 0
    assert out.startswith("server: 2 slot")


# Failures and what the user is told ###########################################################

def test_server_spento(carica):
    rc, out, err = carica("http://127.0.0.1:9")
    assert rc == 1
    assert out == ""
    assert "http://127.0.0.1:9" in err and "connessione rifiutata" in err
    assert "Traceback" not in err


def test_server_che_carica_poi_pronto(fake, carica):
    server = fake(n_slot=2, s_per_token=0.001, loading_s=0.5)
    rc, out, err = carica(server.url, "--token", "2", *VELOCE)
    assert rc == 0, err
    assert "sta caricando il modello" in err and "server pronto" in err
    assert out.startswith("server: 2 slot")


def test_server_che_carica_troppo(fake, carica):
    server = fake(loading_s=60)
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--attesa", "0.5")
    assert rc == 1
    assert out == ""
    assert "503" in err and "Loading model" in err and server.url in err
    assert time.monotonic() - inizio < 10
    assert server.bodies == []  # no load fired


def test_chiave_api_mancante(fake, carica, monkeypatch):
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    server = fake(api_key="segreta-123")
    rc, out, err = carica(server.url)
    assert rc == 1 and out == ""
    assert "richiede una chiave API" in err and "--api-key" in err
    assert server.bodies == []


def test_chiave_api_sbagliata(fake, carica, monkeypatch):
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    server = fake(api_key="segreta-123")
    rc, out, err = carica(server.url, "--api-key", "sbagliata-456")
    assert rc == 1 and out == ""
    assert "ha rifiutato la chiave API" in err
    assert "sbagliata-456" not in err


@pytest.mark.parametrize("da_ambiente", [False, True])
def test_chiave_api_giusta_mai_stampata(fake, carica, monkeypatch, da_ambiente):
    server = fake(n_slot=2, api_key="segreta-123", s_per_token=0.01)
    if da_ambiente:
        monkeypatch.setenv("LLAMA_API_KEY", "segreta-123")
        flags = ()
    else:
        monkeypatch.delenv("LLAMA_API_KEY", raising=False)
        flags = ("--api-key", "segreta-123")
    rc, out, err = carica(server.url, *flags, "--token", "20", *VELOCE)
    assert rc == 0, err
    assert valore(out, "picco slot occupati insieme") == "2"
    assert "segreta-123" not in out + err
    # Every request carried the key: the four chat requests and every /slots sample.
    chat = [h for percorso, h in server.richieste_ricevute if percorso == "/v1/chat/completions"]
    slots = [h for percorso, h in server.richieste_ricevute if percorso == "/slots"]
    assert len(chat) == 4 and len(slots) >= 2
    assert {h.get("Authorization") for h in chat + slots} == {"Bearer segreta-123"}


def test_slots_spento_usa_props(fake, carica):
    """--no-slots: the header from /props, the peak from the server's timings alone."""
    server = fake(n_slot=4, slots=False, s_per_token=0.002)
    rc, out, err = carica(server.url, *VELOCE)
    assert rc == 0
    assert out.splitlines()[0] == "server: 4 slot, n_ctx per slot = 512"
    assert "picco slot occupati insieme=4" in out
    assert "--no-slots" in err and "dai tempi del server" in err


def test_contesto_superato_sulla_riga_della_richiesta(fake, carica, tmp_path):
    lungo = tmp_path / "lungo.txt"
    lungo.write_text("Riassumi: " + "La banda passante della memoria limita la generazione. " * 120)
    server = fake(n_slot=4, n_ctx=2048, s_per_token=0.001)
    rc, out, _ = carica(server.url, "--prompt-file", str(lungo), *VELOCE)
    assert rc == 1
    righe = out.splitlines()
    for riga in righe[1:5]:
        assert re.match(r"  req \d:   [\d.]+ s   errore: HTTP 400 exceed_context_size_error: request \(1093 tokens\) "
                        r"exceeds the available context size \(512 tokens\), try increasing it$", riga), riga
    assert "richieste fallite: 4 su 4 (nessuna riuscita: niente da riassumere)" in out
    assert re.search(r"^tempo totale [\d.]+ s  \|  latenza media n/d, max n/d$", out, re.M), out


def test_una_fallita_non_ferma_le_altre(fake, carica):
    chiamate = []

    def a_volte_500(h, corpo):
        chiamate.append(1)
        if len(chiamate) == 2:
            return risposta_grezza(500, b"<html><body>Internal Server Error</body></html>")(h, corpo)
        h.send_json(*server.completa(json.loads(corpo)))

    server = fake(n_slot=4, s_per_token=0.002, override={"/v1/chat/completions": a_volte_500})
    rc, out, _ = carica(server.url, *VELOCE)
    assert rc == 1
    assert len(latenze(out)) == 3
    assert "errore: HTTP 500: <html><body>Internal Server Error</body></html>" in out
    assert "richieste fallite: 1 su 4 (il riepilogo conta solo le 3 riuscite)" in out
    assert "(96 token generati)" in out


def test_non_llama_cpp_misura_quello_che_puo(fake, carica):
    """An OpenAI-compatible server without /slots, /props or timings."""
    pagina_404 = risposta_grezza(404, b"<html><h1>404 Not Found</h1></html>")

    def chat_senza_timings(h, corpo):
        h.send_json(200, {"choices": [{"finish_reason": "length", "message": {"content": "ciao"}}],
                          "usage": {"completion_tokens": 32, "prompt_tokens": 20}})

    server = fake(override={"/health": pagina_404, "/slots": pagina_404, "/props": pagina_404,
                            "/v1/chat/completions": chat_senza_timings})
    rc, out, err = carica(server.url, *VELOCE)
    assert rc == 0
    righe = out.splitlines()
    assert righe[0] == "server: n/d slot, n_ctx per slot = n/d"
    assert re.match(r"  req 0: +[\d.]+ s   32 token  \(n/d t/s nel proprio slot\)$", righe[1])
    assert "slot=n/d  picco slot occupati insieme=n/d" in out
    assert "(128 token generati)" in out
    assert f"il server su {server.url} non è llama.cpp" in err  # said once (test_altri_server.py)


@pytest.mark.parametrize("flag,valore_flag", [
    ("--richieste", "0"), ("--richieste", "-1"), ("--richieste", "due"), ("--parallele", "0"),
    ("--parallele", "1.5"), ("--token", "0"), ("--token", "x"),
    ("--url", "127.0.0.1:8080"), ("--url", "ftp://127.0.0.1:8080"), ("--url", "http://127.0.0.1:8080/v1/chat"),
    ("--url", "http://127.0.0.1:porta"), ("--url", "http://"), ("--timeout", "0"), ("--intervallo", "-1"),
])
def test_opzioni_sbagliate(capsys, flag, valore_flag):
    with pytest.raises(SystemExit) as uscita:
        carico.main([flag, valore_flag])
    assert uscita.value.code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert f"carico.py: errore: opzione {flag}" in err


def test_prompt_file_mancante(capsys, tmp_path):
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--prompt-file", str(tmp_path / "manca.txt")])
    assert uscita.value.code == 2
    assert "non riesco a leggere" in capsys.readouterr().err


def test_help_in_italiano_e_version(capsys):
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--help"])
    assert uscita.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("uso: carico.py")
    assert "python3 carico.py --url http://127.0.0.1:8080 --richieste 4 --parallele 4 --token 32" in out
    with pytest.raises(SystemExit):
        carico.main(["--version"])
    assert capsys.readouterr().out.strip() == f"carico.py {carico.__version__}"


# As a user runs it: a subprocess ##############################################################

def avvia_carico(url, *flags, **kw):
    return subprocess.Popen([sys.executable, CARICO, "--url", url, *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_da_riga_di_comando(fake):
    server = fake(n_slot=2, s_per_token=0.002)
    proc = avvia_carico(server.url, *VELOCE)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.startswith("server: 2 slot, n_ctx per slot = 1024\n  req 0:")
    assert "Traceback" not in err


@pytest.mark.parametrize("segnale,codice", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interruzione_stampa_quello_che_ha_misurato(fake, segnale, codice):
    server = fake(n_slot=1, s_per_token=0.01)  # each request takes about 0.33 s, one at a time: 1.3 s in all
    proc = avvia_carico(server.url, *VELOCE)
    # Wait until the first request is done and the second is in the slot.
    limite = time.monotonic() + 30
    while server.tokens_predicted_total < 32 and time.monotonic() < limite:
        time.sleep(0.05)
    time.sleep(0.2)
    proc.send_signal(segnale)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == codice, err
    assert "Traceback" not in err
    assert len(latenze(out)) >= 1
    assert "non completata (interrotto)" in out
    assert "richieste non completate:" in out
    assert "interrotto" in err
    assert "tempo totale" in out
    # The server saw the requests in flight go away (it stopped generating for them, as llama.cpp
    # does when the connection closes), and none of them keeps a slot busy.
    limite = time.monotonic() + 5
    while (server.abbandonate == 0 or server.occupati()) and time.monotonic() < limite:
        time.sleep(0.02)
    assert server.abbandonate >= 1
    assert server.occupati() == 0


def test_pipe_chiusa_nessun_rumore(fake):
    server = fake(n_slot=4, s_per_token=0.001)
    comando = (f"'{sys.executable}' '{CARICO}' --url {server.url} --richieste 40 --intervallo 0.05 --grafico "
               "| head -1; echo \"uscita ${PIPESTATUS[0]}\"")
    proc = subprocess.run(["bash", "-c", comando], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "server: 4 slot, n_ctx per slot = 512\nuscita 141\n"
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr


def test_stdout_ascii_nessun_errore_di_codifica(fake):
    server = fake(loading_s=60)
    ambiente = dict(os.environ, PYTHONIOENCODING="ascii", LANG="C", LC_ALL="C")
    proc = avvia_carico(server.url, "--attesa", "1", env=ambiente)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "UnicodeEncodeError" not in err and "Traceback" not in err
    assert "caricando il modello" in err


def test_aiuto_il_lab_per_primo(capsys):
    with pytest.raises(SystemExit):
        carico.main(["--help"])
    out = capsys.readouterr().out
    righe = out.splitlines()
    assert righe[0] == "uso: carico.py [--url URL] [--richieste N] [--parallele N] [--token N] [altre opzioni]"
    assert righe[1] == ""  # the usage fits one line: no continuation to align
    opzioni = re.findall(r"^  (-[-\w]+)", out, re.M)
    assert opzioni[:4] == ["--url", "--richieste", "--parallele", "--token"]
    gruppi = re.findall(r"^([a-z][^:\n]*):$", out[out.index("Codici di uscita"):], re.M)
    assert gruppi[0] == "il lab" and len(gruppi) >= 5, gruppi
    assert "options:" not in out and "optional arguments" not in out


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--tabella=x"], "opzione --tabella: non accetta valori ('x')"),
    (["--token"], "opzione --token: richiede un valore"),
    (["--ri", "3"], "opzione ambigua: --ri potrebbe essere --richieste, --ripeti, --ritmo, --riscaldamento"),
    (["--boh"], "opzioni non riconosciute: --boh"),
    # the tour: a flag mistyped got no hint; the nearest of carico's, when one is near
    (["-richieste", "4"], "opzioni non riconosciute: -richieste 4 (forse --richieste? l'elenco: --help)"),
    (["--richiesta", "4"], "opzioni non riconosciute: --richiesta 4 (forse --richieste? l'elenco: --help)"),
    (["--tokens=8"], "opzioni non riconosciute: --tokens=8 (forse --token? l'elenco: --help)"),
])
def test_errori_di_argparse_in_italiano(capsys, argomenti, messaggio):
    with pytest.raises(SystemExit) as uscita:
        carico.main(argomenti)
    assert uscita.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"carico.py: errore: {messaggio}"
    assert err.splitlines()[0].startswith("uso: carico.py ")
