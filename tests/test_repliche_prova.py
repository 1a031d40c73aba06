"""--repliche with --avvia, on fake servers started as processes: the copies, the table, the comparison, all stopped."""

import os
import re
import signal
import subprocess
import sys
import time

import carico
from aiuti import CARICO, FAKE, VELOCE, porta_libera


def comando(registro, *extra):
    """The fake as llama serve, each copy logging its prompts to `registro` (also how its processes are found)."""
    return f"{sys.executable} {FAKE} serve -c 2048 -t 2 --s-per-token 0.002 --registro {registro} " + " ".join(extra)


def vivi(marca):
    """The fake servers whose command line holds `marca` (carico's own holds it too)."""
    trovati = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                riga = f.read()
                if marca.encode() in riga and FAKE.encode() in riga.split(b"\0")[1]:
                    trovati.append(int(pid))
        except OSError:
            pass
    return trovati


def test_copie_o_slot_con_la_tabella_e_il_confronto(capsys, tmp_path):
    registro = str(tmp_path / "prompt.log")
    rc = carico.main(["--url", f"http://127.0.0.1:{porta_libera()}", "--avvia", comando(registro), "--np", "2",
                      "--repliche", "1,2", "--richieste", "4", "--token", "8", "--spiega", "--silenzioso", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, err
    # The first point one server -np 2 -c 2048; the second two copies of -np 1 -c 1024: 1024 a slot in both.
    decisioni = [r for r in out.splitlines() if r.startswith("il server (-np ")]
    assert decisioni[0].startswith("il server (-np 2) ha deciso, dal suo log: 2 slot, n_ctx per slot 1024")
    copie = [re.fullmatch(r"il server \(-np 1\) ha deciso, dal suo log: 1 slot, n_ctx per slot 1024, .*"
                          r" \(copia (\d) di 2, (http://127\.0\.0\.1:\d+)\)", r) for r in decisioni[1:]]
    assert [m[1] for m in copie] == ["1", "2"] and copie[0][2] != copie[1][2]
    # The run spread over the two copies, each seen on its own line.
    assert "server: 2 slot, n_ctx per slot = 1024\n" in out
    assert f"  {copie[0][2]}: 2 richieste (2 riuscite), picco 1/1 slot" in out
    assert f"  {copie[1][2]}: 2 richieste (2 riuscite), picco 1/1 slot" in out
    tabella = re.findall(r"^\| (2|2x1) \| 1024 \| [\d.]+ \| (\d+) \| ", out, re.M)
    assert [np for np, _ in tabella] == ["2", "2x1"] and all(int(ram) > 0 for _, ram in tabella), out
    assert "Copie o slot? 2 slot in tutto, 1024 token di contesto a slot in ogni disposizione." in out
    assert re.search(r"  RAM: \d+ MiB con un server -np 2, \d+ MiB con 2 copie da -np 1 \(\d+ condivisi fra le copie\)",
                     out)
    assert "  Una prova per disposizione: con --ripeti 3 si misura il rumore" in out
    assert "La domanda del lab" not in out  # the RAM is measured here: no servers started for the lab's question
    assert "  richieste al server con più slot liberi (--smista liberi)" in out
    assert "Traceback" not in err and vivi(registro) == []


def test_contesto_intero(capsys, tmp_path):
    rc = carico.main(["--url", f"http://127.0.0.1:{porta_libera()}", "--avvia", comando(tmp_path / "r"), "--np", "2",
                      "--repliche", "2", "--contesto-intero", "--richieste", "2", "--token", "4", "--silenzioso"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.count("ha deciso, dal suo log: 1 slot, n_ctx per slot 2048") == 2
    assert "server: 2 slot, n_ctx per slot = 2048\n" in out


def avviato(tmp_path, *extra):
    """carico.py --repliche 2 in a process of its own, once both copies answer: (process, the copies' marker)."""
    registro = str(tmp_path / "prompt.log")
    proc = subprocess.Popen([sys.executable, CARICO, "--url", f"http://127.0.0.1:{porta_libera()}", "--avvia",
                             comando(registro, "--s-per-token", "0.05"), "--np", "2", "--repliche", "2",
                             "--richieste", "4", "--token", "64", "--silenzioso", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for riga in proc.stdout:
        if "(copia 2 di 2," in riga:
            break
    scadenza = time.monotonic() + 10
    while not os.path.exists(registro) and time.monotonic() < scadenza:  # a request has reached a copy
        time.sleep(0.05)
    assert len(vivi(registro)) == 2
    return proc, registro


def aspetta_che_finiscano(marca, secondi):
    scadenza = time.monotonic() + secondi
    while vivi(marca) and time.monotonic() < scadenza:
        time.sleep(0.1)
    return vivi(marca)


def test_ctrl_c_ferma_tutte_le_copie(tmp_path):
    proc, registro = avviato(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert aspetta_che_finiscano(registro, 5) == [] and "Traceback" not in err


def test_carico_ucciso_le_copie_muoiono_con_lui(tmp_path):
    proc, registro = avviato(tmp_path)
    proc.kill()
    proc.communicate(timeout=10)
    assert aspetta_che_finiscano(registro, 10) == []  # PR_SET_PDEATHSIG: each copy gets SIGTERM
