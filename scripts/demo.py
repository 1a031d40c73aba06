#!/usr/bin/env python3
"""The lab's steps 1 to 5 replayed on the small model that scripts/install-real.sh installs.

Run it as `bash scripts/demo`. For each step it starts `llama serve` on a free port of 127.0.0.1,
prints the server's `n_slots` log line and carico.py's output, and stops the server.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

QUI = os.path.dirname(os.path.abspath(__file__))
RADICE = os.path.dirname(QUI)
sys.path.insert(0, os.path.join(RADICE, "tests"))

from realserver import LUNGO, ServerNonDisponibile, ServerReale  # noqa: E402


def titolo(testo):
    print(f"\n=== {testo} ===", flush=True)


def carico(url, *flags):
    comando = [sys.executable, os.path.join(RADICE, "carico.py"), "--url", url, *flags]
    print("$ python3 carico.py " + " ".join(comando[2:]), flush=True)
    subprocess.run(comando)


def avvia(np, *extra):
    server = ServerReale(np, extra)
    print("$ llama serve " + " ".join(a for a in server.comando[1:] if a != "serve"), flush=True)
    server.avvia()
    riga = server.riga_log("n_slots =") or ""
    print("srv" + riga.split("srv", 1)[-1], flush=True)  # the line as the lab shows it, without the timestamp
    return server


def errore_grezzo(url, testo):
    """The lab's curl of step 4: the server's own JSON error."""
    corpo = json.dumps({"messages": [{"role": "user", "content": testo}], "max_tokens": 20}).encode()
    richiesta = urllib.request.Request(url + "/v1/chat/completions", corpo, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(richiesta, timeout=120) as r:
            return r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def main():
    lungo = tempfile.NamedTemporaryFile("w", suffix="-lungo.txt", delete=False)
    lungo.write(LUNGO + "\n")
    lungo.close()
    try:
        for passo, np in ((1, 1), (2, 2), (3, 4)):
            titolo(f"passo {passo}: -np {np}")
            with avvia(np) as server:
                carico(server.url, "--richieste", "4", "--parallele", "4", "--token", "32")
        titolo("passo 4: -np 4, prompt lungo")
        with avvia(4) as server:
            print(errore_grezzo(server.url, LUNGO), flush=True)
            carico(server.url, "--prompt-file", lungo.name, "--richieste", "1", "--parallele", "1", "--token", "20")
        titolo("passo 5: -np 4 --kv-unified")
        with avvia(4, "--kv-unified") as server:
            carico(server.url, "--prompt-file", lungo.name, "--richieste", "1", "--parallele", "1", "--token", "20")
            carico(server.url, "--richieste", "4", "--parallele", "4", "--token", "32")
    except ServerNonDisponibile as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    finally:
        os.unlink(lungo.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
