"""The sheet's own variants, as students will try them (issue 23): each fixed with a test that
reproduced it first, on the fake where it can stage it faithfully, on the real server where only
the real one shows it."""

import re

import pytest

import carico
from aiuti import VELOCE
from conftest import CIFRE


# Item 1: a 1-token answer has no speed ######################################################
# llama.cpp samples the only token with the prompt and sends predicted_ms 0.001, predicted_per_second
# 0.0; the fake does the same. 0.0 is no speed: the lab's line says n/d, and no ratio divides by it.

@pytest.mark.parametrize("token", [["1"], ["1,8"]])
def test_un_token_con_spiega_non_crolla_e_dice_nd(fake, carica, token):
    server = fake(n_slot=4, s_per_token=0.002)
    rc, out, err = carica(server.url, "--token", *token, "--spiega", "--blocchi", *VELOCE)
    assert rc == 0, out + err
    assert "Traceback" not in err and "Error" not in err, err
    righe_un_token = [r for r in out.splitlines() if re.match(r"^  req \d+: .* 1 token ", r)]
    assert len(righe_un_token) == 4, out
    assert all(r.endswith("1 token  (n/d t/s nel proprio slot)") for r in righe_un_token), out
    assert not re.search(r"\b0\.0 t/s|\| 0\.0 \|", out), out


# "What to build" point 7: no division, ratio or percentage on a zero or a missing figure ####
# A generated test: server answers with zeros, Nones, one token, as cifre_completamento reads them;
# runs of none, one and two requests, failed or not, with none, one or a missing /slots reading; on a
# server that says nothing about itself and on one that says everything; for the lab, --ritmo,
# --durata, --stream, --turni. Every formatting and verdict function gets each run (and two of them
# as a sweep's points, two servers, two files for --confronta): none may raise, and no speed may be
# 0.0, and no figure nan or inf.

import itertools  # noqa: E402
import json  # noqa: E402

RISPOSTE = {  # the `timings` and `usage` of an answer
    "normale": ({"cache_n": 0, "prompt_n": 34, "prompt_ms": 113.2, "predicted_n": 32, "predicted_ms": 346.9,
                 "predicted_per_second": 89.3}, {"completion_tokens": 32, "prompt_tokens": 34}),
    "un token": ({"cache_n": 0, "prompt_n": 34, "prompt_ms": 113.2, "predicted_n": 1, "predicted_ms": 0.001,
                  "predicted_per_second": 0.0}, {"completion_tokens": 1, "prompt_tokens": 34}),
    "zeri": ({"cache_n": 0, "prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 0, "predicted_ms": 0.0,
              "predicted_per_second": 0.0}, {"completion_tokens": 0, "prompt_tokens": 0}),
    "nulla": ({}, {}),
    "tutto in cache": ({"cache_n": 34, "prompt_n": 0, "prompt_ms": 0.0, "predicted_n": 2, "predicted_ms": 0.0,
                        "predicted_per_second": 0.0}, {"completion_tokens": 2, "prompt_tokens": 34}),
}


def risultato(indice, risposta, inizio=0.0, durata=0.0, errore=None, piano=None, chunk=None):
    if errore:
        return carico.Risultato(indice, inizio, inizio + durata, errore=errore)
    timings, usage = RISPOSTE[risposta]
    dati = {"choices": [{"finish_reason": "length", "message": {"content": "x"}}], "timings": timings, "usage": usage}
    r = carico.Risultato(indice, inizio, inizio + durata, **carico.cifre_oltre(dati, chunk))
    if piano is not None and piano.oltre is not None:
        r = r._replace(oltre=r.oltre._replace(previsto=inizio if piano.oltre.ritmo else None,
                                              conversazione=0 if piano.oltre.turni else None,
                                              turno=1 if piano.oltre.turni else None))
    return r


