"""The seam between the lab and the extras (issue 26, family 8): the lab's records hold what the lab's
run reads, and calls cross the seam one way: a session with extras is a Sessione that calls the lab's
steps and fills its hooks; the lab's Sessione knows nothing of it."""

import ast
import contextlib
import inspect
import io
import sys
import threading

import carico

BANNER = "# Oltre il lab ####"
RIGHE = open(carico.__file__, encoding="utf-8").read().splitlines()
LINEA_BANNER = next(i + 1 for i, riga in enumerate(RIGHE) if riga.startswith(BANNER))


def nomi_in_avanti():
    """Module-level names the chapter (above the banner) loads that are defined only below it, each with the
    lines that use it. An attribute of one is a name of its own, but SessioneOltre's: its hooks for the
    extras' flags (aggiungi_opzioni, dalle_opzioni) are the session's, the one way in for them."""
    albero = ast.parse("\n".join(RIGHE))
    sopra, sotto = set(), set()
    for nodo in albero.body:
        bersagli = [nodo] if isinstance(nodo, (ast.FunctionDef, ast.ClassDef)) else getattr(
            nodo, "targets", [getattr(nodo, "target", None)])
        nomi = {getattr(b, "name", None) or getattr(b, "id", None) for b in bersagli if b is not None}
        (sopra if nodo.lineno < LINEA_BANNER else sotto).update(nomi - {None})
    avanti, usati = sotto - sopra, {}
    for nodo in (n for n in albero.body if n.lineno < LINEA_BANNER):
        locali = {n.id for n in ast.walk(nodo) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
        for n in ast.walk(nodo):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in avanti and n.id not in locali:
                usati.setdefault(n.id, set()).add(n.lineno)
            padrone = getattr(n.value, "id", None) if isinstance(n, ast.Attribute) else None
            if padrone in avanti and padrone != "SessioneOltre":
                usati.setdefault(f"{padrone}.{n.attr}", set()).add(n.lineno)
    return usati


def test_il_capitolo_nomina_al_piu_sei_nomi_degli_extra():
    """The chapter reaches what is defined after the banner through at most six names (annotations
    included), and each use says on its line, or one of the two above it, that it is a seam."""
    usati = nomi_in_avanti()
    assert len(usati) <= 6, sorted(usati)
    for nome, linee in usati.items():
        for linea in linee:
            intorno = RIGHE[linea - 1] + RIGHE[linea - 2] + RIGHE[linea - 3]
            assert "seam" in intorno, (nome, linea, RIGHE[linea - 1])


def test_il_capitolo_non_legge_il_posto_degli_extra():
    """The lab's code never reads an extras' record: no oltre() above the banner (each record's `oltre`
    slot is the extras' alone), and no lab function branches on a stream."""
    albero = ast.parse("\n".join(RIGHE))
    chiamate = [n.lineno for nodo in albero.body if nodo.lineno < LINEA_BANNER for n in ast.walk(nodo)
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "oltre"]
    assert chiamate == []
    assert 'get("stream")' not in inspect.getsource(carico.invia)


def test_una_prova_del_lab_passa_quasi_tutta_sopra_il_banner(fake):
    """The banner by line 1,400, and a plain lab run (the lab's command line, the fake server) executes
    at least 95% of its lines above it: the chapter is the code that runs."""
    assert LINEA_BANNER <= 1400
    eseguite = set()

    def traccia(frame, evento, _arg):
        if frame.f_code.co_filename != carico.__file__:
            return None
        if evento == "line":
            eseguite.add(frame.f_lineno)
        return traccia

    server = fake(n_slot=4, s_per_token=0.001)
    threading.settrace(traccia)
    sys.settrace(traccia)
    try:
        with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
            rc = carico.main(["--url", server.url, "--richieste", "4", "--parallele", "4", "--token", "32"])
    finally:
        sys.settrace(None)
        threading.settrace(None)
    assert rc == 0 and "throughput aggregato" in out.getvalue()
    sopra = sum(linea < LINEA_BANNER for linea in eseguite)
    assert sopra >= 0.95 * len(eseguite), sorted(linea for linea in eseguite if linea >= LINEA_BANNER)


COMPLETAMENTO = {"choices": [{"finish_reason": "stop", "message": {"content": "Ciao"}}],
                 "usage": {"completion_tokens": 5, "prompt_tokens": 12},
                 "timings": {"cache_n": 3, "prompt_n": 9, "predicted_per_second": 10.0, "prompt_ms": 5.0,
                             "predicted_ms": 400.0}}


def test_il_record_del_lab_tiene_quel_che_il_lab_legge():
    """finish_reason and the cached tokens (read by the notes after every lab run) and the prompt's
    tokens are the answer's own figures, on Risultato; the extras' record keeps only what they read."""
    r = carico.Risultato(0, 0.0, 1.0, **carico.cifre_completamento(COMPLETAMENTO))
    assert (r.token, r.token_prompt, r.token_cache, r.finish_reason, r.oltre) == (5, 12, 3, "stop", None)
    assert not {"token_prompt", "token_cache", "finish_reason"} & set(carico.RisultatoOltre._fields)
    r = carico.Risultato(0, 0.0, 1.0, **carico.cifre_oltre(COMPLETAMENTO))
    assert carico.oltre(r).testo == "Ciao"  # a conversation (--turni) sends it back: the extras'


def test_le_note_del_lab_leggono_il_record_del_lab():
    """The notes after a lab run read finish_reason and the cache from the lab's record, no extras' one."""
    ferma = carico.Risultato(0, 0.0, 1.0, 5, 10.0, 5.0, 400.0, finish_reason="stop", token_cache=3)
    prova = carico.Prova(carico.InfoServer(1, 512, True), carico.Esecuzione([ferma], [], 1), carico.Piano(1, 1, 32))
    note = carico.note(prova)
    assert any("si è fermata prima di --token 32 (finish_reason stop, 5 token)" in n for n in note), note
    assert any("il server ha preso dalla cache 3 token di prompt in 1 richiesta" in n for n in note), note


def test_la_sessione_del_lab_non_conosce_gli_extra():
    """One direction across the seam: SessioneOltre is a Sessione; the lab's holds no extras' object
    and never names it; a plain lab command line makes a plain Sessione."""
    assert issubclass(carico.SessioneOltre, carico.Sessione)
    assert "SessioneOltre" not in inspect.getsource(carico.Sessione)
    lab = carico.Sessione(*carico.analizza_argomenti(["--richieste", "2"]))
    assert type(lab) is carico.Sessione and not hasattr(lab, "oltre")
    assert not any(isinstance(v, carico.Sessione) or type(v).__name__.endswith("Oltre") for v in vars(lab).values())
    oltre = carico.SessioneOltre(*carico.analizza_argomenti(["--ripeti", "2"]))
    assert oltre.oltre.ripeti == 2 and oltre.piani and oltre.prove == []


def test_una_prova_del_lab_con_il_server_finto(fake, carica):
    """The lab's run, end to end: the model stops early, and the note reads it from the lab's record."""
    server = fake(n_slot=2, s_per_token=0.001, eos_dopo=5)
    rc, out, err = carica(server.url, "--richieste", "2", "--parallele", "2", "--token", "8")
    assert rc == 0, out + err
    assert "2 richieste su 2 si sono fermate prima di --token 8 (finish_reason stop, 5 token)" in err, err
