"""The price of parallelism, on the fake server: each slot's context as /slots says it, conversations
that outgrow their slot (--turni, --sistema), what a server started by --avvia decided (its log, --np
auto, the KV cache) and the lab's RAM question answered from a second start."""

import csv
import json
import sys

import pytest

import carico
from aiuti import FAKE, VELOCE, porta_libera, rifiutata
from fakeserver import TEMPLATE_TOKENS, conta_token

ERRORE_400 = ("HTTP 400 exceed_context_size_error: request ({} tokens) exceeds the available context size (512 tokens), "
              "try increasing it")


def comando_fake(*extra):
    return f"{sys.executable} {FAKE} serve -c 2048 --s-per-token 0.001 " + " ".join(extra)


# Each slot's context #########################################################################

def test_dettagli_il_contesto_di_ogni_slot(fake, carica):
    """The peak each slot held, from /slots' n_prompt_tokens, which on this llama.cpp already counts
    the decoded tokens: 498 held with 60 decoded is 498, not 558."""
    slots = [{"id": 0, "n_ctx": 512, "is_processing": False},
             {"id": 1, "n_ctx": 512, "is_processing": True, "n_prompt_tokens": 120, "next_token": [{"n_decoded": 20}]},
             {"id": 2, "n_ctx": 512, "is_processing": True, "n_prompt_tokens": 498, "next_token": [{"n_decoded": 60}]}]
    server = fake(n_slot=3, n_ctx=1536, s_per_token=0.003, override={"/slots": lambda h, _: h.send_json(200, slots)})
    rc, out, err = carica(server.url, "--dettagli", "--token", "8", *VELOCE)
    assert rc == 0, err
    assert ("  contesto per slot (token del compito di ogni slot, prompt e generati: il picco fra le letture di "
            "/slots, ogni 0.05 s):") in out
    assert "    slot 0: 0 di 512 token (0%)\n    slot 1: 120 di 512 token (23%)\n    slot 2: 498 di 512 token (97%)\n" in out
    assert "somma sugli slot" not in out  # the context is not known to be shared
    assert "la richiesta più lunga, dalle risposte: req " in out


def test_le_letture_coincidono_con_i_conti_del_fake(fake, carica, tmp_path):
    """Every reading that --json keeps says, slot by slot, what the fake's own /slots answer said then."""
    server = fake(n_slot=2, n_ctx=1024, s_per_token=0.004)
    rc, _, err = carica(server.url, "--token", "40", "--json", str(tmp_path / "p.json"), *VELOCE)
    assert rc == 0, err
    campioni = json.loads((tmp_path / "p.json").read_text())["prove"][0]["campioni"]
    attesi = [[[s["n_prompt_tokens"] if s["is_processing"] else 0, s["n_ctx"]] for s in lettura]
              for lettura in server.letture_slots]
    assert [c["contesto"] for c in campioni] == attesi[2:len(campioni) + 2]  # the first two: before the run
    assert any(t > 40 for c in campioni for t, _ in c["contesto"])  # a slot was seen holding prompt and answer


def test_senza_i_campi_del_contesto_nd_e_una_nota(fake, carica):
    """An older /slots without n_prompt_tokens: n/d and one note; the lab's lines as always."""
    def slots_vecchi(h, _corpo):
        h.send_json(200, [{"id": i, "n_ctx": 512, "is_processing": s.busy} for i, s in enumerate(h.server.fake.slots)])
    server = fake(n_slot=2, n_ctx=1024, s_per_token=0.003, override={"/slots": slots_vecchi})
    rc, out, err = carica(server.url, "--dettagli", "--grafico", *VELOCE)
    assert rc == 0, err
    assert "  contesto per slot: n/d (/slots non dice quanti token tiene ogni slot)" in out
    assert "ctx 0" not in out
    assert err.count("il contesto per slot è n/d") == 1


