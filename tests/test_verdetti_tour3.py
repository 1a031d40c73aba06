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
    assert frase == ("Curva: a ritmo=1, 2, 4 solo 4 richieste a prova, troppo poche per vedere se la coda cresce. Nessun verdetto "
                     "sulla saturazione: usa --durata 12 o più."), frase
    assert len(frase) <= 160
    assert carico.verdetto_saturazione(punti, "ritmo") is None


@pytest.mark.parametrize("curva, detto", [(PIATTA, "Curva: forse saturazione a ritmo=4"),
                                          (SEGUE, "Curva: forse nessuna saturazione fino a ritmo=4")])
def test_abbastanza_richieste_il_verdetto_di_sempre(curva, detto):
    """SILENT: eight requests a point can build a queue; the verdict is the one the curve gives."""
    (frase,) = carico.spiegazione_griglia("ritmo", [("", lungo_il_ritmo(8, curva))])
    assert frase.startswith(detto) and "troppo poche" not in frase, frase


def test_poche_richieste_solo_dove_sono_poche():
    """Only the points that sent too few are left out: the others are judged (the step from 2 to 4 here)."""
    punti = [Punto([prova(40, 1.0, ritmo=0.5, n=3)])] + lungo_il_ritmo(8, PIATTA[1:])
    frasi = carico.spiegazione_griglia("ritmo", [("", punti)])
    assert frasi[0] == ("Curva: a ritmo=0.5 solo 3 richieste a prova, troppo poche per vedere se la coda cresce. Quei punti restano "
                        "fuori dal verdetto: usa --durata 24 o più."), frasi
    assert frasi[1].startswith("Curva: forse saturazione a ritmo=4"), frasi
    assert carico.verdetto_saturazione(punti, "ritmo").prima is punti[1]


