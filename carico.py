#!/usr/bin/env python3
"""carico.py: genera carico su un server llama.cpp (Lab 04-03, "Carico e parallelismo").

Invia N richieste di chat insieme (ThreadPoolExecutor) a `llama serve` e intanto legge /slots
ogni 0,5 s; alla fine stampa, per ogni richiesta, latenza, token generati e velocità nel proprio
slot, poi il riepilogo: tempo totale, latenza media e massima, throughput aggregato e il picco di
slot occupati insieme.

Esempio (il lab):

  llama serve -hf ggml-org/Qwen3.5-0.8B-GGUF --host 127.0.0.1 --port 8080 -c 2048 -np 1 -t 3 -a qwen-0.8b
  python3 carico.py --url http://127.0.0.1:8080 --richieste 4 --parallele 4 --token 32

Ogni richiesta ha un prompt diverso (con lo stesso prompt la cache dei prompt falserebbe il
confronto) e il "thinking" spento, così i token generati sono tutti risposta.

Oltre al lab (ogni opzione è facoltativa e non cambia le righe del lab): --ripeti K ripete la prova
e ne fa la media; --grafico e --svg FILE disegnano la prova (coda, prompt, generazione, slot
occupati); --json e --csv salvano ogni richiesta; --tabella stampa la riga della tabella del
consegnato; --stream misura il tempo al primo token; --spiega legge la prova a parole; --avvia
"COMANDO" --np 1,2,4 avvia il server per ogni valore di -np e fa tutto il lab da solo:

  python3 carico.py --avvia "llama serve -m modello.gguf -c 2048 -t 3" --np 1,2,4,4kv

(4kv = -np 4 --kv-unified). Se il server espone /metrics (--metrics) si aggiunge il picco di
richieste in coda (requests_deferred).

Codici di uscita: 0 tutto bene; 1 server non raggiungibile o almeno una richiesta fallita;
2 opzioni sbagliate; 130 interrotto con Ctrl+C (143 con SIGTERM): si stampa comunque quello che
era già stato misurato; 141 se chi legge l'uscita la chiude prima (per esempio | head).
"""

import argparse
import json
import math
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

# IMPORT_PIGRI: concurrent.futures, csv, shlex, subprocess, tempfile and ssl are imported inside
# the functions that use them. `python3 carico.py --help` must start in a few tens of ms (the
# benchmark measures it), and those imports alone would cost more than the rest of the start.

__version__ = "1.0.0"

# The eight prompts of the lab, one per request. Each opens with different words, so two requests
# share no prefix beyond the chat template's and the server's prompt cache cannot favour one.
PROMPTS = (
    "Spiega in poche frasi perché il cielo di giorno è blu e al tramonto diventa rosso.",
    "Descrivi una mattina qualunque in un porto di pescatori della Liguria.",
    "Quali sono i vantaggi di andare al lavoro in bicicletta in una città di pianura?",
    "Racconta la storia di un vecchio orologiaio che ripara orologi che nessuno vuole più.",
    "Elenca cinque consigli pratici per preparare un esame di matematica.",
    "Come funziona un frigorifero? Rispondi come se parlassi a un bambino di dieci anni.",
    "Scrivi una breve lettera a un amico che si è appena trasferito all'estero.",
    "Immagina una città del futuro senza automobili e descrivi come si muovono le persone.",
)

ND = "n/d"  # what the lab's lines show for a figure the server did not give

# Timeouts, in seconds. Every network call has one, so that nothing can hang the tool.
TIMEOUT_INFO = 10.0  # /health, /slots, /props: the server answers them between two decode steps
TIMEOUT_RICHIESTA = 300.0  # one chat request: it may wait in the server's queue behind the others
ATTESA_CARICAMENTO = 120.0  # how long to wait for a server that is still loading its model
PAUSA_CARICAMENTO = 1.0  # how often to ask again while it loads


# Errors the user can act on ###################################################################

class ErroreUtente(Exception):
    """A problem the user can fix (server down, wrong key...): one Italian line, exit 1."""


class Interruzione(BaseException):
    """Ctrl+C or SIGTERM: stop sending, report what was measured, exit 128 + signal."""

    def __init__(self, codice: int):
        super().__init__(codice)
        self.codice = codice


# HTTP client ##################################################################################

class Risposta(NamedTuple):
    status: int
    corpo: bytes  # or what a `lettore` made of a streamed body


class ErroreRete(Exception):
    """A request that got no HTTP answer; the message is Italian and ready to print."""


class ErroreNelFlusso(Exception):
    """The server reported an error inside a stream (`data: {"error": ...}`), or cut it short."""


ANNULLATA = "annullata (interruzione)"  # the error of a request closed by Ctrl+C or SIGTERM


class RispostaTroncata(Exception):
    """The connection closed in the middle of an answer."""


class RispostaNonValida(Exception):
    """Bytes that are not an HTTP/1.1 answer."""


class _Lettore:
    """Reads one HTTP/1.1 answer from a socket: status, headers, then the body in pieces as they
    arrive (by Content-Length, chunked, or up to the close). A few lines of its own instead of
    http.client, whose header parsing (the email package) cost more CPU than the whole rest of a
    request: the client must not steal the cores the server measures with."""

    def __init__(self, sock: socket.socket):
        self._sock, self._buf = sock, b""

    def _riempi(self) -> None:
        dati = self._sock.recv(65536)
        if not dati:
            raise RispostaTroncata()
        self._buf += dati

    def riga(self) -> bytes:
        while True:
            fine = self._buf.find(b"\r\n")
            if fine >= 0:
                riga, self._buf = self._buf[:fine], self._buf[fine + 2:]
                return riga
            if len(self._buf) > 65536:
                raise RispostaNonValida("intestazione troppo lunga")
            self._riempi()

    def esatti(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._riempi()
        dati, self._buf = self._buf[:n], self._buf[n:]
        return dati

    def testa(self) -> Tuple[int, Dict[str, str]]:
        try:
            stato = self.riga()
        except RispostaTroncata:
            raise ConnectionResetError() from None  # closed before answering anything
        parti = stato.split(None, 2)
        if len(parti) < 2 or not parti[0].startswith(b"HTTP/") or not parti[1].isdigit():
            raise RispostaNonValida("riga di stato non valida")
        intestazioni = {}
        while True:
            riga = self.riga()
            if not riga:
                return int(parti[1]), intestazioni
            nome, _, valore = riga.decode("latin-1").partition(":")
            intestazioni[nome.strip().lower()] = valore.strip()

    def corpo(self, intestazioni: Dict[str, str]):
        """The body's bytes, piece by piece."""
        if "chunked" in intestazioni.get("transfer-encoding", "").lower():
            while True:
                try:
                    dimensione = int(self.riga().split(b";")[0], 16)
                except ValueError:
                    raise RispostaNonValida("chunk non valido") from None
                if dimensione == 0:
                    while self.riga():  # trailers, up to the empty line
                        pass
                    return
                yield self.esatti(dimensione)
                self.esatti(2)
        elif "content-length" in intestazioni:
            try:
                lunghezza = int(intestazioni["content-length"])
            except ValueError:
                raise RispostaNonValida("Content-Length non valido") from None
            if lunghezza:
                yield self.esatti(lunghezza)
        else:
            while True:
                if self._buf:
                    dati, self._buf = self._buf, b""
                    yield dati
                try:
                    self._riempi()
                except RispostaTroncata:
                    return  # the close is the end


def righe(pezzi):
    """Lines out of a body read in pieces: what a stream reader iterates over."""
    resto = b""
    for pezzo in pezzi:
        resto += pezzo
        *complete, resto = resto.split(b"\n")
        yield from complete
    if resto:
        yield resto


class Client:
    """Talks to one server, one connection per exchange (`Connection: close`, so that a request's
    latency never hides a stale keep-alive). It never follows redirects, and keeps the sockets in
    flight in a set, so that `annulla()` can close them from another thread: that is how Ctrl+C
    stops requests blocked in a read without leaving a thread behind."""

    def __init__(self, base: str, api_key: Optional[str] = None, timeout_info: float = TIMEOUT_INFO):
        parti = urllib.parse.urlsplit(base)
        self.timeout_info = timeout_info  # for everything but the chat requests
        self.base = base
        self._https = parti.scheme == "https"
        self._host = parti.hostname or ""
        self._porta = parti.port or (443 if self._https else 80)
        host = parti.netloc.rpartition("@")[2]
        self._host_header = host.encode("ascii") if host.isascii() else host.encode("idna")  # idna: 2 ms to import
        self._api_key = api_key
        self.con_chiave = bool(api_key)
        self._indirizzo = None  # (family, type, proto, _, sockaddr) that connected last
        self._aperte = set()
        self._lock = threading.Lock()
        self.annullato = threading.Event()

    def annulla(self) -> None:
        self.annullato.set()
        with self._lock:
            aperte = list(self._aperte)
        for sock in aperte:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _connetti(self, timeout: float) -> socket.socket:
        """A connected socket. The name is resolved once, at the first request, and the address
        that answered is reused: a lookup per request costs CPU and can stall on a slow resolver."""
        indirizzi = [self._indirizzo] if self._indirizzo else socket.getaddrinfo(
            self._host, self._porta, type=socket.SOCK_STREAM)
        errore = None
        for famiglia, tipo, protocollo, _, indirizzo in indirizzi:
            sock = socket.socket(famiglia, tipo, protocollo)
            sock.settimeout(timeout)
            try:
                sock.connect(indirizzo)
            except OSError as exc:
                sock.close()
                errore = exc
                continue
            self._indirizzo = (famiglia, tipo, protocollo, "", indirizzo)
            return sock
        raise errore if errore else OSError("nessun indirizzo per l'host")

    def _richiesta(self, metodo: str, percorso: str, corpo: Optional[bytes]) -> bytes:
        testa = [f"{metodo} {percorso} HTTP/1.1".encode(), b"Host: " + self._host_header,
                 b"Accept: application/json", b"Connection: close", b"User-Agent: carico.py/" + __version__.encode()]
        if self._api_key:
            testa.append(b"Authorization: Bearer " + self._api_key.encode("ascii"))
        if corpo is not None:
            testa += [b"Content-Type: application/json", b"Content-Length: " + str(len(corpo)).encode()]
        return b"\r\n".join(testa) + b"\r\n\r\n" + (corpo or b"")

    def chiama(self, metodo: str, percorso: str, dati=None, timeout: Optional[float] = None,
               lettore=None) -> Risposta:
        """One exchange on a new connection. `lettore(lines)`, when given, reads a 200 answer
        (a stream, as it arrives) and its result becomes `corpo`."""
        timeout = self.timeout_info if timeout is None else timeout
        corpo = None if dati is None else json.dumps(dati).encode("utf-8")
        sock = None
        try:
            sock = self._connetti(timeout)
            with self._lock:
                self._aperte.add(sock)
            if self.annullato.is_set():
                raise ErroreRete(ANNULLATA)
            if self._https:
                import ssl  # only for https: its import costs time at every start
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self._host)
            sock.sendall(self._richiesta(metodo, percorso, corpo))
            lettura = _Lettore(sock)
            status, intestazioni = lettura.testa()
            pezzi = lettura.corpo(intestazioni)
            contenuto = lettore(righe(pezzi)) if lettore and status == 200 else b"".join(pezzi)
            return Risposta(status, contenuto)
        except (OSError, RispostaTroncata, RispostaNonValida) as exc:  # the network; a lettore's own errors pass
            if self.annullato.is_set():
                raise ErroreRete(ANNULLATA) from None
            raise ErroreRete(descrivi_errore_rete(exc, timeout)) from None
        finally:
            if sock is not None:
                with self._lock:
                    self._aperte.discard(sock)
                sock.close()


