"""The machines carico.py promises to run on: every Python from 3.9 to the newest here, and a server that
dies from a signal said in words (a server built for another CPU dies with SIGILL at its warm-up)."""

import glob
import json
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest

from aiuti import CARICO, RADICE, RIGA_REQ, VELOCE, porta_libera, reale_non_disponibile


def interprete(versione: str) -> str:
    """python3.X under pyenv or on the PATH (a pyenv shim may name one it cannot run: each is tried);
    missing: a skip on a developer's machine, a failure in CI."""
    candidati = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{versione}.*/bin/python{versione}")))
    for percorso in candidati + [shutil.which(f"python{versione}")]:
        if percorso and subprocess.run([percorso, "-c", f"import sys; assert sys.version.startswith('{versione}.')"],
                                       capture_output=True, timeout=30).returncode == 0:
            return percorso
    if os.environ.get("CI") == "true":
        pytest.fail(f"Python {versione} not found (PATH, ~/.pyenv/versions): the README promises it")
    pytest.skip(f"Python {versione} not found")


def carico_con(python, url, *flags, timeout=120):
    proc = subprocess.run([python, CARICO, "--url", url, *flags], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


# Every Python ##################################################################################
# The fake answers `Connection: close` as llama.cpp does: on 3.13 http.client closes the socket as soon as a
# Content-Length body has been read, and carico 1.7.2 then failed every request ("Bad file descriptor").

@pytest.mark.parametrize("versione", ["3.9", "3.13"])
def test_il_comando_del_lab(fake, versione):
    server = fake(n_slot=4, s_per_token=0.002)
    rc, out, err = carico_con(interprete(versione), server.url, *VELOCE)
    assert rc == 0, err
    righe = out.splitlines()
    assert righe[0] == "server: 4 slot, n_ctx per slot = 512"
    assert all(RIGA_REQ.match(r) for r in righe[1:5]), out
    assert righe[6] == "richieste=4 parallele=4 slot=4  picco slot occupati insieme=4"
    assert re.match(r"^throughput aggregato [\d.]+ token/s  \(128 token generati\)$", righe[8]), out
    intestazioni = [dict(h) for percorso, h in server.richieste_ricevute]
    assert all(h.get("Connection") == "close" for h in intestazioni)


def test_gli_extra_su_python_3_9(fake, tmp_path):
    """The extras together, in one run on 3.9 (each starts a Python): streams with their details, a sweep
    explained, the JSON file."""
    server = fake(n_slot=2, s_per_token=0.002)
    json_file = tmp_path / "prova.json"
    rc, out, err = carico_con(interprete("3.9"), server.url, *VELOCE, "--richieste", "4", "--stream", "--dettagli",
                              "--parallele", "1,4", "--spiega", "--json", str(json_file))
    assert rc == 0, err
    righe = [r for r in out.splitlines() if r.startswith("  req ")]
    assert len(righe) == 8 and all(" 32 token  (" in r for r in righe), out
    assert "primo token" in out and "Curva: " in out, out
    assert [len(p["richieste"]) for p in json.loads(json_file.read_text())["prove"]] == [4, 4]


def test_un_errore_di_carico_non_e_del_server(fake, monkeypatch):
    """A socket carico closed itself (EBADF) is carico's own error, never 'the server does not answer'."""
    import http.client

    import carico

    server = fake(n_slot=1)

    def chiuso(*_):
        raise OSError(9, "Bad file descriptor")

    monkeypatch.setattr(http.client.HTTPResponse, "read1", chiuso)
    with pytest.raises(OSError):
        carico.Client(server.url).chiama("GET", "/health")


# A server that dies from a signal ##############################################################

def sostituto(tmp_path, segnale):
    """A stand-in for `llama serve` that writes a line of log, then dies from `segnale` at its start."""
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\necho 'common_init_: warming up the model with an empty run'\nkill -{segnale} $$\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.mark.parametrize("segnale,parole", [
    ("ILL", "(ucciso da SIGILL). Questa CPU non esegue un'istruzione del server, compilato per un'altra CPU: "
            "ricompilalo portabile (cmake -DGGML_NATIVE=OFF)"),
    ("SEGV", "(ucciso da SIGSEGV). Il server è andato in crash. Se accade all'avvio, forse è compilato per un'altra CPU: "
             "ricompilalo portabile (cmake -DGGML_NATIVE=OFF)"),
    ("KILL", "(ucciso da SIGKILL). Spesso è il sistema, senza più memoria (guarda dmesg)")])
def test_avvia_un_server_ucciso_da_un_segnale(carica, tmp_path, segnale, parole):
    rc, out, err = carica(f"http://127.0.0.1:{porta_libera()}", "--avvia", f"{sostituto(tmp_path, segnale)} -m m.gguf")
    assert rc == 1 and "Traceback" not in err, err
    assert f"carico.py: errore: il server si è fermato durante l'avvio {parole}; ultime righe del suo log:" in err
    assert "warming up the model" in err
    assert "sta caricando il modello" not in err  # it never listened: it was starting, not loading (a 503)


def test_il_controllo_dell_installazione_dice_il_segnale(tmp_path):
    """scripts/install-real.sh's own check, on a stand-in that dies with SIGILL: it fails, and says why; in a C
    locale, from a folder whose name has a space and an accent (bash's %q quoted it as carico could not split)."""
    cartella = tmp_path / "così tanto"
    cartella.mkdir()
    proc = subprocess.run(["bash", os.path.join(RADICE, "scripts", "install-real.sh"), "--check",
                           sostituto(cartella, "ILL"), str(cartella / "m.gguf")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "LC_ALL": "C"})
    assert proc.returncode == 1, proc.stderr
    assert "(ucciso da SIGILL)" in proc.stderr
    assert "does not answer on this machine" in proc.stderr


def test_l_installazione_compila_un_server_portabile():
    """The flags the install passes: no -march=native; on x86-64 the AVX2 generation, nothing newer."""
    proc = subprocess.run(["bash", os.path.join(RADICE, "scripts", "install-real.sh"), "--flags"],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    flags = dict(r.split("=", 1) for r in proc.stdout.splitlines())["flags"].split()
    assert "-DGGML_NATIVE=OFF" in flags
    assert not [f for f in flags if re.search(r"AVX512|AMX", f) and f.endswith("=ON")]
    if os.uname().machine in ("x86_64", "amd64"):
        assert {"-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"} <= set(flags)


# The real server ###############################################################################

@pytest.mark.reale
def test_il_server_installato_non_usa_avx512_ne_amx(llama):
    """What the built server says it was built for: its system_info line at start, and its CPU library's
    instructions (no zmm register, no AMX tile instruction). The symbol names are no evidence."""
    server = llama(1)
    info = server.riga_log("system_info")
    assert info and "CPU :" in info, info
    assert not re.search(r"(AVX512\w* = 1|AMX\w* = 1)", info), info
    if os.uname().machine in ("x86_64", "amd64") and shutil.which("objdump"):
        binario = server.argomenti[0]
        (libreria,) = glob.glob(os.path.join(os.path.dirname(binario), "libggml-cpu.so*"))[:1] or [None]
        assert libreria, f"libggml-cpu.so not beside {binario}"
        codice = subprocess.run(["objdump", "-d", "--no-show-raw-insn", libreria], capture_output=True,
                                text=True, timeout=120).stdout
        assert codice.count("\n") > 1000
        assert not re.search(r"%zmm\d|\b(tileloadd|tdpbssd|tdpbf16ps|ldtilecfg)\b", codice)


@pytest.mark.reale
def test_il_comando_del_lab_su_python_3_13_reale(llama):
    server = llama(4)
    rc, out, err = carico_con(interprete("3.13"), server.url, "--richieste", "4", "--parallele", "4", "--token", "8",
                              timeout=300)
    assert rc == 0, out + err
    righe = out.splitlines()
    assert righe[0] == "server: 4 slot, n_ctx per slot = 512"
    assert all(RIGA_REQ.match(r) for r in righe[1:5]), out
