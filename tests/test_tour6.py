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

import carico
from aiuti import RIGA_REQ, VELOCE

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
    assert f"La prova si è fermata prima della fine (è stata interrotta a {m.group(2)} s): " in out
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
