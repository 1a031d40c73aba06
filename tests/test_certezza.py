"""A verdict knows its certainty (issue 23, the verdict half; issue 25, the queue seen from the client).

Each sentence that concludes rests on evidence measured in the session, says how sure it is, and stays
categorical only where that evidence separates it from the noise. For each: a case where it must FIRE
and cases where it must stay SILENT (or say that it cannot tell, and what would settle it), including
the noisy cases the real server showed: one noisy step, two readings, readings phase-locked to the sends."""

import math
import re

import pytest

import carico
from aiuti import VELOCE
from carico import Campione, Esecuzione, InfoServer, Piano, PianoOltre, Prova, Punto, Risultato


def prova(throughput, latenza, parallele=4, richieste=8, ritmo=None, slot=2):
    """One run: `richieste` requests all sent at 0 (or at `ritmo` a second), this mean latency, this
    aggregate throughput."""
    n = richieste
    inizi = [i / ritmo if ritmo else 0.0 for i in range(n)]
    totale = max(inizi) + latenza
    per_richiesta = throughput * totale / n  # a fraction of a token: the throughput exact, as the verdicts read it
    risultati = [Risultato(i, t, t + latenza, per_richiesta, 40.0, 5.0, latenza * 1000 - 5) for i, t in enumerate(inizi)]
    return Prova(InfoServer(slot, 1024, True), Esecuzione(risultati, [], n),
                 Piano(richieste, parallele, 32, oltre=PianoOltre(ritmo=ritmo) if ritmo else None))


def punti(asse, *valori):
    """Points along `asse`: each (value, [(throughput, latency) for each repeat])."""
    return [Punto([prova(x, y, **{asse: v}) for x, y in ripetute]) for v, ripetute in valori]


# Saturation ###################################################################################

def test_un_throughput_sceso_non_e_salito_solo():
    """The tour: "il carico è cresciuto ×2.0 e il throughput solo da 27.9 a 10.6 token/s (-61.8%)": "solo" of a
    fall reads as a small rise. A fall is said as one; a small rise keeps "solo"."""
    sceso = carico.frase_saturazione("parallele", carico.verdetto_saturazione(
        punti("parallele", (1, [(27.9, 1.0)]), (2, [(10.6, 3.0)])), "parallele"))
    assert "carico ×2.0, throughput sceso da 27.9 a 10.6 token/s (-62.0%)" in sceso, sceso
    salito = carico.frase_saturazione("parallele", carico.verdetto_saturazione(
        punti("parallele", (1, [(30.0, 1.0)]), (2, [(31.0, 2.0)])), "parallele"))
    assert ", throughput solo da 30.0 a 31.0 token/s" in salito, salito


def test_saturazione_categorica_solo_con_le_ripetute_oltre_il_rumore():
    """FIRE: three repeats a point, the latency's rise far beyond their spread, the throughput flat within
    its interval: categorical, marked in the curve (◆) and ringed in the SVG."""
    curva = punti("parallele", (1, [(10, 1.0), (10.2, 1.02), (9.9, 0.98)]), (2, [(19, 1.0), (19.3, 1.01), (18.8, 0.99)]),
                  (4, [(19.5, 2.0), (19.6, 2.05), (19.4, 1.96)]))
    verdetto = carico.verdetto_saturazione(curva, "parallele")
    assert verdetto.dopo is curva[2] and verdetto.dubbio is None
    frase = carico.frase_saturazione("parallele", verdetto)
    assert frase.startswith("saturazione a parallele=4: da parallele=2 carico ×2.0") and (
        frase.endswith("oltre il rumore (Welch 95% su 3 e 3 prove)")), frase
    disegno = "\n".join(carico.curva("parallele", [("", curva)], carico.MARCHE_UNICODE))
    assert "◆4" in disegno and "◆ saturazione" in disegno and "forse" not in disegno
    assert "".join(carico.svg_curva("parallele", [("", curva)], 0)[0]).count('r="9"') == 1


def test_un_passo_rumoroso_non_fa_una_saturazione():
    """SILENT: --parallele 1,2,4,8 on -np 4, one run a point, as the real server gave it: 2 looks saturated,
    but 4 -> 8 goes 49.58 -> 67.60 token/s. The throughput climbs to the end: no saturation, no ◆, no verdict."""
    curva = punti("parallele", (1, [(40.0, 0.8)]), (2, [(42.0, 1.1)]), (4, [(49.58, 1.6)]), (8, [(67.60, 2.3)]))
    assert carico.verdetto_saturazione(curva, "parallele") is None
    disegno = "\n".join(carico.curva("parallele", [("", curva)], carico.MARCHE_UNICODE))
    assert "◆" not in disegno and "saturazione" not in disegno
    assert not [f for f in carico.spiegazione_griglia("parallele", [("", curva)]) if "saturazione a" in f]