def descrivi_errore_rete(exc: Exception, timeout: float) -> str:
    """One Italian phrase for a failed exchange; never the exception's repr (no tracebacks)."""
    if isinstance(exc, socket.timeout):
        return f"nessuna risposta entro {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connessione rifiutata (nessun server in ascolto)"
    if isinstance(exc, socket.gaierror):
        return "host sconosciuto"
    if isinstance(exc, RispostaTroncata):
        return "risposta troncata: la connessione si è chiusa a metà"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError)):
        return "connessione chiusa dal server prima della risposta"
    if isinstance(exc, RispostaNonValida):
        return f"risposta HTTP non valida ({exc})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"errore di rete: {exc.strerror}"
    return f"errore di rete: {type(exc).__name__}"


def leggi_json(risposta: Risposta):
    """The body as JSON, or None when it is not JSON."""
    try:
        return json.loads(risposta.corpo.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def testo_errore(status: int, errore: dict) -> str:
    """`HTTP 400 exceed_context_size_error: request (...)` from an error object {code, message, type}."""
    testo = f"HTTP {status}"
    if errore.get("type"):
        testo += f" {errore['type']}"
    if errore.get("message"):
        testo += f": {errore['message']}"
    return testo


def descrivi_errore_http(risposta: Risposta) -> str:
    """`HTTP 400 exceed_context_size_error: request (...) exceeds ...`, from llama.cpp's error body
    {"error": {"code", "message", "type"}}; for another body, its first words."""
    testo = f"HTTP {risposta.status}"
    dati = leggi_json(risposta)
    errore = dati.get("error") if isinstance(dati, dict) else None
    if isinstance(errore, dict):
        return testo_errore(risposta.status, errore)
    if isinstance(errore, str):
        return f"{testo}: {errore}"
    estratto = " ".join(risposta.corpo[:200].decode("utf-8", "replace").split())
    if estratto:
        testo += f": {estratto[:80]}"
    return testo


# What the server says about itself ############################################################

class InfoServer(NamedTuple):
    n_slot: Optional[int]
    n_ctx_slot: Optional[int]
    slots_disponibile: bool  # /slots answers, so the peak of busy slots can be sampled
    avvisi: tuple = ()  # Italian lines for stderr: what could not be seen
    metrics_disponibile: bool = False  # /metrics answers: requests_deferred can be sampled
    props: Optional[dict] = None  # /props as the server gave it, for --json


def conta_occupati(dati) -> Optional[int]:
    """Busy slots in a /slots answer; None when the answer says nothing readable.
    Reads `is_processing` (this server), or `state` (older servers: 0 is idle)."""
    slots = _lista_slot(dati)
    if slots is None:
        return None
    occupati = 0
    for slot in slots:
        if "is_processing" in slot:
            occupati += bool(slot["is_processing"])
        elif isinstance(slot.get("state"), int):
            occupati += slot["state"] != 0
        else:
            return None
    return occupati


def _lista_slot(dati) -> Optional[List[dict]]:
    if isinstance(dati, dict):
        dati = dati.get("slots", [dati] if "id" in dati else None)
    if not isinstance(dati, list) or not all(isinstance(s, dict) for s in dati):
        return None
    return dati


def info_da_slots(dati) -> Optional[InfoServer]:
    slots = _lista_slot(dati)
    if not slots:
        return None
    n_ctx = slots[0].get("n_ctx")
    return InfoServer(len(slots), n_ctx if isinstance(n_ctx, int) else None, conta_occupati(dati) is not None)


def info_da_props(dati) -> Optional[InfoServer]:
    if not isinstance(dati, dict):
        return None
    n_slot = dati.get("total_slots")
    impostazioni = dati.get("default_generation_settings")
    n_ctx = impostazioni.get("n_ctx") if isinstance(impostazioni, dict) else None
    if not isinstance(n_slot, int) and not isinstance(n_ctx, int):
        return None
    return InfoServer(n_slot if isinstance(n_slot, int) else None,
                      n_ctx if isinstance(n_ctx, int) else None, False)


def leggi_metrica(testo: str, nome: str) -> Optional[float]:
    """`llamacpp:<nome> <value>` from Prometheus text (values may look like 1.23457e+07)."""
    for riga in testo.splitlines():
        parti = riga.split()
        if len(parti) == 2 and parti[0] == f"llamacpp:{nome}":
            try:
                return float(parti[1])
            except ValueError:
                return None
    return None


def messaggio_chiave(client: Client) -> str:
    if client.con_chiave:
        return (f"il server su {client.base} ha rifiutato la chiave API (HTTP 401): "
                "controlla --api-key o la variabile LLAMA_API_KEY")
    return (f"il server su {client.base} richiede una chiave API (è stato avviato con --api-key): "
            "passala con --api-key CHIAVE o con la variabile LLAMA_API_KEY")


def chiedi(client: Client, percorso: str, attesa: float, stderr, timer=time.monotonic) -> Risposta:
    """GET a path before the load. While the server answers 503 (model still loading) ask again
    every second, saying so once, up to `attesa` seconds. A server that is down is an ErroreUtente;
    401 is one too, since nothing can be measured without the key."""
    inizio = timer()
    avvisato = False
    while True:
        try:
            risposta = client.chiama("GET", percorso)
        except ErroreRete as exc:
            raise ErroreUtente(f"nessuna risposta dal server {client.base}: {exc}. "
                               "Avvia il server (llama serve ...) o correggi --url, poi riprova") from None
        if risposta.status == 401:
            raise ErroreUtente(messaggio_chiave(client))
        if risposta.status != 503:
            if avvisato:
                print(f"server pronto dopo {timer() - inizio:.0f} s", file=stderr, flush=True)
            return risposta
        passati = timer() - inizio
        if passati >= attesa:
            raise ErroreUtente(f"il server {client.base} risponde ancora 503 ({descrivi_errore_http(risposta)}) "
                               f"dopo {passati:.0f} s: aspetta che finisca di caricare il modello e riprova")
        if not avvisato:
            print(f"il server {client.base} sta caricando il modello: attendo fino a {attesa:g} s...",
                  file=stderr, flush=True)
            avvisato = True
        time.sleep(PAUSA_CARICAMENTO)


def interroga_server(client: Client, attesa: float, stderr, con_props: bool = False) -> InfoServer:
    """Before any load: is the server there and ready, how many slots of what context, and can
    /slots and /metrics be sampled. /props is read when /slots is off, or for --json."""
    chiedi(client, "/health", attesa, stderr)
    risposta = chiedi(client, "/slots", attesa, stderr)
    info = info_da_slots(leggi_json(risposta)) if risposta.status == 200 else None
    avvisi = []
    if info is None or not info.slots_disponibile:
        if risposta.status == 501:
            avvisi.append("/slots è disattivato (server avviato con --no-slots): "
                          "il picco di slot occupati non si può misurare (n/d)")
        else:
            avvisi.append(f"/slots non risponde come llama.cpp ({descrivi_errore_http(risposta)}): "
                          "il picco di slot occupati non si può misurare (n/d)")
    props = None
    if info is None or con_props:
        risposta_props = chiedi(client, "/props", attesa, stderr)
        props = leggi_json(risposta_props) if risposta_props.status == 200 else None
        if info is None:
            info = info_da_props(props)
        if info is None:
            avvisi.append("neanche /props risponde come llama.cpp: numero di slot e contesto n/d "
                          "(il server non sembra llama.cpp)")
            info = InfoServer(None, None, False)
    metrics = chiedi(client, "/metrics", attesa, stderr)
    con_metrics = metrics.status == 200 and b"llamacpp:" in metrics.corpo
    return info._replace(avvisi=tuple(avvisi), metrics_disponibile=con_metrics,
                               props=props if isinstance(props, dict) else None)


# The quiet-machine check ######################################################################

class Macchina(NamedTuple):
    core: int
    carico_medio: Optional[float]  # 1-minute load average
    cpu_occupata: Optional[float]  # share of all cores busy over a short look, 0..1


def _tempi_cpu() -> Optional[Tuple[int, int]]:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            valori = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    inattivo = valori[3] + (valori[4] if len(valori) > 4 else 0)  # idle + iowait
    return sum(valori) - inattivo, sum(valori)


def osserva_macchina(sguardo: float = 0.25) -> Macchina:
    """How busy the machine is before the load: load average, and the CPU share used by others
    over `sguardo` seconds (from /proc/stat, where there is one)."""
    try:
        carico_medio = os.getloadavg()[0]
    except (AttributeError, OSError):
        carico_medio = None
    prima = _tempi_cpu()
    occupata = None
    if prima is not None:
        time.sleep(sguardo)
        dopo = _tempi_cpu()
        if dopo is not None and dopo[1] > prima[1]:
            occupata = (dopo[0] - prima[0]) / (dopo[1] - prima[1])
    return Macchina(os.cpu_count() or 1, carico_medio, occupata)


def macchina_occupata(m: Macchina) -> Optional[str]:
    """Why the machine looks busy, or None when it looks quiet. The CPU share right now is the
    sign, where /proc/stat gives it: the load average also counts the server's own work of a
    minute ago (the previous run of a sweep), so it is only the fallback."""
    if m.cpu_occupata is not None:
        return f"CPU già occupata al {m.cpu_occupata:.0%}" if m.cpu_occupata >= 0.5 else None
    if m.carico_medio is not None and m.carico_medio >= max(1.0, 0.75 * m.core):
        return f"carico medio {m.carico_medio:.1f} su {m.core} core"
    return None


def descrivi_macchina(m: Macchina) -> str:
    parti = [f"{m.core} core"]
    if m.carico_medio is not None:
        parti.append(f"carico medio {m.carico_medio:.1f}")
    if m.cpu_occupata is not None:
        parti.append(f"CPU occupata al {m.cpu_occupata:.0%} prima della prova")
    return ", ".join(parti)


# The load: requests and the samplers ##########################################################

class Piano(NamedTuple):
    """What to send: the same for every run of a sweep."""
    richieste: int = 4
    parallele: int = 4
    token: int = 32
    timeout: float = TIMEOUT_RICHIESTA
    intervallo: float = 0.5
    stream: bool = False
    modello: Optional[str] = None
    testo: Optional[str] = None  # --prompt-file: one prompt for every request


class Risultato(NamedTuple):
    """One request. Times are seconds from the start of the run (perf_counter)."""
    indice: int
    inizio: float
    fine: float
    token: Optional[int] = None
    tps: Optional[float] = None  # the server's timings.predicted_per_second
    token_prompt: Optional[int] = None
    prompt_ms: Optional[float] = None
    predicted_ms: Optional[float] = None
    finish_reason: Optional[str] = None
    errore: Optional[str] = None
    primo_token: Optional[float] = None  # --stream: seconds from send to the first token

    @property
    def latenza(self) -> float:
        return self.fine - self.inizio

    @property
    def riuscita(self) -> bool:
        return self.errore is None

    @property
    def servizio(self) -> Optional[float]:
        """Seconds the server's slot spent on it: prompt_ms + predicted_ms."""
        if self.prompt_ms is None or self.predicted_ms is None:
            return None
        return (self.prompt_ms + self.predicted_ms) / 1000

    @property
    def attesa_coda(self) -> Optional[float]:
        """Latency minus the slot's time: the wait in the server's queue (plus HTTP, a few ms)."""
        servizio = self.servizio
        return None if servizio is None else max(0.0, self.latenza - servizio)


class Campione(NamedTuple):
    t: float  # seconds from the start of the run
    occupati: Optional[int]  # busy slots, None when that sample failed
    in_coda: Optional[int] = None  # llamacpp:requests_deferred, when /metrics is there


def prompt_per(indice: int, testo: Optional[str] = None) -> str:
    """Request i's prompt: the lab's i-th, and past 8 the same ones behind a number, so that they
    stay distinct and share at most a digit of prefix."""
    if testo is not None:
        return testo
    base = PROMPTS[indice % len(PROMPTS)]
    return base if indice < len(PROMPTS) else f"{indice}. {base}"


def corpo_richiesta(prompt: str, piano: Piano) -> dict:
    corpo = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": piano.token,
        # Thinking off, so that every generated token is answer (ignored by models without it).
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if piano.modello:
        corpo["model"] = piano.modello
    if piano.stream:
        corpo["stream"] = True
        corpo["stream_options"] = {"include_usage": True}
    return corpo


def _numero(valore) -> Optional[float]:
    return float(valore) if isinstance(valore, (int, float)) and not isinstance(valore, bool) else None


def _intero(valore) -> Optional[int]:
    return int(valore) if isinstance(valore, int) and not isinstance(valore, bool) else None


def leggi_completamento(dati) -> dict:
    """The figures of a chat completion: tokens from `usage`, else `timings.predicted_n`; speed
    and server times from `timings`. A missing field stays None (printed n/d), never guessed."""
    if not isinstance(dati, dict) or not isinstance(dati.get("choices"), list):
        raise ValueError("la risposta non è un completamento di chat (manca choices)")
    usage = dati.get("usage") if isinstance(dati.get("usage"), dict) else {}
    timings = dati.get("timings") if isinstance(dati.get("timings"), dict) else {}
    token = _intero(usage.get("completion_tokens"))
    if token is None:
        token = _intero(timings.get("predicted_n"))
    token_prompt = _intero(usage.get("prompt_tokens"))
    if token_prompt is None:
        token_prompt = _intero(timings.get("prompt_n"))
    scelte = dati["choices"]
    finish = scelte[0].get("finish_reason") if scelte and isinstance(scelte[0], dict) else None
    return dict(token=token, tps=_numero(timings.get("predicted_per_second")), token_prompt=token_prompt,
                prompt_ms=_numero(timings.get("prompt_ms")), predicted_ms=_numero(timings.get("predicted_ms")),
                finish_reason=finish if isinstance(finish, str) else None)


def lettore_sse(timer, t0: float):
    """A `lettore` for a streamed chat answer: reads the `data:` events as they come, notes when
    the first token arrived, and folds the chunks into one completion-shaped dict (the last
    chunks carry finish_reason, usage and timings)."""
    def leggi(risposta) -> dict:
        completamento = {"choices": [{}]}
        primo = None
        finito = False
        for riga in risposta:
            riga = riga.strip()
            if not riga.startswith(b"data:"):
                continue  # blank separators and ':' keep-alives
            dato = riga[5:].strip()
            if dato == b"[DONE]":
                finito = True
                break
            evento = json.loads(dato.decode("utf-8"))
            if isinstance(evento.get("error"), dict):
                raise ErroreNelFlusso(testo_errore(evento["error"].get("code", 200), evento["error"]))
            for scelta in evento.get("choices") or []:
                delta = scelta.get("delta") or {}
                if primo is None and (delta.get("content") or delta.get("reasoning_content")):
                    primo = timer() - t0
                if scelta.get("finish_reason"):
                    completamento["choices"] = [{"finish_reason": scelta["finish_reason"]}]
            for chiave in ("usage", "timings"):
                if isinstance(evento.get(chiave), dict):
                    completamento[chiave] = evento[chiave]
        if not finito:
            raise ErroreNelFlusso("flusso interrotto prima della fine (manca [DONE])")
        completamento["primo_token_t"] = primo
        return completamento
    return leggi


def invia(client: Client, indice: int, corpo: dict, timeout: float, t0: float,
          timer=time.perf_counter) -> Risultato:
    """One request, timed from send to full answer. Never raises: a failure is a Risultato with
    its error text, so that one bad request does not stop the others."""
    inizio = timer() - t0
    lettore = lettore_sse(timer, t0) if corpo.get("stream") else None
    try:
        risposta = client.chiama("POST", "/v1/chat/completions", corpo, timeout, lettore)
        fine = timer() - t0
        if risposta.status != 200:
            return Risultato(indice, inizio, fine, errore=descrivi_errore_http(risposta))
        if lettore:
            dati = risposta.corpo
            primo = dati.get("primo_token_t")
            return Risultato(indice, inizio, fine, **leggi_completamento(dati),
                             primo_token=None if primo is None else primo - inizio)
        dati = leggi_json(risposta)
        if dati is None:
            return Risultato(indice, inizio, fine, errore="risposta non JSON dal server")
        return Risultato(indice, inizio, fine, **leggi_completamento(dati))
    except Exception as exc:  # a worker never raises
        if client.annullato.is_set():
            errore = ANNULLATA  # closed by Ctrl+C, whatever the read then made of it
        elif isinstance(exc, (ErroreRete, ErroreNelFlusso)):
            errore = str(exc)
        else:
            errore = f"risposta non valida: {exc}"
        return Risultato(indice, inizio, timer() - t0, errore=errore)


class Campionatore:
    """Reads /slots (and /metrics, when there) every `intervallo` seconds in a background thread,
    on a fixed schedule: the time a read takes does not stretch the period. A failed read is kept
    as a gap, not a zero."""

    def __init__(self, client: Client, intervallo: float, t0: float, slots: bool, metrics: bool,
                 timer=time.perf_counter):
        self.campioni: List[Campione] = []
        self._client, self._intervallo, self._t0, self._timer = client, intervallo, t0, timer
        self._slots, self._metrics = slots, metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ciclo, name="campionatore", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _leggi(self, percorso: str, interpreta):
        try:
            risposta = self._client.chiama("GET", percorso)
        except ErroreRete:
            return None
        return interpreta(risposta) if risposta.status == 200 else None

    def _ciclo(self) -> None:
        prossimo = self._timer()
        while True:
            t = self._timer() - self._t0
            occupati = in_coda = None
            if self._slots:
                occupati = self._leggi("/slots", lambda risposta: conta_occupati(leggi_json(risposta)))
            if self._metrics:
                valore = self._leggi("/metrics", lambda risposta: leggi_metrica(
                    risposta.corpo.decode("utf-8", "replace"), "requests_deferred"))
                in_coda = None if valore is None else int(valore)
            self.campioni.append(Campione(t, occupati, in_coda))
            prossimo += self._intervallo
            if self._stop.wait(max(0.0, prossimo - self._timer())):
                return


class Esecuzione(NamedTuple):
    risultati: List[Risultato]  # in request order; those never sent are missing
    campioni: List[Campione]
    richieste: int
    interrotta: Optional[int] = None  # exit code when Ctrl+C/SIGTERM stopped it


def esegui_carico(client: Client, piano: Piano, slots: bool = True, metrics: bool = False,
                  primo_prompt: int = 0, timer=time.perf_counter) -> Esecuzione:
    """Fire the requests, all submitted at once to `parallele` workers, while /slots is sampled.
    Prompts start at `primo_prompt`, so that repeated runs never resend one the server has cached.
    On Ctrl+C or SIGTERM the requests in flight are closed and the ones not sent are cancelled."""
    corpi = [corpo_richiesta(prompt_per(primo_prompt + i, piano.testo), piano) for i in range(piano.richieste)]
    t0 = timer()
    risultati = {}
    interrotta = None
    campionatore = Campionatore(client, piano.intervallo, t0, slots, metrics, timer) if slots or metrics else None
    import concurrent.futures  # here, not at the top: see IMPORT_PIGRI

    esecutore = concurrent.futures.ThreadPoolExecutor(max_workers=piano.parallele, thread_name_prefix="richiesta")
    try:
        if campionatore:
            campionatore.__enter__()
        futuri = {esecutore.submit(invia, client, i, corpo, piano.timeout, t0, timer): i
                  for i, corpo in enumerate(corpi)}
        for futuro in concurrent.futures.as_completed(futuri):
            risultati[futuri[futuro]] = futuro.result()
    except Interruzione as exc:
        interrotta = exc.codice
        client.annulla()  # requests in flight return at once, as "annullata"
    finally:
        with segnali_ignorati():  # a second Ctrl+C must not lose the report
            esecutore.shutdown(wait=True, cancel_futures=True)
            if campionatore:
                campionatore.__exit__()
    # What the interruption closed is not a measurement: keep only the requests that ended by themselves.
    ordinati = [r for _, r in sorted(risultati.items()) if r.errore != ANNULLATA]
    return Esecuzione(ordinati, campionatore.campioni if campionatore else [], piano.richieste, interrotta)


class segnali_ignorati:
    """Ctrl+C and SIGTERM ignored inside the block (only the main thread may touch handlers)."""

    SEGNALI = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self._vecchi = {}
        if threading.current_thread() is threading.main_thread():
            self._vecchi = {s: signal.signal(s, signal.SIG_IGN) for s in self.SEGNALI}

    def __exit__(self, *exc):
        for segnale, gestore in self._vecchi.items():
            signal.signal(segnale, gestore)


# Starting the server: --avvia #################################################################

class Configurazione(NamedTuple):
    """One server of a sweep: -np N, with or without --kv-unified."""
    np: int
    kv_unificata: bool = False

    @property
    def etichetta(self) -> str:
        return f"{self.np} kv" if self.kv_unificata else str(self.np)

    def argomenti(self) -> List[str]:
        return ["-np", str(self.np)] + (["--kv-unified"] if self.kv_unificata else [])


def _uccidi_con_il_padre():
    """In the child: Linux sends it SIGTERM if carico.py dies, even by SIGKILL."""
    try:
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class ServerAvviato:
    """`COMMAND -np N --host H --port P` started and waited for; always stopped on exit (success,
    error, Ctrl+C, a server that dies), and its log tail shown when it fails."""

    def __init__(self, comando: List[str], configurazione: Configurazione, url: str, attesa: float, stderr):
        import tempfile

        parti = urllib.parse.urlsplit(url)
        self.argomenti = comando + configurazione.argomenti() + [
            "--host", parti.hostname, "--port", str(parti.port or 80)]
        self.configurazione, self.url, self.attesa, self.stderr = configurazione, url, attesa, stderr
        self.log = tempfile.NamedTemporaryFile(prefix="carico-server-", suffix=".log", delete=False)
        self.proc = None  # subprocess.Popen

    def __enter__(self) -> "ServerAvviato":
        try:
            self._avvia()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _avvia(self) -> None:
        client = Client(self.url, timeout_info=2.0)
        try:
            client.chiama("GET", "/health")
            raise ErroreUtente(f"su {self.url} risponde già un server: fermalo, o scegli un'altra porta con --url")
        except ErroreRete:
            pass  # nothing there: the port is ours
        import shlex
        import subprocess

        print(f"avvio: {shlex.join(self.argomenti)}", file=self.stderr, flush=True)
        try:
            # Its own session: the terminal's Ctrl+C reaches carico.py, which stops the server itself.
            if os.name == "posix":
                gruppo = dict(start_new_session=True, preexec_fn=_uccidi_con_il_padre)
            else:
                gruppo = dict(creationflags=subprocess.CREATE_NEW_PROCESS_GROUP)
            self.proc = subprocess.Popen(self.argomenti, stdin=subprocess.DEVNULL, stdout=self.log,
                                         stderr=subprocess.STDOUT, **gruppo)
        except OSError as exc:
            raise ErroreUtente(f"non riesco ad avviare '{self.argomenti[0]}': {exc.strerror or exc}") from None
        inizio = time.monotonic()
        ultimo = None
        while True:
            if self.proc.poll() is not None:
                raise ErroreUtente(f"il server si è fermato durante l'avvio (codice {self.proc.returncode}); "
                                   f"ultime righe del suo log:\n{self.coda_log()}")
            try:
                if client.chiama("GET", "/health").status == 200:
                    print(f"server pronto in {time.monotonic() - inizio:.1f} s", file=self.stderr, flush=True)
                    return
            except ErroreRete:
                pass
            passati = time.monotonic() - inizio
            if passati > self.attesa:
                raise ErroreUtente(f"il server non è pronto dopo {self.attesa:g} s (--attesa); "
                                   f"ultime righe del suo log:\n{self.coda_log()}")
            if passati >= 2 and (ultimo is None or passati - ultimo >= 5):
                print(f"  attendo che il server sia pronto... {passati:.0f} s", file=self.stderr, flush=True)
                ultimo = passati
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        import subprocess

        with segnali_ignorati():
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.log.close()
            try:
                os.unlink(self.log.name)
            except OSError:
                pass

    def coda_log(self, righe: int = 15) -> str:
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return "".join("  | " + r for r in f.readlines()[-righe:]).rstrip()


# The report: pure formatting, data -> str #####################################################

class Riepilogo(NamedTuple):
    riuscite: int
    fallite: int
    non_completate: int
    tempo_totale: Optional[float]
    latenza_media: Optional[float]
    latenza_max: Optional[float]
    token: Optional[int]  # None when some successful answer did not say how many
    throughput: Optional[float]
    picco: Optional[int]
    picco_coda: Optional[int]  # llamacpp:requests_deferred, None without /metrics


def media(valori: Sequence[float]) -> Optional[float]:
    return sum(valori) / len(valori) if valori else None


def deviazione_standard(valori: Sequence[float]) -> float:
    """The sample standard deviation (0 for a single value)."""
    if len(valori) < 2:
        return 0.0
    m = sum(valori) / len(valori)
    return math.sqrt(sum((v - m) ** 2 for v in valori) / (len(valori) - 1))


def riassumi(esecuzione: Esecuzione) -> Riepilogo:
    """Mean and max latency over the successful requests; total time from the first submit (t=0)
    to the last successful answer; aggregate throughput = their tokens / total time."""
    ok = [r for r in esecuzione.risultati if r.riuscita]
    latenze = [r.latenza for r in ok]
    totale = max((r.fine for r in ok), default=None)
    token = sum(r.token for r in ok) if ok and all(r.token is not None for r in ok) else None
    throughput = token / totale if token is not None and totale else None
    occupati = [c.occupati for c in esecuzione.campioni if c.occupati is not None]
    in_coda = [c.in_coda for c in esecuzione.campioni if c.in_coda is not None]
    return Riepilogo(len(ok), len(esecuzione.risultati) - len(ok), esecuzione.richieste - len(esecuzione.risultati),
                     totale, media(latenze), max(latenze, default=None),
                     token, throughput, max(occupati, default=None), max(in_coda, default=None))


def fmt(valore, formato: str) -> str:
    """`valore` formatted, with an optional unit after the format spec ('.2f s'); n/d for None."""
    spec, _, unita = formato.partition(" ")
    return ND if valore is None else format(valore, spec) + (f" {unita}" if unita else "")


def riga_server(info: InfoServer) -> str:
    return f"server: {fmt(info.n_slot, 'd')} slot, n_ctx per slot = {fmt(info.n_ctx_slot, 'd')}"


def riga_richiesta(r: Risultato, larghezza: int = 1, stream: bool = False) -> str:
    testa = f"  req {r.indice:>{larghezza}}: {r.latenza:6.2f} s"
    if not r.riuscita:
        return f"{testa}   errore: {r.errore}"
    riga = f"{testa} {fmt(r.token, 'd'):>4} token  ({fmt(r.tps, '.1f')} t/s nel proprio slot)"
    if stream:
        riga += f"  primo token {fmt(r.primo_token, '.2f s')}"
    return riga


def righe_riepilogo(s: Riepilogo, richieste: int, parallele: int, info: InfoServer) -> List[str]:
    righe = [
        f"richieste={richieste} parallele={parallele} slot={fmt(info.n_slot, 'd')}"
        f"  picco slot occupati insieme={fmt(s.picco, 'd')}",
        f"tempo totale {fmt(s.tempo_totale, '.2f s')}  |  latenza media {fmt(s.latenza_media, '.2f s')},"
        f" max {fmt(s.latenza_max, '.2f s')}",
        f"throughput aggregato {fmt(s.throughput, '.2f token/s')}  ({fmt(s.token, 'd')} token generati)",
    ]
    if info.metrics_disponibile:
        righe.append(f"picco richieste in coda (requests_deferred)={fmt(s.picco_coda, 'd')}")
    if s.fallite:
        righe.append(f"richieste fallite: {s.fallite} su {richieste}" + {
            0: " (nessuna riuscita: niente da riassumere)", 1: " (il riepilogo conta solo 1 riuscita)"
        }.get(s.riuscite, f" (il riepilogo conta solo le {s.riuscite} riuscite)"))
    if s.non_completate:
        righe.append(f"richieste non completate: {s.non_completate} su {richieste} (interrotto)")
    return righe


def rapporto(esecuzione: Esecuzione, parallele: int, info: InfoServer, stream: bool = False) -> List[str]:
    """The lab's lines after the header: one per request, a blank line, the summary. After an
    interruption the requests that did not end get a line that says so."""
    larghezza = len(str(max(esecuzione.richieste - 1, 0)))
    per_indice = {r.indice: r for r in esecuzione.risultati}
    righe = []
    for i in range(esecuzione.richieste):
        if i in per_indice:
            righe.append(riga_richiesta(per_indice[i], larghezza, stream))
        elif esecuzione.interrotta:
            righe.append(f"  req {i:>{larghezza}}: non completata (interrotto)")
    righe.append("")
    righe += righe_riepilogo(riassumi(esecuzione), esecuzione.richieste, parallele, info)
    return righe


class Prova(NamedTuple):
    """One run, with what it ran against: the unit of --ripeti, --avvia, and the files."""
    info: InfoServer
    esecuzione: Esecuzione
    configurazione: Optional[Configurazione] = None  # --avvia
    macchina: Optional[Macchina] = None

    @property
    def riepilogo(self) -> Riepilogo:
        return riassumi(self.esecuzione)


def righe_ripetute(prove: List[Prova]) -> List[str]:
    """--ripeti: one line per figure, mean and spread over the runs."""
    figure = (("latenza media", "s", lambda s: s.latenza_media), ("latenza max", "s", lambda s: s.latenza_max),
              ("throughput aggregato", "token/s", lambda s: s.throughput))
    riepiloghi = [p.riepilogo for p in prove]
    righe = [f"su {len(prove)} prove: media (deviazione standard, min-max)"]
    for nome, unita, prendi in figure:
        valori = [v for v in map(prendi, riepiloghi) if v is not None]
        if not valori:
            righe.append(f"  {nome:<21} n/d")
            continue
        righe.append(f"  {nome:<21} {media(valori):7.2f} {unita:<8} (dev.std {deviazione_standard(valori):.2f}, "
                     f"{min(valori):.2f}-{max(valori):.2f})"
                     + ("" if len(valori) == len(prove) else f"  [{len(valori)} prove su {len(prove)}]"))
    return righe


TESTA_TABELLA = ["| np | n_ctx_slot | latenza media | latenza max | throughput |", "|---|---|---|---|---|"]


def riga_tabella(prova: Prova) -> str:
    s = prova.riepilogo
    np = prova.configurazione.etichetta if prova.configurazione else fmt(prova.info.n_slot, "d")
    return (f"| {np} | {fmt(prova.info.n_ctx_slot, 'd')} | {fmt(s.latenza_media, '.2f s')} | "
            f"{fmt(s.latenza_max, '.2f s')} | {fmt(s.throughput, '.2f token/s')} |")


# The picture: --grafico (terminal) and --svg ##################################################

MARCHE_UNICODE = {"coda": "░", "prompt": "▒", "generazione": "█", "errore": "×", "ignoto": "▬"}
MARCHE_ASCII = {"coda": ".", "prompt": "-", "generazione": "#", "errore": "x", "ignoto": "="}
LEGENDA = (("coda", "in coda"), ("prompt", "prompt"), ("generazione", "generazione"),
           ("errore", "fallita"), ("ignoto", "dettagli n/d"))


def fasi(r: Risultato) -> List[Tuple[str, float, float]]:
    """(phase, start, end) of a request: queue wait, prompt, generation, from the server's own
    times laid back from the answer's arrival. Without timings the whole span is 'ignoto'."""
    if not r.riuscita:
        return [("errore", r.inizio, r.fine)]
    if r.servizio is None:
        return [("ignoto", r.inizio, r.fine)]
    fine_prompt = r.fine - r.predicted_ms / 1000
    inizio_prompt = max(r.inizio, fine_prompt - r.prompt_ms / 1000)
    return [("coda", r.inizio, inizio_prompt), ("prompt", inizio_prompt, fine_prompt), ("generazione", fine_prompt, r.fine)]


def occupati_a(campioni: List[Campione], t: float) -> Optional[int]:
    """Busy slots at time t: the last sample taken at or before t."""
    ultimo = None
    for c in campioni:
        if c.t > t:
            break
        ultimo = c.occupati
    return ultimo


def marche_per(flusso) -> Dict[str, str]:
    """Unicode blocks where the stream can encode them, else plain ASCII."""
    codifica = getattr(flusso, "encoding", None) or "ascii"
    try:
        "".join(MARCHE_UNICODE.values()).encode(codifica)
        return MARCHE_UNICODE
    except (UnicodeEncodeError, LookupError):
        return MARCHE_ASCII


def grafico(esecuzione: Esecuzione, marche: Dict[str, str], larghezza: int = 80) -> List[str]:
    """One row per request on a common time axis, a row of busy slots, a legend; within `larghezza`."""
    etichetta = max(8, len(f"req {esecuzione.richieste - 1} "))
    colonne = larghezza - etichetta
    durata = max([r.fine for r in esecuzione.risultati] + [c.t for c in esecuzione.campioni] + [1e-9])
    passo = durata / colonne
    righe = [f"{'':<{etichetta}}0 s{f'{durata:.2f} s':>{colonne - 3}}"]
    for r in esecuzione.risultati:
        barra = [" "] * colonne
        for fase, da, a in fasi(r):
            primo, ultimo = round(da / passo), min(colonne, round(a / passo))
            if fase in ("generazione", "errore", "ignoto"):
                primo = min(primo, ultimo - 1)  # always visible, however short
            for col in range(max(primo, 0), ultimo):
                barra[col] = marche[fase]
        righe.append(f"{f'req {r.indice}':<{etichetta}}" + "".join(barra).rstrip())
    if any(c.occupati is not None for c in esecuzione.campioni):
        celle = []
        for col in range(colonne):
            n = occupati_a(esecuzione.campioni, (col + 0.5) * passo)
            celle.append(" " if n is None else (str(n) if n < 10 else "+"))
        righe.append(f"{'slot':<{etichetta}}" + "".join(celle).rstrip())
    usate = {fase for r in esecuzione.risultati for fase, _, _ in fasi(r)}
    voci = [f"{marche[fase]} {nome}" for fase, nome in LEGENDA if fase in usate]
    if any(c.occupati is not None for c in esecuzione.campioni):
        voci.append("cifre: slot occupati (/slots)")
    righe.append(("legenda: " + "  ".join(voci))[:larghezza])
    return righe


COLORI_SVG = {"coda": "#d9d9d9", "prompt": "#f4a261", "generazione": "#2a9d8f", "errore": "#e63946",
              "ignoto": "#8d99ae", "slot": "#264653"}


def testo_xml(testo: str) -> str:
    return testo.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg(prove: List[Prova]) -> str:
    """The same picture as a standalone SVG, one panel per run, for the deliverable."""
    larghezza, sinistra, riga, destra = 760, 70, 18, 20
    pannelli, y = [], 10
    for prova in prove:
        e = prova.esecuzione
        durata = max([r.fine for r in e.risultati] + [c.t for c in e.campioni] + [1e-9])
        scala = (larghezza - sinistra - destra) / durata
        titolo = riga_server(prova.info) + (f"  (-np {prova.configurazione.etichetta})" if prova.configurazione else "")
        parti = [f'<text x="{sinistra}" y="{y + 12}" font-weight="bold">{testo_xml(titolo)}</text>']
        y += 22
        for r in e.risultati:
            parti.append(f'<text x="4" y="{y + 13}">req {r.indice}</text>')
            for fase, da, a in fasi(r):
                parti.append(f'<rect x="{sinistra + da * scala:.1f}" y="{y + 2}" width="{max(a - da, 0) * scala:.1f}" '
                             f'height="{riga - 4}" fill="{COLORI_SVG[fase]}"><title>{fase} {a - da:.3f} s</title></rect>')
            y += riga
        letti = [c for c in e.campioni if c.occupati is not None]
        if letti:
            # Busy slots as steps: each sample holds until the next one.
            massimo = max(max(c.occupati for c in letti), 1)
            alto = 40
            y += 4
            parti.append(f'<text x="4" y="{y + alto / 2}">slot</text>')
            parti.append(f'<text x="4" y="{y + alto / 2 + 14}" font-size="10">max {massimo}</text>')
            parti.append(f'<rect x="{sinistra}" y="{y}" width="{durata * scala:.1f}" height="{alto}" fill="#f4f4f4"/>')
            for i, c in enumerate(letti):
                fino = letti[i + 1].t if i + 1 < len(letti) else durata
                h = c.occupati / massimo * alto
                parti.append(f'<rect x="{sinistra + c.t * scala:.1f}" y="{y + alto - h:.1f}" '
                             f'width="{max(fino - c.t, 0) * scala:.1f}" height="{h:.1f}" fill="{COLORI_SVG["slot"]}">'
                             f'<title>{c.occupati} slot occupati a {c.t:.2f} s</title></rect>')
            y += alto + 6
        parti.append(f'<line x1="{sinistra}" y1="{y}" x2="{larghezza - destra}" y2="{y}" stroke="#333"/>')
        parti.append(f'<text x="{sinistra}" y="{y + 14}">0 s</text>')
        parti.append(f'<text x="{larghezza - destra}" y="{y + 14}" text-anchor="end">{durata:.2f} s</text>')
        y += 28
        pannelli += parti
    x = sinistra
    usate = {fase for p in prove for r in p.esecuzione.risultati for fase, _, _ in fasi(r)}
    voci = [(fase, nome) for fase, nome in LEGENDA if fase in usate]
    if any(c.occupati is not None for p in prove for c in p.esecuzione.campioni):
        voci.append(("slot", "slot occupati (/slots)"))
    for fase, nome in voci:
        pannelli.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{COLORI_SVG[fase]}"/>')
        pannelli.append(f'<text x="{x + 16}" y="{y + 11}">{nome}</text>')
        x += 24 + 8 * len(nome)
    altezza = y + 24
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{larghezza}" height="{altezza}" '
            f'viewBox="0 0 {larghezza} {altezza}" font-family="monospace" font-size="12" shape-rendering="crispEdges">\n'
            f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(pannelli) + "\n</svg>\n")


