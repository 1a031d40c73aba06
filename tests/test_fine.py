"""The end of a session loses nothing: a closed stdout, Ctrl+C while the files are written, the files'
modes; and --timeout, the schedule's lateness, warm-up with --prompt-file: each with one meaning."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import pytest

import carico
from aiuti import CARICO, FAKE, QUI, RADICE, VELOCE, porta_libera, risponde
from fakeserver import chunk


def con_una_funzione_cambiata(tmp_path, nome, corpo, *argomenti):
    """carico.py run as a process, with its function `nome` wrapped: `corpo` (Python, indented by 4) runs
    first, then the original (`originale`). What the user sees of a moment a test cannot time from outside."""
    copione = tmp_path / "copione.py"
    copione.write_text(f"import os, signal, sys\nsys.path[:0] = [{RADICE!r}, {QUI!r}]\nimport carico\n"
                       f"originale = carico.{nome}\ndef cambiata(*args):\n{corpo}\n    return originale(*args)\n"
                       f"carico.{nome} = cambiata\nsys.exit(carico.main(sys.argv[1:]))\n")
    return subprocess.run([sys.executable, str(copione), *argomenti], capture_output=True, text=True, timeout=60)


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
    proc = con_una_funzione_cambiata(tmp_path, "testo_csv", "    os.kill(os.getpid(), signal.SIGINT)  # between the files\n"
                                     "    os.kill(os.getpid(), signal.SIGTERM)", "--url", server.url, "--token", "4",
                                     "--tabella", "--json", str(tmp_path / "p.json"), "--csv", str(tmp_path / "p.csv"))
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    righe = [r for r in proc.stdout.splitlines() if not r.startswith("la macchina era occupata")]  # a busy CI machine
    assert righe[-1].startswith("| 2 | 1024 | ")  # the table was printed whole
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
    assert rispettate < 20 and riga.endswith(". Latenza e primo token contati dall'orario previsto, perché il ritmo "
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


def test_pipe_chiusa_alla_tabella_i_file_ci_sono(fake, tmp_path):
    """The reader goes away just before the table at the end (as `| head` does when the runs' lines are
    all it wanted): the files were written before the table, and the exit is 141, without noise."""
    server = fake(n_slot=2, s_per_token=0.001)
    chiudi = ("    lettura, scrittura = os.pipe()\n    os.close(lettura)  # nobody reads stdout any more\n"
              "    os.dup2(scrittura, sys.stdout.fileno())")
    proc = con_una_funzione_cambiata(tmp_path, "tabella_consegnato", chiudi, "--url", server.url, "--token", "4",
                                     "--tabella", "--json", str(tmp_path / "p.json"), "--svg", str(tmp_path / "p.svg"))
    assert proc.returncode == 141, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr
    assert len(json.loads((tmp_path / "p.json").read_text())["prove"][0]["richieste"]) == 4
    assert (tmp_path / "p.svg").read_text().startswith("<svg")


@pytest.mark.parametrize("stream", [True, False], ids=["in streaming", "intera"])
def test_timeout_vale_per_la_risposta_intera(fake, carica, stream):
    """An answer that keeps coming, slowly, for seconds: its events (streamed) or the bytes of its body
    (plain, many reads). With --timeout 1 it fails at 1 s either way: --timeout is the longest wait for
    one whole answer."""
    evento = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    corpo = json.dumps({"choices": [{"finish_reason": "length", "message": {"content": "ok"}}]}).encode()

    def goccia(h, _corpo):
        h.send_response(200)
        if stream:
            h.send_header("Transfer-Encoding", "chunked")
            pezzi = [chunk(evento)] * 15
        else:
            h.send_header("Content-Length", str(len(corpo)))
            pezzi = [bytes([b]) for b in corpo]
        h.end_headers()
        try:
            for pezzo in pezzi:
                h.wfile.write(pezzo)
                h.wfile.flush()
                time.sleep(0.2 if stream else 0.05)
        except OSError:  # the client gave up, as it should
            pass
        h.close_connection = True

    server = fake(override={"/v1/chat/completions": goccia})
    inizio = time.monotonic()
    rc, out, err = carica(server.url, *(["--stream"] if stream else []), "--richieste", "1", "--timeout", "1", *VELOCE)
    assert rc == 1
    assert re.match(r"  req 0: +1\.\d\d s   errore: risposta non completa entro 1 s$", out.splitlines()[1]), out
    assert time.monotonic() - inizio < 2.5


def test_ctrl_c_mentre_il_server_si_ferma(tmp_path):
    """--avvia, a server that takes 2 s to stop: a Ctrl+C while it stops is not lost. The server is stopped
    all the same, the next -np never starts, and the exit is 130."""
    porta = porta_libera()
    url = f"http://127.0.0.1:{porta}"
    proc = subprocess.Popen([sys.executable, CARICO, "--url", url, "--avvia",
                             f"{sys.executable} {FAKE} serve --s-per-token 0.001 --lento-a-fermarsi 2", "--np", "1,2",
                             "--token", "4"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out = ""
    while "token/s" not in out:  # the first server's run has ended (its line): it is being stopped
        riga = proc.stdout.readline()
        assert riga, proc.stderr.read()
        out += riga
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    resto, err = proc.communicate(timeout=30)
    out += resto
    assert proc.returncode == 130, out + err
    assert "Traceback" not in err
    assert "server: 2 slot" not in out and err.count("avvio: ") == 1
    assert not risponde(url)


def test_fermate_prima_solo_se_il_modello_ha_finito():
    """A request with fewer tokens than --token is an early stop only when the model ended it
    (finish_reason stop); a `length` stop (a full context) is not said to be one."""
    def r(i, finish, token):
        return carico.Risultato(i, 0.0, 1.0, token, 10.0, 1.0, 999.0, finish_reason=finish)
    prova = carico.Prova(carico.InfoServer(1, 512, True), carico.Esecuzione(
        [r(0, "stop", 5), r(1, "length", 20), r(2, "length", 32)], [], 3), carico.Piano(3, 3, 32))
    assert [q.indice for q in carico.fermate_prima(prova)] == [0]
    assert carico.frase_fermate(prova).startswith("1 richiesta su 3 si è fermata prima di --token 32")