def test_la_saturazione_non_e_prima_del_picco():
    """--parallele 1,2,4,8 where 2 gains little but the throughput peaks at 4: the saturation is not named at 2
    (4 took more), but at the step past the peak, 4 -> 8, where the throughput fell."""
    curva = punti("parallele", (1, [(40.0, 0.8), (40.5, 0.8), (39.5, 0.8)]), (2, [(42.0, 1.1), (42.5, 1.1), (41.5, 1.1)]),
                  (4, [(70.0, 1.6), (70.5, 1.6), (69.5, 1.6)]), (8, [(68.0, 3.2), (68.5, 3.3), (67.5, 3.1)]))
    verdetto = carico.verdetto_saturazione(curva, "parallele")
    assert verdetto.prima is curva[2] and verdetto.dopo is curva[3] and verdetto.dubbio is None
    frase = carico.frase_saturazione("parallele", verdetto)
    assert frase.startswith("saturazione a parallele=8: da parallele=4 carico ×2.0, throughput sceso da 70.0 a 68.0 "
                            "token/s"), frase
    assert "parallele=2" not in frase


def test_ripetute_ma_rumorose_non_bastano():
    """Repeats whose throughput spreads so much that the gain may reach a quarter of the load: not certain."""
    curva = punti("parallele", (2, [(20, 1.0), (20.5, 1.01), (19.5, 0.99)]), (4, [(15, 2.0), (30, 2.02), (22, 1.98)]))
    verdetto = carico.verdetto_saturazione(curva, "parallele")
    assert verdetto is not None and verdetto.dubbio.startswith("il guadagno di throughput (")
    assert "Per deciderlo: --ripeti 5, o più richieste per punto" in carico.frase_saturazione("parallele", verdetto)


def test_una_sola_prova_dice_forse():
    """SILENT (categorically): one run a point, however clear the step looks: the noise is not measured."""
    curva = punti("parallele", (1, [(10, 1.0)]), (2, [(19, 1.0)]), (4, [(20, 2.0)]))
    verdetto = carico.verdetto_saturazione(curva, "parallele")
    assert verdetto.dubbio == ("una prova per punto: il rumore non è misurato, e un solo passo rumoroso basta a farla "
                               "sembrare")


def test_ripetute_con_una_prova_tutta_fallita_non_fanno_un_verdetto_certo():
    """SILENT (categorically), and no traceback: --ripeti 2 where every request of one run failed leaves that
    point one throughput; the noise is not measured (this raised StatisticsError in the 95% interval)."""
    curva = punti("parallele", (1, [(10, 1.0), (10.2, 1.0)]), (2, [(19, 1.0), (19.2, 1.0)]), (4, [(19.5, 2.0), (19.4, 2.0)]))
    fallita = curva[2].prove[1]
    curva[2] = carico.Punto([curva[2].prove[0], fallita._replace(esecuzione=fallita.esecuzione._replace(
        risultati=[r._replace(errore="HTTP 500", token=None) for r in fallita.esecuzione.risultati]))])
    verdetto = carico.verdetto_saturazione(curva, "parallele")
    assert verdetto is not None and verdetto.dopo is curva[2]
    assert verdetto.dubbio == "una sola prova con un throughput in un punto (le altre sono fallite): il rumore non è misurato"
    assert carico.frase_saturazione("parallele", verdetto).startswith("forse saturazione a parallele=4, non accertata")


def test_nessuna_saturazione_solo_se_il_throughput_ha_seguito_il_carico():
    """"Nessuna saturazione" is a verdict too: plain when every step's throughput followed the load; when one
    step's did not and the latency stayed within the repeats' noise, "non accertata", and how to decide. A
    latency over 10% higher that Welch cannot confirm is "non accertato", not "non è salita"."""
    segue = punti("parallele", (1, [(10, 1.0), (10.1, 1.0)]), (2, [(19, 1.0), (19.2, 1.01)]))
    (frase,) = carico.spiegazione_griglia("parallele", [("", segue)])
    assert frase == ("Curva: nessuna saturazione fino a parallele=2. Il throughput è salito da 10.1 a 19.1 token/s, a ogni "
                     "passo di almeno un quarto del carico."), frase
    piatta = punti("parallele", (2, [(130, 0.26), (100, 0.2), (160, 0.32)]), (4, [(116, 0.42), (100, 0.3), (130, 0.55)]))
    (frase,) = carico.spiegazione_griglia("parallele", [("", piatta)])
    assert frase.startswith("Curva: nessuna saturazione accertata fino a parallele=4. Da parallele=2 a 4 il "
                            "throughput forse non ha seguito il carico (130.0 → 115.3 token/s, guadagno -14.7 ±62.3 al "
                            "95%).") and frase.endswith(
        "La latenza media (0.26 → 0.42 s) sale del 63% ma con 3 prove a punto non è accertato: --ripeti 5 lo decide."), frase
    piatta = punti("parallele", (2, [(130, 0.26), (100, 0.2), (160, 0.32)]), (4, [(116, 0.27), (100, 0.2), (130, 0.34)]))
    (frase,) = carico.spiegazione_griglia("parallele", [("", piatta)])  # SILENT: +4%, within the noise
    assert frase.endswith("La latenza media (0.26 → 0.27 s) non è salita oltre il rumore (Welch 95%): --ripeti 5 lo "
                          "decide."), frase