# Files: --json and --csv ######################################################################

CAMPI_CSV = ("prova", "np", "indice", "token_prompt", "token", "latenza_s", "attesa_coda_s", "prompt_ms",
             "predicted_ms", "t_s_nel_slot", "primo_token_s", "finish_reason", "errore")


def riga_dati(r: Risultato) -> dict:
    return {"indice": r.indice, "token_prompt": r.token_prompt, "token": r.token, "latenza_s": r.latenza,
            "attesa_coda_s": r.attesa_coda, "prompt_ms": r.prompt_ms, "predicted_ms": r.predicted_ms,
            "t_s_nel_slot": r.tps, "primo_token_s": r.primo_token, "finish_reason": r.finish_reason,
            "errore": r.errore, "inizio_s": r.inizio, "fine_s": r.fine}


def testo_csv(prove: List[Prova]) -> str:
    import csv
    import io

    uscita = io.StringIO()
    scrittore = csv.DictWriter(uscita, CAMPI_CSV, extrasaction="ignore", lineterminator="\n")
    scrittore.writeheader()
    for numero, prova in enumerate(prove, 1):
        np = prova.configurazione.etichetta if prova.configurazione else prova.info.n_slot
        for r in prova.esecuzione.risultati:
            scrittore.writerow({"prova": numero, "np": np, **riga_dati(r)})
    return uscita.getvalue()


