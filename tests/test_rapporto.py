"""The lab's three sample outputs, re-rendered byte for byte from their numbers."""

import carico
from carico import Campione, Esecuzione, InfoServer, Piano, Prova, Risultato

LAB_NP1 = """\
server: 1 slot, n_ctx per slot = 2048
  req 0:   8.54 s   32 token  (8.8 t/s nel proprio slot)
  req 1:   3.58 s   32 token  (11.4 t/s nel proprio slot)
  req 2:  20.30 s   32 token  (5.1 t/s nel proprio slot)
  req 3:  13.46 s   32 token  (7.8 t/s nel proprio slot)

richieste=4 parallele=4 slot=1  picco slot occupati insieme=1
tempo totale 20.31 s  |  latenza media 11.47 s, max 20.30 s
throughput aggregato 6.30 token/s  (128 token generati)
"""

LAB_NP2 = """\
server: 2 slot, n_ctx per slot = 1024
  req 0:  14.08 s   32 token  (3.0 t/s nel proprio slot)
  req 1:  12.89 s   31 token  (3.2 t/s nel proprio slot)
  req 2:  22.28 s   32 token  (3.8 t/s nel proprio slot)
  req 3:  22.70 s   32 token  (4.1 t/s nel proprio slot)

richieste=4 parallele=4 slot=2  picco slot occupati insieme=2
tempo totale 22.76 s  |  latenza media 17.99 s, max 22.70 s
throughput aggregato 5.58 token/s  (127 token generati)
"""

LAB_NP4 = """\
server: 4 slot, n_ctx per slot = 512
  req 0:  10.12 s   32 token  (4.0 t/s nel proprio slot)
  req 1:  10.28 s   32 token  (4.3 t/s nel proprio slot)
  req 2:  10.28 s   32 token  (4.3 t/s nel proprio slot)
  req 3:  10.27 s   32 token  (4.3 t/s nel proprio slot)

richieste=4 parallele=4 slot=4  picco slot occupati insieme=4
tempo totale 10.30 s  |  latenza media 10.24 s, max 10.28 s
throughput aggregato 12.42 token/s  (128 token generati)
"""


def rendi(n_slot, n_ctx, picco, richieste):
    """richieste: (start, end, tokens, t/s) with the unrounded times a run would have measured."""
    risultati = [Risultato(i, inizio, fine, token=tok, tps=tps) for i, (inizio, fine, tok, tps) in enumerate(richieste)]
    campioni = [Campione(0.0, 0), Campione(0.5, picco), Campione(1.0, picco - 1)]
    info = InfoServer(n_slot, n_ctx, True)
    esecuzione = Esecuzione(risultati, campioni, len(richieste))
    return "\n".join([carico.riga_server(info)] + carico.rapporto(Prova(info, esecuzione))) + "\n"


def rapporto(esecuzione, parallele, info):
    return carico.rapporto(Prova(info, esecuzione, Piano(esecuzione.n_richieste, parallele)))


def test_lab_np1_byte_per_byte():
    assert rendi(1, 2048, 1, [(0.001, 8.541, 32, 8.81), (0.002, 3.581, 32, 11.43), (0.008, 20.308, 32, 5.12),
                              (0.003, 13.462, 32, 7.79)]) == LAB_NP1


def test_lab_np2_byte_per_byte():
    assert rendi(2, 1024, 2, [(0.001, 14.081, 32, 3.04), (0.001, 12.891, 31, 3.18), (0.002, 22.282, 32, 3.79),
                              (0.056, 22.756, 32, 4.12)]) == LAB_NP2


def test_lab_np4_byte_per_byte():
    assert rendi(4, 512, 4, [(0.001, 10.121, 32, 4.04), (0.002, 10.282, 32, 4.31), (0.002, 10.281, 32, 4.27),
                             (0.03, 10.3045, 32, 4.33)]) == LAB_NP4


def test_campi_mancanti_sono_nd_mai_inventati():
    info = InfoServer(None, None, False)
    esecuzione = Esecuzione([Risultato(0, 0.0, 1.5), Risultato(1, 0.0, 2.0, token=32)], [], 2)
    righe = rapporto(esecuzione, 2, info)
    assert carico.riga_server(info) == "server: n/d slot, n_ctx per slot = n/d"
    assert righe[0] == "  req 0:   1.50 s  n/d token  (n/d t/s nel proprio slot)"
    assert righe[1] == "  req 1:   2.00 s   32 token  (n/d t/s nel proprio slot)"
    assert righe[3] == "richieste=2 parallele=2 slot=n/d  picco slot occupati insieme=n/d"
    assert righe[4] == "tempo totale 2.00 s  |  latenza media 1.75 s, max 2.00 s"
    # One answer did not say its tokens: the sum, and so the throughput, are unknown.
    assert righe[5] == "throughput aggregato n/d  (n/d token generati)"


