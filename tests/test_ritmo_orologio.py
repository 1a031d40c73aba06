"""--ritmo keeps its schedule on the clock: a send that leaves late does not push back the ones after it.

The rate tests (test_griglia.py) cannot tell this apart from a loaded machine's noise: a scheduler that
waited each gap from the previous send would fall behind by its own overhead, a fraction of a ms a send,
while a busy spell on a loaded machine delays a few sends in a row by a hundred ms. Here the scheduler's
thread is stalled once, for 0.4 s, by the schedule itself: a delay no machine's noise comes near."""

import statistics
import time

import carico

STALLO = 0.4


def test_un_invio_in_ritardo_non_sposta_gli_altri(fake, carica, monkeypatch):
    originale = carico.orari

    def con_uno_stallo(piano_oltre):
        for i, t in enumerate(originale(piano_oltre)):
            if i == 5:
                time.sleep(STALLO)  # in the scheduler's thread, before it sends request 5 (planned at 0.25 s)
            yield t

    monkeypatch.setattr(carico, "orari", con_uno_stallo)
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "20", "--arrivi", "costanti", "--richieste", "20", "--token", "2")
    assert rc == 0, out + err
    arrivi = sorted(server.arrivi)
    assert len(arrivi) == 20
    ritardi = [(a - arrivi[0]) - i / 20 for i, a in enumerate(arrivi)]
    # The stall happened: request 5, planned at 0.25 s, left after 0.6 s (the stall began after request 4
    # left at 0.2 s), and those planned until then went with it ...
    assert ritardi[5] > STALLO / 2, ritardi
    # ... and the sends planned from 0.75 s on are back on their times: late by what a loaded machine adds,
    # tens of ms, not by the stall, as they would be if each gap ran from the send before.
    assert statistics.median(ritardi[15:]) < STALLO / 2, ritardi
    assert "non ha tenuto il ritmo" in err  # the stall is in the p99 of the sends' lateness, and said


def test_in_ritardo_oltre_la_durata_non_e_il_tetto(fake, carica, monkeypatch, tmp_path):
    """The scheduler's own clock woken past --durata while the cap had room: the requests of the schedule it
    did not send are carico's lateness, said so, not the cap of --parallele (which was never full)."""
    originale = carico.orari

    def con_uno_stallo(piano_oltre):
        for i, t in enumerate(originale(piano_oltre)):
            if i == 3:
                time.sleep(0.6)  # before request 3 (planned at 0.15 s): it wakes past the 0.5 s of --durata
            yield t

    monkeypatch.setattr(carico, "orari", con_uno_stallo)
    server = fake(n_slot=4, s_per_token=0.001)
    risultati = tmp_path / "r.json"
    rc, out, err = carica(server.url, "--ritmo", "20", "--arrivi", "costanti", "--parallele", "8", "--durata", "0.5",
                          "--token", "4", "--json", str(risultati))
    assert rc == 0, out + err
    assert "7 del programma non inviate (carico.py era in ritardo sul programma oltre la fine di --durata)" in out
    assert "tetto" not in out + err and "Alza --parallele" not in err  # the cap was never full
    assert "7 richieste del programma non sono partite prima della fine di --durata" in err
    invii = carico.json.loads(risultati.read_text())["prove"][0]["invii"]
    assert (invii["non_inviate_in_ritardo"], invii["non_inviate_dal_tetto"], invii["inviate"]) == (7, 0, 3)
    assert "nel programma 20.00" in out  # the schedule's rate counts the ones not sent