def testo_json(prove: List[Prova], piano: Piano, url: str) -> str:
    """Every request, the /slots samples with their times, the server's props and the flags
    (never the API key), for plotting."""
    dati = {
        "carico": __version__, "url": url,
        "opzioni": {k: v for k, v in piano._asdict().items() if k != "testo"},
        "prompt_file": piano.testo is not None,
        "prove": [{
            "np": p.configurazione.etichetta if p.configurazione else None,
            "server": {"n_slot": p.info.n_slot, "n_ctx_slot": p.info.n_ctx_slot, "props": p.info.props},
            "macchina": p.macchina._asdict() if p.macchina else None,
            "riepilogo": p.riepilogo._asdict(),
            "richieste": [riga_dati(r) for r in p.esecuzione.risultati],
            "campioni": [c._asdict() for c in p.esecuzione.campioni],
            "interrotta": p.esecuzione.interrotta is not None,
        } for p in prove],
    }
    return json.dumps(dati, indent=2, ensure_ascii=False) + "\n"


# --spiega: the run read out for a student #####################################################

def spiegazione(prova: Prova, parallele: int) -> List[str]:
    """A few plain Italian sentences, each one built from the measured figures."""
    e, s, info = prova.esecuzione, prova.riepilogo, prova.info
    ok = [r for r in e.risultati if r.riuscita]
    frasi = []
    if not ok:
        primo = e.risultati[0].errore if e.risultati else "interrotta"
        if e.richieste == 1:
            return [f"L'unica richiesta non è andata a buon fine ({primo}): non ci sono cifre da leggere."]
        return [f"Nessuna delle {e.richieste} richieste è andata a buon fine (la prima: {primo}): "
                "non ci sono cifre da leggere."]
    insieme = min(parallele, e.richieste)
    if info.n_slot is not None and s.picco is not None:
        servite = "è stata servita" if s.picco == 1 else "sono state servite"
        frasi.append(f"Sono partite {insieme} richieste insieme e il server aveva {info.n_slot} slot: "
                     f"al massimo {s.picco} {servite} nello stesso momento.")
    attese = [(r.attesa_coda, r) for r in ok if r.attesa_coda is not None]
    if attese:
        attesa, r = max(attese, key=lambda coppia: coppia[0])
        in_coda = sum(1 for a, _ in attese if a > 0.1 * r.latenza and a > 0.05)
        if in_coda:
            frasi.append(f"{in_coda} richieste su {len(ok)} hanno aspettato in coda; la più sfortunata è la "
                         f"req {r.indice}: {attesa:.2f} s di attesa su {r.latenza:.2f} s di latenza "
                         f"({attesa / r.latenza:.0%}).")
        else:
            frasi.append(f"Nessuna richiesta ha aspettato in coda più di {attesa:.2f} s: sono partite tutte subito.")
    velocita = [r.tps for r in ok if r.tps is not None]
    if velocita and s.throughput is not None:
        media_slot = media(velocita)
        frasi.append(f"Nel proprio slot ogni richiesta generava {min(velocita):.1f}-{max(velocita):.1f} t/s; "
                     f"tutte insieme hanno fatto {s.throughput:.1f} token/s di throughput aggregato, "
                     f"{s.throughput / media_slot:.1f} volte la velocità media di uno slot.")
    if info.n_ctx_slot is not None:
        frase = f"Ogni slot aveva {info.n_ctx_slot} token di contesto"
        prompt = [r.token_prompt for r in ok if r.token_prompt is not None]
        if prompt:
            frase += (f"; il prompt più lungo ne ha usati {max(prompt)} più {max(r.token or 0 for r in ok)} generati: "
                      "una richiesta più lunga del contesto dello slot viene rifiutata (HTTP 400)")
        frasi.append(frase + ".")
    if s.picco_coda is not None:
        frasi.append(f"/metrics ha visto al massimo {s.picco_coda} richieste in coda insieme (requests_deferred).")
    if prova.macchina is not None:
        motivo = macchina_occupata(prova.macchina)
        if motivo:
            frasi.append(f"La macchina era già occupata prima della prova ({motivo}): le cifre sono falsate, "
                         "ripeti la misura a macchina tranquilla.")
        else:
            frasi.append(f"La macchina era tranquilla prima della prova ({descrivi_macchina(prova.macchina)}).")
    return frasi