PIANI = {
    "lab": carico.Piano(),
    "ritmo": carico.Piano(oltre=carico.PianoOltre(ritmo=1.0, arrivi="costanti")),
    "durata": carico.Piano(richieste=None, oltre=carico.PianoOltre(durata=1.0)),
    "stream": carico.Piano(oltre=carico.PianoOltre(stream=True)),
    "turni": carico.Piano(richieste=None, oltre=carico.PianoOltre(turni=2, sistema=0)),
    "prefisso": carico.Piano(oltre=carico.PianoOltre(prefisso=256)),
}
SERVER = {
    "muto": carico.InfoServer(None, None, False),
    "loquace": carico.InfoServer(1, 2048, True, True, kv_unificata=True),
}
LETTURE = {
    "nessuna": [],
    "una": [carico.Campione(0.0, 1, 0, ((0, 2048),))],
    "fallita": [carico.Campione(0.0, None)],
}
RICHIESTE = ["nessuna", "una fallita", "una", "due", "due a tempo zero", "una e una fallita"]


def esecuzione(quali, risposta, piano, letture):
    chunk = [0.0] if extra_stream(piano) else None
    fatte = {
        "nessuna": [],
        "una fallita": [risultato(0, risposta, errore="HTTP 500: Context size has been exceeded.")],
        "una": [risultato(0, risposta, durata=0.4, piano=piano, chunk=chunk)],
        "due": [risultato(0, risposta, durata=0.4, piano=piano, chunk=chunk),
                risultato(1, risposta, 0.1, 0.4, piano=piano, chunk=chunk)],
        "due a tempo zero": [risultato(0, risposta, piano=piano, chunk=chunk),
                             risultato(1, risposta, piano=piano, chunk=chunk)],
        "una e una fallita": [risultato(0, risposta, durata=0.4, piano=piano, chunk=chunk),
                              risultato(1, risposta, 0.1, errore="connessione rifiutata")],
    }[quali]
    return carico.Esecuzione(fatte, letture, max(len(fatte), 1))


def extra_stream(piano):
    return piano.oltre is not None and piano.oltre.stream


# A speed of a request (t/s: in its slot, or on its prompt) at 0.0 is one nobody measured; nan and inf are
# divisions by zero. (A throughput or goodput of 0.00 token/s, when nothing was generated or met the SLO, is
# a measurement.)
VELOCITA_FALSA = re.compile(r"(?<![\d.])0\.0+ t/s|\bnan\b|\binf(inity)?\b", re.I)


def stringhe(valore):
    """Every string in what a function returned (lists, dicts, tuples), to be read."""
    if isinstance(valore, str):
        yield valore
    elif isinstance(valore, dict):
        for v in valore.values():
            yield from stringhe(v)
    elif isinstance(valore, (list, tuple)):
        for v in valore:
            yield from stringhe(v)


@pytest.mark.parametrize("risposta, piano", list(itertools.product(RISPOSTE, PIANI)))
def test_ogni_funzione_che_scrive_regge_zeri_nulla_e_un_token(risposta, piano):
    uscite, p, marche = [], PIANI[piano], carico.MARCHE_ASCII
    for quali, server, letture in itertools.product(RICHIESTE, SERVER.values(), LETTURE.values()):
        prova = carico.Prova(server, esecuzione(quali, risposta, p, letture), p, macchina=carico.Macchina(2, None, None))
        uscite += [carico.rapporto(prova), carico.note(prova), carico.spiegazione(prova),
                   carico.righe_dettagli(prova, [50, 99]), carico.riga_slo(prova, {"latenza": 1.0}),
                   carico.riga_slo(prova, {"ttft": 1.0, "tpot": 0.1}), carico.grafico(prova, marche),
                   carico.righe_ritmo(prova), carico.note_ritmo(prova), carico.righe_contesto(prova),
                   carico.righe_prompt_esatti(prova), carico.riga_little(prova), carico.sovraccarico(prova),
                   carico.righe_conversazioni(prova) if p.oltre is not None and p.oltre.turni else []]
        if letture is not LETTURE["una"]:
            continue  # the files, the tables and the sweeps: once per run and server
        altra = prova._replace(piano=p._replace(parallele=8))  # a second point of a sweep
        np1, np4 = (prova._replace(configurazione=carico.Configurazione(n), piano=q.piano)
                    for n, q in ((1, prova), (4, altra)))
        json_ = carico.testo_json([prova, altra], [prova.piano, altra.piano], "http://x", {"latenza": 1.0}, [99])
        salvate = json.loads(json_)["prove"]
        uscite += [json_, carico.testo_csv([prova, altra]), carico.svg([prova, altra]),
                   carico.righe_confronto(("A", salvate), ("B", salvate)),
                   carico.righe_confronto(("A", salvate[:1]), ("B", salvate[1:])),
                   carico.righe_ripetute([prova, prova]), carico.tabella_consegnato([prova, prova, altra]),
                   carico.tabella_consegnato([np1, np4])]
        for prove, chiavi in (([prova, prova, altra, altra], ["parallele"]), ([np1, np4], ["np", "parallele"])):
            punti = carico.punti_di(prove)
            asse, gruppi = carico.serie(punti, chiavi)
            uscite += [carico.tabella_griglia(punti, chiavi, [50, 99]), carico.rapporti_np(punti, chiavi),
                       carico.curva(asse, gruppi, marche), carico.spiegazione_griglia(asse, gruppi),
                       carico.svg(prove, (asse, gruppi), chiavi)]
    cattive = [t for t in stringhe(uscite) for riga in t.splitlines() if VELOCITA_FALSA.search(riga)]
    assert not cattive, cattive[:3]


