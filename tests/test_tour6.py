"""The instructor's tour of 1.6.1: three findings, each with the run that showed it.

1. After Ctrl+C, `tempo totale` was the last completed answer's time, said as if the run had lasted that.
2. `attesa dello slot` named two figures (the --dettagli row: only while every slot was busy; the files'
   `attesa_slot_s`: from the send to the slot).
3. "Alza --parallele per tenere il ritmo" was said also when the server itself was the limit.
"""

import csv
import json
import re
import signal
import threading

import pytest

import carico
from aiuti import RIGA_REQ, VELOCE
from conftest import CIFRE
from carico import Campione, Esecuzione, EsecuzioneOltre, InfoServer, Piano, PianoOltre, Prova, Risultato, RisultatoOltre

TEMPO_INTERROTTO = re.compile(r"^tempo totale (n/d|[\d.]+ s) \(fino all'ultima risposta; prova interrotta a ([\d.]+) s\)"
                              r"  \|  latenza media ")
TEMPO_LAB = re.compile(r"^tempo totale [\d.]+ s  \|  latenza media [\d.]+ s, max [\d.]+ s$")
THROUGHPUT_LAB = re.compile(r"^throughput aggregato [\d.]+ token/s  \(\d+ token generati\)$")


def ctrl_c_a_meta(quale: int, dopo_token: int):
    """A chat handler for the fake: Ctrl+C to the main thread (as a terminal's reaches carico.py) once the
    `quale`-th request (from 1) has generated `dopo_token` tokens in its slot."""
    arrivate, fatto = [], threading.Event()

    def chat(h, corpo):
        arrivate.append(True)
        mia = len(arrivate)

        def al_token(i):
            if mia == quale and i == dopo_token and not fatto.is_set():
                fatto.set()
                signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

        status, dati = h.server.fake.completa(json.loads(corpo), al_token=al_token, chiusa=h.chiusa)
        if status is not None:
            h.send_json(status, dati)
    return chat


# 1. Ctrl+C: the span the figures cover, and when the run was stopped ##########################

def test_interrotta_dice_fin_dove_arrivano_le_cifre_e_quando_si_e_fermata(fake, carica, tmp_path):
    """One slot, three requests: the first answers, Ctrl+C comes while the second has been generating
    for 30 steps. The total time is the first answer's; the line says so and when the run was stopped
    (later), the throughput line that it counts only what completed; the files record the same time."""
    server = fake(n_slot=1, s_per_token=0.01, override={"/v1/chat/completions": ctrl_c_a_meta(2, 30)})
    rc, out, err = carica(server.url, "--richieste", "3", "--parallele", "3", "--token", "40", *VELOCE, "--spiega",
                          "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"))
    assert rc == 130, err
    righe = out.splitlines()
    tempo = next(r for r in righe if r.startswith("tempo totale"))
    m = TEMPO_INTERROTTO.match(tempo)
    assert m, tempo
    interrotta_a = float(m.group(2))
    dati = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    riepilogo = dati["riepilogo"]
    assert dati["interrotta"] and f"{riepilogo['interrotta_a']:.2f}" == m.group(2)
    if riepilogo["tempo_totale"] is not None:  # the first answer read before the Ctrl+C (always, but on a stalled machine)
        assert m.group(1) == f"{riepilogo['tempo_totale']:.2f} s"
        # The second request was 30 steps (of >= 10 ms) into its slot, after the first had left it.
        assert interrotta_a >= riepilogo["tempo_totale"] + 0.1, tempo
        assert next(r for r in righe if r.startswith("throughput aggregato")).endswith(
            "token generati, solo dalle richieste completate: un limite inferiore)")
    assert f"La prova si è fermata prima della fine (è stata interrotta a {m.group(2)} s). " in out
    assert "richieste non completate: 2 su 3 (interrotto)" in righe or "richieste non completate: 3 su 3 (interrotto)" in righe
    file_csv = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert {r["interrotta"] for r in file_csv} == {"True"}
    assert {round(float(r["interrotta_a_s"]), 6) for r in file_csv} == {round(riepilogo["interrotta_a"], 6)}