def test_picco_ignora_i_campioni_falliti():
    esecuzione = Esecuzione([Risultato(0, 0.0, 1.0, token=8)], [Campione(0, None), Campione(0.5, 2), Campione(1, None)], 1)
    assert carico.riassumi(esecuzione).picco == 2
    assert carico.riassumi(Esecuzione([], [Campione(0, None)], 1)).picco is None  # nothing measured: n/d, never 0


def test_richiesta_fallita_sulla_sua_riga_e_riepilogo_sulle_riuscite():
    errore = ("HTTP 400 exceed_context_size_error: request (1217 tokens) exceeds the available "
              "context size (512 tokens), try increasing it")
    esecuzione = Esecuzione([Risultato(0, 0.0, 2.0, token=32, tps=20.0), Risultato(1, 0.0, 0.05, errore=errore)],
                            [Campione(0, 1)], 2)
    righe = rapporto(esecuzione, 2, InfoServer(4, 512, True))
    assert righe[1] == "  req 1:   0.05 s   errore: " + errore
    assert righe[4] == "tempo totale 2.00 s  |  latenza media 2.00 s, max 2.00 s"
    assert righe[5] == "throughput aggregato 16.00 token/s  (32 token generati)"
    assert righe[6] == "richieste fallite: 1 su 2 (il riepilogo conta solo 1 riuscita)"


def test_indici_allineati_oltre_dieci_richieste():
    esecuzione = Esecuzione([Risultato(i, 0.0, 1.0, token=1, tps=1.0) for i in range(12)], [], 12)
    righe = rapporto(esecuzione, 12, InfoServer(4, 512, True))
    assert righe[0].startswith("  req  0:   1.00 s")
    assert righe[11].startswith("  req 11:   1.00 s")


def test_spiega_quando_nessuna_riesce():
    esecuzione = Esecuzione([Risultato(0, 0.0, 0.01, errore="HTTP 400 exceed_context_size_error: troppo lungo")], [], 1)
    prova = carico.Prova(InfoServer(4, 512, True), esecuzione)
    assert carico.spiegazione(prova) == [
        "L'unica richiesta non è andata a buon fine (HTTP 400 exceed_context_size_error: "
        "troppo lungo): non ci sono cifre da leggere."]


def test_tempo_totale_fino_all_ultima_risposta_anche_fallita():
    """The run lasted until its last answer, a failure included; throughput is the tokens over that time."""
    esecuzione = Esecuzione([Risultato(0, 0.0, 1.0, token=32, tps=32.0), Risultato(1, 0.0, 3.0, errore="HTTP 500")],
                            [Campione(0.5, 1)], 2)
    righe = rapporto(esecuzione, 2, InfoServer(2, 1024, True))
    assert righe[4] == "tempo totale 3.00 s  |  latenza media 1.00 s, max 1.00 s"
    assert righe[5] == "throughput aggregato 10.67 token/s  (32 token generati)"
    tutte_fallite = Esecuzione([Risultato(0, 0.0, 0.05, errore="HTTP 400")], [], 1)
    assert rapporto(tutte_fallite, 1, InfoServer(4, 512, True))[3] == (
        "tempo totale 0.05 s  |  latenza media n/d, max n/d")


def test_picco_dai_tempi_del_server_quando_le_letture_non_lo_vedono():
    """Two slots, four requests of 0.2 s: 0 and 1 together in the slots, 2 and 3 waiting for them. No
    /slots reading fell inside the run: the peak comes from the server's timings."""
    def r(i, inizio, fine, servizio):
        return Risultato(i, inizio, fine, token=8, tps=40.0, prompt_ms=5.0, predicted_ms=servizio * 1000 - 5)
    risultati = [r(0, 0.001, 0.205, 0.2), r(1, 0.002, 0.206, 0.2), r(2, 0.002, 0.41, 0.2), r(3, 0.003, 0.412, 0.2)]
    prova = Prova(InfoServer(2, 1024, True, True), Esecuzione(risultati, [Campione(0.5, 0, 0)], 4))
    s = prova.riepilogo
    assert (s.occupati_letti, s.occupati_dai_tempi, s.picco) == (0, 2, 2)
    assert (s.coda_letta, s.coda_dai_tempi, s.picco_coda) == (0, 2, 2)
    righe = carico.rapporto(prova)
    assert righe[5] == "richieste=4 parallele=4 slot=2  picco slot occupati insieme=2"
    assert righe[8] == "picco richieste in coda (dai tempi del server)=2"
    # Never more than the slots, even when the client read an answer late and two intervals touch.
    tardi = risultati[:2] + [r(2, 0.002, 0.45, 0.2), r(3, 0.003, 0.46, 0.2)]
    assert carico.picchi_dai_tempi(tardi, 2)[0] == 2
    # Sent one after the other: nobody waited, whatever the HTTP trip took.
    in_fila = [r(0, 0.0, 0.2, 0.19), r(1, 0.2, 0.4, 0.19), r(2, 0.4, 0.6, 0.19)]
    assert carico.picchi_dai_tempi(in_fila, 1) == (1, 0)