# Command line #################################################################################

def positivo(converti, cosa: str):
    """An argparse type: a number (int or float) greater than 0 and finite."""
    def controlla(testo: str):
        try:
            valore = converti(testo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{testo}' non è {cosa}") from None
        if not 0 < valore < float("inf"):
            raise argparse.ArgumentTypeError(f"deve essere maggiore di 0, non {testo}")
        return valore
    return controlla


intero_positivo = positivo(int, "un numero intero")
secondi_positivi = positivo(float, "un numero di secondi")


def url_server(testo: str) -> str:
    """The server's root, e.g. http://127.0.0.1:8080; a trailing / or /v1 is accepted and dropped."""
    try:
        parti = urllib.parse.urlsplit(testo.strip())
        parti.port  # raises ValueError for a port that is not a number
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{testo}' non è un URL valido") from None
    if parti.scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(
            f"'{testo}' deve iniziare con http:// o https:// (per esempio http://127.0.0.1:8080)")
    if not parti.hostname:
        raise argparse.ArgumentTypeError(f"'{testo}' non dice a quale host collegarsi")
    percorso = parti.path.rstrip("/")
    if percorso not in ("", "/v1") or parti.query or parti.fragment:
        raise argparse.ArgumentTypeError(
            f"'{testo}' deve essere la radice del server (per esempio http://127.0.0.1:8080), "
            f"non il percorso '{parti.path}'")
    return f"{parti.scheme}://{parti.netloc}"


def chiave_api(testo: str) -> str:
    # Checked here, so that a key that cannot go in a header never reaches one (nor an error message).
    if not testo or not all(33 <= ord(c) < 127 for c in testo):
        raise argparse.ArgumentTypeError("la chiave API deve essere fatta di caratteri ASCII stampabili, senza spazi")
    return testo


def lista_np(testo: str) -> List[Configurazione]:
    """`1,2,4,4kv`: the -np values of a sweep; `Nkv` adds --kv-unified (the lab's step 5)."""
    configurazioni = []
    for voce in testo.split(","):
        voce = voce.strip().lower()
        kv = voce.endswith("kv")
        try:
            np = int(voce[:-2] if kv else voce)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{voce}' non è un valore di -np (per esempio 1,2,4,4kv)") from None
        if np < 1 and np != -1:
            raise argparse.ArgumentTypeError(f"-np {np} non ha senso: usa 1, 2, 4... o -1 (automatico)")
        configurazioni.append(Configurazione(np, kv))
    return configurazioni


def comando_server(testo: str) -> List[str]:
    import shlex

    try:
        parti = shlex.split(testo)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"comando non valido: {exc}") from None
    if not parti:
        raise argparse.ArgumentTypeError("il comando del server è vuoto")
    gestite = {"-np", "--parallel", "--host", "--port", "--kv-unified", "-kvu"}
    doppie = sorted(gestite.intersection(p.split("=")[0] for p in parti))
    if doppie:
        raise argparse.ArgumentTypeError(
            f"non mettere {', '.join(doppie)} nel comando: -np viene da --np, host e porta da --url")
    return parti