def test_non_interrotta_le_righe_del_lab_restano_quelle(fake, carica, tmp_path):
    """A run that ends by itself: the lab's lines exactly, and the files say it was not stopped."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, *VELOCE, "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"))
    assert rc == 0, err
    righe = out.splitlines()
    assert all(RIGA_REQ.match(r) for r in righe[1:5]) and righe[5] == ""
    assert TEMPO_LAB.match(righe[7]) and THROUGHPUT_LAB.match(righe[8]), righe
    assert json.loads((tmp_path / "r.json").read_text())["prove"][0]["riepilogo"]["interrotta_a"] is None
    assert {r["interrotta_a_s"] for r in csv.DictReader((tmp_path / "r.csv").open())} == {""}


def test_righe_riepilogo_interrotta_prima_di_ogni_risposta():
    """Pure: a run stopped before any answer says n/d and when it was stopped, never a duration it did not have."""
    s = carico.riassumi(carico.Esecuzione([], [], 4, 130, interrotta_a=1.5), 1)
    righe = carico.righe_riepilogo(s, 4, "4", carico.InfoServer(1, 2048, True))
    assert righe[1] == "tempo totale n/d (fino all'ultima risposta; prova interrotta a 1.50 s)  |  latenza media n/d, max n/d"
    assert righe[-1] == "richieste non completate: 4 su 4 (interrotto)"


# 2. Two figures, two names: the wait for a slot and the wait in the queue #######################

def test_attesa_dello_slot_e_attesa_in_coda_due_nomi_due_cifre(fake, carica, capsys, tmp_path):
    """One slot, four requests at once: every figure named `attesa in coda` (--dettagli, --spiega, the files'
    attesa_in_coda_s) is the same figure, the time with every slot busy; `attesa dello slot` (attesa_slot_s) is
    latency minus prompt and generation, never less; --help says both."""
    server = fake(n_slot=1, s_per_token=0.005)
    rc, out, err = carica(server.url, "--token", "20", "--dettagli", "--spiega", *VELOCE,
                          "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"))
    assert rc == 0, out + err
    assert "attesa dello slot" not in out
    richieste = list(csv.DictReader((tmp_path / "r.csv").open()))
    for r in richieste:
        attesa_slot, in_coda = float(r["attesa_slot_s"]), float(r["attesa_in_coda_s"])
        servizio = (float(r["prompt_ms"]) + float(r["predicted_ms"])) / 1000
        assert attesa_slot == pytest.approx(float(r["latenza_s"]) - servizio, abs=1e-9)
        assert 0 <= in_coda <= attesa_slot
    in_coda = {int(r["indice"]): float(r["attesa_in_coda_s"]) for r in richieste}
    (riga,) = [r for r in out.splitlines() if r.startswith("  attesa in coda (s)")]
    assert riga.split()[-1] == f"{max(in_coda.values()):.2f}" and riga.split()[4] == f"{min(in_coda.values()):.2f}", riga
    dati = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    assert dati["dettagli"]["figure_s"]["attesa in coda"]["max"] == pytest.approx(max(in_coda.values()))
    assert [r["attesa_in_coda_s"] for r in dati["richieste"]] == pytest.approx([in_coda[i] for i in range(4)])
    m = re.search(r"La più sfortunata, la req (\d): ([\d.]+) s in coda su", out)
    assert m and m.group(2) == f"{in_coda[int(m.group(1))]:.2f}", out
    capsys.readouterr()
    with pytest.raises(SystemExit):
        carico.main(["--help"])
    aiuto = " ".join(capsys.readouterr().out.split())
    assert "attesa in coda: il tempo in cui la richiesta aspettava con tutti gli slot occupati" in aiuto
    assert ("attesa dello slot (--json, --csv): dall'invio a quando uno slot la prende (la coda più il viaggio), "
            "cioè latenza meno prompt e generazione") in aiuto


def test_senza_sapere_gli_slot_niente_attesa_in_coda():
    """Pure: with the slot count unknown nobody can tell when every slot was busy: n/d, not 0.00."""
    r = Risultato(0, 0.0, 1.0, 8, 40.0, 5.0, 495.0)
    assert carico.attese_a_slot_pieni([r], None) == {}
    assert carico.valori_figure(Prova(InfoServer(None, None, False), Esecuzione([r], [], 1)))["attesa in coda"] == []


# 3. Who held the schedule back: the cap, or the server ##########################################

RITMO_TETTO_PIENO = ("--ritmo", "20", "--arrivi", "costanti", "--parallele", "1", "--durata", "1", "--token", "30",
                     "--spiega", "--silenzioso", "--intervallo", "0.1")  # 0.3 s a request against a send every 0.05 s


def test_tetto_pieno_su_un_server_senza_slot_liberi_il_limite_e_il_server(fake, carica):
    """The tour: `--ritmo 2 --durata 10 --parallele 1` on -np 1 said "Alza --parallele per tenere il ritmo" while
    the one slot was busy the whole time: a higher cap would only have moved the wait into the server's queue."""
    server = fake(n_slot=1, s_per_token=0.01)
    rc, out, err = carica(server.url, *RITMO_TETTO_PIENO)
    assert rc == 0, out + err
    assert "alza --parallele" not in (out + err).lower(), out + err
    (nota,) = [r for r in err.splitlines() if "il tetto di --parallele" in r]
    m = re.search(r"\. Il limite è il server, non il tetto: il suo slot era occupato e ha completato ([\d.]+) req/s\. "
                  r"Più --parallele sposterebbe solo l'attesa nella sua coda$", nota)
    assert m, nota
    assert float(m.group(1)) < 20 / 4  # the server's own rate: a slot busy 0.3 s a request, far below the 20 asked


