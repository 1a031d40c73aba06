"""Every sentence that concludes is a claim: saturation, overload, the queue, Little's law. Each has
cases where it must fire and cases where it must stay silent (a verdict is only as good as the cases
where it says nothing), on synthetic runs (exact figures) and on the fake server."""

import json
import re

import pytest

import carico
from aiuti import VELOCE, valore
from carico import Configurazione, Esecuzione, InfoServer, Piano, PianoOltre, Prova, Punto, Risultato


def prova(throughput, latenza, parallele=4, richieste=8, token=32, ritmo=None, n=1, slot=2):
    """A run of n requests with this aggregate throughput and mean latency (sent at `ritmo` a second, or
    all at once)."""
    inizi = [i / ritmo if ritmo else 0.0 for i in range(n)]
    totale = max(inizi) + latenza
    per_richiesta = round(throughput * totale / n)
    risultati = [Risultato(i, t, t + latenza, per_richiesta, 40.0, 5.0, latenza * 1000 - 5) for i, t in enumerate(inizi)]
    return Prova(InfoServer(slot, 1024, True), Esecuzione(risultati, [], n),
                 Piano(richieste, parallele, token, oltre=PianoOltre(ritmo=ritmo) if ritmo else None))


def curva(asse, *punti):
    """Points along an axis: each (value, [(throughput, latency), ...one per repeat])."""
    chiave = {"parallele": "parallele", "token": "token", "ritmo": "ritmo"}[asse]
    return [Punto([prova(x, y, **{chiave: v}) for x, y in ripetute]) for v, ripetute in punti]


# Saturation ###################################################################################

def test_saturazione_quando_il_throughput_non_segue_il_carico():
    punti = curva("parallele", (1, [(10, 1.0)]), (2, [(19, 1.0)]), (4, [(20, 2.0)]))
    assert carico.saturazione(punti, "parallele") == (punti[1], punti[2])  # load x2, throughput +5%, latency x2
    frase = carico.frase_saturazione("parallele", carico.verdetto_saturazione(punti, "parallele"))
    assert frase == ("forse saturazione a parallele=4, non accertata: da parallele=2 carico ×2.0, throughput solo da "
                     "19.0 a 20.0 token/s (+5.3%). La latenza media è salita da 1.00 a 2.00 s (+100%). Ma una prova per "
                     "punto: il rumore non è misurato, e un solo passo rumoroso basta a farla sembrare. Per deciderlo: "
                     "--ripeti 3")


@pytest.mark.parametrize("punti", [
    [(1, [(10, 1.0)]), (2, [(10.4, 1.04)]), (4, [(9.9, 0.98)])],  # flat, latency within its noise
    [(1, [(10, 1.0)]), (2, [(18, 1.0)]), (4, [(35, 1.1)])],  # throughput follows the load
    [(1, [(10, 1.0)]), (2, [(10.5, 1.0)])],  # flat, and latency did not rise
])
def test_saturazione_tace_senza_segno(punti):
    assert carico.saturazione(curva("parallele", *punti), "parallele") is None


def test_saturazione_tace_lungo_token_e_np():
    """Latency grows with the answer's length by construction: along --token nothing saturates, and the
    explanation compares what that axis changes instead."""
    punti = curva("token", (16, [(60, 0.3)]), (32, [(61, 0.6)]), (64, [(60, 1.2)]))
    assert carico.saturazione(punti, "token") is None
    assert carico.saturazione(punti, "np") is None
    (frase,) = carico.spiegazione_griglia("token", [("", punti)])
    assert frase.startswith("Curva: cambiando token il carico non cresce, e non si parla di saturazione. Da token=16 a "
                            "token=64 la velocità nel proprio slot è passata da 40.0 a 40.0 t/s (da 25.0 a 25.0 ms per "
                            "token)"), frase