def test_vantaggio_del_batching_oltre_il_rumore_delle_ripetute():
    """--avvia --np 1,4 --token 16,128 --ripeti 3: the ratio grew from ×2.0 to ×2.3; with repeats that spread
    by a third that is within the noise: a rise over 10% "non accertato" (not "rimasto lo stesso"); with tight
    repeats it grew, beyond the noise; within 10% and the noise, "rimasto lo stesso"."""
    def punto(np, token, valori):
        return Punto([Prova(InfoServer(np, 512, True), Esecuzione([Risultato(0, 0.0, 1.0, v)], [], 1),
                            Piano(4, 4, token), carico.Configurazione(np)) for v in valori])

    def righe(spread, dopo=23):
        return carico.rapporti_np([punto(1, 16, [10 - spread, 10, 10 + spread]), punto(4, 16, [20 - spread, 20, 20 + spread]),
                                   punto(1, 128, [10 - spread, 10, 10 + spread]),
                                   punto(4, 128, [dopo - spread, dopo, dopo + spread])], ["np", "token"])
    rumorose = righe(3.0)[-1]
    assert rumorose == ("con risposte più lunghe (token=16 -> token=128) il vantaggio del batching è cresciuto ma non è "
                        "accertato (rumore ±116% al 95%): ×2.00 -> ×2.30"), rumorose
    rumorose = righe(3.0, 21)[-1]
    assert rumorose.startswith("con risposte più lunghe (token=16 -> token=128) il vantaggio del batching è rimasto lo "
                               "stesso, entro il rumore (±"), rumorose
    strette = righe(0.1)[-1]
    assert strette.startswith("con risposte più lunghe (token=16 -> token=128) il vantaggio del batching è cresciuto: "
                              "×2.00 -> ×2.30 (oltre il rumore: ±"), strette


def test_vantaggio_del_batching_con_una_prova_per_punto_e_un_forse():
    """The tour: two identical `--avvia --np 1,4 --token 16,64` sweeps said "è calato ×3.61 -> ×2.48" and "è
    cresciuto ×1.33 -> ×1.51", hedged only by "(indicativo ...)". With one run a point the noise is not measured:
    said "forse", as saturation is; with repeats, as before (the test above). --ripeti 3 is said once, before the
    ratios (test_verdetti_tour3.py)."""
    def punto(np, token, v):
        return Punto([Prova(InfoServer(np, 512, True), Esecuzione([Risultato(0, 0.0, 1.0, v)], [], 1),
                            Piano(4, 4, token), carico.Configurazione(np))])
    riga = carico.rapporti_np([punto(1, 16, 10), punto(4, 16, 36), punto(1, 64, 10), punto(4, 64, 25)], ["np", "token"])[-1]
    assert riga == ("con risposte più lunghe (token=16 -> token=64) il vantaggio del batching forse è calato: ×3.60 -> "
                    "×2.50"), riga


def test_il_riferimento_del_lab_solo_accanto_a_np_4_su_np_1():
    """The tour: `--np 4kv,auto` printed "np auto / np 4 kv ×1.00 (nel lab, su 6 vCPU senza GPU: np 4 / np 1
    ×2)", the lab's ratio beside an unlike one. Said only where the same ratio is there: np 4 over np 1."""
    def punto(np, v, kv=False):
        return Punto([Prova(InfoServer(4, 512, True), Esecuzione([Risultato(0, 0.0, 1.0, v)], [], 1), Piano(4, 4, 32),
                            carico.Configurazione(np, kv))])
    (_, simile) = carico.rapporti_np([punto(1, 10), punto(4, 20)], ["np"])  # after the line on --ripeti 3
    assert "(nel lab, su 6 vCPU senza GPU: np 4 / np 1 ×2)" in simile, simile
    (_, diverso) = carico.rapporti_np([punto(4, 10, kv=True), punto(-1, 10)], ["np"])
    assert "nel lab" not in diverso, diverso
    # the next tour: at --token 16 beside the lab's ratio, measured at --token 32
    corti = [Punto([p.prove[0]._replace(piano=Piano(4, 4, 16))]) for p in (punto(1, 10), punto(4, 20))]
    (_, altro_token) = carico.rapporti_np(corti, ["np"])
    assert "nel lab" not in altro_token, altro_token