def test_tetto_pieno_con_slot_liberi_consiglia_di_alzarlo(fake, carica):
    """The same load on four slots: the cap of 1 left three idle; raising it is the advice, said with why."""
    server = fake(n_slot=4, s_per_token=0.01)
    rc, out, err = carica(server.url, *RITMO_TETTO_PIENO)
    assert rc == 0, out + err
    consiglio = "il server aveva slot liberi (1 in volo su 4 slot): alza --parallele (fino a 4). Se non basta, il limite è il server"
    (nota,) = [r for r in err.splitlines() if "il tetto di --parallele" in r]
    assert nota.endswith(". " + carico.maiuscola(consiglio)), nota
    assert "il limite è il server, non il tetto" not in out + err


def test_tetto_pieno_senza_sapere_gli_slot_non_conclude():
    """Pure: no slot count, or slots never all seen busy with the cap at or above them: neither verdict."""
    def prova(n_slot, picco, parallele, esecuzione_oltre=EsecuzioneOltre(3)):
        risultati = [Risultato(i, 0.5 * i, 0.5 * i + 0.4, 8, 40.0, 5.0, 395.0, oltre=RisultatoOltre(previsto=0.1 * i))
                     for i in range(4)]
        campioni = [Campione(0.2, picco)]
        return Prova(InfoServer(n_slot, 1024, n_slot is not None), Esecuzione(risultati, campioni, 4,
                     oltre=esecuzione_oltre), Piano(4, parallele, 8, oltre=PianoOltre(ritmo=10.0)))
    assert carico.il_tetto_ha_frenato(prova(4, 1, 1)) is True
    assert carico.il_tetto_ha_frenato(prova(1, 1, 1)) is False
    assert carico.il_tetto_ha_frenato(prova(2, 1, 2)) is None  # the timings prove one busy at a time, no reading saw two
    assert carico.il_tetto_ha_frenato(prova(None, None, 1)) is None
    assert carico.chi_ha_frenato(prova(None, None, 1)) == (
        "non si sa se il limite è il tetto o il server (il server non dice quanti slot ha). Se il server ha più di 1 "
        "slot, alza --parallele; se no il limite è il server")
    assert "(né le letture né i tempi del server hanno visto occupati tutti i suoi 2 slot)" in carico.chi_ha_frenato(
        prova(2, 1, 2))
    # The schedule's requests never sent: the note says who held them; --spiega points to it, once.
    mai_partite = carico.EsecuzioneOltre(0, 1.5, 5)
    for n_slot, consiglio in ((1, ". Il limite è il server, non il tetto: il suo slot era occupato"),
                              (4, ". Il server aveva slot liberi (1 in volo su 4 slot)")):
        (nota,) = carico.note_ritmo(prova(n_slot, 1, 1, mai_partite))
        assert "5 richieste del programma non sono partite: si sono inviate " in nota and consiglio in nota, nota
        frasi = " ".join(carico.spiegazione(prova(n_slot, 1, 1, mai_partite)))
        assert "Il server ha visto meno carico di quello chiesto: vedi la nota su stderr." in frasi
        assert consiglio[2:] not in frasi, frasi