def test_grafico_e_svg_il_riempimento_di_ogni_slot(fake, carica, tmp_path):
    """A slot's row rises with what /slots says it holds; a full block is its n_ctx. The SVG draws the
    same steps under a dashed n_ctx line."""
    letture = iter(range(0, 10 ** 6, 64))

    def slots_che_crescono(h, _corpo):
        tenuti = min(512, next(letture))
        h.send_json(200, [{"id": 0, "n_ctx": 512, "is_processing": True, "n_prompt_tokens": tenuti}])
    server = fake(n_slot=1, s_per_token=0.01, override={"/slots": slots_che_crescono})
    rc, out, err = carica(server.url, "--grafico", "--svg", str(tmp_path / "p.svg"), "--richieste", "2",
                          "--intervallo", "0.08")
    assert rc == 0, err
    riga = next(r for r in out.splitlines() if r.startswith("ctx 0"))[8:].strip()
    livelli = " ▁▂▃▄▅▆▇█"
    assert [livelli.index(c) for c in riga] == sorted(livelli.index(c) for c in riga)  # never goes down
    assert riga.endswith("█") and len(set(riga)) >= 5
    assert "▁..█ contesto dello slot fino a n_ctx 512 (/slots)" in out
    disegno = (tmp_path / "p.svg").read_text()
    assert '<title>n_ctx 512</title>' in disegno and 'stroke-dasharray="4 3"' in disegno
    assert "<title>slot 0: 512 di 512 token a " in disegno
    assert "contesto per slot, fino alla linea di n_ctx (/slots)" in disegno


