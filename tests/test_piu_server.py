"""Several servers in one run (--url A,B): routing, each server's line, one going away; fakes of different sizes."""

import csv
import io
import json
import re

import pytest

import carico
from aiuti import rifiutata


def chat_di(server):
    return [b for b in server.bodies]


def righe_server(out):
    """Each server's line after `per server:`, by its URL."""
    coda = re.split(r"^per server.*:\n", out, maxsplit=1, flags=re.M)[1].splitlines()
    return {m.group(1): m.group(2) for m in (re.match(r"  (http://\S+): (.*)", r) for r in coda) if m}


def test_a_turno_fra_server_di_taglie_diverse(fake, carica):
    a, b = fake(n_slot=1, metrics=True), fake(n_slot=2, metrics=True)
    rc, out, err = carica(f"{a.url},{b.url}", "--richieste", "6", "--parallele", "3", "--token", "8")
    assert rc == 0, err
    # The lab's lines for the whole run, over the slots of both.
    assert out.startswith(f"server: 3 slot, n_ctx per slot = n/d\n  {a.url}: 1 slot, n_ctx per slot = 2048\n"
                          f"  {b.url}: 2 slot, n_ctx per slot = 1024\n  richieste a turno (--smista turno)\n")
    assert "richieste=6 parallele=3 slot=3  picco slot occupati insieme=" in out
    assert len(a.bodies) == len(b.bodies) == 3  # in turn, whatever their size
    linee = righe_server(out)
    assert linee[a.url].startswith("3 richieste (3 riuscite), picco 1/1 slot, coda ")
    assert linee[b.url].startswith("3 richieste (3 riuscite), picco ")
    # Each server's throughput is its tokens over the run's time: together, the run's.
    totale = float(re.search(r"throughput aggregato ([\d.]+)", out)[1])
    parti = [float(re.search(r", quota del throughput ([\d.]+) token/s$", r)[1]) for r in linee.values()]
    assert sum(parti) == pytest.approx(totale, abs=0.02)


def test_al_server_con_piu_slot_liberi(fake, carica):
    a, b = fake(n_slot=1, metrics=True, s_per_token=0.02), fake(n_slot=3, metrics=True, s_per_token=0.02)
    rc, out, err = carica(f"{a.url},{b.url}", "--smista", "liberi", "--richieste", "4", "--token", "8")
    assert rc == 0, err
    assert "  richieste al server con più slot liberi (--smista liberi)" in out
    # Counted from carico's own requests in flight: 4 at once fill the 4 slots, none waits.
    assert (len(a.bodies), len(b.bodies)) == (1, 3)
    assert "picco richieste in coda (requests_deferred)=0" in out
    # In turn, the same load queues on the small one.
    a.bodies.clear(), b.bodies.clear()
    rc, out, _ = carica(f"{a.url},{b.url}", "--richieste", "4", "--token", "8")
    assert (len(a.bodies), len(b.bodies)) == (2, 2)
    assert re.search(r"coda [1-9]", righe_server(out)[a.url])


def test_liberi_conta_gli_slot_gia_occupati_da_un_altro(fake, carica):
    """The latest /slots reading corrects carico's own count: a server busy with another client's work gets less."""
    a, b = fake(n_slot=2, s_per_token=0.02), fake(n_slot=2, s_per_token=0.02)
    gruppo = carico.Gruppo([carico.Client(a.url), carico.Client(b.url)],
                           [carico.InfoServer(2, 1024, True), carico.InfoServer(2, 1024, True)], "liberi")
    gruppo.altri = [2, 0]  # a reading saw both of a's slots busy, none of them carico's
    assert [gruppo.scegli() for _ in range(3)] == [1, 1, 0]  # b's two free slots first, then the tie: a


def test_un_server_che_se_ne_va(fake, carica, tmp_path):
    """One server stopped mid-run: the others go on, its requests failed and said (--spiega: the slots left; --json:
    when and why), nothing more sent to it, exit 1."""
    a = fake(n_slot=2, s_per_token=0.01)
    b = fake(n_slot=2, s_per_token=0.01, spegni_dopo=2, spegni_uccidendo=True)
    rc, out, err = carica(a.url, "--url", b.url, "--richieste", "10", "--token", "16", "--spiega", "--json",
                          str(tmp_path / "p.json"))
    assert rc == 1
    linee = righe_server(out)
    andato = re.fullmatch(r"(\d+) richieste \(0 riuscite, \1 fallite\); non rispondeva più a ([\d.]+) s", linee[b.url])
    assert andato, linee[b.url]
    assert f"{b.url} non rispondeva più a {andato[2]} s: da lì le richieste sono andate all'altro server, 2 slot in " \
           "tutto." in out
    salvato = json.loads((tmp_path / "p.json").read_text())["prove"][0]["server_andato"]
    assert salvato["url"] == b.url and f"{salvato['t_s']:.2f}" == andato[2] and salvato["perche"]
    a_servite = int(linee[a.url].split()[0])
    assert a_servite >= 6 and f"{a_servite} richieste ({a_servite} riuscite)" in linee[a.url]
    # no hammering of the dead one: what carico sent it, answered or refused, is its 2 and a few refusals
    assert int(andato[1]) <= 2 + carico.RIFIUTI_DI_FILA and a_servite + int(andato[1]) == 10
    assert f"{b.url}: smesso di rispondere durante la prova, le richieste dopo sono andate agli altri server" in err
    assert "Traceback" not in err