LUNGO = "Riassumi: " + "La banda passante della memoria limita la generazione. " * 120  # the sheet's step 4


# Item 12: a 500 "Context size has been exceeded." comes only from a shared buffer ###########
# The sheet's step 5 run its way: a plain --kv-unified server (no --avvia), so carico cannot know
# from the start that the slots share one buffer; the 500 says it.

def test_kv_piena_detta_anche_senza_avvia_con_la_somma_sugli_slot(fake, carica):
    server = fake(n_slot=4, n_ctx=2048, kv_unified=True, s_per_token=0.004, s_per_prompt_token=0.0)
    rc, out, err = carica(server.url, "--turni", "4", "--sistema", "300", "--token", "64", "--dettagli", *VELOCE)
    assert rc == 3, out + err
    assert "contesto 2048 token condivisi fra gli slot (--kv-unified)" in out, out
    fermi = [r for r in out.splitlines() if re.match(r"^  utente \d: fermo al turno", r)]
    assert fermi and all("il buffer KV condiviso fra gli slot (--kv-unified) è pieno" in r for r in fermi), out
    assert "non ha trovato posto" not in out
    (somma,) = re.findall(r"^    somma sugli slot: (\d+) token chiesti al buffer che condividono \(--kv-unified\), "
                          r"di 2048 \(\d+%\)$", out, re.M)
    (insieme,) = re.findall(r"^  il buffer condiviso: .* fino a (\d+) token di 2048", out, re.M)
    assert somma == insieme and int(somma) > 512, out


def test_il_prompt_lungo_per_quattro_su_kv_unificata_dice_perche(fake, carica, tmp_path):
    """The step-4 prompt, four at once, on a plain --kv-unified server: four 500s, and a note that says
    this answer comes from a shared buffer that the four together outgrew."""
    lungo = tmp_path / "lungo.txt"
    lungo.write_text(LUNGO)
    server = fake(n_slot=4, n_ctx=2048, kv_unified=True, s_per_token=0.003, s_per_prompt_token=0.0)
    rc, out, err = carica(server.url, "--prompt-file", str(lungo), "--token", "100", *VELOCE)
    assert rc == 1, out + err
    fallite = len(re.findall(r"errore: HTTP 500 .*Context size has been exceeded\.$", out, re.M))
    assert fallite >= 2, out  # any two together outgrow the buffer (four, unless a busy machine staggers them)
    assert (f"{fallite} richieste sono fallite con HTTP 500 \"Context size has been exceeded.\": il buffer KV "
            "condiviso fra gli slot (--kv-unified) è pieno. Questo llama.cpp lo risponde solo con un buffer "
            "condiviso") in err, err