@pytest.mark.parametrize("np,somma", [("4kv", True), ("4", False)])
def test_con_kv_unified_la_somma_contro_il_buffer(capsys, tmp_path, np, somma):
    """With --kv-unified (known with --avvia) the sum over the slots against the shared buffer, in
    --dettagli and in the pictures; without it, each slot has its own context and there is no sum."""
    url = f"http://127.0.0.1:{porta_libera()}"
    rc = carico.main(["--url", url, "--avvia", comando_fake("--s-per-token 0.004"), "--np", np, "--dettagli",
                      "--grafico", "--svg", str(tmp_path / "p.svg"), "--token", "40", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert ("    somma sugli slot: " in out) is somma
    assert ("ctx tutti" in out) is somma
    assert (">tutti</text>" in (tmp_path / "p.svg").read_text()) is somma
    if somma:
        assert " token chiesti al buffer che condividono (--kv-unified), di 2048 (" in out


# Conversations ###############################################################################

def turno_che_non_entra(utente, sistema, token, n_ctx_slot, turni):
    """The arithmetic of the fake's context: each turn's prompt is the template, the system prompt and
    the history (questions and answers, an answer cut where the slot ends). Returns (turn, its prompt's
    tokens) of the first turn that does not fit, or None."""
    domande = carico.Conversazioni(carico.Piano(parallele=4), 0)
    storia = TEMPLATE_TOKENS + sistema
    for turno in range(1, turni + 1):
        storia += conta_token(domande.messaggio_utente(utente, turno - 1)["content"])
        if storia >= n_ctx_slot:
            return turno, storia
        storia += min(token, n_ctx_slot - storia)
    return None


def test_conversazioni_si_fermano_dove_dice_l_aritmetica(fake, carica):
    """At -np 4 -c 2048 (512 a slot), each conversation stops at the turn the arithmetic predicts, with the
    server's own error; the exit code is 3 (the context ran out, as designed), and the cache note is not a warning."""
    server = fake(n_slot=4, n_ctx=2048, s_per_token=0.001)
    rc, out, err = carica(server.url, "--turni", "5", "--sistema", "400", "--token", "16", "--stream", *VELOCE)
    assert rc == 3, err
    assert "conversazioni: 4 utenti da 5 turni, prompt di sistema di 400 token; contesto 512 token per slot" in out
    assert "  turno  riuscite  token di prompt  dalla cache  latenza media  primo token" in out
    for utente in range(4):
        turno, prompt = turno_che_non_entra(utente, 400, 16, 512, 5)
        assert turno < 5
        assert (f"  utente {utente}: fermo al turno {turno}, il contesto dello slot è finito: "
                + ERRORE_400.format(prompt)) in out
    assert "arrivate all'ultimo turno: 0 su 4; 4 richieste non sono entrate nel contesto" in out
    assert "cache_prompt: false" not in err  # the cache is the experiment here, not a flaw of the run


def test_una_conversazione_con_tutto_il_contesto_arriva_in_fondo(fake, carica, tmp_path):
    """The same conversation on one slot of 2048 goes through every turn, reusing its history from the
    cache turn after turn; exit 0."""
    server = fake(n_slot=1, n_ctx=2048, s_per_token=0.001)
    rc, out, err = carica(server.url, "--turni", "5", "--sistema", "400", "--token", "16", "--parallele", "1",
                          "--csv", str(tmp_path / "c.csv"), *VELOCE)
    assert rc == 0, err
    with open(tmp_path / "c.csv", newline="") as f:
        assert [(r["conversazione"], r["turno"]) for r in csv.DictReader(f)] == [("0", str(t)) for t in range(1, 6)]
    assert turno_che_non_entra(0, 400, 16, 2048, 5) is None
    tabella = out[out.index("  turno  riuscite"):].splitlines()[1:6]
    assert [r.split()[:2] for r in tabella] == [[str(t), "1/1"] for t in range(1, 6)]
    cache = [int(r.split()[3]) for r in tabella]
    assert cache[0] == 0 and all(c > 400 for c in cache[1:])  # the system prompt and the history, reused
    assert "arrivate all'ultimo turno: 1 su 1" in out


def test_risposte_troncate_dal_contesto(fake, carica):
    """A prompt that fits but leaves less room than --token: the answer stops where the slot ends
    (finish_reason length), and the report says so."""
    server = fake(n_slot=4, n_ctx=2048, s_per_token=0.001)
    rc, out, _ = carica(server.url, "--turni", "3", "--sistema", "430", "--token", "60", *VELOCE)
    assert rc == 3
    assert "la risposta si è fermata a " in out and " token di 60: lo slot era pieno (finish_reason length)" in out


def test_lo_slot_era_pieno_solo_se_prompt_e_risposta_lo_riempiono():
    """finish_reason length before --token is a full slot only when prompt + answer reach its n_ctx; a
    server that caps the answer for another reason (its own -n) gets no cause."""
    def turno(utente, prompt, token):
        return carico.Risultato(utente, 0.0, 1.0, token, 30.0, 10.0, 900.0, token_prompt=prompt,
                                token_cache=0, finish_reason="length",
                                oltre=carico.RisultatoOltre(conversazione=utente, turno=1))
    piano = carico.Piano(None, 2, 32, oltre=carico.PianoOltre(turni=1))
    prova = carico.Prova(carico.InfoServer(4, 512, True), carico.Esecuzione([turno(0, 490, 22), turno(1, 100, 10)], [], 2),
                         piano)
    righe = carico.righe_conversazioni(prova)
    assert "  utente 0: al turno 1 la risposta si è fermata a 22 token di 32: lo slot era pieno (finish_reason length)" in righe
    assert "  utente 1: al turno 1 la risposta si è fermata a 10 token di 32 (finish_reason length)" in righe


@pytest.mark.parametrize("utenti,pieno", [("4", True), ("2", False)])
def test_kv_unified_pieno_fa_fallire_le_richieste_in_volo(fake, carica, utenti, pieno):
    """With --kv-unified, conversations that together outgrow the shared buffer fail (HTTP 500, every
    request in flight, as this llama.cpp does); two conversations fit and go to the end. Without --avvia
    the 500 itself says that the buffer is shared: this llama.cpp sends it only from one (issue 23)."""
    server = fake(n_slot=4, n_ctx=2048, kv_unified=True, s_per_token=0.001)
    rc, out, err = carica(server.url, "--turni", "6", "--sistema", "300", "--token", "32", "--parallele", utenti,
                          "--grafico", *VELOCE)
    fermi = [r for r in out.splitlines() if "fermo al turno" in r]
    if pieno:
        assert rc == 3, err
        assert fermi and all("il buffer KV condiviso fra gli slot (--kv-unified) è pieno: HTTP 500 server_error: Context size "
                             "has been exceeded." in r for r in fermi)
        # The failed turns have no timings: where one was in flight, the busy slots are unknown, not 0.
        disegno = out[out.index("        0 s"):].splitlines()
        fallite = {i for r in disegno if r.startswith("req ") for i, c in enumerate(r) if c == "×"}
        slot = next(r for r in disegno if r.startswith("slot    "))
        assert fallite and all(i >= len(slot) or slot[i] != "0" for i in fallite)
    else:
        assert rc == 0, err
        assert fermi == [] and f"arrivate all'ultimo turno: {utenti} su {utenti}" in out


def test_con_avvia_4kv_il_buffer_condiviso_pieno(capsys):
    """Started by --avvia with --kv-unified, the same 500 is the shared buffer, full: said so."""
    url = f"http://127.0.0.1:{porta_libera()}"
    rc = carico.main(["--url", url, "--avvia", comando_fake(), "--np", "4kv", "--turni", "6", "--sistema", "300",
                      "--token", "32", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 3, err
    fermi = [r for r in out.splitlines() if "fermo al turno" in r]
    assert fermi and all("il buffer KV condiviso fra gli slot (--kv-unified) è pieno: HTTP 500 server_error: "
                         "Context size has been exceeded." in r for r in fermi)


def test_slots_vecchi_con_state_contesto_nd(fake, carica):
    """An older /slots that says busy with `state` and not the tokens: n/d, never a 0% for a busy slot."""
    def slots_state(h, _corpo):
        h.send_json(200, [{"id": i, "n_ctx": 512, "state": int(s.busy)} for i, s in enumerate(h.server.fake.slots)])
    server = fake(n_slot=2, n_ctx=1024, s_per_token=0.003, override={"/slots": slots_state})
    rc, out, _ = carica(server.url, "--dettagli", "--token", "40", *VELOCE)
    assert rc == 0
    assert "  contesto per slot: n/d (/slots non dice quanti token tiene ogni slot)" in out
    assert carico.contesto_degli_slot([{"id": 0, "n_ctx": 0, "is_processing": False}]) is None  # n_ctx 0: no divide


def test_un_altro_guasto_non_e_il_contesto(fake, carica):
    """A turn that fails for another reason stops its conversation too, but the exit code is 1."""
    def a_volte_500(h, corpo):
        fake_server = h.server.fake
        fake_server.bodies.append(json.loads(corpo))
        if len(fake_server.bodies) == 3:
            return h.errore(500, "server_error", "guasto")
        return h.send_json(*fake_server.completa(fake_server.bodies[-1]))
    server = fake(n_slot=2, n_ctx=4096, s_per_token=0.001, override={"/v1/chat/completions": a_volte_500})
    rc, out, _ = carica(server.url, "--turni", "3", "--parallele", "2", "--token", "8", *VELOCE)
    assert rc == 1
    assert [r for r in out.splitlines() if "fermo al turno 2" in r] == [
        next(r for r in out.splitlines() if r.startswith("  utente "))]
    assert "è fallito: HTTP 500 server_error: guasto" in out


def test_il_prompt_di_sistema_ha_esattamente_n_token(fake):
    server = fake()
    client = carico.Client(server.url)
    for n in (1, 7, 300, 1000):
        testo = carico.testo_di_token(client, n)
        assert conta_token(testo) == n


def test_tokenize_che_chiude_la_connessione(fake, capsys):
    """A /tokenize that drops the connection: one Italian line, exit 1 (the server failed), no traceback."""
    def chiude(h, _corpo):
        h.close_connection = True
    server = fake(override={"/tokenize": chiude})
    rc = carico.main(["--url", server.url, "--turni", "2", "--sistema", "50"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.splitlines()[-1] == (f"carico.py: errore: nessuna risposta dal server {server.url} (/tokenize): "
                                    "connessione chiusa dal server prima della risposta")
    assert server.bodies == []


@pytest.mark.parametrize("status,corpo,detto", [
    (404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}},
     "HTTP 404 not_found_error: File Not Found"),
    (200, {"tokens": [5379, 236748]}, 'HTTP 200: {"tokens": [5379, 236748]}'),  # ids without their pieces
    (200, {"tokens": [{"id": 1, "piece": [300]}]}, 'HTTP 200: {"tokens": [{"id": 1, "piece": [300]}]}'),
])
def test_senza_tokenize_sistema_esce_1_prima_del_carico(fake, capsys, status, corpo, detto):
    server = fake(override={"/tokenize": lambda h, _: h.send_json(status, corpo)})
    rc = carico.main(["--url", server.url, "--turni", "2", "--sistema", "50"])
    err = capsys.readouterr().err
    assert rc == 1  # the server's limit, not a bad option
    ne = "; né con /extras/tokenize" if status == 404 else ""
    assert err.splitlines()[-1] == (f"carico.py: errore: il server su {server.url} non conta i token con /tokenize "
                                    f"({detto}{ne}). --sistema, --prompt-token e --prefisso hanno bisogno del suo "
                                    "tokenizzatore")
    assert server.bodies == []


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--sistema", "100"], "--sistema va usato insieme a --turni: è il prompt di sistema delle conversazioni"),
    (["--turni", "3", "--ritmo", "1"], "--turni e --ritmo si escludono"),
    (["--turni", "3", "--durata", "5"], "--turni e --durata si escludono"),
    (["--turni", "3", "--richieste", "8"], "--turni e --richieste si escludono"),
    (["--turni", "3", "--parallele", "1,2"], "--turni prova una conversazione per utente: --parallele e --token "
                                             "vogliono un valore solo"),
    (["--turni", "0"], "opzione --turni: deve essere maggiore di 0, non 0"),
    (["--avvia", "llama serve", "--np", "autokv"], "'autokv' non è un valore di -np (per esempio 1,2,4,4kv)"),
    (["--avvia", "llama serve", "--np=-1kv"], "-np -1kv non ha senso: usa 1, 2, 4, 4kv... o auto (decide il server)"),
])
def test_opzioni_sbagliate_delle_conversazioni(fake, capsys, argomenti, messaggio):
    assert messaggio in rifiutata(fake(), capsys, argomenti)


def test_turni_con_prompt_file_si_escludono(fake, capsys, tmp_path):
    (tmp_path / "p.txt").write_text("Riassumi.")
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--turni", "2", "--prompt-file", str(tmp_path / "p.txt")])
    assert uscita.value.code == 2
    assert "--turni e --prompt-file si escludono" in capsys.readouterr().err


def test_ctrl_c_durante_le_conversazioni(fake, tmp_path):
    """Ctrl+C in the middle of the turns: the report of what ended, the conversations' table, exit 130."""
    from test_fine import con_una_funzione_cambiata

    server = fake(n_slot=2, n_ctx=4096, s_per_token=0.002)
    proc = con_una_funzione_cambiata(
        tmp_path, "cifre_completamento", "    cambiata.n = getattr(cambiata, 'n', 0) + 1\n"
        "    if cambiata.n == 3:\n        os.kill(os.getpid(), signal.SIGINT)",
        "--url", server.url, "--turni", "4", "--parallele", "2", "--token", "8")
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "conversazioni: 2 utenti da 4 turni" in proc.stdout and "carico.py: interrotto" in proc.stderr


# What the server decided ######################################################################

LOG_VERO = """\
0.00.830.426 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 512 cells
0.00.833.580 I llama_kv_cache: size =    6.00 MiB (   512 cells,   3 layers,  4/4 seqs), K (f16):    3.00 MiB, V (f16):    3.00 MiB
0.00.833.595 I llama_kv_cache_iswa: creating     SWA KV cache, size = 512 cells
0.00.849.416 I llama_kv_cache: size =   30.00 MiB (   512 cells,  15 layers,  4/4 seqs), K (f16):   15.00 MiB, V (f16):   15.00 MiB
0.00.963.628 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 512, kv_unified = 'false'
"""


def test_le_decisioni_dal_log_di_llama_cpp():
    """Lines as llama.cpp (b11434) prints them at -lv 4; without the KV lines (-lv 3), n/d."""
    d = carico.leggi_decisioni(LOG_VERO)
    assert (d.n_slot, d.n_ctx_slot, d.kv_unificata, d.kv_mib) == (4, 512, False, 36.0)
    assert d.cache_kv == (("non-SWA", 6.0, 512, 3), ("SWA", 30.0, 512, 15))
    senza = carico.leggi_decisioni(LOG_VERO.splitlines()[-1])
    assert (senza.n_slot, senza.kv_mib) == (4, None)
    assert carico.riga_decisioni(carico.Configurazione(4), senza).endswith("kv_unified false, cache KV n/d")
    assert carico.leggi_decisioni("altro server\n") == carico.Decisioni()


def test_np_auto_senza_np_e_il_server_decide(capsys):
    assert carico.lista_np("auto,4") == [carico.Configurazione(-1), carico.Configurazione(4)]
    assert carico.Configurazione(-1).argomenti() == [] and carico.Configurazione(-1).etichetta == "auto"
    url = f"http://127.0.0.1:{porta_libera()}"
    rc = carico.main(["--url", url, "--avvia", comando_fake(), "--np", "auto", "--token", "4", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "avvio: " in err and " -np " not in err
    assert out.splitlines()[0] == ("il server (-np auto) ha deciso, dal suo log: 4 slot, n_ctx per slot 2048, "
                                   "kv_unified true, cache KV 36.00 MiB")
    assert "server: 4 slot, n_ctx per slot = 2048\n  (--kv-unified: 2048 token di contesto condivisi fra i 4 slot)" in out
    assert "| auto | 2048 | 36.00 | " in out


def test_auto_non_e_mai_la_base_dei_rapporti(capsys):
    url = f"http://127.0.0.1:{porta_libera()}"
    rc = carico.main(["--url", url, "--avvia", comando_fake(), "--np", "auto,1", "--token", "4", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "throughput: np auto / np 1 ×" in out and "/ np auto" not in out


@pytest.mark.parametrize("swa", [True, False])
def test_la_domanda_della_ram_misurata(capsys, swa):
    """--spiega with --avvia starts the question's servers (-np 4 and -np 4 --kv-unified, at -c 16384: 4
    conversations of 4096) and reads the KV each allocated. It says the growth is not proportional only
    when it is not (sliding windows)."""
    url = f"http://127.0.0.1:{porta_libera()}"
    rc = carico.main(["--url", url, "--avvia", comando_fake(*([] if swa else ["--senza-swa"])), "--np", "4",
                      "--token", "4", "--spiega", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "-c 16384 -np 4 -lv 4 --host" in err and "-c 16384 -np 4 --kv-unified -lv 4 --host" in err
    assert "  Servono -c 16384: 4 slot da 4096 (-np 4)" in out
    assert ("  La cache KV, misurata: il server di questa sessione (-np 4, -c 2048) ha allocato 36.00 MiB; avviato "
            "con -c 16384:") in out
    if swa:
        assert "    -np 4: 108.00 MiB (+72.00 MiB, x3.0 per x8 token di contesto)" in out
        assert "      cache SWA (15 strati): 60.00 MiB, 1024 celle per flusso" in out
        assert ("      per token di contesto: 18.0 KiB in media a -c 2048; ogni token in più fino a -c 16384 ne costa "
                "5.1 KiB (la differenza fra i due avvii)") in out
        assert "    -np 4 --kv-unified: 85.50 MiB (+49.50 MiB, x2.4 per x8 token di contesto)" in out
        assert "  Non cresce come il contesto: con -np 4 la cache SWA (15 strati) si ferma a 1024 celle; " in out
    else:
        assert "    -np 4: 288.00 MiB (+252.00 MiB, x8.0 per x8 token di contesto)" in out
        assert "Non cresce come il contesto" not in out


def test_la_domanda_della_ram_senza_cifre_non_indovina(tmp_path):
    """No KV lines in the first log: n/d, and no second start. A second start that fails: n/d with its
    reason, not the session's failure. A cache that grows less than the context without an SWA cache in
    the log: the figures, and no cause given."""
    muto = carico.Configurazione(4, deciso=carico.Decisioni(4, 512, False))
    opzioni = carico.Opzioni(f"http://127.0.0.1:{porta_libera()}", oltre=carico.OpzioniOltre(avvia=["/non/esiste"]))
    misurate, perche = carico.misura_ram(opzioni, muto)
    assert misurate == [] and "il log del server non scrive la cache KV" in perche
    assert carico.righe_ram(muto, misurate, perche)[-1] == (
        "  La cache KV: n/d (il log del server non scrive la cache KV (questo llama.cpp la scrive da -lv 4)).")
    prima = carico.Configurazione(4, deciso=carico.leggi_decisioni(LOG_VERO))
    fallisce = opzioni._replace(oltre=carico.OpzioniOltre(avvia=comando_fake("--fallisci").split()), attesa_pronto=10)
    misurate, perche = carico.misura_ram(fallisce, prima)
    assert [g for _, g in misurate] == [None, None]
    assert perche.startswith("il server non è partito con -np 4 -c 16384: il server si è fermato")
    senza_swa = carico.Decisioni(4, 4096, False, (("KV", 48.0, 4096, 3),))
    righe = carico.righe_ram(carico.Configurazione(4, deciso=carico.Decisioni(4, 512, False, (("KV", 36.0, 512, 3),))),
                             [(carico.Configurazione(4), senza_swa)], "")
    assert any("x1.3 per x8 token di contesto" in r for r in righe)
    assert not any("Non cresce" in r for r in righe)