def test_un_solo_ritardo_perdonato_per_il_ritmo_e_per_il_tetto():
    """A trace of one request a second: a send 50 ms late is on time for ritmo_tenuto (a tenth of the mean gap)
    and so for attese_del_tetto too, which forgave only 10 ms; 150 ms late is late for both."""
    def prova(ritardo, trattenute):
        dataset = tuple(("ciao", 8, float(t)) for t in range(4))
        risultati = [Risultato(i, i + (ritardo if i == 1 else 0.0), i + 0.5, 8, 40.0, 5.0, 100.0,
                               oltre=RisultatoOltre(previsto=float(i))) for i in range(4)]
        return Prova(InfoServer(4, 512, True), Esecuzione(risultati, [], 4, oltre=EsecuzioneOltre(trattenute)),
                     Piano(None, 1, 8, oltre=PianoOltre(dataset=dataset)))
    assert carico.ritardo_perdonato(prova(0.05, 1)) == pytest.approx(0.1)
    assert carico.ritmo_tenuto(prova(0.05, 0)) and carico.attese_del_tetto(prova(0.05, 1)) == {}
    assert not carico.ritmo_tenuto(prova(0.15, 0)) and carico.attese_del_tetto(prova(0.15, 1)) == {1: pytest.approx(0.15)}


# The real server, once ##########################################################################

@pytest.mark.reale
def test_reale_ctrl_c_dopo_la_prima_risposta(llama, carica, tmp_path):
    """-np 1, three requests: Ctrl+C half a second after the server counted the first answer's tokens. The
    summary says the span of its figures and the later time the run was stopped; the files agree. A run
    started at once finds the server still at work on the requests the first one closed, and says so."""
    import time
    import urllib.request

    server = llama(1, "--metrics")

    def generati():
        with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
            return carico.leggi_metrica(r.read().decode(), "tokens_predicted_total") or 0

    def ctrl_c_dopo_la_prima():
        limite = time.monotonic() + 240
        while generati() < 24 and time.monotonic() < limite:
            time.sleep(0.1)
        time.sleep(0.5)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    threading.Thread(target=ctrl_c_dopo_la_prima, daemon=True).start()
    rc, out, err = carica(server.url, "--richieste", "3", "--parallele", "3", "--token", "24",
                          "--json", str(tmp_path / "r.json"))
    assert rc == 130, out + err
    tempo = next(r for r in out.splitlines() if r.startswith("tempo totale"))
    m = TEMPO_INTERROTTO.match(tempo)
    assert m, out
    riepilogo = json.loads((tmp_path / "r.json").read_text())["prove"][0]["riepilogo"]
    assert m.group(2) == f"{riepilogo['interrotta_a']:.2f}" and riepilogo["tempo_totale"] is not None, out
    assert riepilogo["interrotta_a"] >= riepilogo["tempo_totale"] + 0.2, out
    CIFRE.append(("Ctrl+C 0.5 s after the first answer (-np 1)", tempo.split("  |")[0]))
    # llama serve goes on generating the requests carico closed (without --stream it notices only when it
    # writes the answer): a run started at once is told the server is already at work.
    rc, out, err = carica(server.url, "--richieste", "1", "--token", "2")
    assert rc == 0 and re.search(r"il server sta già lavorando \(1 slot su 1 occupati( e \d+ richiest[ae] in coda)? "
                                 r"prima della prova", err), err


def test_spiega_una_velocita_sola_non_e_un_intervallo(fake, carica):
    """One request: --spiega says its speed in the slot once, not as a range from a value to itself."""
    server = fake(n_slot=1, s_per_token=0.002)
    rc, out, err = carica(server.url, "--richieste", "1", "--token", "8", "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert re.search(r"Insieme [\d.]+ token/s: [\d.]+ volte uno slot \([\d.]+ t/s in media\)\.", out), out


def test_interrotta_senza_risposte_nessun_limite_inferiore():
    """The tour: "throughput aggregato n/d  (n/d token generati, solo dalle richieste completate: un limite
    inferiore)": n/d bounds nothing. The bound is said only where there is a figure."""
    vuoto = carico.Riepilogo(0, 0, 3, None, None, None, None, None, None, None, None, None, interrotta_a=1.5)
    (riga,) = [r for r in carico.righe_riepilogo(vuoto, 3, "3", carico.InfoServer(2, 1024, True))
               if r.startswith("throughput aggregato")]
    assert riga == "throughput aggregato n/d  (n/d token generati)", riga