def test_senza_kv_piena_nessuna_nota_sul_buffer(fake, carica, tmp_path):
    lungo = tmp_path / "lungo.txt"
    lungo.write_text(LUNGO)
    server = fake(n_slot=4, n_ctx=2048, s_per_token=0.003, s_per_prompt_token=0.0)  # 512 a slot: the 400
    rc, out, err = carica(server.url, "--prompt-file", str(lungo), "--token", "20", *VELOCE)
    assert rc == 1 and "exceed_context_size_error" in out, out
    assert "Context size" not in err and "buffer KV" not in err, err


# Item 9: --confronta of a --stream file against a plain one #################################
# Two files of different loads are not compared: every load option that differs is named, --stream
# among them, and the exit is 2 (what was given cannot be compared: other files are needed).

def test_confronta_stream_contro_semplice_dice_stream_ed_esce_2(fake, carica, tmp_path, capsys):
    server = fake(n_slot=2, s_per_token=0.001)
    a, b, c = (str(tmp_path / f"{n}.json") for n in "abc")
    for flag in (["--json", a], ["--json", b, "--stream"], ["--json", c, "--stream", "--parallele", "2"]):
        assert carica(server.url, "--richieste", "2", "--token", "4", *flag)[0] == 0
    for altro, diverse in ((b, "differiscono --stream (A no, B sì)"),
                           (c, "differiscono --parallele (A 4, B 2); --stream (A no, B sì)")):
        with pytest.raises(SystemExit) as uscita:
            carico.main(["--confronta", a, altro])
        assert uscita.value.code == 2
        out, err = capsys.readouterr()
        assert out == "" and "Traceback" not in err
        assert err.splitlines()[-1] == (f"carico.py: errore: --confronta: {a} e {altro} non si confrontano: {diverse}. "
                                        "Rifai le prove con le stesse opzioni, cambiando solo il server o -np"), err


def test_confronta_stesso_carico_esce_0(fake, carica, tmp_path, capsys):
    server = fake(n_slot=2, s_per_token=0.001)
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    for f in (a, b):
        assert carica(server.url, "--richieste", "2", "--token", "4", "--stream", "--json", f)[0] == 0
    assert carico.main(["--confronta", a, b]) == 0
    assert capsys.readouterr().out.startswith(f"confronto: A = {a} (np 2, n_ctx per slot 1024, parallele 4, token 4: 1 prova)")


# Item 14's small ones ########################################################################

def test_sharegpt_dice_le_conversazioni_senza_domanda(fake, carica, tmp_path):
    (tmp_path / "s.json").write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "Prima domanda"}]},
        {"conversations": [{"from": "gpt", "value": "solo una risposta"}]},
        {"conversations": [{"from": "human", "value": "Seconda domanda"}]}]))
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--dataset", str(tmp_path / "s.json"), "--token", "2")
    assert rc == 0, out + err
    assert (f"richieste da {tmp_path / 's.json'} (ShareGPT; 1 conversazione su 3 senza una domanda (from human), "
            "saltata): 2 richieste nel file, 2 inviate") in out, out


def test_percentili_con_decimali(fake, carica, tmp_path):
    """--percentili 99.9 (and 99.99): the same method, statistics.quantiles(method="inclusive"), on a finer
    grid; in --dettagli's table and in the --json file."""
    import statistics

    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--richieste", "6", "--token", "3", "--dettagli", "--percentili", "50,99.9,99.99",
                          "--json", str(tmp_path / "r.json"))
    assert rc == 0, out + err
    assert re.search(r"^ +min +media +p50 +p99\.9 +p99\.99 +max$", out, re.M), out
    dati = json.loads((tmp_path / "r.json").read_text())
    latenze = [r["latenza_s"] for r in dati["prove"][0]["richieste"]]
    figura = dati["prove"][0]["dettagli"]["figure_s"]["latenza"]
    assert figura["p99.9"] == statistics.quantiles(latenze, n=1000, method="inclusive")[998]
    assert figura["p99.99"] == statistics.quantiles(latenze, n=10000, method="inclusive")[9998]
    assert figura["p50"] == statistics.quantiles(latenze, n=100, method="inclusive")[49]
    assert figura["p50"] < figura["p99.9"] < figura["p99.99"] <= figura["max"]


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--percentili", "99.9"], "--percentili da solo non cambia nulla: aggiungi --dettagli. Sceglie i percentili di "
                               "--dettagli, del file di --json e della tabella di una griglia con --stream"),
    (["--percentili", "99.999", "--dettagli"], "'99.999': percentili fra 0 e 100 (esclusi), al più con due decimali"),
    (["--percentili", "0.0", "--dettagli"], "'0.0': percentili fra 0 e 100 (esclusi)"),
    (["--token", "40-8"], "'40-8': MIN-MAX vuole MIN almeno 1 e non più di MAX (per esempio 8-40)"),
    (["--token", "0-8"], "'0-8': MIN-MAX vuole MIN almeno 1 e non più di MAX (per esempio 1-8)"),
])
def test_opzioni_piccole_rifiutate_con_il_perche(fake, capsys, argomenti, messaggio):
    from aiuti import rifiutata

    assert messaggio in rifiutata(fake(), capsys, argomenti)


