"""Any OpenAI-compatible server: what carico.py says is true there too.

The fake plays llama-cpp-python 0.3.36's server where it differs from llama.cpp (measured, see
../shared/llama-server-api.md): 404 on every llama.cpp endpoint, no timings, usage only in answers not
streamed, its tokenizer at /extras/tokenize, any `model` echoed back; a chat that answers 0 tokens and
ignores ignore_eos (a GGUF without a chat template). The real server is checked at the end (marked reale)."""

import json
import os
import re
import subprocess
import sys
import time

import pytest

import carico
from aiuti import CARICO, RADICE, VELOCE, porta_libera, reale_non_disponibile
from fakeserver import conta_token


def test_che_cosa_e_il_server_detto_una_volta(fake, carica):
    """Neither /slots nor /props: one note says what the server answers and what this run cannot give."""
    server = fake(n_slot=1, altro_server=True)
    rc, out, err = carica(server.url, "--richieste", "2", "--parallele", "2", "--token", "8")
    assert rc == 0, out + err
    note = [r for r in err.splitlines() if r.startswith("carico.py: nota: il server su ")]
    assert note == [f"carico.py: nota: il server su {server.url} non è llama.cpp (/slots: HTTP 404). Risponde a "
                    "/v1/models (fake-model), /extras/tokenize; non a /slots, /props, /metrics. Slot, contesto e coda "
                    "sono n/d: slot occupati e attesa vengono solo dai timings delle risposte, se ci sono"], err
    assert ("carico.py: nota: il server non ha dato né /slots né i suoi tempi (timings): velocità nel proprio "
            "slot, slot occupati, attese dello slot e in coda sono n/d") in err.splitlines()
    assert out.splitlines()[0] == "server: n/d slot, n_ctx per slot = n/d"
    assert "(16 token generati)" in out  # usage is there: the lab's figures that need nothing else
    assert "non sembra llama.cpp" not in err and "se li dà\ncarico.py" not in err


def test_llama_cpp_non_dice_nulla_di_se(fake, carica):
    """On llama.cpp (the lab), no such note: stdout and stderr as before."""
    server = fake(n_slot=2)
    rc, out, err = carica(server.url, "--richieste", "2", "--token", "4")
    assert rc == 0
    assert "non è llama.cpp" not in err and "timings" not in err


def test_modello_che_il_server_non_elenca_esce_2(fake, capsys):
    server = fake(n_slot=1, altro_server=True)
    rc = carico.main(["--url", server.url, "--modello", "nonesiste-7b", "--richieste", "1"])
    assert rc == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"carico.py: errore: --modello nonesiste-7b: il server su {server.url} non ha questo modello; /v1/models "
        "elenca fake-model")
    assert server.bodies == []  # refused before any request


def test_modello_elencato_passa(fake, carica):
    server = fake(n_slot=1, alias="gemma-270m")
    rc, out, err = carica(server.url, "--modello", "gemma-270m", "--richieste", "1", "--token", "2")
    assert rc == 0, err
    assert server.bodies[0]["model"] == "gemma-270m"


def test_risposte_vuote_dette_per_quello_che_sono(fake, carica):
    """A chat that answers 0 tokens (a wrong chat template) and ignores ignore_eos: one note says the
    model stops at once and why, and does not suggest --esatti on a server that is not llama.cpp."""
    server = fake(n_slot=1, altro_server=True, eos_dopo=0, rispetta_ignore_eos=False)
    rc, out, err = carica(server.url, "--richieste", "3", "--parallele", "1", "--token", "16")
    assert rc == 0
    (vuote,) = [r for r in err.splitlines() if "hanno 0 token" in r]
    assert vuote.startswith("carico.py: nota: 3 risposte su 3 hanno 0 token: il modello si ferma subito, e questa "
                            "prova non misura la generazione. Di solito il template di chat del server non va con il modello"), vuote
    assert "--chat_format" in vuote and "--chat-template" in vuote
    assert "--esatti" not in err  # it cannot mend a template, and this server ignores ignore_eos


def test_risposte_vuote_su_llama_cpp_esatti_detto_per_quello_che_fa(fake, carica):
    server = fake(n_slot=1, eos_dopo=0)
    rc, out, err = carica(server.url, "--richieste", "2", "--parallele", "1", "--token", "16")
    (vuote,) = [r for r in err.splitlines() if "hanno 0 token" in r]
    assert vuote.endswith("Con --esatti (ignore_eos) llama.cpp genera comunque --token token, ma il testo resta "
                          "sbagliato"), vuote


def test_fermate_prima_esatti_solo_dove_conta(fake, carica):
    """Answers that stop early (not empty): --esatti is suggested on llama.cpp, said as llama.cpp's elsewhere."""
    for altro, atteso in ((False, "--esatti li fa generare tutti"),
                          (True, "--esatti (ignore_eos) li farebbe generare tutti su llama.cpp, ma altri server lo "
                                 "ignorano")):
        server = fake(n_slot=1, eos_dopo=3, altro_server=altro, rispetta_ignore_eos=not altro)
        rc, out, err = carica(server.url, "--richieste", "2", "--parallele", "1", "--token", "16")
        assert err.rstrip().endswith(atteso) or atteso in err, err


def test_401_su_una_richiesta_dice_della_chiave(fake, carica):
    """A server whose /health and /slots need no key but whose chat does (llama-cpp-python --api_key): the
    hint comes from the requests' 401s, once, not one per request."""
    def chat_con_chiave(h, _corpo):
        h.send_json(401, {"detail": "Invalid API key"})

    server = fake(n_slot=1, altro_server=True, override={"/v1/chat/completions": chat_con_chiave})
    rc, out, err = carica(server.url, "--richieste", "3", "--parallele", "1")
    assert rc == 1
    assert out.count('errore: HTTP 401: {"detail": "Invalid API key"}') == 3, out
    assert ("carico.py: nota: 3 richieste rifiutate con HTTP 401: il server vuole una chiave API. Passala con "
            "--api-key CHIAVE o con la variabile LLAMA_API_KEY (se l'hai già passata, controllala)") in err.splitlines()


