"""Beyond the closed loop: --ritmo (open-loop arrivals), --durata, sweeps over lists of values, the
sweep's table, the capacity curve and --spiega on it, against the fake server.

The arrival tests read the fake's own clock: when each chat request reached it."""

import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time

import pytest

import carico
from aiuti import CARICO, FAKE, RIGA_REQ, VELOCE, porta_libera, risponde


def intervalli(tempi):
    tempi = sorted(tempi)
    return [b - a for a, b in zip(tempi, tempi[1:])]


def cv(valori):
    return statistics.pstdev(valori) / statistics.fmean(valori)


def righe_tabella(out):
    """The rows of the sweep's table, as lists of cells (header first, the --- line left out)."""
    righe = [r for r in out.splitlines() if r.startswith("| ")]
    return [[c.strip() for c in r.strip("|").split("|")] for r in righe]


# --ritmo: requests sent by the clock ########################################################

def test_ritmo_costante_sul_tempo_del_server(fake, carica):
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "50", "--arrivi", "costanti", "--richieste", "200", "--token", "2")
    assert rc == 0, out + err
    gap = intervalli(server.arrivi)
    assert len(gap) == 199
    ritmo = 1 / statistics.fmean(gap)
    assert 0.95 * 50 < ritmo < 1.05 * 50, ritmo
    assert cv(gap) < 0.2, cv(gap)
    riga = next(r for r in out.splitlines() if r.startswith("ritmo chiesto"))
    assert riga.startswith("ritmo chiesto 50 req/s (arrivi costanti): nel programma 50.00, ottenuto "), riga
    assert "ritardo degli invii sul programma: p99 " in riga
    assert "non ha tenuto il ritmo" not in err


def test_ritmo_poisson_seminato_segue_il_programma(fake, carica):
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "50", "--seme", "11", "--richieste", "200", "--token", "2")
    assert rc == 0, out + err
    programma = list(itertools.islice(carico.orari(carico.Piano(ritmo=50, seme=11)), 200))
    previsti, visti = intervalli(programma), intervalli(server.arrivi)
    scarti = sorted(abs(a - b) for a, b in zip(previsti, visti))
    assert scarti[len(scarti) // 2] < 0.002, scarti[-10:]  # the median gap within 2 ms of its plan
    assert scarti[int(0.95 * len(scarti))] < 0.005, scarti[-10:]  # 95% within 5 ms, on a shared machine
    assert 0.7 < cv(visti) < 1.3, cv(visti)
    assert "(arrivi di Poisson, seme 11)" in out
    # The same seed is the same schedule; another seed another one.
    assert programma == list(itertools.islice(carico.orari(carico.Piano(ritmo=50, seme=11)), 200))
    assert programma != list(itertools.islice(carico.orari(carico.Piano(ritmo=50, seme=12)), 200))


def test_ritmo_senza_seme_ne_sceglie_uno_e_lo_salva(fake, carica, tmp_path):
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "40", "--richieste", "6", "--token", "2",
                          "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"))
    assert rc == 0, out + err
    seme = int(re.search(r"seme (\d+)\)", out).group(1))
    dati = json.loads((tmp_path / "r.json").read_text())
    prova = dati["prove"][0]
    assert dati["opzioni"]["seme"] == seme and dati["opzioni"]["arrivi"] == "poisson"
    previsti = [r["previsto_s"] for r in prova["richieste"]]
    assert previsti == list(itertools.islice(carico.orari(carico.Piano(ritmo=40, seme=seme)), 6))
    assert all(r["ritardo_invio_s"] >= 0 for r in prova["richieste"])
    assert prova["invii"]["ritardo_max_s"] == max(r["ritardo_invio_s"] for r in prova["richieste"])
    assert prova["invii"]["trattenute_dal_tetto"] == 0
    righe = (tmp_path / "r.csv").read_text().splitlines()
    assert len(righe) == 7 and "ritmo" in righe[0].split(",") and ",40.0," in righe[1]


def test_parallele_e_il_tetto_delle_richieste_in_volo(fake, carica):
    server = fake(n_slot=4, s_per_token=0.01)
    rc, out, err = carica(server.url, "--ritmo", "100", "--richieste", "30", "--parallele", "3", "--token", "5")
    assert rc == 0, out + err
    assert server.picco_in_volo == 3  # reached, never exceeded
    assert "richieste=30 parallele=3 " in out
    assert "(il tetto di --parallele) e sono partite dopo l'orario previsto" in err
    ottenuto = float(re.search(r"ottenuto ([\d.]+) req/s", out).group(1))
    assert ottenuto < 60, out  # 3 in flight at ~60 ms each cannot be sent 100 a second


