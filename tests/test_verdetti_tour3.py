"""The third instructor's tour (issue 37), the verdicts of sweeps and repeats: a --ritmo curve judged on too few
requests to build a queue, a rate sent measured between the first and the last send, one seed scaled for every
rate, the sheet's own question hedged on every line, and a repeat slowed by a load beside the server averaged in.
Each verdict where it must fire and where it must stay silent."""

import itertools
import json
import re

import pytest

import carico
from aiuti import VELOCE
from carico import Configurazione, Esecuzione, InfoServer, Macchina, Piano, PianoOltre, Prova, Punto, Risultato


def prova(throughput, latenza, ritmo=None, n=4, parallele=4, tps=40.0, np=None, token=32):
    """A run of n requests with this aggregate throughput and mean latency (sent at `ritmo` a second, or all at
    once), each at `tps` in its slot (a number, or one per request)."""
    inizi = [i / ritmo if ritmo else 0.0 for i in range(n)]
    totale = max(inizi) + latenza
    per_richiesta = round(throughput * totale / n)
    velocita = tps if isinstance(tps, list) else [tps] * n
    risultati = [Risultato(i, t, t + latenza, per_richiesta, v, 5.0, latenza * 1000 - 5)
                 for i, (t, v) in enumerate(zip(inizi, velocita))]
    return Prova(InfoServer(2, 1024, True), Esecuzione(risultati, [], n),
                 Piano(n, parallele, token, oltre=PianoOltre(ritmo=ritmo) if ritmo else None),
                 Configurazione(np) if np else None)


# 3. --ritmo without --durata: four requests cannot build a queue ###############################

PIATTA = ((1, 40, 1.0), (2, 78, 1.0), (4, 80, 2.0))  # the throughput stops at ritmo=4, the latency doubles
SEGUE = ((1, 40, 1.0), (2, 80, 1.0), (4, 160, 1.0))  # the throughput follows the rate


def lungo_il_ritmo(n, punti):
    return [Punto([prova(x, y, ritmo=r, n=n)]) for r, x, y in punti]


@pytest.mark.parametrize("curva", [PIATTA, SEGUE])
def test_poche_richieste_per_una_coda_dette_non_rumore(curva):
    """The tour: `--ritmo 1,2,4 --spiega` (4 requests a point) said "nessuna saturazione fino a ritmo=4", then on
    the same run again "forse saturazione a ritmo=2, non accertata … una prova per punto". FIRE: too few requests
    to build a queue, --durata; no verdict, no word on noise, no mark on the curve."""
    punti = lungo_il_ritmo(4, curva)
    (frase,) = carico.spiegazione_griglia("ritmo", [("", punti)])
    assert frase == ("Curva: a ritmo=1, 2, 4 solo 4 richieste a prova, troppo poche per formare una coda: nessun verdetto "
                     "sulla saturazione (usa --durata 12 o più)."), frase
    assert len(frase) <= 160
    assert carico.verdetto_saturazione(punti, "ritmo") is None


@pytest.mark.parametrize("curva, detto", [(PIATTA, "Curva: forse saturazione a ritmo=4"),
                                          (SEGUE, "Curva: nessuna saturazione fino a ritmo=4")])
def test_abbastanza_richieste_il_verdetto_di_sempre(curva, detto):
    """SILENT: eight requests a point can build a queue; the verdict is the one the curve gives."""
    (frase,) = carico.spiegazione_griglia("ritmo", [("", lungo_il_ritmo(8, curva))])
    assert frase.startswith(detto) and "troppo poche" not in frase, frase


def test_poche_richieste_solo_dove_sono_poche():
    """Only the points that sent too few are left out: the others are judged (the step from 2 to 4 here)."""
    punti = [Punto([prova(40, 1.0, ritmo=0.5, n=3)])] + lungo_il_ritmo(8, PIATTA[1:])
    frasi = carico.spiegazione_griglia("ritmo", [("", punti)])
    assert frasi[0] == ("Curva: a ritmo=0.5 solo 3 richieste a prova, troppo poche per formare una coda: fuori dal verdetto "
                        "(usa --durata 24 o più)."), frasi
    assert frasi[1].startswith("Curva: forse saturazione a ritmo=4"), frasi
    assert carico.verdetto_saturazione(punti, "ritmo").prima is punti[1]


def test_ritmo_senza_durata_sul_fake(fake, carica):
    """End to end: --ritmo alone sends --richieste 4 a point (FIRE); with --durata, enough (SILENT)."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--ritmo", "10,20,40", "--seme", "1", "--token", "4", "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert ("Curva: a ritmo=10, 20, 40 solo 4 richieste a prova, troppo poche per formare una coda: nessun verdetto "
            "sulla saturazione (usa --durata 2 o più).") in out, out
    assert "nessuna saturazione" not in out and "il rumore non è misurato" not in out
    durata = ("--durata", "1.5")
    assert all(len(list(itertools.takewhile(lambda t: t < 1.5, carico.orari(PianoOltre(ritmo=r, seme=1))))) >= 12
               for r in (10, 20))  # the schedule: 12 or more a point, twice what an overload needs
    rc, out, err = carica(server.url, "--ritmo", "10,20", "--seme", "1", "--token", "4", *durata, "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert "troppo poche" not in out and "Curva: " in out, out