# Overload ####################################################################################

def in_fila(arrivi, servizio, n_slot, ritmo=1.0, rumore=()):
    """Requests sent at `arrivi`, `servizio` s each in a slot (plus `rumore[i]`), first come first served."""
    liberi, risultati = [0.0] * n_slot, []
    for i, arrivo in enumerate(arrivi):
        k = min(range(n_slot), key=liberi.__getitem__)
        durata = servizio + (rumore[i] if i < len(rumore) else 0.0)
        fine = max(arrivo, liberi[k]) + durata
        liberi[k] = fine
        risultati.append(Risultato(i, arrivo, fine, 32, 32 / durata, 10.0, durata * 1000 - 10.0))
    oltre = PianoOltre(ritmo=ritmo) if ritmo else None
    return Prova(InfoServer(n_slot, 1024, True), Esecuzione(risultati, [], len(arrivi)), Piano(len(arrivi), 256, 32,
                                                                                               oltre=oltre))


def test_sovraccarico_solo_dove_ci_sono_arrivi():
    """FIRE under --ritmo (an arrival process); SILENT on the same requests sent as a batch (no rate of
    arrivals: --parallele 8 --richieste 8 is not "714 richieste al secondo")."""
    arrivi = [i / 2.5 for i in range(20)]
    visto = carico.sovraccarico(in_fila(arrivi, 1.0, 2))
    assert visto is not None and visto.certo
    assert carico.frase_sovraccarico(visto).endswith(". Il server è più lento degli arrivi (sovraccarico): la latenza "
                                                     "dipende da quanto dura la prova.")
    assert carico.sovraccarico(in_fila(arrivi, 1.0, 2, ritmo=None)) is None
    lotto = in_fila([0.0] * 8, 0.3, 2, ritmo=None)._replace(piano=Piano(8, 8, 32))
    assert carico.sovraccarico(lotto) is None
    assert not any("sovraccarico" in f for f in carico.spiegazione(lotto))


def test_sovraccarico_incerto_quando_le_attese_sono_rumorose():
    """Six requests, the waits of the first and last third within each other's noise: said as "forse",
    with what would settle it (a longer --durata)."""
    arrivi = [i * 0.3 for i in range(9)]  # 3.3 a second to one slot that serves 2.9: a mild overload...
    prova_ = in_fila(arrivi, 0.35, 1, rumore=[0.0, 0.6])  # ...and one long answer early: a jump, then a slow rise
    visto = carico.sovraccarico(prova_)
    assert visto is not None and not visto.certo, visto
    frase = carico.frase_sovraccarico(visto)
    assert frase.endswith(". Forse sovraccarico, non accertato: l'attesa cresciuta non si separa dal rumore delle attese "
                          "(Welch 95%): una --durata più lunga lo decide."), frase
    assert carico.segno_sovraccarico([prova_]) == "forse"


def test_capacita_non_dice_no_al_sovraccarico_con_troppe_poche_risposte():
    """The tour of 1.6.0: --capacita at -np 2 gave 5 answers whose latencies rose 13 -> 73 s, and its table said
    "sovraccarico: no". Too few answers to tell is n/d (SILENT); six that kept up are "no"; a queue that grew
    is said (FIRE)."""
    crescente = in_fila([i * 0.3 for i in range(5)], 1.0, 1)  # one slot, five arrivals far faster than it serves
    assert carico.sovraccarico(crescente) is None and carico.segno_sovraccarico([crescente]) == "n/d"
    al_passo = in_fila([i * 1.0 for i in range(6)], 0.5, 2)
    assert carico.segno_sovraccarico([al_passo]) == "no"
    assert carico.segno_sovraccarico([in_fila([i / 2.5 for i in range(20)], 1.0, 2)]) == "sì"