def file_scrivibile(testo: str) -> str:
    """An output file that can be written: checked before any load is fired."""
    cartella = os.path.dirname(os.path.abspath(testo))
    if os.path.isdir(testo):
        raise argparse.ArgumentTypeError(f"'{testo}' è una cartella, non un file")
    if not os.path.isdir(cartella):
        raise argparse.ArgumentTypeError(f"la cartella '{cartella}' non esiste")
    if not os.access(cartella, os.W_OK) or (os.path.exists(testo) and not os.access(testo, os.W_OK)):
        raise argparse.ArgumentTypeError(f"non posso scrivere '{testo}' (permessi)")
    return testo


class _Parser(argparse.ArgumentParser):
    """argparse with its few English words of error said in Italian."""

    TRADUZIONI = (("unrecognized arguments", "opzioni non riconosciute"),
                  ("expected one argument", "richiede un valore"),
                  ("argument ", "opzione "),
                  ("ambiguous option", "opzione ambigua"),
                  ("could match", "potrebbe essere"))

    def error(self, message):
        for inglese, italiano in self.TRADUZIONI:
            message = message.replace(inglese, italiano)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: errore: {message}\n")

    def format_usage(self):
        return super().format_usage().replace("usage:", "uso:", 1)

    def format_help(self):
        return super().format_help().replace("usage:", "uso:", 1)