def test_una_lista_con_un_url_sbagliato(fake, capsys):
    a = fake()
    assert rifiutata(a, capsys, ["--url", "http://127.0.0.1:1,ftp://x"]) == (
        "carico.py: errore: opzione --url: 'ftp://x' deve iniziare con http:// o https:// (es. http://127.0.0.1:8080)")
    assert rifiutata(a, capsys, ["--url", a.url]) == f"carico.py: errore: --url {a.url} è ripetuto: ogni server una volta"


def test_lo_stesso_server_due_volte(fake, capsys):
    a = fake()
    with pytest.raises(SystemExit):
        carico.main(["--url", f"{a.url},{a.url}"])
    assert capsys.readouterr().err.rstrip().endswith("ogni server una volta")
    assert a.richieste_ricevute == []


def test_file_dicono_il_server_di_ogni_richiesta(fake, carica, tmp_path):
    a, b = fake(n_slot=1), fake(n_slot=1)
    rc, _, err = carica(f"{a.url},{b.url}", "--richieste", "4", "--token", "4", "--json", str(tmp_path / "p.json"),
                        "--csv", str(tmp_path / "p.csv"))
    assert rc == 0, err
    dati = json.loads((tmp_path / "p.json").read_text())
    prova = dati["prove"][0]
    assert [s["url"] for s in prova["per_server"]] == [a.url, b.url]
    assert [s["richieste"] for s in prova["per_server"]] == [2, 2]
    assert sorted(r["server"] for r in prova["richieste"]) == [0, 0, 1, 1]
    righe = list(csv.DictReader(io.StringIO((tmp_path / "p.csv").read_text())))
    assert sorted(r["server"] for r in righe) == ["0", "0", "1", "1"]


def test_la_coda_di_un_server_pieno_accanto_a_uno_libero():
    """Timings: a request waits for a slot of ITS server; the run's queue is each full server's, summed at each instant."""
    def fatta(indice, fine, server):
        return carico.Risultato(indice, 0.0, fine, token=8, prompt_ms=100.0, predicted_ms=900.0,
                                oltre=carico.RisultatoOltre(server=server))
    risultati = [fatta(0, 1.0, 0), fatta(1, 2.0, 0), fatta(2, 1.0, 1)]  # the 1-slot server: one waits 1 s
    info = [carico.InfoServer(1, 2048, True, True), carico.InfoServer(2, 1024, True, True)]
    server = tuple(carico.DelServer(f"http://s{k}", i, []) for k, i in enumerate(info))
    prova = carico.Prova(carico.info_del_gruppo(info), carico.Esecuzione(
        risultati, [], 3, oltre=carico.EsecuzioneOltre(server=server)))
    assert prova.riepilogo.coda_dai_tempi == 0  # over the 3 slots together, 2 busy: no queue
    assert carico.riepilogo_oltre(prova).coda_dai_tempi == 1
    assert carico.righe_per_server(prova)[1].startswith("  http://s0: 2 richieste (2 riuscite), picco 1/1 slot, coda 1,")


def test_ctrl_c_ogni_server_conta_le_sue_in_volo(fake):
    """Ctrl+C with 4 requests in flight over two servers (none answered): each server's line counts those it had,
    2 and 2, not 0; the workers the stop frees send nothing more (the note: 4 left in flight, not 5)."""
    import signal
    import subprocess
    import sys
    import time

    from aiuti import CARICO

    a, b = fake(n_slot=1, s_per_token=0.05), fake(n_slot=2, s_per_token=0.05)  # 32 tokens: 1.6 s each
    proc = subprocess.Popen([sys.executable, CARICO, "--url", f"{a.url},{b.url}", "--richieste", "8", "--token", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scadenza = time.monotonic() + 20
    while len(chat_di(a)) + len(chat_di(b)) < 4 and time.monotonic() < scadenza:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert righe_server(out) == {a.url: "2 richieste (0 riuscite, 2 non completate)",
                                 b.url: "2 richieste (0 riuscite, 2 non completate)"}, out
    assert "per server (le altre 4 non sono partite):" in out
    assert "4 richieste lasciate in volo" in err and len(chat_di(a)) + len(chat_di(b)) == 4


def test_dettagli_chiamano_ogni_slot_col_suo_server(fake, carica):
    """--dettagli's context per slot: each slot by its server and its own id there, as that server's /slots says."""
    a, b = fake(n_slot=1, s_per_token=0.02), fake(n_slot=2, s_per_token=0.02)
    rc, out, err = carica(f"{a.url},{b.url}", "--richieste", "3", "--token", "32", "--dettagli", "--intervallo", "0.05")
    assert rc == 0, err
    nomi = re.findall(r"^    (\S+ slot \d): \d+ di (\d+) token", out, re.M)
    assert nomi == [(f"{a.url} slot 0", "2048"), (f"{b.url} slot 0", "1024"), (f"{b.url} slot 1", "1024")], out


def test_ctrl_c_dopo_un_server_andato_esce_130(fake):
    """One of two servers gone, then Ctrl+C: the interruption wins (exit 130, "interrotto"), as with one server."""
    import signal
    import subprocess
    import sys
    import time

    from aiuti import CARICO

    a = fake(n_slot=4, s_per_token=0.05)
    b = fake(n_slot=4, s_per_token=0.05, spegni_dopo=1, spegni_uccidendo=True)
    proc = subprocess.Popen([sys.executable, CARICO, "--url", f"{a.url},{b.url}", "--richieste", "12", "--token", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scadenza = time.monotonic() + 20
    while len(chat_di(a)) < 4 and time.monotonic() < scadenza:  # b gone, its share sent to a
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "carico.py: interrotto" in err and "Traceback" not in err