def test_griglia_a_lotti_senza_sovraccarico(fake, carica):
    """Issue 23 item 2 on the fake: --parallele 2,8 --richieste 8 on one slot: requests wait, but they
    were submitted at once: no arrival rate, no overload."""
    server = fake(n_slot=1, s_per_token=0.002)
    rc, out, err = carica(server.url, "--parallele", "2,8", "--richieste", "8", "--token", "16", "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert "sovraccarico" not in out and "arrivavano" not in out


def test_saturazione_sotto_ritmo_mai_dopo_il_sovraccarico():
    """--ritmo 1,2,4 on two slots: at 2 the queue grows (overload), from 2 to 4 the throughput is flat. The
    saturation is "entro ritmo=2", never "a ritmo=4" beside "ritmo=2 sovraccarico"."""
    def a_ritmo(r):
        return in_fila([i / r for i in range(int(8 * r))], 1.4, 2, ritmo=r)
    curva = [Punto([a_ritmo(r)]) for r in (1, 2, 4)]
    assert carico.sovraccarico(curva[0].prove[0]) is None and carico.sovraccarico(curva[1].prove[0])
    verdetto = carico.verdetto_saturazione(curva, "ritmo")
    assert verdetto.sovraccarico and verdetto.dopo is curva[1] and verdetto.prima is curva[0]
    frasi = carico.spiegazione_griglia("ritmo", [("", curva)])
    testo = " ".join(frasi)
    assert "saturazione a ritmo=4" not in testo, frasi
    assert re.search(r"saturazione entro ritmo=2 \(fra ritmo=1 e ritmo=2; inviate davvero [\d.]+ e [\d.]+ req/s\)",
                     testo), frasi
    assert "non può crescere" not in testo  # the tour: a throughput that went on rising contradicted it
    assert "A ritmo=2, finché si inviava" in testo


# Little's law ###############################################################################

def prova_little(coppie, tempi=None, ritmo=None, arrivi="poisson", intervallo=0.5, inizi=None):
    """A run whose readings saw (in flight for the client, held by the server) = `coppie`."""
    tempi = tempi or [0.5 + k * intervallo for k in range(len(coppie))]
    fine = tempi[-1] + 1.0
    inizi = inizi or [0.0]
    risultati = [Risultato(i, t, fine, 8, 40.0, 5.0, 100.0) for i, t in enumerate(inizi)]
    # Readings of the server's count; the client's count is set by the requests in flight: build it from
    # extra requests that start and end around each reading.
    extra = []
    for k, (client, _) in enumerate(coppie):
        for j in range(client - len(inizi)):
            extra.append(Risultato(len(inizi) + len(extra), tempi[k] - 0.01, tempi[k] + 0.01, 8, 40.0, 5.0, 10.0))
    campioni = [Campione(t, server, 0) for t, (_, server) in zip(tempi, coppie)]
    oltre = PianoOltre(ritmo=ritmo, arrivi=arrivi) if ritmo else None
    e = Esecuzione(risultati + extra, campioni, len(risultati) + len(extra))
    return Prova(InfoServer(4, 512, True, True), e, Piano(None, 8, 8, intervallo=intervallo, oltre=oltre))


def test_little_due_letture_non_coincidono():
    """Issue 23 item 6: two readings, 3.00 vs 1.00 and 4.00 vs 2.00: not "coincidono"; too few to tell, so
    nothing said (a rule with nothing to conclude is silent)."""
    assert carico.riga_little(prova_little([(3, 1), (4, 2)])) is None


def test_little_coincide_e_differisce_con_abbastanza_letture():
    """FIRE both ways: twelve readings that agree within one request; twelve with the client two ahead."""
    uguali = carico.riga_little(prova_little([(2, 2), (3, 3), (2, 2), (3, 2), (2, 2), (3, 3)] * 2))
    assert "Coincidono, entro il rumore delle letture (+0.17 ±0.25 al 95% su 12 letture: meno di una richiesta)" in (
        uguali), uguali
    avanti = carico.riga_little(prova_little([(3, 1), (4, 2), (3, 1), (4, 2)] * 3))
    assert "2.00 in media erano inviate ma non ancora nel server (+2.00 ±0.00 al 95% su 12 letture)" in avanti, avanti
    assert carico.riga_little(prova_little([(3, 1), (2, 2), (4, 2), (2, 3), (3, 1), (2, 2)])) is None  # within the noise


def test_little_letture_in_fase_con_gli_arrivi():
    """--ritmo 2 --arrivi costanti with --intervallo 0.5: every reading falls just after a send, and always
    sees the newest request in transit. No verdict, and which --intervallo gives one; readings every 0.37 s
    on the same sends are not phase-locked."""
    invii = [k * 0.5 for k in range(20)]
    tempi = [0.52 + k * 0.5 for k in range(16)]
    in_fase = prova_little([(2, 1)] * 16, tempi=tempi, ritmo=2.0, arrivi="costanti", inizi=invii)
    riga = carico.riga_little(in_fase)
    assert ("Non si confrontano: le letture (ogni 0.5 s) cadono tutte a 0.02 s dall'ultimo invio (arrivi costanti, uno "
            "ogni 0.50 s). Con --intervallo 0.37 non sarebbero in fase") in riga, riga
    assert "in viaggio" not in riga
    sfasate = [0.52 + k * 0.37 for k in range(16)]
    assert carico.letture_in_fase(in_fase, sfasate, invii) is None
    assert carico.letture_in_fase(in_fase._replace(piano=in_fase.piano._replace(oltre=PianoOltre(ritmo=2.0))),
                                  tempi, invii) is None  # Poisson arrivals have no phase


# --ripeti: the mean with its interval; one meaning of "latenza max" ###########################

def test_intervallo_di_confidenza_t_di_student():
    assert carico.ic95([1.0, 2.0, 3.0]) == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-4)
    assert carico.ic95([5.0]) is None
    assert [round(carico.t_critico(g), 3) for g in (1, 2, 4, 10, 120)] == [12.706, 4.303, 2.776, 2.228, 1.980]