def test_ritmo_senza_durata_sul_fake(fake, carica):
    """End to end: --ritmo alone sends --richieste 4 a point (FIRE); with --durata, enough (SILENT)."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--ritmo", "10,20,40", "--seme", "1", "--token", "4", "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert ("Curva: a ritmo=10, 20, 40 solo 4 richieste a prova, troppo poche per vedere se la coda cresce. Nessun verdetto "
            "sulla saturazione: usa --durata 2 o più.") in out, out
    assert "nessuna saturazione" not in out and "il rumore non è misurato" not in out
    durata = ("--durata", "0.75")
    assert all(len(list(itertools.takewhile(lambda t: t < 0.75, carico.orari(PianoOltre(ritmo=r, seme=1))))) >= 12
               for r in (20, 40))  # the schedule: 12 or more a point, twice what an overload needs
    rc, out, err = carica(server.url, "--ritmo", "20,40", "--seme", "1", "--token", "4", *durata, "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert "troppo poche" not in out and "Curva: " in out, out


# 4. The rate sent under --durata, and one seed a rate ##########################################

def test_inviate_davvero_sulla_durata(fake, carica):
    """The tour: `--ritmo 1,2,4 --durata 6` printed "inviate davvero 1.95 req/s" for 8 requests in 6 s: (n - 1)
    over the first and last send. The rate sent is the requests over the duration they were scheduled in, in
    the line, the table and the JSON alike."""
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "20", "--seme", "2", "--durata", "0.6", "--token", "2", *VELOCE)
    assert rc == 0, out + err
    inviate = int(re.search(r"in 0\.6 s \(--durata\): inviate (\d+) richieste", out).group(1))
    (riga,) = [r for r in out.splitlines() if r.startswith("ritmo chiesto 20 req/s")]
    assert f"inviate davvero {inviate / 0.6:.2f} req/s" in riga, (inviate, riga)
    previsti = list(itertools.takewhile(lambda t: t < 0.6, carico.orari(PianoOltre(ritmo=20, seme=2))))
    assert f"nel programma {len(previsti) / 0.6:.2f}" in riga, riga  # the schedule's, over the same window


@pytest.mark.parametrize("seme", [2, 4])
def test_il_programma_si_scosta_sulla_durata(fake, carica, seme):
    """The "si scosta dal chiesto" clause, now on the schedule over the duration: FIRE where its count over 0.6 s
    strays by 5% or more from 20 a second (seed 2: 22 requests, 36.67), SILENT where it keeps it (seed 4: 12,
    20.00)."""
    previsti = list(itertools.takewhile(lambda t: t < 0.6, carico.orari(PianoOltre(ritmo=20, seme=seme))))
    scosta = abs(len(previsti) / 0.6 / 20 - 1) >= 0.05
    assert scosta == (seme == 2), len(previsti)  # the case each seed stages
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "20", "--seme", str(seme), "--durata", "0.6", "--token", "2", *VELOCE)
    assert rc == 0, out + err
    (riga,) = [r for r in out.splitlines() if r.startswith("ritmo chiesto 20 req/s")]
    assert ("si scosta dal chiesto" in riga) == scosta, riga


def test_ogni_ritmo_ha_le_sue_estrazioni(fake, carica, tmp_path):
    """The tour: every rate of a sweep shared one seed, so every point was a scaled copy of the same draws (seed 7:
    1.87, 3.73, 7.41 sent for 1, 2, 4 asked). Each rate draws its own, from the seed and the rate: the sweep is
    reproducible, and each point alone with the seed it prints."""
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "10,20", "--seme", "3", "--richieste", "6", "--token", "2",
                          "--json", str(tmp_path / "r.json"), "--blocchi", *VELOCE)
    assert rc == 0, out + err
    assert out.count("(arrivi di Poisson, seme 3)") == 2
    prove = json.loads((tmp_path / "r.json").read_text())["prove"]
    dieci, venti = ([r["previsto_s"] for r in p["richieste"]] for p in prove)
    assert dieci == list(itertools.islice(carico.orari(PianoOltre(ritmo=10, seme=3)), 6))
    assert venti == list(itertools.islice(carico.orari(PianoOltre(ritmo=20, seme=3)), 6))
    assert not all(abs(a - 2 * b) < 1e-9 for a, b in zip(dieci, venti)), (dieci, venti)  # not one draw scaled


# 5. The sheet's own question: --ripeti 3 said once, up front ##################################

def punti_np_token(valori):
    """--np 1,4 --token 16,64: each (np, token) with its runs' throughputs."""
    return [Punto([prova(v, 1.0, np=np, token=token) for v in tutti]) for np, token, tutti in valori]


def test_la_domanda_del_foglio_con_una_prova_detta_una_volta():
    """The tour: two identical `--np 1,4 --token 32,128` sweeps said "forse è cresciuto" and "forse è rimasto lo
    stesso", each with "(indicativo…)" on three lines in a row. FIRE: one line first, that --ripeti 3 makes it
    an answer; no hedge on each line."""
    righe = carico.rapporti_np(punti_np_token([(1, 16, [100]), (4, 16, [200]), (1, 64, [100]), (4, 64, [232])]),
                               ["np", "token"])
    assert righe[0] == ("una prova per punto: questi rapporti possono cambiare da un'esecuzione all'altra; con --ripeti 3 "
                        "si misura il rumore e diventano una risposta"), righe
    assert len(righe[0]) <= 160
    assert righe[1:] == ["throughput a token=16: np 4 / np 1 ×2.00", "throughput a token=64: np 4 / np 1 ×2.32",
                         "con risposte più lunghe (token=16 -> token=64) il vantaggio del batching forse è cresciuto: "
                         "×2.00 -> ×2.32"], righe
    assert sum("--ripeti" in r for r in righe) == 1 and not any("indicativo" in r for r in righe)


def test_la_domanda_del_foglio_con_le_ripetute_senza_avvertenza():
    """SILENT: with three runs a point the noise is measured, and nothing asks for --ripeti."""
    righe = carico.rapporti_np(punti_np_token([(1, 16, [96, 100, 104]), (4, 16, [196, 200, 204]),
                                               (1, 64, [96, 100, 104]), (4, 64, [228, 232, 236])]), ["np", "token"])
    assert righe[0].startswith("throughput a token=16: np 4 / np 1 ×2.00"), righe
    assert not any("--ripeti" in r or "una prova per punto" in r for r in righe), righe


