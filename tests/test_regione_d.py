"""The extras' helpers that issue 26's fold rewrote in fewer lines (the live line, the network's errors in
Italian, the log of a started server): what they print, pinned where no other test pins it."""

import concurrent.futures
import http.client
import io
import socket
import ssl

import carico


def finita(risultato):
    futuro = concurrent.futures.Future()
    futuro.set_result(risultato)
    return futuro


def test_la_riga_dal_vivo_conta_i_token_delle_risposte_e_degli_slot_occupati():
    """Tokens shown: the answers' own, plus n_decoded of each busy slot's next_token (an idle slot, or one
    whose next_token is not a list of objects, adds nothing); the count never goes back."""
    diretta = carico.Diretta(io.StringIO(), 4, carico.Client("http://127.0.0.1:9").sentinella)
    futuri = [finita(carico.Risultato(0, 0.0, 1.0, token=10)), finita(carico.Risultato(1, 0.0, 1.5)),
              concurrent.futures.Future()]
    diretta.seguendo(futuri, carico.Piano(richieste=5, parallele=3))
    slots = [{"id": 0, "is_processing": True, "next_token": [{"n_decoded": 7}]},
             {"id": 1, "is_processing": False, "next_token": [{"n_decoded": 100}]},
             {"id": 2, "is_processing": True, "next_token": "rotto"},
             {"id": 3, "is_processing": True, "next_token": [{"n_decoded": 3}]}]
    assert diretta.riga(carico.Campione(2.0, 2), slots) == (
        "[2/5] slot occupati 2/4  in coda 0  generati 20 token  10.0 t/s  2.0 s")
    # A reading without the slots: the answers alone would say 10, the line keeps the 20 it showed.
    assert diretta.riga(carico.Campione(4.0, None), None) == (
        "[2/5] slot occupati n/d/4  in coda n/d  generati 20 token  5.0 t/s  4.0 s")


def test_ogni_errore_di_rete_ha_la_sua_frase():
    """The first kind that matches says it: a truncated answer before any other HTTP error, TLS with its
    reason (or its class), an unknown error by its strerror, else its class's name."""
    frase = carico.descrivi_errore_rete
    assert frase(socket.timeout(), 2.5) == "nessuna risposta entro 2.5 s"
    assert frase(http.client.IncompleteRead(b"x"), 1) == "risposta troncata: la connessione si è chiusa a metà"
    assert frase(http.client.RemoteDisconnected(), 1) == "connessione chiusa dal server prima della risposta"
    assert frase(http.client.BadStatusLine("x"), 1) == "risposta HTTP non valida (BadStatusLine)"
    tls = ssl.SSLError(1, "boh")
    tls.reason = "CERTIFICATE_VERIFY_FAILED"
    assert frase(tls, 1) == "errore TLS (CERTIFICATE_VERIFY_FAILED)"
    eof = ssl.SSLEOFError()
    eof.reason = None  # as the ssl module raises it: a reason it may not know
    assert frase(eof, 1) == "errore TLS (SSLEOFError)"
    assert frase(OSError(113, "No route to host"), 1) == "errore di rete: No route to host"
    assert frase(ValueError("x"), 1) == "errore di rete: ValueError"


def test_il_log_del_server_avviato_senza_flush(tmp_path):
    """The server writes its log itself: carico reads what it decided, and the last 15 lines, from the file."""
    log = tmp_path / "server.log"
    righe = [f"riga {i}\n" for i in range(20)]
    log.write_text("load_model: initializing, n_slots = 4, n_ctx_slot = 512, kv_unified = 'false'\n" + "".join(righe))
    server = carico.ServerAvviato(["llama"], carico.Configurazione(4), "http://127.0.0.1:9", 1.0, io.StringIO())
    with open(log, "rb") as server.log:
        assert server.decisioni() == carico.Decisioni(4, 512, False)
        assert server.coda_log() == "".join("  | " + r for r in righe[-15:]).rstrip()


def test_il_verdetto_di_welch_dice_gradi_infiniti_come_inf():
    """Files whose repeats all agree: the degrees of freedom are infinite, and printed `inf` like the t."""
    assert carico.oltre_il_rumore([1.0, 1.0], [2.0, 2.0]) == "oltre il rumore (Welch 95%: t inf, gl inf, soglia 1.96)"
    assert carico.oltre_il_rumore([1.0, 1.0], [1.0, 1.0]) == "entro il rumore (Welch 95%: t 0.00, gl inf, soglia 1.96)"
    assert carico.oltre_il_rumore([1.0, 1.2, 1.1], [1.3, 1.5, 1.4]) == (
        "oltre il rumore (Welch 95%: t 3.67, gl 4.00, soglia 2.78)")
