"""The end of a session loses nothing: a closed stdout, Ctrl+C while the files are written, the files'
modes; and --timeout, the schedule's lateness, warm-up with --prompt-file: each with one meaning."""

import json
import os
import re
import stat
import subprocess
import sys
import time

import carico
from aiuti import CARICO, QUI, RADICE, VELOCE
from fakeserver import chunk


def test_pipe_chiusa_i_file_si_scrivono(fake, tmp_path):
    """`| head -1` closes stdout after the first line: exit 141, no noise, and --json still written."""
    server = fake(n_slot=4, s_per_token=0.001)
    uscita = tmp_path / "p.json"
    comando = (f"'{sys.executable}' '{CARICO}' --url {server.url} --richieste 8 --json '{uscita}' --csv '{tmp_path}/p.csv'"
               " | head -1; echo \"uscita ${PIPESTATUS[0]}\"")
    proc = subprocess.run(["bash", "-c", comando], capture_output=True, text=True, timeout=60)
    assert proc.stdout == "server: 4 slot, n_ctx per slot = 512\nuscita 141\n", proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert len(json.loads(uscita.read_text())["prove"][0]["richieste"]) == 8
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 9


def test_ctrl_c_mentre_si_scrivono_i_file(fake, tmp_path):
    """SIGINT (then SIGTERM) arrives while the table and the files are being written: they are finished,
    whole, and the exit is 130; no traceback."""
    server = fake(n_slot=2, s_per_token=0.001)
    copione = tmp_path / "interrompi.py"
    copione.write_text(f"""\
import os, signal, sys
sys.path[:0] = [{RADICE!r}, {QUI!r}]
import carico
scrivi = carico.testo_csv
def scrivi_interrotto(prove):
    os.kill(os.getpid(), signal.SIGINT)  # Ctrl+C between the JSON and the CSV
    os.kill(os.getpid(), signal.SIGTERM)
    return scrivi(prove)
carico.testo_csv = scrivi_interrotto
sys.exit(carico.main(sys.argv[1:]))
""")
    proc = subprocess.run([sys.executable, str(copione), "--url", server.url, "--token", "4", "--tabella",
                           "--json", str(tmp_path / "p.json"), "--csv", str(tmp_path / "p.csv")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.splitlines()[-1].startswith("| 2 | 1024 | ")  # the table was printed whole
    assert len(json.loads((tmp_path / "p.json").read_text())["prove"][0]["richieste"]) == 4
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 5
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".carico-")]  # no temporary file left


def test_file_con_la_umask_dell_utente(tmp_path):
    """A new file gets 0666 less the umask, as a shell redirect would give it; an old one keeps its mode."""
    vecchia = os.umask(0o022)
    try:
        carico.scrivi_file(str(tmp_path / "a.json"), "{}\n")
        os.umask(0o027)
        carico.scrivi_file(str(tmp_path / "b.json"), "{}\n")
        (tmp_path / "c.json").write_text("vecchio")
        os.chmod(tmp_path / "c.json", 0o600)
        carico.scrivi_file(str(tmp_path / "c.json"), "{}\n")
    finally:
        os.umask(vecchia)
    modi = [stat.S_IMODE(os.stat(tmp_path / f).st_mode) for f in ("a.json", "b.json", "c.json")]
    assert modi == [0o644, 0o640, 0o600]
    assert (tmp_path / "c.json").read_text() == "{}\n"


def test_timeout_vale_per_la_risposta_intera_anche_in_streaming(fake, carica):
    """A stream whose chunks keep coming, slowly, for 3 s: with --timeout 1 it fails at 1 s, as a plain
    answer that takes too long does. --timeout is the longest wait for one whole answer."""
    def goccia(h, _corpo):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        try:
            for _ in range(15):
                h.wfile.write(chunk(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'))
                h.wfile.flush()
                time.sleep(0.2)
        except OSError:  # the client gave up, as it should
            pass
        h.close_connection = True

    server = fake(override={"/v1/chat/completions": goccia})
    inizio = time.monotonic()
    rc, out, err = carica(server.url, "--stream", "--richieste", "1", "--timeout", "1", *VELOCE)
    assert rc == 1
    assert re.match(r"  req 0: +1\.\d\d s   errore: risposta non completa entro 1 s$", out.splitlines()[1]), out
    assert time.monotonic() - inizio < 2.5


def test_latenza_dal_previsto_senza_omissione_coordinata(fake, carica):
    """--ritmo 100 with one request in flight at a time, each ~50 ms: the sends fall behind the schedule. The
    SLO counts latency from when each request was meant to leave, and says so; the sent-time latency alone
    would meet it every time."""
    server = fake(n_slot=1, s_per_token=0.005)
    rc, out, err = carica(server.url, "--ritmo", "100", "--richieste", "20", "--parallele", "1", "--token", "8",
                          "--arrivi", "costanti", "--slo", "latenza=0.5", "--dettagli")
    assert rc == 0, out + err
    riga = next(r for r in out.splitlines() if r.startswith("SLO "))
    rispettate = int(re.search(r"rispettati da (\d+) richiest", riga).group(1))
    assert rispettate < 20 and riga.endswith("latenza e primo token contati dall'orario previsto, perché il ritmo "
                                             "non è stato tenuto"), riga
    dal_previsto = [float(v) for v in next(r for r in out.splitlines() if "latenza dal previsto" in r).split()[-6:]]
    latenza = [float(v) for v in next(r for r in out.splitlines() if r.startswith("  latenza (s)")).split()[-6:]]
    assert latenza[-1] < 0.5 < dal_previsto[-1]


def test_tpot_di_un_solo_token_rispetta_l_obiettivo(fake, carica):
    """One token has no time between tokens: a TPOT objective is met, not failed."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--token", "1", "--stream", "--slo", "tpot=0.5", "--richieste", "2")
    assert rc == 0, out + err
    assert "SLO (TPOT <= 0.5 s): rispettati da 2 richieste su 2 (100%)" in out


def test_riscaldamento_con_il_prompt_del_file(fake, carica, tmp_path):
    testo = tmp_path / "p.txt"
    testo.write_text("Un prompt del file, per ogni richiesta.\n")
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--riscaldamento", "2", "--prompt-file", str(testo), "--token", "2")
    assert rc == 0, out + err
    assert server.prompts == ["Un prompt del file, per ogni richiesta."] * 6