def test_client_in_ritardo_detto_su_stderr():
    """A schedule the client did not keep is said as such, and the table does not present it as kept."""
    risultati = [carico.Risultato(i, i * 0.01 + 0.05, i * 0.01 + 0.1, 1, previsto=i * 0.01) for i in range(50)]
    prova = carico.Prova(carico.InfoServer(1, 512, True), carico.Esecuzione(risultati, [], 50),
                         piano=carico.Piano(50, 256, 1, ritmo=100, seme=1))
    assert not carico.ritmo_tenuto(prova)
    (nota,) = carico.note_ritmo(prova)
    assert nota.startswith("il client non ha tenuto il ritmo chiesto") and "p99 50.0 ms" in nota
    riga = carico.tabella_griglia([prova], ["ritmo"])[2]
    assert riga.endswith("(non tenuto) |"), riga
    puntuale = prova._replace(esecuzione=carico.Esecuzione([r._replace(inizio=r.previsto) for r in risultati], [], 50))
    assert carico.ritmo_tenuto(puntuale) and carico.note_ritmo(puntuale) == []


# --durata ###################################################################################

def test_durata_ad_anello_chiuso(fake, carica):
    server = fake(n_slot=2, s_per_token=0.01)
    rc, out, err = carica(server.url, "--durata", "1", "--parallele", "2", "--token", "5", *VELOCE)
    assert rc == 0, out + err
    inviate = int(re.search(r"inviate (\d+) richieste, (\d+) con risposta", out).group(1))
    assert inviate == len(server.arrivi) and inviate >= 6  # ~60 ms each, two at a time, for a second
    assert f"richieste={inviate} parallele=2 " in out
    assert len([r for r in out.splitlines() if RIGA_REQ.match(r)]) == inviate
    assert server.picco_in_volo == 2
    assert max(server.arrivi) - min(server.arrivi) < 1.0


def test_durata_a_ritmo(fake, carica):
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--durata", "1", "--ritmo", "20", "--arrivi", "costanti", "--token", "2")
    assert rc == 0, out + err
    assert "in 1 s (--durata): inviate 20 richieste, 20 con risposta" in out


# Sweeps #######################################################################################

def test_griglia_parallele_tabella_curva_e_spiega(fake, carica, tmp_path):
    server = fake(n_slot=2, s_per_token=0.01)
    rc, out, err = carica(server.url, "--parallele", "1,2,4", "--token", "16", "--grafico", "--spiega",
                          "--json", str(tmp_path / "g.json"), "--svg", str(tmp_path / "g.svg"), *VELOCE)
    assert rc == 0, out + err
    for j, p in enumerate((1, 2, 4), 1):
        assert f"punto {j} di 3: parallele={p}" in out
        assert f"richieste=4 parallele={p} slot=2  picco slot occupati insieme={min(p, 2)}" in out
    testa, *righe = righe_tabella(out)
    assert testa == ["parallele", "throughput", "latenza media", "latenza p90", "latenza max",
                     "picco slot occupati", "picco coda"]
    assert [r[0] for r in righe] == ["1", "2", "4"]
    assert [r[5] for r in righe] == ["1/2", "2/2", "2/2"]
    assert righe[0][6] == "0" and int(righe[2][6]) >= 1  # with 4 in flight and 2 slots, 2 wait
    # Two slots: 2 in flight doubles throughput, 4 do not add any and only wait.
    assert "saturazione a parallele=4: da parallele=2 il throughput" in out
    assert "◆4" in out and "●1" in out and "●2" in out
    assert "Lì gli slot erano tutti occupati (picco 2 su 2)" in out
    little = [r for r in out.splitlines() if r.startswith("  parallele=")]
    assert len(little) == 3 and all("req/s ×" in r for r in little)
    # Each point got prompts the server had not seen.
    assert len(set(server.prompts)) == len(server.prompts) == 12
    dati = json.loads((tmp_path / "g.json").read_text())
    assert dati["griglia"] == {"parallele": [1, 2, 4]}
    assert [p["punto"] for p in dati["prove"]] == [{"parallele": 1}, {"parallele": 2}, {"parallele": 4}]
    assert all(len(p["richieste"]) == 4 and p["campioni"] for p in dati["prove"])
    testo_svg = (tmp_path / "g.svg").read_text()
    assert "curva di capacità" in testo_svg and "saturazione" in testo_svg
    assert testo_svg.count('r="4" fill=') == 3 and testo_svg.count('r="9"') == 1  # three points, one ringed