def test_prompt_token_con_extras_tokenize(fake, carica):
    """--prompt-token on a server whose tokenizer is /extras/tokenize (ids, the BOS first) and
    /extras/detokenize: exact prompts still, counted as the server counts them without its BOS."""
    server = fake(n_slot=2, altro_server=True)
    rc, out, err = carica(server.url, "--prompt-token", "40", "--richieste", "3", "--token", "2")
    assert rc == 0, out + err
    assert [conta_token(p) for p in server.prompts] == [40, 40, 40]
    detok = [p for p, _ in server.richieste_ricevute if p == "/extras/detokenize"]
    assert 0 < len(detok) <= len(server.pezzi_per_id) + 1  # each id's piece asked once


# The real llama-cpp-python server ###############################################################

PYTHON_ALTRO = os.path.join(os.environ.get("CARICO_DEPS", os.path.join(RADICE, ".deps")), "venv-altro", "bin", "python")


@pytest.fixture
def llama_cpp_python():
    """llama_cpp_python(*flags): llama-cpp-python's OpenAI server (scripts/install-altro.sh) on gemma-270m,
    -t 1 as the real-server tests; stopped after the test."""
    from realserver import ServerNonDisponibile, trova_modello

    avviati = []

    def avvia(*flags):
        if not os.access(PYTHON_ALTRO, os.X_OK):
            reale_non_disponibile(f"llama-cpp-python not installed ({PYTHON_ALTRO}): run bash scripts/install-altro.sh")
        try:
            modello = trova_modello()
        except ServerNonDisponibile as exc:
            reale_non_disponibile(exc)
        porta = porta_libera()
        log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), f"llama-cpp-python-{porta}.log"), "w+")
        proc = subprocess.Popen([PYTHON_ALTRO, "-m", "llama_cpp.server", "--model", modello, "--host", "127.0.0.1",
                                 "--port", str(porta), "--n_ctx", "2048", "--n_threads", "1", *flags],
                                stdout=log, stderr=subprocess.STDOUT)
        avviati.append((proc, log))
        url = f"http://127.0.0.1:{porta}"
        limite = time.monotonic() + 120
        while time.monotonic() < limite and proc.poll() is None:
            try:
                carico.Client(url, timeout_info=2).chiama("GET", "/v1/models")
                return url
            except carico.ErroreRete:
                time.sleep(0.25)
        log.seek(0)
        pytest.fail(f"llama-cpp-python did not start: {log.read()[-2000:]}")

    yield avvia
    for proc, log in avviati:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def carico_cli(url, *flags):
    proc = subprocess.run([sys.executable, CARICO, "--url", url, *flags], capture_output=True, text=True, timeout=300)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


@pytest.mark.reale
@pytest.mark.altro
def test_llama_cpp_python_reale(llama_cpp_python):
    """Against llama-cpp-python's server, as a student would bring it: with the GGUF's missing template it
    answers 0 tokens, and carico says so; with --chat_format gemma the lab's run is measured (the tokens
    from usage, the rest n/d), the server said for what it is once, --modello it does not list refused."""
    from conftest import CIFRE

    url = llama_cpp_python()  # no --chat_format: gemma-3-270m's GGUF carries no template here
    rc, out, err = carico_cli(url, "--richieste", "4", "--parallele", "1", "--token", "16")
    assert rc == 0, out + err
    assert "hanno 0 token: il modello si ferma subito" in err, err  # measured: 3 of the lab's first 4 prompts
    assert "--esatti" not in err

    url = llama_cpp_python("--chat_format", "gemma")
    rc, out, err = carico_cli(url, "--richieste", "4", "--parallele", "4", "--token", "32")
    assert rc == 0, out + err
    righe = out.splitlines()
    assert righe[0] == "server: n/d slot, n_ctx per slot = n/d"
    assert all(re.match(r"  req \d: +[\d.]+ s +\d+ token  \(n/d t/s nel proprio slot\)$", r) for r in righe[1:5]), out
    assert "non è llama.cpp" in err and "/extras/tokenize" in err
    CIFRE.append(("llama-cpp-python --chat_format gemma, 4x32", re.search(r"throughput aggregato .*", out).group(0)))

    rc, out, err = carico_cli(url, "--modello", "nonesiste-7b", "--richieste", "1")
    assert rc == 2 and "/v1/models elenca" in err, err


def test_un_server_web_qualunque_dice_di_controllare_url(carica, tmp_path):
    """The tour: --url on the port of `python3 -m http.server` (404 to every GET, 501 to POST): the note said
    "non è llama.cpp (...): non a /slots, ..." with its verb missing, and nothing told the student to check
    the URL. It says that the server answers none of a model server's paths, and what to check."""
    import functools
    import http.server
    import threading

    class Zitto(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *argomenti):  # quiet, as the tests' servers are
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Zitto, directory=str(tmp_path)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        rc, out, err = carica(f"http://127.0.0.1:{server.server_address[1]}", "--richieste", "1", "--intervallo", "0.05")
    finally:
        server.shutdown()
        server.server_close()
    assert rc == 1 and "Traceback" not in err
    assert ("Non risponde a nessuna strada nota (/slots, /props, /metrics, /v1/models, /tokenize): controlla --url e "
            "la porta.") in err, err
