"""One drawing model, two renderers: the steps of the server's intervals and the lanes of a run, read
the same way by the peaks, the waits, the terminal's picture and the SVG."""

import re

import carico
from carico import Campione, Esecuzione, InfoServer, Prova, Risultato


def servita(i, inizio, fine, servizio):
    """A request sent at `inizio`, answered at `fine`, `servizio` seconds of it in its slot."""
    return Risultato(i, inizio, fine, token=8, tps=40.0, prompt_ms=5.0, predicted_ms=servizio * 1000 - 5)


def in_fila(n, servizio=1.0, n_slot=1):
    """n requests sent together to n_slot slots, served first come first served."""
    risultati = [servita(i, 0.0, (i // n_slot + 1) * servizio, servizio) for i in range(n)]
    return Prova(InfoServer(n_slot, 512, True), Esecuzione(risultati, [], n))


def test_gradini_a_un_istante_chi_chiude_prima_di_chi_apre():
    # At t=2 one interval ends and another begins: the count stays 2, it never reads 3.
    assert carico.gradini([(0.0, 2.0), (1.0, 3.0), (2.0, 4.0)]) == [
        (0.0, 1.0, 1, 0), (1.0, 2.0, 2, 0), (2.0, 3.0, 2, 0), (3.0, 4.0, 1, 0)]
    # Waiting intervals are counted apart; an interval of no length only splits a step.
    assert carico.gradini([(0.0, 2.0)], [(0.5, 1.5), (1.0, 1.0)]) == [
        (0.0, 0.5, 1, 0), (0.5, 1.0, 1, 1), (1.0, 1.5, 1, 1), (1.5, 2.0, 1, 0)]
    assert carico.gradini([None, (1.0, 1.0)]) == []


def test_picchi_e_attese_dagli_stessi_gradini():
    prova = in_fila(3)  # one slot: 0 in it at once, 1 waits 1 s, 2 waits 2 s
    assert carico.picchi_dai_tempi(prova.esecuzione.riuscite, 1) == (1, 2)
    attese = carico.attese_a_slot_pieni(prova.esecuzione.riuscite, 1)
    assert attese.get(0, 0.0) == 0.0 and 0.9 < attese[1] < 1.0 < 1.9 < attese[2] < 2.0
    # Two slots for the same load: nobody waits while both are busy, no queue.
    due = in_fila(2, n_slot=2)
    assert carico.picchi_dai_tempi(due.esecuzione.riuscite, 2) == (2, 0)
    assert not any(carico.attese_a_slot_pieni(due.esecuzione.riuscite, 2).values())


def test_terminale_e_svg_leggono_le_stesse_corsie():
    prova = in_fila(4, n_slot=2)
    richieste, slot, fonte, contesto = carico.disegno(prova)
    assert fonte == "dai tempi del server" and contesto == []
    assert [nome for nome, _ in richieste] == ["req 0", "req 1", "req 2", "req 3"]
    # The busy slots: two, then (after a 2nd pair waited) two again; the steps never exceed the peak.
    assert max(t.valore for t in slot) == prova.riepilogo.picco == 2
    righe = carico.grafico(prova, carico.MARCHE_ASCII)
    (riga_slot,) = [r for r in righe if r.startswith("slot")]
    assert set(riga_slot[8:].strip()) == {"2"}
    disegno = carico.svg([prova])
    occupati = [int(n) for n in re.findall(r"<title>(\d+) slot occupati da", disegno)]
    assert occupati and set(occupati) == {2} and "max 2" in disegno
    # Each request's phases: the same pieces, as columns and as rectangles.
    fasi_svg = re.findall(r'fill="#[0-9a-f]+"><title>(\w+) [\d.]+ s</title>', disegno)
    assert fasi_svg == [t.tipo for _, tratti in richieste for t in tratti]
    assert "coda" in fasi_svg  # the second pair waited for a slot


def test_una_lettura_alla_fine_della_prova_nel_terminale_non_oltre_l_asse_svg():
    # No timings (another server): the busy slots come from /slots. The one reading came with the last answer,
    # at the end of the axis; 72 columns of 1.26 / 72 s end a hair past it (floating point), and hold it.
    prova = Prova(InfoServer(4, 512, True), Esecuzione([Risultato(0, 0.0, 1.26, token=8)], [Campione(1.26, 4)], 1))
    _, slot, fonte, _ = carico.disegno(prova)
    assert fonte == "/slots"
    (riga_slot,) = [r for r in carico.grafico(prova, carico.MARCHE_ASCII) if r.startswith("slot")]
    assert riga_slot.strip().endswith("4")  # at the last column, where the reading is
    assert "inf" not in carico.svg([prova])  # its piece holds past the axis: no bar drawn there


def test_una_fallita_in_volo_non_prova_slot_liberi():
    # One slot busy 0-1 s; a request that failed 2-3 s had no timings: an idle slot then is not proven.
    risultati = [servita(0, 0.0, 1.0, 1.0), Risultato(1, 2.0, 3.0, errore="HTTP 500")]
    prova = Prova(InfoServer(1, 512, True), Esecuzione(risultati, [], 2))
    _, slot, _, _ = carico.disegno(prova)
    assert carico.valore_fra(slot, 0.2, 0.8) == 1
    assert carico.valore_fra(slot, 1.2, 1.8) == 0
    assert carico.valore_fra(slot, 2.2, 2.8) is None
    assert carico.valore_fra(slot, 1.9, 2.2) is None  # nothing busy, and the failed one in flight


def test_contesto_e_somma_con_kv_unificata():
    letture = [Campione(0.0, 0, contesto=((0, 512), (0, 512))), Campione(0.5, 2, contesto=((300, 512), (100, 512))),
               Campione(1.0, 2, contesto=((100, 512), (300, 512))), Campione(1.5, 0, contesto=((0, 512), (0, 512)))]
    prova = Prova(InfoServer(2, 512, True, kv_unificata=True),
                  Esecuzione([Risultato(0, 0.0, 2.0, token=8), Risultato(1, 0.0, 2.0, token=8)], letture, 2))
    contesto = carico.corsie_contesto(prova)
    assert [(nome, n_ctx) for nome, n_ctx, _ in contesto] == [("ctx 0", 512), ("ctx 1", 512), ("tutti", 512)]
    assert [t.valore for t in contesto[2][2]] == [0, 400, 400, 0]  # the sum of each reading
    assert [(t.da, t.a) for t in contesto[0][2]] == [(0.0, 0.5), (0.5, 1.0), (1.0, 1.5), (1.5, 2.0)]
    righe = carico.grafico(prova, carico.MARCHE_ASCII)
    assert [r[:9] for r in righe if r.startswith("ctx")] == ["ctx 0    ", "ctx 1    ", "ctx tutti"]
    disegno = carico.svg([prova])
    assert "tutti gli slot: 400 di 512 token a 0.50 s" in disegno and "slot 0: 300 di 512 token a 0.50 s" in disegno


def test_un_solo_slot_occupato_al_singolare():
    """The tour: the SVG's tooltip said '1 slot occupati'."""
    tratti, _ = carico.slot_nel_tempo(in_fila(2))
    assert {t.titolo.split(" da ")[0] for t in tratti if t.valore == 1} == {"1 slot occupato"}, tratti