def _formato_aiuto(prog: str) -> argparse.HelpFormatter:
    # The width given here, so that argparse does not import shutil (5 ms of start-up) to ask it.
    try:
        larghezza = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        larghezza = int(os.environ.get("COLUMNS", "80")) if os.environ.get("COLUMNS", "").isdigit() else 80
    return argparse.RawDescriptionHelpFormatter(prog, width=max(larghezza, 40) - 2)


def analizza_argomenti(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = _Parser(prog="carico.py", description=__doc__, add_help=False, formatter_class=_formato_aiuto)
    parser._optionals.title = "opzioni"
    aggiungi = parser.add_argument
    aggiungi("-h", "--help", action="help", help="mostra questo aiuto ed esce")
    aggiungi("--version", action="version", version=f"carico.py {__version__}", help="mostra la versione ed esce")
    aggiungi("--url", type=url_server, default="http://127.0.0.1:8080",
             help="radice del server llama.cpp (default: %(default)s)")
    aggiungi("--richieste", type=intero_positivo, default=4, help="quante richieste inviare in tutto (default: %(default)s)")
    aggiungi("--parallele", type=intero_positivo, default=4,
             help="quante richieste tenere in volo insieme (default: %(default)s)")
    aggiungi("--token", type=intero_positivo, default=32,
             help="token da generare per richiesta, max_tokens (default: %(default)s)")
    aggiungi("--prompt-file", metavar="FILE", help="manda il testo di FILE come prompt di ogni richiesta (il passo 4 del lab)")
    aggiungi("--api-key", type=chiave_api, metavar="CHIAVE", default=None,
             help="chiave API del server (--api-key di llama serve); se manca si usa la variabile LLAMA_API_KEY. "
                  "Non viene mai stampata")
    aggiungi("--modello", metavar="NOME", help="il campo model delle richieste (l'alias -a del server)")
    aggiungi("--timeout", type=secondi_positivi, default=TIMEOUT_RICHIESTA, metavar="S",
             help="secondi massimi di attesa di una risposta, coda compresa (default: %(default)g)")
    aggiungi("--intervallo", type=secondi_positivi, default=0.5, metavar="S",
             help="ogni quanti secondi leggere /slots (default: %(default)g)")
    aggiungi("--attesa", type=secondi_positivi, default=ATTESA_CARICAMENTO, metavar="S",
             help="per quanti secondi aspettare un server che sta ancora caricando il modello (default: %(default)g)")
    aggiungi("--stream", action="store_true",
             help="richieste in streaming: ogni riga aggiunge il tempo al primo token (mostra l'attesa in coda)")
    aggiungi("--ripeti", type=intero_positivo, default=1, metavar="K",
             help="ripete la prova K volte e stampa media e dispersione delle cifre")
    aggiungi("--grafico", action="store_true", help="disegna la prova nel terminale (coda, prompt, generazione, slot)")
    aggiungi("--svg", type=file_scrivibile, metavar="FILE", help="salva lo stesso disegno in un file SVG")
    aggiungi("--json", type=file_scrivibile, metavar="FILE", help="salva richieste, campioni di /slots e metadati in JSON")
    aggiungi("--csv", type=file_scrivibile, metavar="FILE", help="salva una riga per richiesta in CSV")
    aggiungi("--tabella", action="store_true",
             help="stampa la riga della tabella del consegnato (np | n_ctx_slot | latenze | throughput)")
    aggiungi("--spiega", action="store_true", help="dopo il riepilogo, legge la prova a parole")
    aggiungi("--avvia", type=comando_server, metavar="COMANDO",
             help="avvia il server con questo comando per ogni valore di --np (host e porta da --url), "
                  "misura e lo ferma: tutto il lab in un comando")
    aggiungi("--np", type=lista_np, metavar="LISTA",
             help="con --avvia: i valori di -np, per esempio 1,2,4,4kv (4kv = -np 4 --kv-unified; default 1,2,4)")
    argomenti = parser.parse_args(argv)
    if argomenti.np is not None and argomenti.avvia is None:
        parser.error("--np va usato insieme a --avvia")
    if argomenti.avvia is not None and argomenti.np is None:
        argomenti.np = lista_np("1,2,4")
    if argomenti.api_key is None and os.environ.get("LLAMA_API_KEY"):
        try:
            argomenti.api_key = chiave_api(os.environ["LLAMA_API_KEY"])
        except argparse.ArgumentTypeError as exc:
            parser.error(f"LLAMA_API_KEY: {exc}")
    argomenti.testo = None
    if argomenti.prompt_file is not None:
        try:
            with open(argomenti.prompt_file, encoding="utf-8") as f:
                argomenti.testo = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"--prompt-file: non riesco a leggere '{argomenti.prompt_file}': "
                         f"{getattr(exc, 'strerror', None) or exc}")
        if not argomenti.testo:
            parser.error(f"--prompt-file: '{argomenti.prompt_file}' è vuoto")
    return argomenti