def test_saturazione_confronta_i_punti_non_le_ripetute():
    """Three repeats per point: each point is their mean, and a rise within the spread of the repeats is noise."""
    rumorosa = curva("parallele", (1, [(10, 1.0), (10, 1.4), (10, 0.6)]), (2, [(10.2, 1.3), (10, 1.7), (10, 0.9)]))
    assert carico.saturazione(rumorosa, "parallele") is None  # +30% of latency, but the repeats spread by 40%
    netta = curva("parallele", (1, [(10, 1.0), (10, 1.02), (10, 0.98)]), (2, [(10.2, 1.3), (10, 1.32), (10, 1.28)]))
    assert carico.saturazione(netta, "parallele") == (netta[0], netta[1])
    frase = carico.frase_saturazione("parallele", carico.verdetto_saturazione(netta, "parallele"))
    assert frase.startswith("saturazione a parallele=2: ") and frase.endswith("oltre il rumore (Welch 95% su 3 e 3 prove)")
    assert [len(p.intere) for p in netta] == [3, 3] and netta[0].throughput == pytest.approx(10, rel=0.01)


def test_passi_troppo_piccoli_o_stesso_carico():
    """--ritmo 1,1.05: a +5% load step is not a step. --parallele 4,8 with 4 requests: the same load."""
    ritmo = [Punto([prova(10, 1.0, ritmo=1.0)]), Punto([prova(10.2, 1.0, ritmo=1.05)])]
    assert carico.saturazione(ritmo, "ritmo") is None
    stessa = curva("parallele", (2, [(10, 1.0)]), (4, [(19, 1.05)]), (8, [(19.2, 1.9)]))
    stessa = [Punto([p.prove[0]._replace(piano=p.prove[0].piano._replace(richieste=4))]) for p in stessa]
    assert [p.carico("parallele") for p in stessa] == [2, 4, 4]
    assert carico.saturazione(stessa, "parallele") is None  # 8 is no step beyond 4: noise cannot make one
    assert carico.stessi_carichi(stessa, "parallele") == [
        "parallele=8 porta lo stesso carico di parallele=4 (con 4 richieste in tutto non ne partono più di 4 insieme):"
        " non è un passo della curva."]


def test_il_passo_prima_e_l_ultimo_punto_misurato():
    """The step is taken from the last point that was one: a point that failed whole (no throughput) or
    that carried the same load is skipped, and the sentence names the point really compared."""
    fallito = Punto([Prova(InfoServer(2, 1024, True), Esecuzione([Risultato(0, 0.0, 0.1, errore="HTTP 500")], [], 1),
                           Piano(8, 2, 32))])
    punti = curva("parallele", (1, [(10, 1.0)]))[:1] + [fallito] + curva("parallele", (4, [(10.5, 2.5)]))
    assert carico.saturazione(punti, "parallele") == (punti[0], punti[2])
    righe = carico.curva("parallele", [("", punti)], carico.MARCHE_ASCII)  # no crash on the failed point
    assert righe[-1].startswith("forse saturazione a parallele=4, non accertata: da parallele=1 carico ×4.0"), righe[-1]
    # --parallele 20,21,22 with 40 requests: 21 is 5% more than 20 (no step), 22 is 10% more (a step).
    vicini = [Punto([prova(x, y, parallele=v, richieste=40)]) for v, x, y in ((20, 100, 1.0), (21, 100, 1.1),
                                                                               (22, 101, 1.3))]
    assert carico.stessi_carichi(vicini, "parallele") == [
        "parallele=21 porta lo stesso carico di parallele=20 (il carico è cresciuto di 5%, meno del 10%): non è un "
        "passo della curva."]
    assert carico.saturazione(vicini, "parallele") == (vicini[0], vicini[2])


def test_griglia_con_ripetute_un_punto_per_valore(fake, carica):
    """--ripeti in a sweep: one row and one curve point per value (the mean of its runs), and no point is
    compared with its own repeats."""
    server = fake(n_slot=2, s_per_token=0.003)
    rc, out, err = carica(server.url, "--parallele", "1,2", "--ripeti", "2", "--token", "8", "--grafico", *VELOCE)
    assert rc == 0, out + err
    righe = [r for r in out.splitlines() if r.startswith("| ") and "---" not in r][1:]
    # Of two runs none is left out, even when a busy machine slowed one (runs of 0.1 s): either may be the odd one.
    assert [r.split(" | ")[0] for r in righe] == ["| 1 (media di 2)", "| 2 (media di 2)"], righe
    assert re.search(r"\d token/s ±\d+\.\d\d", righe[0]), righe[0]
    assert "●11" not in out and "●22" not in out and out.count("●1") == 1