def test_latenza_max_una_sola_cifra_nel_riepilogo_e_nella_tabella():
    """Issue 23 item 10: --tabella --ripeti 3: the summary and the table's mean row give the same
    "latenza max", the mean of the maxima, and each line says so."""
    prove = [prova(20, lat, richieste=4)._replace(esecuzione=Esecuzione(
        [Risultato(0, 0.0, lat), Risultato(1, 0.0, lat + d)], [], 2)) for lat, d in ((1.0, 1.3), (1.0, 1.38), (1.0, 1.4))]
    riepilogo = carico.righe_ripetute(prove)
    (riga_max,) = [r for r in riepilogo if "latenza max" in r]
    assert riga_max.startswith("  latenza max (media dei massimi)    2.36 s        ±")
    media = carico.tabella_consegnato(prove)[-1]
    assert media.startswith("| 2 (media di 3) |") and "| 2.36 s |" in media, media


def test_ripeti_media_con_l_intervallo(fake, carica):
    server = fake(n_slot=2, s_per_token=0.003)
    rc, out, err = carica(server.url, "--ripeti", "3", "--token", "8", *VELOCE)
    assert rc == 0, out + err
    riga = next(r for r in out.splitlines() if r.startswith("  throughput aggregato"))
    m = re.match(r"  throughput aggregato +([\d.]+) token/s +±([\d.]+) \(dev.std ([\d.]+), ", riga)
    assert m, riga
    t = carico.t_critico(2)  # 4.3027: the exact quantile, not the table's 4.303
    # each printed figure rounded to 2 decimals: the interval's half-cent, and the deviation's scaled by t / sqrt(3)
    assert float(m.group(2)) == pytest.approx(t * float(m.group(3)) / math.sqrt(3), abs=0.0051 * (1 + t / math.sqrt(3)))


# Smaller ones (issue 23 items 11, 14) ########################################################

def test_nota_letture_conta_le_letture_non_la_durata():
    """Item 11: a run cut by Ctrl+C after six readings (no answer, so no duration) does not say "meno di
    due letture"; one with a single reading does."""
    piano = Piano(4, 4, 32)
    sei = Prova(InfoServer(4, 512, True), Esecuzione([], [Campione(0.5 * k, 4) for k in range(6)], 4, 130), piano)
    assert not any("sottostimato" in n for n in carico.note(sei))
    una = sei._replace(esecuzione=Esecuzione([], [Campione(0.0, 1)], 4, 130))
    assert ["il picco di slot occupati può essere sottostimato: la prova ha avuto 1 lettura di /slots (--intervallo "
            "0.5). Senza i tempi del server, viene solo dalle letture di /slots"] == [n for n in carico.note(una) if "sottostimato" in n]


def test_mai_zero_richieste_in_coda_nelle_frasi():
    """Item 14: with metrics and an empty queue, no "Al massimo 0 richieste", no "arrivata a 0 (prima 0)"."""
    risultati = [Risultato(i, 0.0, 0.5, 8, 40.0, 5.0, 445.0) for i in range(2)]  # 0.05 s to a free slot
    vuota = Prova(InfoServer(4, 512, True, True), Esecuzione(risultati, [Campione(0.2, 2, 0), Campione(0.4, 2, 0)], 2),
                  Piano(2, 2, 8))
    assert vuota.riepilogo.picco_coda == 0
    assert not any("Al massimo 0" in f for f in carico.spiegazione(vuota))
    a, b = Punto([vuota]), Punto([vuota])
    perche = carico.perche_satura(a, b)
    assert "la coda è rimasta vuota" in perche and "(prima 0)" not in perche, perche
    assert "Nessuna richiesta ha aspettato uno slot" in perche and "da 0.00 a 0.00 s" not in perche, perche