# Main #########################################################################################

def _al_segnale(numero, _frame):
    raise Interruzione(128 + numero)


def main(argv: Optional[Sequence[str]] = None) -> int:
    # A terminal or pipe that cannot encode Unicode gets '?' instead of a UnicodeEncodeError.
    for flusso in (sys.stdout, sys.stderr):
        if hasattr(flusso, "reconfigure"):
            flusso.reconfigure(errors="replace")
    argomenti = analizza_argomenti(argv)
    precedenti = {}
    if threading.current_thread() is threading.main_thread():
        precedenti = {s: signal.signal(s, _al_segnale) for s in segnali_ignorati.SEGNALI}
    try:
        return Sessione(argomenti).esegui()
    except BrokenPipeError:
        # The reader went away (`| head -1`): no noise, and no second error when Python flushes.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        for segnale, gestore in precedenti.items():
            signal.signal(segnale, gestore)


def nota(testo: str) -> None:
    print(f"carico.py: nota: {testo}", file=sys.stderr, flush=True)


class Sessione:
    """One invocation: each server (one, or one per --np value with --avvia) gets --ripeti runs;
    every run is printed as soon as it ends, and what was measured is always reported and saved,
    whatever stops the session (an error, Ctrl+C, a server that dies)."""

    def __init__(self, argomenti: argparse.Namespace):
        self.a = argomenti
        self.piano = Piano(argomenti.richieste, argomenti.parallele, argomenti.token, argomenti.timeout,
                           argomenti.intervallo, argomenti.stream, argomenti.modello, argomenti.testo)
        self.prove: List[Prova] = []
        self.marche = marche_per(sys.stdout)

    def esegui(self) -> int:
        codice = 0
        try:
            for configurazione in self.a.np or [None]:
                if configurazione is None:
                    self._misura(None)
                else:
                    with ServerAvviato(self.a.avvia, configurazione, self.a.url, self.a.attesa, sys.stderr) as server:
                        self._misura(configurazione)
                        if server.proc.poll() is not None:
                            raise ErroreUtente(f"il server (-np {configurazione.etichetta}) si è fermato durante la "
                                               f"prova (codice {server.proc.returncode}); ultime righe del suo log:\n"
                                               f"{server.coda_log()}")
                if any(p.esecuzione.interrotta for p in self.prove):
                    break
        except ErroreUtente as exc:
            print(f"carico.py: errore: {exc}", file=sys.stderr)
            codice = 1
        except Interruzione as exc:
            print("carico.py: interrotto", file=sys.stderr)
            codice = exc.codice
        codice = self._concludi() or codice
        interrotta = next((p.esecuzione.interrotta for p in self.prove if p.esecuzione.interrotta), None)
        if interrotta:
            return interrotta
        if codice:
            return codice
        return 0 if all(r.riuscita for p in self.prove for r in p.esecuzione.risultati) else 1

    def _misura(self, configurazione: Optional[Configurazione]) -> None:
        client = Client(self.a.url, self.a.api_key, min(TIMEOUT_INFO, self.a.timeout))
        info = interroga_server(client, self.a.attesa, sys.stderr, con_props=bool(self.a.json))
        for avviso in info.avvisi:
            nota(avviso)
        mie = []
        for k in range(self.a.ripeti):
            macchina = osserva_macchina()
            motivo = macchina_occupata(macchina)
            if motivo:
                print(f"carico.py: attenzione: la macchina è già occupata ({motivo}): le cifre saranno falsate, "
                      "perché il server si divide i core con gli altri processi. Chiudi i processi pesanti e ripeti",
                      file=sys.stderr, flush=True)
            if self.a.ripeti > 1:
                print(f"prova {k + 1} di {self.a.ripeti}")
            print(riga_server(info), flush=True)
            # Each repeat on this server gets prompts it was not sent before: a cached prompt would
            # flatter the repeat. A new server (--avvia) starts again from the lab's first prompt.
            esecuzione = esegui_carico(client, self.piano, info.slots_disponibile, info.metrics_disponibile,
                                       primo_prompt=k * self.piano.richieste)
            prova = Prova(info, esecuzione, configurazione, macchina)
            self.prove.append(prova)
            mie.append(prova)
            self._stampa(prova)
            if esecuzione.interrotta:
                return
        if len(mie) > 1:
            print("\n".join(righe_ripetute(mie) + [""]), flush=True)  # multi-run blocks end with a blank line

    def _stampa(self, prova: Prova) -> None:
        e = prova.esecuzione
        righe = rapporto(e, self.piano.parallele, prova.info, self.piano.stream)
        if self.a.grafico and e.risultati:
            righe += [""] + grafico(e, self.marche)
        if self.a.spiega:
            righe += [""] + spiegazione(prova, self.piano.parallele)
        if self.a.avvia or self.a.ripeti > 1:
            righe.append("")
        print("\n".join(righe), flush=True)
        durata = prova.riepilogo.tempo_totale
        if prova.info.slots_disponibile and durata is not None and durata < 2 * self.piano.intervallo:
            nota(f"la prova è durata {durata:.2f} s, meno di due letture di /slots (--intervallo "
                 f"{self.piano.intervallo:g}): il picco di slot occupati può essere sottostimato")
        if e.interrotta:
            print(f"carico.py: interrotto: {len(e.risultati)} richieste su {e.richieste} completate, "
                  "le altre annullate", file=sys.stderr)

    def _concludi(self) -> int:
        """The sweep's table, then the files: written even after an error or an interruption."""
        if self.prove and (self.a.tabella or self.a.avvia):
            separa = [] if self.a.avvia or self.a.ripeti > 1 else [""]
            print("\n".join(separa + TESTA_TABELLA + [riga_tabella(p) for p in self.prove]), flush=True)
        file = [(self.a.json, lambda: testo_json(self.prove, self.piano, self.a.url)),
                (self.a.csv, lambda: testo_csv(self.prove)), (self.a.svg, lambda: svg(self.prove))]
        codice = 0
        for percorso, testo in file:
            if percorso and self.prove:
                try:
                    scrivi_file(percorso, testo())
                except OSError as exc:
                    print(f"carico.py: errore: non riesco a scrivere '{percorso}': {exc.strerror or exc}",
                          file=sys.stderr)
                    codice = 1
        return codice


def scrivi_file(percorso: str, testo: str) -> None:
    """All or nothing: a temporary file beside it, then a rename."""
    import tempfile

    cartella = os.path.dirname(os.path.abspath(percorso))
    fd, provvisorio = tempfile.mkstemp(prefix=".carico-", dir=cartella)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(testo)
        os.replace(provvisorio, percorso)
    except BaseException:
        try:
            os.unlink(provvisorio)
        except OSError:
            pass
        raise


if __name__ == "__main__":
    sys.exit(main())