def test_griglia_token_e_ritmo_insieme(fake, carica):
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--token", "4,8", "--ritmo", "10,20", "--richieste", "4", "--seme", "5")
    assert rc == 0, out + err
    testa, *righe = righe_tabella(out)
    assert testa[:2] == ["token", "ritmo"] and testa[-1] == "ritmo ottenuto"
    assert [r[:2] for r in righe] == [["4", "10"], ["4", "20"], ["8", "10"], ["8", "20"]]
    assert out.count("(arrivi di Poisson, seme 5)") == 4


def test_interrotto_a_meta_griglia(tmp_path):
    porta = porta_libera()
    url = f"http://127.0.0.1:{porta}"
    server = subprocess.Popen([sys.executable, FAKE, "serve", "--port", str(porta), "-np", "1", "--s-per-token", "0.02"],
                              stdout=subprocess.DEVNULL)
    try:
        while not risponde(url):
            time.sleep(0.05)
        proc = subprocess.Popen([sys.executable, CARICO, "--url", url, "--parallele", "1,2,4", "--richieste", "2",
                                 "--token", "20", "--json", str(tmp_path / "i.json"), "--csv", str(tmp_path / "i.csv")],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out = ""
        while out.count("server: 1 slot") < 2:  # the first point has ended
            out += proc.stdout.readline()
        client = carico.Client(url)
        while not carico.conta_occupati(json.loads(client.chiama("GET", "/slots").corpo)):
            time.sleep(0.01)  # the second point's first request is in the slot
        proc.send_signal(signal.SIGINT)
        resto, err = proc.communicate(timeout=30)
        out += resto
    finally:
        server.terminate()
        server.wait()
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err and "carico.py: interrotto" in err
    testa, *righe = righe_tabella(out)
    assert testa[0] == "parallele" and [r[0] for r in righe] == ["1", "2"], out + err
    assert "richieste non completate: 2 su 2 (interrotto)" in out.split("punto 2 di 3")[1]
    assert len(json.loads((tmp_path / "i.json").read_text())["prove"]) == 2
    assert len((tmp_path / "i.csv").read_text().splitlines()) == 1 + 2  # point 1's two requests
    assert "punto 3 di 3" not in out


def test_avvia_griglia_su_piu_server(capsys):
    url = f"http://127.0.0.1:{porta_libera()}"
    rc = carico.main(["--url", url, "--avvia", f"{sys.executable} {FAKE} serve --s-per-token 0.002", "--np", "1,2",
                      "--parallele", "1,2", "--token", "4", "--richieste", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    testa, *righe = righe_tabella(out)
    assert testa[:3] == ["np", "parallele", "n_ctx_slot"]
    assert [r[:3] for r in righe] == [["1", "1", "2048"], ["1", "2", "2048"], ["2", "1", "1024"], ["2", "2", "1024"]]
    assert out.count("punto 1 di 2: parallele=1") == 2
    assert "curva" not in out  # without --grafico


def test_saturazione_e_percentile():
    def prova(throughput, latenza, valore):
        e = carico.Esecuzione([carico.Risultato(0, 0.0, latenza, int(throughput * latenza))], [], 1)
        return carico.Prova(carico.InfoServer(2, 512, True), e, piano=carico.Piano(parallele=valore))

    def curva(*punti):
        return [prova(x, y, v) for v, (x, y) in enumerate(punti, 1)]

    assert carico.saturazione(curva((10, 1), (20, 1), (21, 2))) == 2  # +5% throughput, latency up
    assert carico.saturazione(curva((10, 1), (11.5, 2), (30, 3))) is None  # +15%, then +160%
    assert carico.saturazione(curva((10, 1), (10.5, 1))) is None  # flat, but latency did not rise
    assert carico.saturazione(curva((10, 1), (9, 2))) == 1  # throughput fell
    valori = [i / 1000 for i in range(1, 101)]
    assert carico.percentile(valori, 50) == statistics.quantiles(valori, n=100, method="inclusive")[49]
    assert carico.percentile(valori, 99) == pytest.approx(0.09901)
    assert carico.percentile([0.3], 90) == 0.3 and carico.percentile([], 90) is None


# Bad input: one Italian line, exit 2, before any load ##########################################

@pytest.mark.parametrize("argomenti,messaggio", [
    (["--parallele", "1,0,4"], "opzione --parallele: deve essere maggiore di 0, non 0"),
    (["--parallele", "1,-2"], "opzione --parallele: deve essere maggiore di 0, non -2"),
    (["--token", "32,x"], "opzione --token: 'x' non è un numero intero"),
    (["--token", "32,"], "opzione --token: '' non è un numero intero"),
    (["--ritmo"], "opzione --ritmo: richiede un valore"),
    (["--ritmo", "0"], "opzione --ritmo: deve essere maggiore di 0, non 0"),
    (["--ritmo", "due"], "opzione --ritmo: 'due' non è un numero di richieste al secondo"),
    (["--ritmo", "1,nan"], "opzione --ritmo: deve essere maggiore di 0, non nan"),
    (["--arrivi", "a caso", "--ritmo", "1"], "opzione --arrivi: scelta non valida: 'a caso' (choose from 'poisson', 'costanti')"),
    (["--durata", "5", "--richieste", "4"], "--durata e --richieste si escludono: con --durata si inviano richieste "
                                            "finché dura il tempo"),
    (["--durata", "0"], "opzione --durata: deve essere maggiore di 0, non 0"),
    (["--seme", "3"], "--arrivi e --seme vanno usati insieme a --ritmo"),
    (["--parallele", ",".join(map(str, range(1, 12))), "--token", ",".join(map(str, range(1, 11)))],
     "la griglia ha 110 punti, oltre 100: accorcia le liste, o aggiungi --forza"),
])
def test_opzioni_sbagliate_della_griglia(fake, capsys, argomenti, messaggio):
    server = fake()
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--url", server.url, *argomenti])
    assert uscita.value.code == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == f"carico.py: errore: {messaggio}"
    assert server.richieste_ricevute == []


def test_forza_accetta_una_griglia_grande():
    piani, _ = carico.analizza_argomenti(["--parallele", ",".join(map(str, range(1, 12))),
                                          "--token", ",".join(map(str, range(1, 11))), "--forza"])
    assert len(piani) == 110 and (piani[0].parallele, piani[0].token) == (1, 1) and piani[-1][1:3] == (11, 10)
    piani, _ = carico.analizza_argomenti(["--ritmo", "2"])
    assert piani[0].parallele == 4 and piani[0].richieste == 4  # the cap: no more than the requests
    piani, _ = carico.analizza_argomenti(["--durata", "3", "--ritmo", "2"])
    assert piani[0].richieste is None and piani[0].parallele == carico.TETTO_RITMO


def test_ritmo_oltre_la_capacita_e_sovraccarico(fake, carica):
    """One slot at ~0.1 s a request holds ~10 a second: at 40 a second the queue grows all run long."""
    server = fake(n_slot=1, s_per_token=0.005)
    rc, out, err = carica(server.url, "--ritmo", "4,40", "--arrivi", "costanti", "--richieste", "12",
                          "--token", "20", "--spiega", *VELOCE)
    assert rc == 0, out + err
    (frase,) = [r for r in out.splitlines() if "sovraccarico" in r]
    assert frase.startswith("A ritmo=40 il server ha completato "), frase
    completate = float(re.search(r"completato ([\d.]+) richieste al secondo", frase).group(1))
    assert completate < 15, frase
    testa, *righe = righe_tabella(out)
    assert [r[0] for r in righe] == ["4", "40"] and int(righe[1][testa.index("picco coda")]) >= 5


def test_perche_satura_coda_o_core():
    """Why saturation came, read from the figures: requests that waited for a slot, or slots that
    each went slower because they share the cores."""
    info = carico.InfoServer(2, 1024, True)

    def prova(latenza, servizio, tps, picco):
        risultati = [carico.Risultato(i, 0.0, latenza, 32, tps, 20, 0.0, servizio * 1000) for i in range(4)]
        campioni = [carico.Campione(0.1, picco), carico.Campione(0.2, picco)]
        return carico.Prova(info, carico.Esecuzione(risultati, campioni, 4))

    # Two slots at half speed each: latency doubled, nobody waited.
    frase = carico.perche_satura(prova(0.5, 0.5, 70.0, 1), prova(1.0, 1.0, 35.0, 2))
    assert frase == ("La coda non è cresciuta (2 in attesa al massimo; picco 2 su 2), ma nel proprio slot ogni "
                     "richiesta è scesa da 70.0 a 35.0 t/s: gli slot si dividono gli stessi core, e la macchina non "
                     "genera più token al secondo."), frase
    # Same speed in the slot, but each request waited 0.5 s of its 1.0 s for one.
    frase = carico.perche_satura(prova(0.5, 0.5, 70.0, 2), prova(1.0, 0.5, 70.0, 2))
    assert frase.startswith("Lì gli slot erano tutti occupati (picco 2 su 2) e la coda è cresciuta"), frase
    assert "l'attesa media in coda è passata da 0.00 a 0.50 s" in frase