def test_percentili_senza_dettagli_vale_con_json_e_con_una_griglia_in_flusso(fake, carica, tmp_path):
    server = fake(n_slot=2, s_per_token=0.001)
    rc, _, err = carica(server.url, "--percentili", "95", "--json", str(tmp_path / "r.json"), "--token", "2")
    assert rc == 0, err
    assert "p95" in json.loads((tmp_path / "r.json").read_text())["prove"][0]["dettagli"]["figure_s"]["latenza"]
    rc, out, err = carica(server.url, "--percentili", "95", "--stream", "--parallele", "1,2", "--token", "2")
    assert rc == 0, err
    assert "TTFT p95" in out


# Item 13: a second --turni on the same server starts from the first run's cache ##############

def test_seconda_prova_a_turni_dice_la_cache_della_prima(fake, carica):
    server = fake(n_slot=2, s_per_token=0.001)
    argomenti = ("--turni", "2", "--sistema", "100", "--parallele", "2", "--token", "8", *VELOCE)
    rc, prima, err = carica(server.url, *argomenti)
    assert rc == 0, prima + err
    assert "prova precedente" not in prima, prima
    rc, seconda, err = carica(server.url, *argomenti)
    assert rc == 0, seconda + err
    (riga,) = [r for r in seconda.splitlines() if "prova precedente" in r]
    cache = int(re.search(r"^      1       2/2 +\S+ +(\d+) ", seconda, re.M).group(1))
    assert cache > 100, seconda  # the system prompt at least, from the first run
    assert riga.startswith("  al turno 1 2 richieste hanno preso dalla cache ") and riga.endswith(
        "token prima che questa prova avesse una risposta. Vengono da una prova precedente sullo stesso server: "
        "quei turni ne escono più veloci. Per una prova da zero riavvia il server"), riga


# Item 4: the RAM question is the sheet's, whatever --np list the session ran #################