def test_in_coda_solo_a_slot_pieni():
    """Item 14: a request that took 0.68 s to reach a slot while three of four were idle was not queued:
    the picture draws that span as the trip (its own mark), not "░ in coda", and --dettagli's "attesa in
    coda" is 0; a request that waited while every slot was busy is drawn in the queue."""
    lenta = Risultato(0, 0.0, 1.68, 8, 40.0, 500.0, 500.0)  # in its slot from 0.68 s, the other slots idle
    libera = Prova(InfoServer(4, 512, True), Esecuzione([lenta], [], 1), Piano(1, 1, 8))
    assert carico.attesa_dello_slot(lenta) == pytest.approx(0.68)
    attese = carico.attese_a_slot_pieni(libera.esecuzione.riuscite, libera.info.n_slot)
    assert [f for f, _, _ in carico.fasi(lenta, attese)] == ["viaggio", "prompt", "generazione"]
    assert carico.valori_figure(libera)["attesa in coda"] == [0.0]
    riga = next(r for r in carico.grafico(libera, carico.MARCHE_UNICODE) if r.startswith("req 0"))
    assert "░" not in riga and "·" in riga
    # One slot, two requests at once: the second waits the whole of the first's time in the slot.
    due = Prova(InfoServer(1, 512, True), Esecuzione([Risultato(0, 0.0, 1.0, 8, 40.0, 500.0, 500.0),
                                                      Risultato(1, 0.0, 2.0, 8, 40.0, 500.0, 500.0)], [], 2), Piano(2, 2, 8))
    attese = carico.attese_a_slot_pieni(due.esecuzione.riuscite, due.info.n_slot)
    (coda,) = [f for f in carico.fasi(due.esecuzione.risultati[1], attese) if f[0] == "coda"]
    assert coda[2] - coda[1] == pytest.approx(1.0, abs=0.05)


def test_capacita_con_uno_slo_sotto_la_latenza_di_una_richiesta():
    """Item 14: an objective no request met, not even the fastest, alone: said."""
    cerca = carico.Capacita.__new__(carico.Capacita)
    cerca.oltre = carico.OpzioniOltre(slo={"latenza": 0.2}, capacita=95.0)
    lente = in_fila([0.0, 2.0, 4.0], 0.5, 1, ritmo=0.5)
    cerca.punti = [(0.5, [lente], False)]
    assert cerca.neanche_da_sola().startswith(". Anche la richiesta più veloce misurata ha latenza 0.50 s, oltre i "
                                              "0.2 s dello SLO")
    cerca.oltre = carico.OpzioniOltre(slo={"latenza": 0.6}, capacita=95.0)
    assert cerca.neanche_da_sola() == ""


# Issue 25 item 5: the queue from the latencies, where the server says nothing #################

def senza_nulla(latenze, inizi=None):
    inizi = inizi or [0.0] * len(latenze)
    risultati = [Risultato(i, t, t + lat, 32) for i, (t, lat) in enumerate(zip(inizi, latenze))]
    return Prova(InfoServer(None, None, False), Esecuzione(risultati, [], len(risultati)), Piano(len(risultati), 4, 32))


def test_i_distacchi_diversi_non_sono_circa_la_loro_media():
    """The tour on llama-cpp-python: "arrivate una dopo l'altra, circa 0.85 s l'una dall'altra (latenze 0.45,
    2.37, 2.70, 3.01 s ...)", gaps of 1.92, 0.33 and 0.31 s. Their range where they differ; "circa" their
    mean where they are alike (within 1.5 times)."""
    (diversi,) = [f for f in carico.spiegazione(senza_nulla([0.45, 2.37, 2.70, 3.01])) if f.startswith("Dal lato")]
    assert "una dopo l'altra. Distavano da 0.31 a 1.92 s l'una dall'altra (latenze 0.45, 2.37, 2.70, 3.01 s" in diversi, diversi
    (simili,) = [f for f in carico.spiegazione(senza_nulla([0.93, 1.84, 2.86, 3.74])) if f.startswith("Dal lato")]
    assert "una dopo l'altra. Distavano circa 0.94 s l'una dall'altra" in simili, simili