# 6. A load beside the server during a run: the look after it, and a repeat slowed ############

def test_la_macchina_guardata_anche_dopo_la_prova():
    """The tour: `--spiega` said "La macchina era tranquilla prima della prova" of a run that a load beside the
    server had slowed: the look before cannot see what starts after it. FIRE: busy just after, said; SILENT:
    quiet after too, the look after beside the one before."""
    quieta, occupata = Macchina(2, 0.3, 0.02), Macchina(2, 1.9, 0.87)
    frasi = carico.spiegazione(prova(40, 1.0)._replace(macchina=quieta, macchina_dopo=occupata))
    assert frasi[-2:] == ["La macchina era tranquilla prima della prova (2 core, carico medio 0.3, CPU occupata al 2% prima "
                          "della prova).", "Macchina occupata subito dopo la prova: vedi la nota su stderr."], frasi
    assert all(len(f) <= 160 for f in frasi[-2:])
    frasi = carico.spiegazione(prova(40, 1.0)._replace(macchina=quieta, macchina_dopo=quieta))
    assert frasi[-1] == ("La macchina era tranquilla prima della prova (2 core, carico medio 0.3, CPU occupata al 2% prima "
                         "della prova, al 2% subito dopo)."), frasi
    assert not any("subito dopo la prova" in f for f in frasi)
    # busy before and after: said once, by the look before
    frasi = carico.spiegazione(prova(40, 1.0)._replace(macchina=occupata, macchina_dopo=occupata))
    assert sum("occupata" in f for f in frasi) == 1 and not any("subito dopo la prova" in f for f in frasi), frasi


def test_una_ripetuta_sotto_meta_della_mediana_esclusa():
    """The tour: one repeat at 15.81 token/s against ~42 made the point "33.34 token/s ±37.74". FIRE: under half the
    median of its siblings, out of the mean, said with its evidence (the slots' speed against the others', the
    machine after it)."""
    lenta = prova(16, 1.0, tps=12.0)._replace(macchina_dopo=Macchina(2, 1.9, 0.87))
    prove = [prova(40, 1.0), lenta, prova(44, 1.0)]
    punto = Punto(prove)
    assert carico.anomale(prove) == [(lenta, 42.0)]
    assert punto.intere == [prove[0], prove[2]] and punto.throughput == 42.0
    righe = carico.righe_ripetute(prove)
    assert righe[0].startswith("su 2 prove: media ±"), righe
    assert righe[1] == ("prova 2 esclusa dalla media: 16.00 token/s, meno di metà della mediana delle altre (42.00). Nel "
                        "proprio slot 12.0 t/s contro 40.0; subito dopo CPU al 87%"), righe
    assert len(righe[1]) <= 160
    assert righe[-1].endswith("(dev.std 2.83, 40.00-44.00)"), righe  # the throughput's spread: the two kept
    tabella = carico.tabella_griglia([punto, Punto([prova(80, 1.0, parallele=8) for _ in range(3)])], ["parallele"])
    assert tabella[2].startswith("| 4 (media di 2, 1 esclusa) | 42.00 token/s ±25.41 |"), tabella
    assert tabella[3].startswith("| 8 (media di 3) | 80.00 token/s ±0.00 |"), tabella
    assert tabella[-1] == ("esclusa: una prova sotto metà del throughput mediano delle altre dello stesso punto, fuori "
                           "dalle medie (detta dopo le sue prove)"), tabella