def test_la_domanda_della_ram_per_il_server_del_foglio(capsys):
    """With --np 2,4kv (servers other than the question's, one of them --kv-unified) the answer is still -np 4
    -c 16384, and the same with --kv-unified: the question's setup, not the session's servers restarted at a
    larger -c."""
    import sys

    from aiuti import FAKE, porta_libera

    url = f"http://127.0.0.1:{porta_libera()}"
    rc = carico.main(["--url", url, "--avvia", f"{sys.executable} {FAKE} serve -c 2048 --s-per-token 0.001", "--np", "2,4kv",
                      "--richieste", "2", "--token", "2", "--spiega", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    avvii = re.findall(r"^avvio: .* -c (\d+)( -np \S+)?( --kv-unified)? -lv 4 ", err, re.M)
    assert avvii[-2:] == [("16384", " -np 4", ""), ("16384", " -np 4", " --kv-unified")], err
    assert "    -np 4: 108.00 MiB " in out and "    -np 4 --kv-unified: 85.50 MiB " in out, out


# Item 5: --prefisso says what the evidence shows ###############################################
# The old line blamed "the first on a free slot" while every request reused 1 token: on gemma-3 the
# server restores a context checkpoint of 1 token (sliding-window layers) and computes the rest again.

def prova_col_prefisso(cache, inizi, configurazione=None):
    piano = carico.Piano(oltre=carico.PianoOltre(prefisso=256))
    risultati = [carico.Risultato(i, t, t + 1.0, token=4, tps=10.0, prompt_ms=500.0, predicted_ms=400.0,
                                  token_prompt=323, token_cache=c)
                 for i, (c, t) in enumerate(zip(cache, inizi))]
    return carico.Prova(carico.InfoServer(2, 1024, True), carico.Esecuzione(risultati, [], len(risultati)), piano,
                        configurazione)


LOG_SWA = ("slot update_slots: id  0 | task 5 | restored context checkpoint (pos_min = 0, pos_max = 0, n_tokens = 1, "
           "n_past = 1, size = 0.011 MiB)\n") * 2
CON_SWA = carico.Configurazione(2, deciso=carico.Decisioni(2, 1024, False, (("non-SWA", 6.0, 1024, 3),
                                                                          ("SWA", 30.0, 1024, 15))))


def test_prefisso_col_log_dice_il_checkpoint_e_la_finestra_scorrevole():
    prova = prova_col_prefisso([1, 1, 1, 1], [0.0, 0.0, 1.1, 1.1], CON_SWA)
    (riga,) = carico.righe_prompt_esatti(prova, LOG_SWA)
    assert riga == ("prefisso comune di 256 token (cache_prompt acceso): dalla cache 1 token di prompt per richiesta in "
                    "media (1). 4 su 4 ne hanno presi meno della metà del prefisso (2 prese da uno slot prima che "
                    "un altro avesse calcolato il prefisso). Il log del server dice che ha ripristinato un checkpoint "
                    "del contesto 2 volte (restored context checkpoint, n_tokens 1). Da lì ha ricalcolato il prompt. "
                    "Il modello ha strati a finestra scorrevole (la cache SWA nel log): la loro cache non si accorcia "
                    "al prefisso comune, si riusa solo fino a un checkpoint")
    assert "slot libero" not in riga


def test_prefisso_senza_log_non_indovina_il_perche():
    (riga,) = carico.righe_prompt_esatti(prova_col_prefisso([1, 1, 1, 1], [0.0, 0.0, 1.1, 1.1]))
    assert riga.endswith(". 4 su 4 ne hanno presi meno della metà del prefisso (2 prese da uno slot prima che un altro "
                         "avesse calcolato il prefisso). Le risposte non dicono perché: con --avvia carico legge il log "
                         "del server, che lo dice"), riga
    (riga,) = carico.righe_prompt_esatti(prova_col_prefisso([1, 1, 255, 255], [0.0, 0.0, 1.1, 1.1]))
    assert riga.endswith(". 2 su 4 ne hanno presi meno della metà del prefisso: i loro slot le hanno prese prima che "
                         "un altro avesse calcolato il prefisso"), riga
    (riga,) = carico.righe_prompt_esatti(prova_col_prefisso([255, 255, 255, 255], [0.0, 0.0, 1.1, 1.1]))
    assert riga.endswith("(255)"), riga


# On the real server: what only the real one shows ###########################################

@pytest.mark.reale
def test_un_token_reale_nd_e_nessun_crollo(llama):
    """The premise measured (llama.cpp's 1-token answer: predicted_per_second 0.0), then --token 1,2
    --spiega on -np 4: the lab's line says n/d, and nothing divides by it."""
    import urllib.request

    server = llama(4)
    domanda = json.dumps({"messages": [{"role": "user", "content": "Ciao"}], "max_tokens": 1}).encode()
    richiesta = urllib.request.Request(server.url + "/v1/chat/completions", domanda, {"Content-Type": "application/json"})
    with urllib.request.urlopen(richiesta, timeout=60) as r:
        timings = json.loads(r.read())["timings"]
    assert timings["predicted_n"] == 1 and timings["predicted_per_second"] == 0, timings
    rc, out, err = carico_cli_reale(server.url, "--token", "1,2", "--spiega", "--blocchi")  # each run's req lines
    assert rc == 0, out + err
    righe_un_token = [r for r in out.splitlines() if re.match(r"^  req \d+: .* 1 token ", r)]
    assert len(righe_un_token) == 4 and all(r.endswith("(n/d t/s nel proprio slot)") for r in righe_un_token), out
    assert not VELOCITA_FALSA.search(out), out


def carico_cli_reale(url, *flags, timeout=600):
    import subprocess
    import sys

    from aiuti import CARICO

    proc = subprocess.run([sys.executable, CARICO, "--url", url, *flags], capture_output=True, text=True,
                          timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.reale
def test_prefisso_reale_il_perche_dal_log():
    """--prefisso 256 on -np 2, started by --avvia (so carico reads the server's log at -lv 4): the reason
    given for the requests that did not reuse the prefix is what the log shows, never "the first on a free
    slot" for requests that a slot took after another had computed the prefix."""
    from aiuti import porta_libera
    from test_reale import comando_reale

    url = f"http://127.0.0.1:{porta_libera()}"
    rc, out, err = carico_cli_reale(url, "--avvia", comando_reale(), "--np", "2", "--prefisso", "256", "--richieste",
                                    "4", "--parallele", "2", "--token", "4")
    assert rc == 0, out + err
    (riga,) = [r for r in out.splitlines() if r.startswith("prefisso comune di 256 token")]
    cache = [int(v) for v in re.search(r"dalla cache \d+ token di prompt per richiesta in media \(([\d-]+)\)",
                                       riga).group(1).split("-")]
    if min(cache) < 128:  # what gemma-3 does here: the reason comes from the log, or none is given
        assert re.search(r"Il log del server dice che (ha ripristinato un checkpoint del contesto|ha ricalcolato "
                         r"tutto il prompt)|i loro slot le hanno prese prima|il suo slot l'ha presa prima", riga), riga
    CIFRE.append(("--prefisso 256, -np 2: dalla cache", riga.split("dalla cache ")[1]))


@pytest.mark.reale
def test_seconda_prova_a_turni_reale_dice_la_cache(llama):
    server = llama(2)
    argomenti = ("--turni", "2", "--sistema", "100", "--parallele", "2", "--token", "8")
    rc, prima, err = carico_cli_reale(server.url, *argomenti)
    assert rc == 0, prima + err
    assert "prova precedente" not in prima, prima
    rc, seconda, err = carico_cli_reale(server.url, *argomenti)
    assert rc == 0, seconda + err
    (riga,) = [r for r in seconda.splitlines() if "prova precedente" in r]
    CIFRE.append(("a second --turni on the same server", riga.strip()))


@pytest.mark.parametrize("prima", [carico.Decisioni(), carico.Decisioni(4, 0, False), carico.Decisioni(4, 512, None),
                                   carico.Decisioni(4, 512, False, (("KV", 0.0, 0, 3),)),
                                   carico.Decisioni(4, 512, False, (("SWA", 6.0, 512, 3),))])
@pytest.mark.parametrize("grande", [None, carico.Decisioni(), carico.Decisioni(4, 4096, False, (("SWA", 0.0, 0, 15),))])
def test_la_domanda_della_ram_e_le_decisioni_reggono_zeri_e_nulla(prima, grande):
    c = carico.Configurazione(4, deciso=prima)
    righe = carico.righe_ram(c, [(carico.Configurazione(4), grande), (carico.Configurazione(4, True), grande)], "")
    righe.append(carico.riga_decisioni(c, prima))
    assert not [r for r in righe if VELOCITA_FALSA.search(r)], righe


def test_confronta_dice_i_carichi_che_solo_un_file_ha(fake, carica, tmp_path, capsys):
    server = fake(n_slot=2, s_per_token=0.001)
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    assert carica(server.url, "--richieste", "2", "--token", "4", "--parallele", "1,2", "--json", a)[0] == 0
    assert carica(server.url, "--richieste", "2", "--token", "4", "--parallele", "2", "--json", b)[0] == 0
    assert carico.main(["--confronta", a, b]) == 0
    righe = capsys.readouterr().out.splitlines()
    assert righe[0].startswith(f"confronto: A = {a} (np 2, n_ctx per slot 1024, parallele 2, token 4: 1 prova)"), righe
    assert righe[-1] == (f"non confrontate, senza lo stesso carico nell'altro file: {a} (np 2, n_ctx per slot 1024, "
                         "parallele 1, token 4: 1 prova)")