def test_risposte_vuote_spiegate_dal_template_non_da_esatti():
    """The tour on llama-cpp-python with its default chat format: 3 answers of 4 with 0 tokens, and --spiega
    said "(finish_reason stop, 0 token) ... --esatti (ignore_eos) li farebbe generare tutti su llama.cpp",
    where stderr (rightly) blamed the chat template. --spiega says what stderr says."""
    risultati = [Risultato(i, 0.0, 0.4 + i, 0 if i else 32, finish_reason="stop") for i in range(4)]
    prova = Prova(InfoServer(None, None, False, llama_cpp=False), Esecuzione(risultati, [], 4), Piano(4, 4, 32))
    testo = " ".join(carico.spiegazione(prova))
    assert "3 risposte su 4 hanno 0 token: il modello si ferma subito" in testo and "--chat_format" in testo, testo
    assert "--esatti (ignore_eos) li farebbe" not in testo, testo
    # the next tour, with --esatti: answers of 0, 32, 0 and 1 tokens said only "il server non rispetta ignore_eos":
    # half of them empty is the template too
    meta = [Risultato(i, 0.0, 0.4 + i, t, finish_reason="stop") for i, t in enumerate([0, 32, 0, 1])]
    esatti = Piano(4, 4, 32, oltre=carico.PianoOltre(esatti=True))
    testo = " ".join(carico.spiegazione(Prova(InfoServer(None, None, False, llama_cpp=False), Esecuzione(meta, [], 4), esatti)))
    assert "2 risposte su 4 hanno 0 token" in testo and "--chat_format" in testo, testo
    uno = [Risultato(i, 0.0, 0.4 + i, t, finish_reason="stop") for i, t in enumerate([0, 32, 20, 1])]
    testo = " ".join(carico.spiegazione(Prova(InfoServer(None, None, False, llama_cpp=False), Esecuzione(uno, [], 4), esatti)))
    assert "hanno 0 token" not in testo and "il server non rispetta ignore_eos (--esatti)" in testo, testo


def test_coda_dedotta_dalle_latenze():
    """FIRE: four requests sent together, answers 0.93, 1.84, 2.86, 3.74 s (llama-cpp-python, one at a
    time): said as an inference from the client's side. SILENT: answers that came back together."""
    frasi = carico.spiegazione(senza_nulla([0.93, 1.84, 2.86, 3.74]))
    (frase,) = [f for f in frasi if f.startswith("Dal lato del client")]
    assert "latenze 0.93, 1.84, 2.86, 3.74 s" in frase and "una alla volta" in frase and "deduzione" in frase
    assert not any(f.startswith("Dal lato del client") for f in carico.spiegazione(senza_nulla([1.0, 1.02, 1.03, 1.05])))
    # Sent one after another (--parallele 1): sequential by construction, nothing to infer.
    assert carico.una_alla_volta(senza_nulla([0.9, 0.9, 0.9], inizi=[0.0, 0.9, 1.8]).esecuzione.riuscite) is None


def test_la_nota_sui_tempi_non_resta_se_non_li_ha_dati():
    nota = ("il server non ha dato né /slots né i suoi tempi (timings): velocità nel proprio slot, slot occupati, "
            "attese dello slot e in coda sono n/d")
    assert nota in carico.note(senza_nulla([0.93, 1.84, 2.86, 3.74]))
    con_tempi = senza_nulla([1.0])._replace(esecuzione=Esecuzione([Risultato(0, 0.0, 1.0, 32, 40.0, 5.0, 990.0)], [], 1))
    assert nota not in carico.note(con_tempi)


# The real server: the phase-locked readings, as the issue saw them ##########################

@pytest.mark.reale
def test_reale_letture_in_fase_con_gli_arrivi_costanti(llama, carica):
    """On the real server (--metrics), --ritmo 2 --arrivi costanti with readings every 0.5 s: no Little's-law
    verdict ("in viaggio" was the phase, not a finding), and the --intervallo that gives one; readings every
    0.37 s on the same load are not phase-locked, and give a verdict."""
    server = llama(2, "--metrics")
    rc, out, err = carica(server.url, "--ritmo", "2", "--arrivi", "costanti", "--durata", "5", "--token", "8",
                          "--spiega")
    assert rc == 0, out + err
    (riga,) = [r for r in out.splitlines() if r.startswith("Legge di Little")]
    assert "cadono tutte a" in riga and "--intervallo 0.37 non sarebbero in fase" in riga and "in viaggio" not in riga, riga
    rc, out, err = carica(server.url, "--ritmo", "2", "--arrivi", "costanti", "--durata", "5", "--token", "8",
                          "--spiega", "--intervallo", "0.37")
    assert rc == 0, out + err
    (riga,) = [r for r in out.splitlines() if r.startswith("Legge di Little")]
    assert "in fase" not in riga and "al 95% su" in riga, riga


def test_la_nota_sui_tempi_con_slots_letti():
    """/slots answered but the answers had no timings: the note names what only the timings give."""
    nota = ("le risposte non hanno i timings di llama.cpp: velocità nel proprio slot, attese dello slot e in coda, "
            "slot occupati dai tempi sono n/d")
    con_slots = senza_nulla([0.93, 1.84])._replace(info=InfoServer(2, 1024, True))
    assert nota in carico.note(con_slots)
    assert not any("né /slots" in t for t in carico.note(con_slots))
    con_tempi = con_slots._replace(esecuzione=Esecuzione([Risultato(0, 0.0, 1.0, 32, 40.0, 5.0, 990.0)], [], 1))
    assert nota not in carico.note(con_tempi)