# Overload (--ritmo) ###########################################################################

def test_sovraccarico_quando_gli_arrivi_superano_il_server(fake, carica):
    """One slot at ~0.1 s a request holds ~10 a second: at 40 a second the queue grows all run long, at 4 it
    does not. Four sleeps of 25 ms a request, not twenty of 5: on a loaded machine each sleep ends late by
    its own few ms, and twenty of them made the fake slower than 4 a second."""
    server = fake(n_slot=1, s_per_token=0.025)
    rc, out, err = carica(server.url, "--ritmo", "4,40", "--arrivi", "costanti", "--richieste", "8",
                          "--token", "4", "--spiega", "--blocchi", *VELOCE)
    assert rc == 0, out + err
    (frase,) = [r for r in out.splitlines() if "sovraccarico" in r and r.startswith("A ritmo=")]
    assert frase.startswith("A ritmo=40, finché si inviava, il server ha completato "), frase
    # The run's own explanation says it too: an overload needs no sweep to be seen.
    assert sum(r.startswith("Finché si inviava, il server ha completato") for r in out.splitlines()) == 1
    completate = float(re.search(r"completato ([\d.]+) richieste al secondo", frase).group(1))
    assert completate < 15, frase


def test_sovraccarico_tace_con_slot_liberi(fake, carica, tmp_path):
    """Eight free slots, answers longer than the gap between arrivals: over the send window fewer answers
    came back than requests left (the first test of the rule passes), but they were on their way, not
    queued. No verdict. (The rule compares rates and waits: at a quarter of the times, the same run in a quarter
    of the wait: answers still 2.4 gaps long.)"""
    server = fake(n_slot=8, n_ctx=8 * 512, s_per_token=0.01)
    rc, out, err = carica(server.url, "--ritmo", "2,8", "--arrivi", "costanti", "--durata", "1", "--token", "30",
                          "--spiega", "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    assert "sovraccarico" not in out
    richieste = json.loads((tmp_path / "r.json").read_text())["prove"][1]["richieste"]  # ritmo=8
    inizi = sorted(r["inizio_s"] for r in richieste)
    completate = sum(inizi[0] < r["fine_s"] <= inizi[-1] for r in richieste)
    assert len(richieste) >= 6 and completate < 0.9 * (len(inizi) - 1), (len(richieste), completate)


def servite_in_fila(arrivi, servizio, n_slot):
    """Requests sent at `arrivi`, each `servizio` seconds in a slot, served first come first served by
    `n_slot` slots: what a run would record (latency, and the server's own times)."""
    liberi, risultati = [0.0] * n_slot, []
    for i, arrivo in enumerate(arrivi):
        k = min(range(n_slot), key=liberi.__getitem__)
        fine = max(arrivo, liberi[k]) + servizio
        liberi[k] = fine
        risultati.append(Risultato(i, arrivo, fine, 32, 32 / servizio, 10.0, servizio * 1000 - 10.0))
    return risultati


def prova_a_ritmo(arrivi, servizio, n_slot):
    e = Esecuzione(servite_in_fila(arrivi, servizio, n_slot), [], len(arrivi))
    return Prova(InfoServer(n_slot, 1024, True), e, Piano(None, 256, 32, oltre=PianoOltre(ritmo=1.0)))


def test_sovraccarico_solo_se_la_coda_cresce():
    """Arrivals faster than two slots can serve (2.5 a second, 1 s each): the wait grows all along, and the
    verdict fires. A burst of three at the start, then arrivals the two slots keep up with (1.3 a second,
    1.4 s each): requests waited, and at the end of the sends answers were still on their way, so fewer
    came back than left; but the wait did not grow. No verdict."""
    visto = carico.sovraccarico(prova_a_ritmo([i / 2.5 for i in range(20)], 1.0, 2))
    assert visto is not None and visto[0] < 0.9 * visto[1]
    raffica = [0.0, 0.1, 0.2] + [1.0 + i / 1.3 for i in range(10)]
    prova = prova_a_ritmo(raffica, 1.4, 2)
    assert prova.riepilogo.picco_coda >= 1 and prova.riepilogo.picco == 2  # a queue, and full slots
    inizi = [r.inizio for r in prova.esecuzione.risultati]
    completate = sum(r.fine <= inizi[-1] for r in prova.esecuzione.risultati[1:])
    assert completate < 0.9 * (len(inizi) - 1)  # fewer came back during the sends than left...
    assert carico.sovraccarico(prova) is None  # ...but the wait did not grow: no overload


# The queue ####################################################################################

def test_coda_zero_se_gli_slot_bastano_e_quattro_se_sono_il_doppio(fake, carica):
    server = fake(n_slot=4, n_ctx=4 * 512, s_per_token=0.004, metrics=True)
    rc, out, err = carica(server.url, "--richieste", "8", "--parallele", "4", "--token", "16")
    assert rc == 0, out + err
    assert re.search(r"^picco richieste in coda \(\S.*\)=0$", out, re.M), out
    rc, out, err = carica(server.url, "--richieste", "8", "--parallele", "8", "--token", "16")
    assert rc == 0, out + err
    assert re.search(r"^picco richieste in coda \(\S.*\)=4$", out, re.M), out
    assert valore(out, "picco slot occupati insieme") == "4"


# Little's law ################################################################################

def test_little_confronta_il_client_col_server(fake, carica):
    """Requests that spend 0.15 s read by the server but in neither of its counts (not in a slot, not
    deferred): the client has them in flight, the server does not, and the sentence says how many."""
    server = fake(n_slot=4, n_ctx=4 * 512, s_per_token=0.008, metrics=True, ritardo_ingresso=0.15)
    rc, out, err = carica(server.url, "--richieste", "8", "--token", "20", "--spiega", *VELOCE)
    assert rc == 0, out + err
    (frase,) = [r for r in out.splitlines() if r.startswith("Legge di Little")]
    differenza = float(re.search(r"\(slot occupati \+ requests_deferred\)\. ([\d.]+) in media erano inviate ma non "
                                 r"ancora nel server", frase).group(1))
    assert 0.8 < differenza < 3.2, frase  # ~4 in flight, a third of each request's time outside the server


def test_little_coincide_senza_ritardi_e_tace_senza_metrics(fake, carica):
    server = fake(n_slot=4, n_ctx=4 * 512, s_per_token=0.008, metrics=True)
    rc, out, err = carica(server.url, "--richieste", "8", "--token", "20", "--spiega", *VELOCE)
    assert rc == 0, out + err
    (frase,) = [r for r in out.splitlines() if r.startswith("Legge di Little")]
    assert re.search(r"Coincidono, entro il rumore delle letture \([+-]\d\.\d\d ±\d\.\d\d al 95% su \d+ letture: meno di una richiesta\)\.$",
                     frase), frase
    senza = fake(n_slot=4, n_ctx=4 * 512, s_per_token=0.002)
    rc, out, err = carica(senza.url, "--richieste", "8", "--token", "20", "--spiega", *VELOCE)
    assert rc == 0 and "Little" not in out  # without the server's own count, the law would check itself


# The explanation of one run ###################################################################

def test_spiega_conta_chi_ha_aspettato_rispetto_alla_propria_latenza():
    """Request 1 waited 0.4 s of its own 0.6 s for the only slot; request 2 (sent later, a slot free) waited
    none of its 3 s: one waited, not two."""
    risultati = [Risultato(0, 0.0, 0.4, 8, 40.0, 5.0, 395.0), Risultato(1, 0.0, 0.6, 8, 40.0, 5.0, 195.0),
                 Risultato(2, 0.7, 3.7, 8, 40.0, 5.0, 2995.0)]
    frasi = carico.spiegazione(Prova(InfoServer(1, 2048, True), Esecuzione(risultati, [], 3), Piano(3, 2, 8)))
    assert ("1 richiesta su 3 ha aspettato in coda uno slot libero. La più sfortunata, la req 1: 0.36 s in coda su "
            "0.60 s di latenza (60%).") in frasi  # the queue, MARGINE inside each end