@pytest.mark.parametrize("throughput, tps", [
    ([44, 40, 24], [40.0] * 4),  # the slowest above half the median of the others (21)
    ([6.3, 6.1, 6.5], [8.8, 11.4, 5.1, 7.8]),  # the sheet's quiet run: speeds from 5.1 to 11.4 t/s in each repeat
    ([42.0], [40.0] * 4),  # one run: no siblings
    ([40, 16], [40.0] * 4),  # two runs apart: either may be the odd one (a shared machine slowed one of two)
])
def test_ripetute_vicine_tutte_nella_media(throughput, tps):
    """SILENT: repeats within a factor of two of each other, or speeds in a slot that merely differ, are noise."""
    prove = [prova(v, 1.0, tps=tps) for v in throughput]
    assert carico.anomale(prove) == [] and Punto(prove).intere == prove
    assert not any("esclusa" in r for r in carico.righe_ripetute(prove) + carico.tabella_griglia([Punto(prove)], ["parallele"]))


def rallenta_una(monkeypatch, server, quale, s_per_token):
    """The `quale`-th run (from 1) on a fake slowed to `s_per_token`, as a load beside the server would; the machine
    quiet before every run and after the others, busy just after that one."""
    vera, chiamate, stato = carico.esegui_carico, [], {}

    def esegui(*a, **k):
        chiamate.append(1)
        normale = server.config.s_per_token
        if len(chiamate) == quale:
            server.config.s_per_token = s_per_token
        try:
            return vera(*a, **k)
        finally:
            server.config.s_per_token = normale
            stato["dopo_lenta"] = len(chiamate) == quale

    monkeypatch.setattr(carico, "esegui_carico", esegui)
    monkeypatch.setattr(carico, "osserva_macchina", lambda: Macchina(2, 1.9, 0.91) if stato.pop("dopo_lenta", False)
                        else Macchina(2, 0.2, 0.03))


def test_ripetuta_rallentata_sul_fake(fake, carica, monkeypatch, tmp_path):
    """End to end: the second of three repeats ten times slower, the machine busy just after it. The repeat is out
    of the mean and said; the table marks it; the JSON keeps it, marked; --spiega and stderr see the machine."""
    server = fake(n_slot=2, s_per_token=0.003)
    rallenta_una(monkeypatch, server, 2, 0.03)
    rc, out, err = carica(server.url, "--ripeti", "3", "--parallele", "2", "--token", "8", "--tabella", "--spiega",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    per_prova = [float(x) for x in re.findall(r"^throughput aggregato ([\d.]+) token/s  \(", out, re.M)]
    assert len(per_prova) == 3 and per_prova[1] < 0.5 * min(per_prova[0], per_prova[2]), per_prova
    (esclusa,) = [r for r in out.splitlines() if r.startswith("prova 2 esclusa dalla media: ")]
    assert "meno di metà della mediana delle altre" in esclusa and esclusa.endswith("; subito dopo CPU al 91%"), esclusa
    lenta, altre = (float(x) for x in re.search(r"Nel proprio slot ([\d.]+) t/s contro ([\d.]+)", esclusa).groups())
    assert lenta < 0.5 * altre, esclusa  # the slots themselves were slower: the evidence of a load beside them
    assert "su 2 prove: media" in out
    media = float(re.search(r"^  throughput aggregato +([\d.]+) token/s", out, re.M).group(1))
    assert media == pytest.approx((per_prova[0] + per_prova[2]) / 2, abs=0.02), (media, per_prova)
    righe = [r for r in out.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert [r.split(" | ")[0] for r in righe] == ["| 2", "| 2 (esclusa)", "| 2", "| 2 (media di 2)"], righe
    assert out.count("Macchina occupata subito dopo la prova: vedi la nota su stderr.") == 1
    # the run left out was busy: the table's line says its figures do not count (the tour: the busy run dropped)
    assert out.count("la macchina era occupata (CPU occupata al 91%): quelle cifre non valgono") == 1, out
    assert err.count("carico.py: nota: subito dopo la prova la macchina era occupata (CPU occupata al 91%)") == 1
    dati = json.loads((tmp_path / "r.json").read_text())["prove"]
    assert [p["esclusa_dalla_media"] for p in dati] == [False, True, False]
    assert dati[1]["macchina_dopo"]["cpu_occupata"] == 0.91


def test_ripetute_senza_rallentamento_sul_fake(fake, carica, monkeypatch):
    """SILENT: the same repeats, none slowed, the machine quiet around each: nothing excluded, no word on the
    machine after; --spiega's quiet machine says the look after too."""
    server = fake(n_slot=2, s_per_token=0.003)
    rallenta_una(monkeypatch, server, 0, 0.03)
    rc, out, err = carica(server.url, "--ripeti", "3", "--parallele", "2", "--token", "8", "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert "esclusa" not in out and "su 3 prove: media" in out
    assert "Macchina occupata subito dopo" not in out and "subito dopo la prova" not in err
    assert out.count("La macchina era tranquilla prima della prova (2 core, carico medio 0.2, CPU occupata al 3% prima "
                     "della prova, al 3% subito dopo).") == 3, out


def test_sovraccarico_conta_gli_arrivi_come_inviate_davvero(fake, carica):
    """The overload's arrival rate is the rate sent the run's own line gives (under --durata: requests over the
    duration), not (n - 1) over the first to the last send: one output, one figure for one rate."""
    server = fake(n_slot=1, s_per_token=0.025)  # ~18 answers a second: at 40 a second the queue grows
    rc, out, err = carica(server.url, "--ritmo", "40", "--arrivi", "costanti", "--durata", "0.5", "--token", "2",
                          "--spiega", *VELOCE)
    assert rc == 0, out + err
    inviate = re.search(r"inviate davvero ([\d.]+) req/s", out).group(1)
    arrivate = re.search(r"e ne arrivavano ([\d.]+)\.", out)
    assert arrivate, out
    assert arrivate.group(1) == inviate, out


@pytest.mark.parametrize("cpu,detto", [(0.57, True), (0.05, False)])
def test_la_domanda_del_foglio_su_una_macchina_occupata(cpu, detto):
    """The fourth tour: a sweep's np=4 point ran beside a load (carico had said so on stderr) and the ratio fell to
    ×0.32, the lab's lesson upside down, with nothing beside it. FIRE: a busy look before or after a point's run
    says that point's figures and the ratios do not hold, every busy point named; SILENT on a quiet one."""
    punti = punti_np_token([(1, 32, [100]), (4, 32, [32]), (1, 128, [100]), (4, 128, [99])])
    for k in (1, 3):
        punti[k] = Punto([punti[k].prove[0]._replace(macchina=Macchina(2, 0.5, 0.05), macchina_dopo=Macchina(2, 1.0, cpu))])
    righe = carico.riga_occupata(punti, ["np", "token"])
    assert righe == ([f"la macchina era occupata a np=4, token=32; np=4, token=128 (CPU occupata al {cpu:.0%}): "
                      "quelle cifre e i rapporti non valgono, ripeti a macchina tranquilla"] if detto else []), righe
    assert all(len(r) <= 160 for r in righe)


@pytest.mark.parametrize("cpu,detto", [(0.52, True), (0.04, False)])
def test_confronta_dice_la_macchina_occupata(tmp_path, capsys, cpu, detto):
    """The fourth tour: `--confronta np4.json kv.json`, where kv.json's run had said the machine was busy (52%),
    gave ×0.45 with nothing beside it. FIRE: the saved look says the comparison does not hold; SILENT when quiet."""
    from test_confronto import file_di_prove

    a = file_di_prove(tmp_path / "a.json", [66.0], [1.0], np=4)
    b = tmp_path / "b.json"
    dati = json.loads(open(file_di_prove(b, [29.5], [2.0], np=4)).read())
    dati["prove"][0]["macchina"] = {"core": 2, "carico_medio": 1.0, "cpu_occupata": cpu}
    b.write_text(json.dumps(dati))
    assert carico.main(["--confronta", a, str(b)]) == 0
    avviso = [r for r in capsys.readouterr().out.splitlines() if "la macchina era occupata" in r]
    assert avviso == ([f"  la macchina era occupata in una prova di B (CPU occupata al {cpu:.0%}): il confronto "
                       "non vale, ripeti a macchina tranquilla"] if detto else [])


def test_picco_sottostimato_mai_con_ogni_slot_visto_occupato():
    """The fourth tour: a killed 1-slot server, peak 1, got "il picco … può essere sottostimato": one slot cannot
    show more. SILENT when a reading saw every slot busy; FIRE when it saw fewer."""
    from carico import Campione

    for n_slot, visti, detto in ((1, 1, False), (4, 4, False), (4, 1, True)):
        prova_ = Prova(InfoServer(n_slot, 512, True), Esecuzione([], [Campione(0.0, visti)], 4, 130), Piano(4, 4, 32))
        assert any("sottostimato" in n for n in carico.note(prova_)) == detto, (n_slot, visti)


def test_inviate_davvero_dopo_ctrl_c_sulla_finestra_fino_allo_stop():
    """The review: a --durata 6 run stopped at 2.48 s said 'inviate davvero 1.67 req/s' for 4 a second sent: over
    the window the requests were scheduled in, up to the stop when it came first."""
    base = prova(40, 0.1, ritmo=4, n=10)
    durata = base._replace(piano=base.piano._replace(oltre=PianoOltre(ritmo=4, durata=6)))
    assert carico.invii_al_secondo(durata) == pytest.approx(10 / 6)
    fermata = durata._replace(esecuzione=durata.esecuzione._replace(interruzione=130, interrotta_a=2.5))
    assert carico.invii_al_secondo(fermata) == pytest.approx(10 / 2.5)


@pytest.mark.parametrize("timeout,detto", [("0.3", False), ("30", True)])
def test_nessuno_sguardo_dopo_una_richiesta_fallita(fake, carica, monkeypatch, timeout, detto):
    """The review: a request the client gave up on (--timeout) keeps the server at work a few seconds, and the look
    after the run would blame another load for it. SILENT after a failed request; FIRE on a whole run."""
    viste = iter([carico.Macchina(2, 0.1, 0.01)] + [carico.Macchina(2, 1.9, 0.9)] * 5)  # quiet before, busy after
    monkeypatch.setattr(carico, "osserva_macchina", lambda *durata: next(viste))
    server = fake(n_slot=1, s_per_token=0.005 if detto else 0.02)  # 0.64 s answers, for the 0.3 s --timeout
    rc, out, err = carica(server.url, "--richieste", "2", "--token", "32", "--timeout", timeout, *VELOCE)
    assert (rc == 0) == detto, out + err
    assert ("subito dopo la prova la macchina era occupata" in err) == detto, err


def test_un_solo_punto_con_la_coda_che_cresce_basta():
    """The next tour: `--ritmo 1,4 --durata 5` sent 3 requests at ritmo=1 and overloaded ritmo=4; the curve said
    "Nessun verdetto sulla saturazione: usa --durata" and the next line the overload. FIRE: the point left is
    enough when its queue grew, and the few are only left out of the verdict."""
    from test_verdetti import prova_a_ritmo

    punti = [Punto([prova(40, 1.0, ritmo=0.5, n=3)]), Punto([prova_a_ritmo([i / 2.5 for i in range(20)], 1.0, 2)])]
    frasi = carico.spiegazione_griglia("ritmo", [("", punti)])
    assert frasi[0].endswith("Quei punti restano fuori dal verdetto: usa --durata 24 o più."), frasi
    assert frasi[1].startswith("Curva: saturazione entro ritmo=1 (inviate davvero 2.50 req/s)."), frasi
    assert "Nessun verdetto" not in " ".join(frasi)
    # SILENT: one point left whose queue did not grow is no verdict
    calmo = [punti[0], Punto([prova_a_ritmo([i / 1.0 for i in range(20)], 1.0, 2)])]
    assert carico.spiegazione_griglia("ritmo", [("", calmo)])[0].endswith(
        "Nessun verdetto sulla saturazione: usa --durata 24 o più."), carico.spiegazione_griglia("ritmo", [("", calmo)])
