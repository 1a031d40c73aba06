#!/usr/bin/env python3
"""carico.py: genera carico su un server llama.cpp (Lab 04-03, "Carico e parallelismo").

Invia N richieste di chat insieme (ThreadPoolExecutor) a `llama serve` e intanto legge /slots
ogni 0,5 s; alla fine stampa, per ogni richiesta, latenza, token generati e velocità nel proprio
slot, poi il riepilogo: il picco di slot occupati insieme, il tempo totale, la latenza media e
massima, il throughput aggregato.

Esempio (il lab):

  llama serve -hf ggml-org/Qwen3.5-0.8B-GGUF --host 127.0.0.1 --port 8080 -c 2048 -np 1 -t 3 -a qwen-0.8b
  python3 carico.py --url http://127.0.0.1:8080 --richieste 4 --parallele 4 --token 32

Ogni richiesta ha un prompt diverso (con lo stesso prompt la cache dei prompt falserebbe il
confronto) e il "thinking" spento, così i token generati sono tutti risposta.

Oltre il lab: le opzioni dopo il gruppo "il lab" sono tutte facoltative e non cambiano le righe
del lab (in fondo, qualche esempio).

Codici di uscita: 0 tutto bene; 1 server non raggiungibile o almeno una richiesta fallita;
2 opzioni sbagliate; 130 interrotto con Ctrl+C (143 con SIGTERM): si stampa comunque quello che
era già stato misurato; 141 se chi legge l'uscita la chiude prima (per esempio | head).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse
from typing import Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

# Some modules are imported inside the functions that use them (http.client, concurrent.futures,
# statistics, csv, ssl, subprocess...): `carico.py --help` and a bad flag answer at once, and a
# plain lab run never loads what only an extra needs.

__version__ = "1.2.0"

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

CHAT = "/v1/chat/completions"
ND = "n/d"  # what the lab's lines show for a figure the server did not give

# Timeouts, in seconds. Every network call has one, so that nothing can hang the tool.
TIMEOUT_INFO = 10.0  # /health, /slots, /props: the server answers them between two decode steps
TIMEOUT_RICHIESTA = 300.0  # one chat request: it may wait in the server's queue behind the others
ATTESA_PRONTO = 120.0  # how long to wait for a server that is still loading its model
PAUSA_PRONTO = 0.25  # how often to ask /health again meanwhile
SGUARDO_MACCHINA = 0.25  # how long the quiet-machine check watches the CPU before a run


# The records that flow ########################################################################
# Piano (what to send) -> Risultato (one request) + Campione (one /slots reading) -> Esecuzione
# (the run) -> Prova (the run with the server it ran against) -> the report.

class Piano(NamedTuple):
    """What to send: the lab's four flags and how to send them."""
    richieste: Optional[int] = 4  # None with --durata: as many as fit in the time
    parallele: int = 4  # requests in flight together: the pool's workers
    token: int = 32  # max_tokens of each request
    timeout: float = TIMEOUT_RICHIESTA
    intervallo: float = 0.5  # period of the /slots sampling
    stream: bool = False  # --stream
    modello: Optional[str] = None  # --modello: the requests' `model` field
    testo: Optional[str] = None  # --prompt-file: one prompt for every request
    ritmo: Optional[float] = None  # --ritmo: requests per second, sent by the clock (open loop)
    arrivi: str = "poisson"  # --arrivi: poisson or costanti
    seme: Optional[int] = None  # --seme: the seed of the Poisson schedule
    durata: Optional[float] = None  # --durata: keep sending for this many seconds
    esatti: bool = False  # --esatti: ignore_eos, so that every request generates exactly `token`


class Risultato(NamedTuple):
    """One request. Times are seconds from the start of the run (time.perf_counter)."""
    indice: int
    inizio: float  # when it was sent
    fine: float  # when its whole answer had arrived
    token: Optional[int] = None  # generated tokens, from the server's usage
    tps: Optional[float] = None  # the server's timings.predicted_per_second: speed in its own slot
    token_prompt: Optional[int] = None
    prompt_ms: Optional[float] = None  # the server's time on the prompt
    predicted_ms: Optional[float] = None  # the server's time generating
    finish_reason: Optional[str] = None
    errore: Optional[str] = None  # why it failed, in Italian; None when it succeeded
    annullata: bool = False  # closed by Ctrl+C: not a measurement
    previsto: Optional[float] = None  # --ritmo: when the schedule meant to send it
    token_cache: Optional[int] = None  # the server's timings.cache_n: prompt tokens reused from the slot's cache
    arrivi_chunk: Optional[Tuple[float, ...]] = None  # --stream: seconds from send to each chunk with text

    @property
    def latenza(self) -> float:
        return self.fine - self.inizio

    @property
    def primo_token(self) -> Optional[float]:
        """--stream: seconds from send to the first token, the first chunk with text."""
        return self.arrivi_chunk[0] if self.arrivi_chunk else None

    @property
    def riuscita(self) -> bool:
        return self.errore is None


class Campione(NamedTuple):
    """One reading of /slots (and /metrics), taken by the sampler."""
    t: float  # seconds from the start of the run
    occupati: Optional[int]  # busy slots, None when that reading failed
    in_coda: Optional[int] = None  # llamacpp:requests_deferred, when /metrics is there
    in_corso: Optional[int] = None  # tokens generated so far by the requests in the busy slots (the live line)


class Esecuzione(NamedTuple):
    """One run of the load."""
    risultati: List[Risultato]  # in request order; those never sent or cut by Ctrl+C are missing
    campioni: List[Campione]
    richieste: int  # how many were to be sent
    interrotta: Optional[int] = None  # the exit code when Ctrl+C (130) or SIGTERM (143) cut it short
    trattenute: int = 0  # --ritmo: requests sent late because --parallele were already in flight


class Prova(NamedTuple):
    """One run with what it ran against: what the report, --ripeti, --avvia and the files read."""
    info: InfoServer
    esecuzione: Esecuzione
    configurazione: Optional[Configurazione] = None  # --avvia: the -np it started the server with
    macchina: Optional[Macchina] = None  # how busy the machine was just before
    piano: Piano = Piano()  # what was sent: with lists of values, one point of the sweep

    @property
    def riepilogo(self) -> Riepilogo:
        return riassumi(self.esecuzione)


class ErroreUtente(Exception):
    """A problem the user can fix (server down, wrong key...): one Italian line, exit 1."""


class Interruzione(BaseException):
    """Ctrl+C or SIGTERM: stop sending, report what was measured, exit 128 + the signal."""

    def __init__(self, codice: int):
        super().__init__(codice)
        self.codice = codice


# Talking to the server: one HTTP exchange #####################################################

class Risposta(NamedTuple):
    status: int
    corpo: bytes


class ErroreRichiesta(Exception):
    """A request that got no usable answer; the message is Italian and ready to print."""


class ErroreRete(ErroreRichiesta):
    """No HTTP answer at all: refused, unknown host, timeout, connection closed."""


class Client:
    """Talks to one server with the standard library's http.client, one connection per exchange
    (`Connection: close`, so that a request's latency never hides a stale keep-alive). Redirects
    are never followed (http.client does not follow them). The connections in flight are kept in a
    set, so that `annulla()` can close them from another thread: that is how Ctrl+C stops requests
    blocked in a read without leaving a thread behind."""

    def __init__(self, base: str, api_key: Optional[str] = None, timeout_info: float = TIMEOUT_INFO):
        parti = urllib.parse.urlsplit(base)
        self.base = base
        self.timeout_info = timeout_info  # for everything but the chat requests
        self.con_chiave = bool(api_key)
        self._https = parti.scheme == "https"
        self._host, self._porta = parti.hostname, parti.port or (443 if self._https else 80)
        host = parti.netloc.rpartition("@")[2]
        self._intestazioni = {"Host": host if host.isascii() else host.encode("idna").decode("ascii"),
                              "Accept": "application/json", "Connection": "close",
                              "User-Agent": f"carico.py/{__version__}"}
        if api_key:
            self._intestazioni["Authorization"] = f"Bearer {api_key}"
        self._indirizzo = None  # the address that answered first: the name is looked up once
        self._tls = None  # one ssl context for every https exchange
        self._aperte = set()
        self._lock = threading.Lock()
        self.annullato = threading.Event()

    def chiama(self, metodo: str, percorso: str, dati=None, timeout: Optional[float] = None) -> Risposta:
        """One exchange: status and whole body. Raises ErroreRete when no answer comes."""
        with self.apri(metodo, percorso, dati, timeout) as risposta:
            return Risposta(risposta.status, risposta.read())

    @contextlib.contextmanager
    def apri(self, metodo: str, percorso: str, dati=None, timeout: Optional[float] = None):
        """One exchange on a new connection: yields http.client's answer with its headers read, for
        the caller to read the body. A network error, while connecting or while reading, becomes an
        ErroreRete with an Italian phrase."""
        import http.client  # here, not at the top: see the note under the imports

        timeout = self.timeout_info if timeout is None else timeout
        intestazioni = dict(self._intestazioni)
        corpo = None
        if dati is not None:
            corpo = json.dumps(dati).encode("utf-8")
            intestazioni["Content-Type"] = "application/json"
        connessione = self._connessione(timeout)
        with self._lock:
            self._aperte.add(connessione)
        try:
            connessione.connect()
            if self.annullato.is_set():
                raise ErroreRete("richiesta annullata")
            if self._indirizzo is None and not self._https:
                self._indirizzo = connessione.sock.getpeername()[0]
            connessione.request(metodo, percorso, corpo, intestazioni)
            yield connessione.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            raise ErroreRete(descrivi_errore_rete(exc, timeout)) from None
        finally:
            with self._lock:
                self._aperte.discard(connessione)
            connessione.close()

    def _connessione(self, timeout: float):
        import http.client

        if not self._https:  # after the first exchange, the address that answered: no lookup per request
            return http.client.HTTPConnection(self._indirizzo or self._host, self._porta, timeout=timeout)
        if self._tls is None:
            import ssl

            self._tls = ssl.create_default_context()
        # TLS checks the certificate against the name: the name, not an address, goes here.
        return http.client.HTTPSConnection(self._host, self._porta, timeout=timeout, context=self._tls)

    def annulla(self) -> None:
        """Close every connection in flight (from any thread); later exchanges fail at once."""
        self.annullato.set()
        with self._lock:
            aperte = [c.sock for c in self._aperte if c.sock is not None]
        for sock in aperte:
            with contextlib.suppress(OSError):  # already closed by the other side
                sock.shutdown(socket.SHUT_RDWR)


def leggi_json(corpo: bytes):
    """A body as JSON, or None when it is not JSON."""
    try:
        return json.loads(corpo)  # bytes: json finds the UTF encoding itself
    except ValueError:  # UnicodeDecodeError included
        return None


# What the server says about itself ############################################################

class InfoServer(NamedTuple):
    n_slot: Optional[int]
    n_ctx_slot: Optional[int]
    slots_disponibile: bool  # /slots answers, so the peak of busy slots can be sampled
    avvisi: tuple = ()  # Italian lines for stderr: what could not be seen
    metrics_disponibile: bool = False  # /metrics answers: requests_deferred can be sampled
    props: Optional[dict] = None  # /props as the server gave it, for --json


def aspetta_pronto(client: Client, attesa: float, stderr, avviato: Optional[ServerAvviato] = None,
                   timer=time.monotonic) -> None:
    """Ask /health until the server is ready, up to `attesa` seconds. While it answers 503 it is
    still loading its model; a server that --avvia has just started may not even listen yet. Any
    other server that does not answer is down. 401: nothing can be measured without the key."""
    inizio = timer()
    avvisato = None  # when the user was last told that we wait
    while True:
        if avviato is not None:
            avviato.controlla("il server si è fermato durante l'avvio")
        try:
            risposta = client.chiama("GET", "/health")
        except ErroreRete as exc:
            if avviato is None:
                raise ErroreUtente(f"nessuna risposta dal server {client.base}: {exc}. "
                                   "Avvia il server (llama serve ...) o correggi --url, poi riprova") from None
            risposta = None  # just started: not listening yet
        if risposta is not None and risposta.status == 401:
            raise ErroreUtente(messaggio_chiave(client))
        passati = timer() - inizio
        if risposta is not None and risposta.status != 503:
            if avvisato is not None:
                print(f"server pronto in {passati:.1f} s", file=stderr, flush=True)
            return
        if passati >= attesa:
            ancora = f": risponde ancora {descrivi_errore_http(risposta)}" if risposta is not None else ""
            perche = (f"; ultime righe del suo log:\n{avviato.coda_log()}" if avviato is not None
                      else ": aspetta che finisca di caricare il modello e riprova")
            raise ErroreUtente(f"il server {client.base} non è pronto dopo {attesa:g} s (--attesa){ancora}{perche}")
        if avvisato is None or passati - avvisato >= 10:  # at first, then every 10 s
            print(f"il server {client.base} sta caricando il modello: attendo fino a {attesa:g} s..."
                  if avvisato is None else f"  attendo ancora il server... {passati:.0f} s", file=stderr, flush=True)
            avvisato = passati
        time.sleep(PAUSA_PRONTO)


def chiedi(client: Client, percorso: str) -> Risposta:
    """GET a path of a server that is ready; down or refusing the key is an ErroreUtente."""
    try:
        risposta = client.chiama("GET", percorso)
    except ErroreRete as exc:
        raise ErroreUtente(f"nessuna risposta dal server {client.base} ({percorso}): {exc}") from None
    if risposta.status == 401:
        raise ErroreUtente(messaggio_chiave(client))
    return risposta


def interroga_server(client: Client, attesa: float, stderr, con_props: bool = False) -> InfoServer:
    """Before any load: is the server there and ready, how many slots of what context, and can
    /slots and /metrics be sampled."""
    aspetta_pronto(client, attesa, stderr)
    risposta = chiedi(client, "/slots")
    info = info_da_slots(leggi_json(risposta.corpo)) if risposta.status == 200 else None
    if info is None or not info.slots_disponibile or con_props:
        info = info_da_props(client, risposta, info)  # /slots off, another server, --json: see "Oltre il lab"
    metrics = chiedi(client, "/metrics")
    return info._replace(metrics_disponibile=metrics.status == 200 and b"llamacpp:" in metrics.corpo)


def lista_slot(dati) -> Optional[List[dict]]:
    """The slots of a /slots answer: a list (this server), {"slots": [...]} or one bare slot (older ones)."""
    if isinstance(dati, dict):
        dati = dati.get("slots", [dati] if "id" in dati else None)
    if not isinstance(dati, list) or not all(isinstance(s, dict) for s in dati):
        return None
    return dati


def conta_occupati(dati) -> Optional[int]:
    """Busy slots in a /slots answer; None when the answer says nothing readable.
    Reads `is_processing` (this server), or `state` (older servers: 0 is idle)."""
    slots = lista_slot(dati)
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


def info_da_slots(dati) -> Optional[InfoServer]:
    slots = lista_slot(dati)
    if not slots:
        return None
    n_ctx = slots[0].get("n_ctx")
    return InfoServer(len(slots), n_ctx if isinstance(n_ctx, int) else None, conta_occupati(dati) is not None)


# The load: one request, the /slots sampler, the pool that fires them ##########################

def prompt_per(indice: int, testo: Optional[str] = None) -> str:
    """Request i's prompt: the lab's i-th, and past 8 the same ones behind a number, so that they
    stay distinct and share at most a digit of prefix."""
    if testo is not None:
        return testo
    base = PROMPTS[indice % len(PROMPTS)]
    return base if indice < len(PROMPTS) else f"{indice}. {base}"


def domanda_chat(prompt: str, piano: Piano) -> dict:
    """The JSON that one request sends to /v1/chat/completions."""
    domanda = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": piano.token,
        # Thinking off, so that every generated token is answer (ignored by models without it).
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if piano.modello:
        domanda["model"] = piano.modello
    if piano.esatti:  # --esatti: see "Oltre il lab"
        domanda["ignore_eos"] = True
    return domanda


def invia(client: Client, indice: int, domanda: dict, timeout: float, t0: float,
          timer=time.perf_counter) -> Risultato:
    """One request, timed from send to full answer. Never raises: a failure is a Risultato with
    its error text, so that one bad request does not stop the others."""
    inizio = timer() - t0
    try:
        risposta = client.chiama("POST", CHAT, domanda, timeout)
        fine = timer() - t0
        if risposta.status != 200:
            return Risultato(indice, inizio, fine, errore=descrivi_errore_http(risposta))
        dati = leggi_json(risposta.corpo)
        if dati is None:
            raise ErroreRichiesta("risposta non JSON dal server")
        return Risultato(indice, inizio, fine, **cifre_completamento(dati))
    except Exception as exc:  # a worker never raises
        return fallita(client, indice, inizio, timer() - t0, exc)


def cifre_completamento(dati) -> dict:
    """The figures of a chat completion: tokens from `usage`, else `timings.predicted_n`; speed
    and server times from `timings`. A missing field stays None (printed n/d), never guessed."""
    if not isinstance(dati, dict) or not isinstance(dati.get("choices"), list):
        raise ErroreRichiesta("risposta non valida: la risposta non è un completamento di chat (manca choices)")
    usage = dati.get("usage") if isinstance(dati.get("usage"), dict) else {}
    timings = dati.get("timings") if isinstance(dati.get("timings"), dict) else {}
    token = intero(usage.get("completion_tokens"))
    if token is None:
        token = intero(timings.get("predicted_n"))
    token_prompt = intero(usage.get("prompt_tokens"))
    if token_prompt is None:
        token_prompt = intero(timings.get("prompt_n"))
    scelte = dati["choices"]
    finish = scelte[0].get("finish_reason") if scelte and isinstance(scelte[0], dict) else None
    return dict(token=token, tps=numero(timings.get("predicted_per_second")), token_prompt=token_prompt,
                prompt_ms=numero(timings.get("prompt_ms")), predicted_ms=numero(timings.get("predicted_ms")),
                finish_reason=finish if isinstance(finish, str) else None, token_cache=intero(timings.get("cache_n")))


def numero(valore) -> Optional[float]:
    return float(valore) if isinstance(valore, (int, float)) and not isinstance(valore, bool) else None


def intero(valore) -> Optional[int]:
    return int(valore) if isinstance(valore, int) and not isinstance(valore, bool) else None


def fallita(client: Client, indice: int, inizio: float, fine: float, exc: Exception) -> Risultato:
    """The Risultato of a request that raised. What the server or the network said is printed as
    it is; anything else is a bug of carico.py, and says so rather than blame the server."""
    if client.annullato.is_set():
        return Risultato(indice, inizio, fine, errore="annullata (interruzione)", annullata=True)
    errore = str(exc) if isinstance(exc, ErroreRichiesta) else f"errore interno: {type(exc).__name__}: {exc}"
    return Risultato(indice, inizio, fine, errore=errore)


class Campionatore:
    """Reads /slots (and /metrics, when there) every `intervallo` seconds in a background thread,
    on a fixed schedule: the time a read takes does not stretch the period. A failed read is kept
    as a gap, not a zero."""

    def __init__(self, client: Client, intervallo: float, slots: bool, metrics: bool, timer=time.perf_counter,
                 al_campione=None):
        self.campioni: List[Campione] = []
        self._client, self._intervallo, self._timer = client, intervallo, timer
        self._slots, self._metrics = slots, metrics
        self._al_campione = al_campione  # called with each sample: the live line (see "Oltre il lab")
        self._t0 = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ciclo, name="campionatore", daemon=True)

    def avvia(self, t0: float) -> None:
        if self._slots or self._metrics:
            self._t0 = t0
            self._thread.start()

    def ferma(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _ciclo(self) -> None:
        prossimo = self._timer()
        while True:
            t = self._timer() - self._t0
            occupati = in_coda = in_corso = None
            if self._slots:
                dati = self._leggi("/slots", leggi_json)
                occupati = conta_occupati(dati)
                if self._al_campione is not None:
                    in_corso = token_in_corso(dati)
            if self._metrics:
                valore = self._leggi("/metrics", lambda corpo: leggi_metrica(
                    corpo.decode("utf-8", "replace"), "requests_deferred"))
                in_coda = None if valore is None else int(valore)
            campione = Campione(t, occupati, in_coda, in_corso)
            self.campioni.append(campione)
            if self._al_campione is not None:
                self._al_campione(campione)
            prossimo += self._intervallo
            if self._stop.wait(max(0.0, prossimo - self._timer())):
                return

    def _leggi(self, percorso: str, interpreta):
        try:
            risposta = self._client.chiama("GET", percorso)
        except ErroreRete:
            return None
        return interpreta(risposta.corpo) if risposta.status == 200 else None


def esegui_carico(client: Client, piano: Piano, slots: bool = True, metrics: bool = False,
                  primo_prompt: int = 0, timer=time.perf_counter, diretta: Optional[Diretta] = None) -> Esecuzione:
    """Fire the requests, all submitted at once to `parallele` workers, while /slots is sampled
    (with --ritmo or --durata, a Programma sends them by the clock instead). The clock starts at the
    first request. Prompts start at `primo_prompt`, so that repeated runs never resend one the
    server has cached. Ctrl+C or SIGTERM ends the run early: the requests in flight are closed, the
    ones not sent are cancelled, and the run says it was cut short."""
    import concurrent.futures  # here, not at the top: see the note under the imports

    invio = invia_in_flusso if piano.stream else invia  # --stream: see "Oltre il lab"
    programma = Programma(piano, primo_prompt) if piano.ritmo or piano.durata else None  # see "Oltre il lab"
    domande = [] if programma else [domanda_chat(prompt_per(primo_prompt + i, piano.testo), piano)
                                    for i in range(piano.richieste)]
    futuri = []  # each request's future, in the order they were submitted
    al_campione = diretta.seguendo(futuri, piano) if diretta else None  # the live line: see "Oltre il lab"
    campionatore = Campionatore(client, piano.intervallo, slots, metrics, timer, al_campione)
    esecutore = concurrent.futures.ThreadPoolExecutor(max_workers=piano.parallele, thread_name_prefix="richiesta")
    interrotta = None
    try:
        t0 = timer()
        campionatore.avvia(t0)
        if programma is None:  # the lab: every request submitted now, the pool runs `parallele` at a time
            for i, domanda in enumerate(domande):
                futuri.append(esecutore.submit(invio, client, i, domanda, piano.timeout, t0, timer))
        else:  # --ritmo, --durata: sent by the clock
            programma.lancia(futuri, esecutore, invio, client, t0, timer)
        concurrent.futures.wait(futuri)
    except Interruzione as exc:
        interrotta = exc.codice
        client.annulla()  # the requests in flight return at once, marked `annullata`
    finally:
        with segnali_ignorati():  # a second Ctrl+C must not lose the report
            esecutore.shutdown(wait=True, cancel_futures=True)
            campionatore.ferma()
            if diretta:
                diretta.cancella()
    # What the interruption closed is not a measurement: keep only the requests that ended by themselves.
    finite = sorted((f.result() for f in futuri if not f.cancelled()), key=lambda r: r.indice)
    richieste = piano.richieste if piano.durata is None else len(futuri)
    return Esecuzione([r for r in finite if not r.annullata], campionatore.campioni, richieste, interrotta,
                      programma.trattenute if programma else 0)


# The report: pure formatting, data -> lines ###################################################

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


def riassumi(esecuzione: Esecuzione) -> Riepilogo:
    """Mean and max latency over the successful requests; total time from the first request
    (t = 0) to the last successful answer; aggregate throughput = their tokens / total time."""
    ok = [r for r in esecuzione.risultati if r.riuscita]
    latenze = [r.latenza for r in ok]
    totale = max((r.fine for r in ok), default=None)
    token = sum(r.token for r in ok) if ok and all(r.token is not None for r in ok) else None
    throughput = token / totale if token is not None and totale else None
    occupati = [c.occupati for c in esecuzione.campioni if c.occupati is not None]
    in_coda = [c.in_coda for c in esecuzione.campioni if c.in_coda is not None]
    return Riepilogo(len(ok), len(esecuzione.risultati) - len(ok), esecuzione.richieste - len(esecuzione.risultati),
                     totale, sum(latenze) / len(latenze) if latenze else None, max(latenze, default=None),
                     token, throughput, max(occupati, default=None), max(in_coda, default=None))


def fmt(valore, formato: str) -> str:
    """`valore` formatted, with an optional unit after the format spec ('.2f s'); n/d for None."""
    spec, _, unita = formato.partition(" ")
    return ND if valore is None else format(valore, spec) + (f" {unita}" if unita else "")


def riga_server(info: InfoServer) -> str:
    return f"server: {fmt(info.n_slot, 'd')} slot, n_ctx per slot = {fmt(info.n_ctx_slot, 'd')}"


def riga_richiesta(r: Risultato, larghezza: int = 1, stream: bool = False) -> str:
    inizio_riga = f"  req {r.indice:>{larghezza}}: {r.latenza:6.2f} s"
    if not r.riuscita:
        return f"{inizio_riga}   errore: {r.errore}"
    riga = f"{inizio_riga} {fmt(r.token, 'd'):>4} token  ({fmt(r.tps, '.1f')} t/s nel proprio slot)"
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
    """The lab's lines after the `server:` line: one per request, a blank line, the summary. After
    an interruption the requests that did not end get a line that says so."""
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


# What the run's tokens mean: notes on stderr after every run ##################################
# Two things change what throughput means, and stdout cannot show them: requests that stopped
# before --token (the model said it was done), and prompt tokens the server reused from its cache.

INIZIO_TEMPLATE = 16  # prompt tokens the cache may reuse from the chat template's opening alone


def note_token(prova: Prova) -> List[str]:
    """The notes on stderr after every run, with or without flags: requests that stopped before
    --token, and a prompt cache that served more than the chat template's opening."""
    note = [frase_fermate(prova)] if fermate_prima(prova) else []
    dalla_cache = [r for r in prova.esecuzione.risultati if (r.token_cache or 0) > INIZIO_TEMPLATE]
    if dalla_cache:
        note.append(f"la cache dei prompt ha servito {sum(r.token_cache for r in dalla_cache)} token di prompt in "
                    f"{len(dalla_cache)} richieste (oltre i primi {INIZIO_TEMPLATE}, l'inizio del template di chat): "
                    "quei token non sono stati calcolati, e la prova ne esce avvantaggiata")
    return note


def fermate_prima(prova: Prova) -> List[Risultato]:
    """The successful requests that generated fewer tokens than --token (finish_reason `stop`)."""
    return [r for r in prova.esecuzione.risultati if r.riuscita and r.token is not None and r.token < prova.piano.token]


def frase_fermate(prova: Prova) -> str:
    """What stderr, --spiega and --dettagli say of the requests that stopped before --token."""
    corte, piano = fermate_prima(prova), prova.piano
    frase = (f"{len(corte)} richieste su {len(prova.esecuzione.risultati)} si sono fermate prima di --token "
             f"{piano.token} (finish_reason stop, {min(r.token for r in corte)}-{max(r.token for r in corte)} token)")
    if piano.esatti:
        return frase + ": il server non rispetta ignore_eos (--esatti)"
    return (frase + ": il throughput conta i token generati davvero, e non si confronta con prove che arrivano a "
            "--token; --esatti li fa generare tutti")


# Is the machine quiet? ########################################################################
# The lab asks for a quiet machine: the server shares the cores with whatever else runs.

class Macchina(NamedTuple):
    core: int
    carico_medio: Optional[float]  # 1-minute load average
    cpu_occupata: Optional[float]  # share of all cores busy over a short look, 0..1


def osserva_macchina(sguardo: Optional[float] = None) -> Macchina:
    """How busy the machine is before the load: the load average, and the CPU share used by others
    over `sguardo` seconds (from /proc/stat, where there is one)."""
    try:
        carico_medio = os.getloadavg()[0]
    except (AttributeError, OSError):
        carico_medio = None
    prima = tempi_cpu()
    occupata = None
    if prima is not None:
        time.sleep(SGUARDO_MACCHINA if sguardo is None else sguardo)
        dopo = tempi_cpu()
        if dopo is not None and dopo[1] > prima[1]:
            occupata = (dopo[0] - prima[0]) / (dopo[1] - prima[1])
    return Macchina(os.cpu_count() or 1, carico_medio, occupata)


def tempi_cpu() -> Optional[Tuple[int, int]]:
    """(busy, total) CPU time of all cores since boot, from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            valori = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    inattivo = valori[3] + (valori[4] if len(valori) > 4 else 0)  # idle + iowait
    return sum(valori) - inattivo, sum(valori)


def macchina_occupata(m: Macchina) -> Optional[str]:
    """Why the machine looks busy, or None when it looks quiet. The CPU share right now is the
    sign, where /proc/stat gives it: the load average also counts the server's own work of a
    minute ago (the previous run of a sweep), so it is only the fallback."""
    if m.cpu_occupata is not None:
        return f"CPU già occupata al {m.cpu_occupata:.0%}" if m.cpu_occupata >= 0.5 else None
    if m.carico_medio is not None and m.carico_medio >= max(1.0, 0.75 * m.core):
        return f"carico medio {m.carico_medio:.1f} su {m.core} core"
    return None


# The command line #############################################################################

class Opzioni(NamedTuple):
    """What the flags say beyond what to send (the Piano): which server, how many runs, what to
    print and save."""
    url: str = "http://127.0.0.1:8080"
    api_key: Optional[str] = None
    attesa: float = ATTESA_PRONTO
    ripeti: int = 1
    tabella: bool = False
    grafico: bool = False
    spiega: bool = False
    file_svg: Optional[str] = None
    file_json: Optional[str] = None
    file_csv: Optional[str] = None
    avvia: Optional[List[str]] = None  # the server's command, split as a shell would
    np: Optional[List[Configurazione]] = None  # with --avvia: one server per value
    dettagli: bool = False
    slo: Optional[Dict[str, float]] = None  # --slo: objective -> seconds
    riscaldamento: int = 0  # --riscaldamento: warm-up requests before the first run on each server
    silenzioso: bool = False  # --silenzioso: no live line


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


def lista_di(converti):
    """An argparse type: one value, or a comma-separated list of them (a sweep: one run per value)."""
    def controlla(testo: str) -> list:
        return [converti(voce.strip()) for voce in testo.split(",")]
    return controlla


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


def analizza_argomenti(argv: Optional[Sequence[str]]) -> Tuple[List[Piano], Opzioni]:
    """Read the flags, in three steps: build the parser (the lab's four flags first, then the extras
    in groups named after what they are for); parse (a bad flag ends here: one Italian line, exit 2);
    turn the result into the load plans and the other options, the only place the flags are read.
    There is one plan, unless a flag was given a list of values: then one per point of the sweep."""
    parser = ParserItaliano(prog="carico.py", description=__doc__, epilog=EPILOGO, add_help=False,
                            usage="%(prog)s [--url URL] [--richieste N] [--parallele N] [--token N] [altre opzioni]",
                            formatter_class=formato_aiuto)
    lab = parser.add_argument_group("il lab")
    lab.add_argument("--url", type=url_server, default="http://127.0.0.1:8080",
                     help="radice del server llama.cpp (default: %(default)s)")
    lab.add_argument("--richieste", type=intero_positivo, metavar="N",
                     help="quante richieste inviare in tutto (default: 4)")
    lab.add_argument("--parallele", type=lista_di(intero_positivo), metavar="N",
                     help="quante richieste tenere in volo insieme (default: 4)")
    lab.add_argument("--token", type=lista_di(intero_positivo), default=[32], metavar="N",
                     help="token da generare per richiesta, max_tokens (default: 32)")
    gruppo = parser.add_argument_group("il server e le richieste").add_argument
    gruppo("--api-key", type=chiave_api, metavar="CHIAVE", help="chiave API del server (--api-key di llama serve); "
           "se manca, la variabile LLAMA_API_KEY. Mai stampata")
    gruppo("--modello", metavar="NOME", help="il campo model delle richieste (l'alias -a del server)")
    gruppo("--prompt-file", metavar="FILE", help="il testo di FILE come prompt di ogni richiesta (il passo 4 del lab)")
    gruppo("--timeout", type=secondi_positivi, default=TIMEOUT_RICHIESTA, metavar="S",
           help="secondi massimi di attesa di una risposta, coda compresa (default: %(default)g)")
    gruppo("--intervallo", type=secondi_positivi, default=0.5, metavar="S",
           help="ogni quanti secondi leggere /slots (default: %(default)g)")
    gruppo("--attesa", type=secondi_positivi, default=ATTESA_PRONTO, metavar="S",
           help="quanto aspettare un server che sta ancora caricando il modello (default: %(default)g)")
    gruppo = parser.add_argument_group("ripetere e confrontare").add_argument
    gruppo("--ripeti", type=intero_positivo, default=1, metavar="K", help="ripete la prova K volte: media e dispersione")
    gruppo("--tabella", action="store_true", help="la riga della tabella del consegnato (np | n_ctx_slot | ...)")
    gruppo = parser.add_argument_group("ritmo, durata, griglie", "--parallele, --token e --ritmo accettano anche una "
                                       "lista (1,2,4): una prova per valore,\no per combinazione, poi la tabella e "
                                       "la curva di capacità").add_argument
    gruppo("--ritmo", type=lista_di(positivo(float, "un numero di richieste al secondo")), metavar="R",
           help="invia R richieste al secondo, qualunque sia il ritmo delle risposte (--parallele fa da tetto)")
    gruppo("--arrivi", choices=("poisson", "costanti"), help="con --ritmo: arrivi di Poisson (default) o a "
           "intervalli costanti")
    gruppo("--seme", type=int, metavar="N", help="con --ritmo: il seme degli arrivi di Poisson, per ripetere la prova")
    gruppo("--durata", type=secondi_positivi, metavar="S", help="continua a inviare per S secondi (al posto di "
           "--richieste), poi aspetta quelle in volo")
    gruppo("--forza", action="store_true", help="accetta una griglia di oltre 100 punti")
    gruppo = parser.add_argument_group("ogni cifra, esatta").add_argument
    gruppo("--dettagli", action="store_true", help="dopo il riepilogo: min, media, p50, p90, p99, max di latenza, "
           "attesa in coda e, con --stream, primo token, TPOT e ITL")
    gruppo("--slo", type=obiettivi_slo, metavar="OBIETTIVI", help="per esempio latenza=5,ttft=1,tpot=0.1 (secondi): "
           "quante richieste li rispettano tutti, e il goodput")
    gruppo("--riscaldamento", type=intero_positivo, default=0, metavar="N",
           help="N richieste prima della prova, con prompt propri, escluse da ogni cifra")
    gruppo("--esatti", action="store_true", help="ignore_eos: ogni richiesta genera esattamente --token token, così "
           "le prove si confrontano")
    gruppo("--silenzioso", action="store_true", help="niente riga dal vivo su stderr durante la prova")
    gruppo = parser.add_argument_group("vedere la prova").add_argument
    gruppo("--stream", action="store_true", help="richieste in streaming: il tempo al primo token (l'attesa in coda)")
    gruppo("--grafico", action="store_true", help="disegna la prova nel terminale (coda, prompt, generazione, slot)")
    gruppo("--svg", type=file_scrivibile, metavar="FILE", help="salva lo stesso disegno in un file SVG")
    gruppo("--spiega", action="store_true", help="dopo il riepilogo, legge la prova a parole")
    gruppo = parser.add_argument_group("salvare i dati").add_argument
    gruppo("--json", type=file_scrivibile, metavar="FILE", help="richieste, campioni di /slots e metadati in JSON")
    gruppo("--csv", type=file_scrivibile, metavar="FILE", help="una riga per richiesta in CSV")
    gruppo = parser.add_argument_group("tutto il lab in un comando").add_argument
    gruppo("--avvia", type=comando_server, metavar="COMANDO",
           help="avvia il server con COMANDO per ogni valore di --np (host e porta da --url), misura e lo ferma")
    gruppo("--np", type=lista_np, metavar="LISTA", help="con --avvia: i valori di -np (default 1,2,4; 4kv = -np 4 "
           "--kv-unified)")
    gruppo = parser.add_argument_group("aiuto").add_argument
    gruppo("-h", "--help", action="help", help="mostra questo aiuto ed esce")
    gruppo("--version", action="version", version=f"carico.py {__version__}", help="mostra la versione ed esce")

    a = parser.parse_args(argv)
    if a.np is not None and a.avvia is None:
        parser.error("--np va usato insieme a --avvia")
    if a.durata is not None and a.richieste is not None:
        parser.error("--durata e --richieste si escludono: con --durata si inviano richieste finché dura il tempo")
    if a.ritmo is None and (a.arrivi is not None or a.seme is not None):
        parser.error("--arrivi e --seme vanno usati insieme a --ritmo")
    if a.slo and not a.stream and set(a.slo) & {"ttft", "tpot"}:
        parser.error("--slo: ttft e tpot si misurano solo in streaming: aggiungi --stream")
    api_key = a.api_key
    if api_key is None and os.environ.get("LLAMA_API_KEY"):
        try:
            api_key = chiave_api(os.environ["LLAMA_API_KEY"])
        except argparse.ArgumentTypeError as exc:
            parser.error(f"LLAMA_API_KEY: {exc}")
    testo = None
    if a.prompt_file is not None:
        try:
            with open(a.prompt_file, encoding="utf-8") as f:
                testo = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"--prompt-file: non riesco a leggere '{a.prompt_file}': "
                         f"{getattr(exc, 'strerror', None) or exc}")
        if not testo:
            parser.error(f"--prompt-file: '{a.prompt_file}' è vuoto")
    richieste = None if a.durata is not None else a.richieste or 4
    np = a.np if a.np is not None or a.avvia is None else lista_np("1,2,4")
    piani = [Piano(richieste, (a.parallele or [4])[0], a.token[0], a.timeout, a.intervallo, a.stream, a.modello,
                   testo, durata=a.durata, esatti=a.esatti)]
    if a.ritmo or len(a.parallele or []) > 1 or len(a.token) > 1:  # --ritmo, lists of values: see "Oltre il lab"
        piani = griglia(piani[0]._replace(arrivi=a.arrivi or "poisson"), a.parallele, a.token, a.ritmo, a.seme)
    punti = len(piani) * len(np or [None])
    if punti > MAX_PUNTI and not a.forza:
        parser.error(f"la griglia ha {punti} punti, oltre {MAX_PUNTI}: accorcia le liste, o aggiungi --forza")
    opzioni = Opzioni(a.url, api_key, a.attesa, a.ripeti, a.tabella, a.grafico, a.spiega,
                      a.svg, a.json, a.csv, a.avvia, np, a.dettagli, a.slo, a.riscaldamento, a.silenzioso)
    return piani, opzioni


# main #########################################################################################

def main(argv: Optional[Sequence[str]] = None) -> int:
    """carico.py from the command line, in this order: read the flags (a bad one ends here with
    exit 2), turn Ctrl+C and SIGTERM into an Interruzione, run the session, return its exit code."""
    for flusso in (sys.stdout, sys.stderr):
        if hasattr(flusso, "reconfigure"):  # a terminal that cannot encode Unicode gets '?', not an error
            flusso.reconfigure(errors="replace")
    piani, opzioni = analizza_argomenti(argv)
    precedenti = {}
    if threading.current_thread() is threading.main_thread():
        precedenti = {s: signal.signal(s, al_segnale) for s in segnali_ignorati.SEGNALI}
    try:
        return Sessione(piani, opzioni).esegui()
    except BrokenPipeError:
        # The reader went away (`| head -1`): no noise, and no second error when Python flushes.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        for segnale, gestore in precedenti.items():
            signal.signal(segnale, gestore)


def al_segnale(numero, _frame):
    raise Interruzione(128 + numero)


class Sessione:
    """One invocation, in the order it goes: for each server (the one at --url, or with --avvia one
    started per --np value) ask what it is, then run the load --ripeti times (for each point, in a
    sweep), printing each run as soon as it ends; at the end the table and the files. What was
    measured is always printed and saved, whatever stops the session (a server that is down or dies,
    Ctrl+C), and the exit code is decided once, at the end, by `codice()`."""

    def __init__(self, piani: List[Piano], opzioni: Opzioni):
        self.piani, self.opzioni = piani, opzioni  # the lab: one plan; a sweep: one per point
        self.prove: List[Prova] = []
        self.errore = False  # something the user must fix stopped it, or a file could not be written
        self.interruzione: Optional[int] = None  # 130 (Ctrl+C) or 143 (SIGTERM)

    def esegui(self) -> int:
        o = self.opzioni
        try:
            for configurazione in o.np or [None]:
                if configurazione is None:
                    self.misura(None)
                    continue
                with ServerAvviato(o.avvia, configurazione, o.url, o.attesa, sys.stderr) as server:
                    self.misura(configurazione)
                    server.controlla(f"il server (-np {configurazione.etichetta}) si è fermato durante la prova")
        except ErroreUtente as exc:
            print(f"carico.py: errore: {exc}", file=sys.stderr)
            self.errore = True
        except Interruzione as exc:  # the report of a run cut short says which requests did not end
            self.interruzione = exc.codice
            print("carico.py: interrotto", file=sys.stderr)
        if self.prove:
            tabella_e_file(self)  # --tabella, --avvia, --json, --csv, --svg: see "Oltre il lab"
        return self.codice()

    def misura(self, configurazione: Optional[Configurazione]) -> None:
        """All the runs on one server: ask it what it is, then --ripeti runs of each plan, each printed
        as it ends."""
        client = Client(self.opzioni.url, self.opzioni.api_key, min(TIMEOUT_INFO, self.piani[0].timeout))
        info = interroga_server(client, self.opzioni.attesa, sys.stderr, con_props=bool(self.opzioni.file_json))
        for avviso in info.avvisi:
            nota(avviso)
        if self.opzioni.riscaldamento:  # see "Oltre il lab"
            riscalda(client, self.piani[0], self.opzioni.riscaldamento, sys.stderr)
        ripeti = self.opzioni.ripeti
        # Each run on this server gets prompts it was not sent before: a cached prompt would flatter
        # it. A new server (--avvia) starts again from the lab's first prompt.
        inviate = 0
        for j, piano in enumerate(self.piani):
            if len(self.piani) > 1:  # a sweep: see "Oltre il lab"
                print(f"punto {j + 1} di {len(self.piani)}: {descrivi_punto(piano, self.piani)}")
            for k in range(ripeti):
                macchina = osserva_macchina()
                motivo = macchina_occupata(macchina)
                if motivo:
                    print(f"carico.py: attenzione: la macchina è già occupata ({motivo}): le cifre saranno "
                          "falsate, perché il server si divide i core con gli altri processi. Chiudi i processi "
                          "pesanti e ripeti", file=sys.stderr, flush=True)
                if ripeti > 1:
                    print(f"prova {k + 1} di {ripeti}")
                print(riga_server(info), flush=True)
                # On a terminal, one line on stderr shows the run while it lasts: see "Oltre il lab".
                diretta = Diretta(sys.stderr, info.n_slot) if sys.stderr.isatty() and not self.opzioni.silenzioso else None
                esecuzione = esegui_carico(client, piano, info.slots_disponibile, info.metrics_disponibile,
                                           primo_prompt=inviate, diretta=diretta)
                inviate += esecuzione.richieste
                prova = Prova(info, esecuzione, configurazione, macchina, piano)
                self.prove.append(prova)
                self.stampa(prova)
                if esecuzione.interrotta:
                    raise Interruzione(esecuzione.interrotta)
            if ripeti > 1:
                print("\n".join(righe_ripetute(self.prove[-ripeti:]) + [""]), flush=True)

    def stampa(self, prova: Prova) -> None:
        """A run's lines, then the extras asked for: its pace, its picture, its explanation."""
        e, piano = prova.esecuzione, prova.piano
        righe = rapporto(e, piano.parallele, prova.info, piano.stream)
        if piano.ritmo or piano.durata:
            righe += righe_ritmo(prova)  # --ritmo, --durata: see "Oltre il lab"
        if self.opzioni.dettagli:
            righe += [""] + righe_dettagli(prova)
        if self.opzioni.slo:
            righe += ([] if self.opzioni.dettagli else [""]) + [riga_slo(prova, self.opzioni.slo)]
        if self.opzioni.grafico and e.risultati:
            righe += [""] + grafico(e, marche_per(sys.stdout))
        if self.opzioni.spiega:
            righe += [""] + spiegazione(prova, piano.parallele)
        if self.opzioni.avvia or self.opzioni.ripeti > 1 or len(self.piani) > 1:
            righe.append("")
        print("\n".join(righe), flush=True)
        durata = prova.riepilogo.tempo_totale
        if prova.info.slots_disponibile and durata is not None and durata < 2 * piano.intervallo:
            nota(f"la prova è durata {durata:.2f} s, meno di due letture di /slots (--intervallo "
                 f"{piano.intervallo:g}): il picco di slot occupati può essere sottostimato")
        for testo in (note_ritmo(prova) if piano.ritmo else []) + note_token(prova):
            nota(testo)

    def codice(self) -> int:
        """0 when every request was answered; 1 when one failed, the server could not be measured or a
        file not written; 128 + the signal after Ctrl+C or SIGTERM."""
        if self.interruzione:
            return self.interruzione
        if self.errore:
            return 1
        return 0 if all(r.riuscita for p in self.prove for r in p.esecuzione.risultati) else 1


# Oltre il lab #################################################################################
# Everything below is opt-in: each extra in its own section, none of it runs on a plain lab run,
# and none of it changes the lab's lines.


EPILOGO = """\
Oltre il lab, per esempio: --ripeti K ripete la prova e ne fa la media; --grafico e --svg FILE
disegnano la prova (coda, prompt, generazione, slot occupati); --json e --csv salvano ogni
richiesta; --tabella stampa la riga della tabella del consegnato; --stream misura il tempo al
primo token; --spiega legge la prova a parole; --avvia "COMANDO" --np 1,2,4 avvia il server per
ogni valore di -np e fa tutto il lab da solo (4kv = -np 4 --kv-unified):

  python3 carico.py --avvia "llama serve -m modello.gguf -c 2048 -t 3" --np 1,2,4,4kv

Se il server espone /metrics (--metrics) si aggiunge il picco di richieste in coda
(requests_deferred).

Quanto carico regge il server? --ritmo R invia R richieste al secondo (arrivi di Poisson, o
--arrivi costanti), --durata S continua per S secondi, e una lista di valori fa una prova per
valore, poi la tabella e, con --grafico o --svg, la curva di capacità (throughput e latenza):

  python3 carico.py --parallele 1,2,4,8 --grafico --spiega
  python3 carico.py --ritmo 0.5,1,2,4 --durata 30 --svg curva.svg

Ogni cifra: --dettagli aggiunge percentili di latenza, attesa in coda e (con --stream) primo token,
TPOT e ITL; --slo latenza=5,ttft=1,tpot=0.1 conta le richieste che rispettano gli obiettivi (il
goodput); --esatti fa generare a ogni richiesta esattamente --token token. Su un terminale una riga
su stderr mostra la prova mentre dura (--silenzioso la spegne).
"""


# Where a request's latency went: the server's own times #######################################

def servizio(r: Risultato) -> Optional[float]:
    """Seconds the server's slot spent on a request: its prompt_ms + predicted_ms."""
    if r.prompt_ms is None or r.predicted_ms is None:
        return None
    return (r.prompt_ms + r.predicted_ms) / 1000


def attesa_coda(r: Risultato) -> Optional[float]:
    """Latency minus the slot's time: the wait in the server's queue (plus HTTP, a few ms)."""
    s = servizio(r)
    return None if s is None else max(0.0, r.latenza - s)


# Servers that say less: /slots off, another server; /props for --json ########################

def info_da_props(client: Client, risposta_slots: Risposta, info: Optional[InfoServer]) -> InfoServer:
    """When /slots does not answer like llama.cpp (off with --no-slots, an older or another server),
    the header line comes from /props and the peak of busy slots is n/d; --json also keeps /props."""
    avvisi = []
    if info is None or not info.slots_disponibile:
        if risposta_slots.status == 501:
            avvisi.append("/slots è disattivato (server avviato con --no-slots): "
                          "il picco di slot occupati non si può misurare (n/d)")
        else:
            avvisi.append(f"/slots non risponde come llama.cpp ({descrivi_errore_http(risposta_slots)}): "
                          "il picco di slot occupati non si può misurare (n/d)")
    risposta = chiedi(client, "/props")
    props = leggi_json(risposta.corpo) if risposta.status == 200 else None
    props = props if isinstance(props, dict) else None
    if info is None and props is not None:
        impostazioni = props.get("default_generation_settings")
        n_slot, n_ctx = props.get("total_slots"), impostazioni.get("n_ctx") if isinstance(impostazioni, dict) else None
        if isinstance(n_slot, int) or isinstance(n_ctx, int):
            info = InfoServer(n_slot if isinstance(n_slot, int) else None, n_ctx if isinstance(n_ctx, int) else None,
                              False)
    if info is None:
        avvisi.append("neanche /props risponde come llama.cpp: numero di slot e contesto n/d "
                      "(il server non sembra llama.cpp)")
        info = InfoServer(None, None, False)
    return info._replace(avvisi=tuple(avvisi), props=props)


# /metrics: the server's own queue (llama serve --metrics) ####################################

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


# --stream: the time to the first token ########################################################

class ErroreNelFlusso(ErroreRichiesta):
    """The server reported an error inside a stream (`data: {"error": ...}`), or cut it short."""


class RispostaInFlusso(NamedTuple):
    """A streamed answer, read whole."""
    completamento: dict  # the chunks folded into the shape of a chat completion (choices, usage, timings)
    arrivi: List[float]  # the timer's reading when each chunk with text arrived: the first is the first token


def invia_in_flusso(client: Client, indice: int, domanda: dict, timeout: float, t0: float,
                    timer=time.perf_counter) -> Risultato:
    """`invia` for a streaming request: the same Risultato, plus the time to the first token. The
    tokens and the speed still come from the server's final usage and timings."""
    domanda = dict(domanda, stream=True, stream_options={"include_usage": True})  # usage in the last chunk
    inizio = timer() - t0
    try:
        with client.apri("POST", CHAT, domanda, timeout) as risposta:
            if risposta.status != 200:
                errore = descrivi_errore_http(Risposta(risposta.status, risposta.read()))
                return Risultato(indice, inizio, timer() - t0, errore=errore)
            letta = leggi_flusso(risposta, timer)
        fine = timer() - t0
        return Risultato(indice, inizio, fine, **cifre_completamento(letta.completamento),
                         arrivi_chunk=tuple(t - t0 - inizio for t in letta.arrivi))
    except Exception as exc:  # a worker never raises
        return fallita(client, indice, inizio, timer() - t0, exc)


def leggi_flusso(righe, timer) -> RispostaInFlusso:
    """Read the `data:` events as they come, note when each chunk with text arrived, and fold the
    chunks into one completion (the last chunks carry finish_reason, usage and timings). A chunk
    with only the role, or empty text, is not a token: the first token is the first chunk with
    content or reasoning text."""
    completamento = {"choices": [{}]}
    arrivi = []
    for riga in righe:
        riga = riga.strip()
        if not riga.startswith(b"data:"):
            continue  # blank separators and ':' keep-alives
        dato = riga[5:].strip()
        if dato == b"[DONE]":
            return RispostaInFlusso(completamento, arrivi)
        try:
            evento = json.loads(dato.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ErroreNelFlusso("evento non JSON nel flusso") from None
        if not isinstance(evento, dict):
            continue
        if isinstance(evento.get("error"), dict):
            raise ErroreNelFlusso(testo_errore(evento["error"].get("code", 200), evento["error"]))
        for scelta in evento.get("choices") or []:
            delta = scelta.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content"):
                arrivi.append(timer())
            if scelta.get("finish_reason"):
                completamento["choices"] = [{"finish_reason": scelta["finish_reason"]}]
        for chiave in ("usage", "timings"):
            if isinstance(evento.get(chiave), dict):
                completamento[chiave] = evento[chiave]
    raise ErroreNelFlusso("flusso interrotto prima della fine (manca [DONE])")


# --ritmo and --durata: requests sent by the clock ############################################

TETTO_RITMO = 256  # --ritmo without --parallele: at most this many in flight (a thread each)


def orari(piano: Piano) -> Iterator[float]:
    """When to send each request, in seconds from the start of the run. --arrivi costanti: every
    1/ritmo s. Poisson (the default): gaps drawn from an exponential distribution of mean 1/ritmo,
    as independent users arrive; the same --seme gives the same schedule."""
    import random

    if piano.arrivi == "costanti":
        yield from (i / piano.ritmo for i in itertools.count())
    caso = random.Random(piano.seme)
    t = 0.0
    while True:
        yield t
        t += caso.expovariate(piano.ritmo)


class Programma:
    """Sends a run's requests by the clock rather than all at once. With --ritmo each request has a
    planned time (open loop: a slow answer does not delay the next send); with --durata alone a new
    request leaves as soon as one of the --parallele in flight ends (closed loop), until the time is
    up. --parallele stays the cap: a request that finds it full waits for a place, and is counted."""

    def __init__(self, piano: Piano, primo_prompt: int):
        self.piano, self.primo_prompt = piano, primo_prompt
        self.trattenute = 0  # planned requests that found --parallele already in flight

    def lancia(self, futuri: list, esecutore, invio, client: Client, t0: float, timer) -> None:
        """Submit each request at its time, appending its future to `futuri`, until --richieste or
        --durata ends. Each wait runs to the planned time measured from t0, so one late send does not
        push back the ones after it: the schedule is kept on the clock."""
        piano = self.piano
        posti = threading.Semaphore(piano.parallele)
        tempi = orari(piano) if piano.ritmo else itertools.repeat(None)
        for i, previsto in enumerate(tempi):
            if i == piano.richieste or (previsto is not None and piano.durata is not None and previsto >= piano.durata):
                return
            if previsto is not None:
                time.sleep(max(0.0, t0 + previsto - timer()))
            if not posti.acquire(blocking=False):  # --parallele already in flight: wait for a place
                self.trattenute += previsto is not None
                posti.acquire()
            if piano.durata is not None and timer() - t0 >= piano.durata:
                return
            domanda = domanda_chat(prompt_per(self.primo_prompt + i, piano.testo), piano)
            futuro = esecutore.submit(self.invia, invio, client, i, domanda, previsto, t0, timer)
            futuro.add_done_callback(lambda _: posti.release())
            futuri.append(futuro)

    def invia(self, invio, client: Client, indice: int, domanda: dict, previsto: Optional[float], t0: float,
              timer) -> Risultato:
        return invio(client, indice, domanda, self.piano.timeout, t0, timer)._replace(previsto=previsto)


def ritardi_invio(e: Esecuzione) -> List[float]:
    """How late each request left against the schedule (--ritmo), in seconds."""
    return [r.inizio - r.previsto for r in e.risultati if r.previsto is not None]


def ritmo_di(tempi: List[float]) -> Optional[float]:
    """Requests per second of a list of send times: the gaps between the first and the last."""
    return (len(tempi) - 1) / (max(tempi) - min(tempi)) if len(tempi) > 1 and max(tempi) > min(tempi) else None


def ritmo_ottenuto(e: Esecuzione) -> Optional[float]:
    return ritmo_di([r.inizio for r in e.risultati])


def ms(secondi: Optional[float]) -> Optional[float]:
    return None if secondi is None else secondi * 1000


def righe_ritmo(prova: Prova) -> List[str]:
    """After the lab's summary: with --ritmo the rate asked and the one achieved, and how late the
    sends were against the schedule; with --durata how many requests were sent and answered."""
    e, piano = prova.esecuzione, prova.piano
    righe = []
    if piano.ritmo:
        arrivi = f"arrivi di Poisson, seme {piano.seme}" if piano.arrivi == "poisson" else "arrivi costanti"
        ritardi = ritardi_invio(e)
        programmato = ritmo_di([r.previsto for r in e.risultati if r.previsto is not None])
        righe.append(f"ritmo chiesto {piano.ritmo:g} req/s ({arrivi}): nel programma {fmt(programmato, '.2f')}, "
                     f"ottenuto {fmt(ritmo_ottenuto(e), '.2f req/s')}; ritardo degli invii sul programma: "
                     f"p99 {fmt(ms(percentile(ritardi, 99)), '.1f ms')}, max {fmt(ms(max(ritardi, default=None)), '.1f ms')}")
    if piano.durata:
        risposte = sum(r.riuscita for r in e.risultati)
        righe.append(f"in {piano.durata:g} s (--durata): inviate {e.richieste} richieste, {risposte} con risposta")
    return righe


def ritmo_tenuto(prova: Prova) -> bool:
    """Whether the sends kept to the schedule: none held by the cap, and the p99 lateness within
    10 ms or a tenth of the mean gap, whichever is larger."""
    p99 = percentile(ritardi_invio(prova.esecuzione), 99)
    return not prova.esecuzione.trattenute and (p99 is None or p99 <= max(0.010, 0.1 / prova.piano.ritmo))


def note_ritmo(prova: Prova) -> List[str]:
    """What stderr says when the schedule was not kept: the figures hold for the rate achieved."""
    e, piano = prova.esecuzione, prova.piano
    if ritmo_tenuto(prova):
        return []
    ottenuto = fmt(ritmo_ottenuto(e), ".2f req/s")
    if e.trattenute:
        return [f"{e.trattenute} richieste su {len(e.risultati)} hanno trovato già {piano.parallele} in volo "
                f"(il tetto di --parallele) e sono partite dopo l'orario previsto: il ritmo ottenuto è {ottenuto}, "
                f"non {piano.ritmo:g} req/s. Alza --parallele per tenere il ritmo"]
    ritardi = ritardi_invio(e)
    return [f"il client non ha tenuto il ritmo chiesto: gli invii sono partiti in ritardo sul programma (p99 "
            f"{ms(percentile(ritardi, 99)):.1f} ms, max {ms(max(ritardi)):.1f} ms): le cifre valgono per il ritmo "
            f"ottenuto, {ottenuto}, non per {piano.ritmo:g} req/s"]


# --dettagli, --slo, --esatti: every figure, exact to the token ###############################

METODO = 'statistics.quantiles(method="inclusive")'  # the one percentile method, see `percentile`
CHIAVI_SLO = {"latenza": "latenza", "ttft": "primo token", "tpot": "TPOT"}


def tpot(r: Risultato) -> Optional[float]:
    """Time per output token after the first, in seconds: (latency - first token) / (tokens - 1)."""
    if r.primo_token is None or r.token is None or r.token < 2:
        return None
    return (r.latenza - r.primo_token) / (r.token - 1)


def token_per_chunk(r: Risultato) -> Optional[float]:
    """How many tokens one chunk with text carried, on average: the server's token count (never the
    chunks) over the chunks. llama.cpp sends one token a chunk; other servers may send several."""
    if not r.arrivi_chunk or len(r.arrivi_chunk) < 2 or r.token is None or r.token < 2:
        return None
    return (r.token - 1) / (len(r.arrivi_chunk) - 1)


def itl(r: Risultato) -> List[float]:
    """The gaps between streamed tokens, in seconds: between chunks with text, each divided by the
    tokens a chunk carried when that is more than one."""
    per_chunk = token_per_chunk(r)
    if per_chunk is None:
        return []
    dividi = per_chunk if per_chunk > 1.05 else 1.0
    return [(b - a) / dividi for a, b in zip(r.arrivi_chunk, r.arrivi_chunk[1:])]


def figure(e: Esecuzione) -> Dict[str, List[float]]:
    """The values of each figure of --dettagli over the successful requests, in seconds."""
    ok = [r for r in e.risultati if r.riuscita]
    valori = {"latenza": [r.latenza for r in ok], "attesa in coda": [a for a in map(attesa_coda, ok) if a is not None]}
    if any(r.arrivi_chunk is not None for r in ok):  # --stream
        valori["primo token"] = [r.primo_token for r in ok if r.primo_token is not None]
        valori["TPOT"] = [t for t in map(tpot, ok) if t is not None]
        valori["ITL"] = [g for r in ok for g in itl(r)]
    return valori


def riassunto(valori: List[float]) -> Dict[str, Optional[float]]:
    """min, mean, p50, p90, p99, max of a figure (None when it has no values)."""
    return {"min": min(valori, default=None), "media": sum(valori) / len(valori) if valori else None,
            "p50": percentile(valori, 50), "p90": percentile(valori, 90), "p99": percentile(valori, 99),
            "max": max(valori, default=None), "n": len(valori)}


def tipo_errore(errore: str) -> str:
    """The kind of a failure, for counting: `HTTP 400 exceed_context_size_error`, or the phrase before ':'."""
    return errore.split(":")[0]


def cadenze(prova: Prova) -> Dict[str, Optional[float]]:
    """Requests, prompt tokens and generated tokens per second over the run's total time."""
    s, ok = prova.riepilogo, [r for r in prova.esecuzione.risultati if r.riuscita]
    prompt = [r.token_prompt for r in ok]
    per_secondo = (lambda n: n / s.tempo_totale) if s.tempo_totale else (lambda n: None)  # noqa: E731
    return {"richieste": per_secondo(len(ok)) if ok else None,
            "token_prompt": per_secondo(sum(prompt)) if ok and None not in prompt else None,
            "token_generati": s.throughput}


def dati_dettagli(prova: Prova, slo: Optional[Dict[str, float]] = None) -> dict:
    """What --dettagli prints, as data: always in --json."""
    from collections import Counter

    fallite = Counter(tipo_errore(r.errore) for r in prova.esecuzione.risultati if not r.riuscita)
    dati = {"metodo_percentili": METODO, "figure_s": {nome: riassunto(v) for nome, v in figure(prova.esecuzione).items()},
            "al_secondo": cadenze(prova), "fallite_per_tipo": dict(fallite), "fermate_prima_di_token": len(fermate_prima(prova)),
            "token_dalla_cache": sum(r.token_cache or 0 for r in prova.esecuzione.risultati)}
    if slo:
        dati["slo"] = dict(zip(("obiettivi", "rispettate", "quota", "goodput_richieste_s", "goodput_token_s"),
                               (slo,) + goodput(prova, slo)))
    return dati


def righe_dettagli(prova: Prova) -> List[str]:
    """--dettagli: a table of min, mean, p50, p90, p99 and max per figure, then the rates, the failures
    by kind, and what changes what throughput means."""
    d = dati_dettagli(prova)
    colonne = ("min", "media", "p50", "p90", "p99", "max")
    righe = [f"dettagli (percentili: {METODO})", f"  {'':<20}" + "".join(f"{c:>9}" for c in colonne)]
    for nome, cifre in d["figure_s"].items():
        ms_o_s = nome in ("TPOT", "ITL")  # per token: in milliseconds
        scala, formato = (1000, ".1f") if ms_o_s else (1, ".2f")
        righe.append(f"  {nome + (' (ms)' if ms_o_s else ' (s)'):<20}" + "".join(
            f"{fmt(None if cifre[c] is None else cifre[c] * scala, formato):>9}" for c in colonne))
    a = d["al_secondo"]
    righe.append(f"  richieste/s {fmt(a['richieste'], '.2f')}  token di prompt/s {fmt(a['token_prompt'], '.1f')}  "
                 f"token generati/s {fmt(a['token_generati'], '.1f')}")
    if d["fallite_per_tipo"]:
        righe.append("  fallite per tipo: " + "; ".join(f"{n} {tipo}" for tipo, n in d["fallite_per_tipo"].items()))
    divise = [r for r in prova.esecuzione.risultati if (token_per_chunk(r) or 0) > 1.05]
    if divise:
        righe.append(f"  ITL: in {len(divise)} richieste un chunk portava più token (in media "
                     f"{sum(map(token_per_chunk, divise)) / len(divise):.1f}): ogni intervallo è diviso per il loro numero")
    if d["fermate_prima_di_token"]:
        righe.append(f"  {frase_fermate(prova)}")
    return righe


def riga_slo(prova: Prova, slo: Dict[str, float]) -> str:
    rispettate, quota, al_s, token_s = goodput(prova, slo)
    obiettivi = ", ".join(f"{CHIAVI_SLO[k]} <= {v:g} s" for k, v in slo.items())
    return (f"SLO ({obiettivi}): rispettati da {rispettate} richieste su {len(prova.esecuzione.risultati)} "
            f"({fmt(quota, '.0%')}); goodput {fmt(al_s, '.2f req/s')}, {fmt(token_s, '.1f token/s')}")


def obiettivi_slo(testo: str) -> Dict[str, float]:
    """An argparse type: `latenza=5,ttft=1,tpot=0.1`, in seconds."""
    obiettivi = {}
    for voce in testo.split(","):
        chiave, uguale, valore = voce.strip().partition("=")
        if chiave not in CHIAVI_SLO or not uguale:
            raise argparse.ArgumentTypeError(f"'{voce.strip()}' non è un obiettivo: usa latenza=S, ttft=S o tpot=S "
                                             "(secondi), per esempio latenza=5,ttft=1,tpot=0.1")
        obiettivi[chiave] = positivo(float, "un numero di secondi")(valore.strip())
    return obiettivi


def goodput(prova: Prova, slo: Dict[str, float]) -> Tuple[int, Optional[float], Optional[float], Optional[float]]:
    """The requests that met every objective: how many, their share of all, and the goodput (their
    requests and their tokens per second over the run's total time), as vLLM and aiperf define it."""
    misura = {"latenza": lambda r: r.latenza, "ttft": lambda r: r.primo_token, "tpot": tpot}
    e, totale = prova.esecuzione, prova.riepilogo.tempo_totale
    buone = [r for r in e.risultati if r.riuscita and all(
        misura[k](r) is not None and misura[k](r) <= v for k, v in slo.items())]
    quota = len(buone) / len(e.risultati) if e.risultati else None
    if not totale:
        return len(buone), quota, None, None
    token = sum(r.token for r in buone) if all(r.token is not None for r in buone) else None
    return len(buone), quota, len(buone) / totale, None if token is None else token / totale


def riscalda(client: Client, piano: Piano, n: int, stderr) -> None:
    """--riscaldamento: n requests before the measured ones, with prompts of their own (so that the
    cache cannot favour a measured one), left out of every figure."""
    import concurrent.futures

    print(f"riscaldamento: {n} richieste prima della prova, escluse dalle cifre", file=stderr, flush=True)
    domande = [domanda_chat(f"(riscaldamento {i + 1}) {prompt_per(i)}", piano) for i in range(n)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(n, piano.parallele)) as esecutore:
        try:
            risultati = list(esecutore.map(lambda i: invia(client, i, domande[i], piano.timeout, 0.0), range(n)))
        except Interruzione:
            client.annulla()
            raise
    fallite = [r for r in risultati if not r.riuscita]
    if fallite:
        nota(f"riscaldamento: {len(fallite)} richieste su {n} fallite (la prima: {fallite[0].errore})")


# The live line: the run seen while it lasts, on a terminal ####################################

class Diretta:
    """One line on stderr, rewritten at each /slots sample while a run lasts, only on a terminal:
    requests done, busy slots, queue, tokens generated, speed, time. It uses the sampler's own
    readings (no extra request) and is cleared at the end, so stdout and the lab's lines stay as
    they are."""

    def __init__(self, stderr, n_slot: Optional[int]):
        self.stderr, self.n_slot = stderr, n_slot
        self._futuri: list = []
        self._piano = Piano()

    def seguendo(self, futuri: list, piano: Piano):
        """Follow the run whose requests go into `futuri`; returns what the sampler calls with each sample."""
        self._futuri, self._piano = futuri, piano
        return self.aggiorna

    def riga(self, c: Campione) -> str:
        futuri = list(self._futuri)  # one atomic copy: the sender may be adding to it
        finite = [f.result() for f in futuri if f.done() and not f.cancelled()]
        generati = sum(r.token or 0 for r in finite) + (c.in_corso or 0)
        in_coda = c.in_coda
        if in_coda is None and c.occupati is not None:  # sent (the pool sends `parallele` at a time), not in a slot
            in_coda = max(0, min(len(futuri) - len(finite), self._piano.parallele) - c.occupati)
        totale = self._piano.richieste if self._piano.richieste is not None else len(futuri)
        larghezza = len(str(totale))
        return (f"[{len(finite):>{larghezza}}/{totale}] slot occupati {fmt(c.occupati, 'd')}/{fmt(self.n_slot, 'd')}"
                f"  in coda {fmt(in_coda, 'd')}  generati {generati} token  "
                f"{generati / c.t if c.t > 0 else 0:.1f} t/s  {c.t:.1f} s")

    def aggiorna(self, c: Campione) -> None:
        try:
            colonne = os.get_terminal_size(self.stderr.fileno()).columns
        except (OSError, ValueError, AttributeError):
            colonne = 0
        colonne = colonne or 80  # a terminal that does not say its width
        self.stderr.write("\r" + self.riga(c)[:colonne - 1] + "\033[K")  # never wider than the terminal
        self.stderr.flush()

    def cancella(self) -> None:
        self.stderr.write("\r\033[K")
        self.stderr.flush()


def token_in_corso(dati) -> Optional[int]:
    """Tokens generated so far by the requests in the busy slots, from /slots' next_token[0].n_decoded."""
    slots = lista_slot(dati)
    if slots is None:
        return None
    in_corso = 0
    for slot in slots:
        prossimo = slot.get("next_token")
        if slot.get("is_processing") and isinstance(prossimo, list) and prossimo and isinstance(prossimo[0], dict):
            in_corso += intero(prossimo[0].get("n_decoded")) or 0
    return in_corso


# --ripeti and --tabella: the same load again, and the deliverable's table #####################

def righe_ripetute(prove: List[Prova]) -> List[str]:
    """--ripeti: one line per figure, mean and spread over the runs."""
    import statistics

    figure = (("latenza media", "s", lambda s: s.latenza_media), ("latenza max", "s", lambda s: s.latenza_max),
              ("throughput aggregato", "token/s", lambda s: s.throughput))
    riepiloghi = [p.riepilogo for p in prove]
    righe = [f"su {len(prove)} prove: media (deviazione standard, min-max)"]
    for nome, unita, prendi in figure:
        valori = [v for v in map(prendi, riepiloghi) if v is not None]
        if not valori:
            righe.append(f"  {nome:<21} n/d")
            continue
        deviazione = statistics.stdev(valori) if len(valori) > 1 else 0.0
        righe.append(f"  {nome:<21} {statistics.fmean(valori):7.2f} {unita:<8} (dev.std {deviazione:.2f}, "
                     f"{min(valori):.2f}-{max(valori):.2f})"
                     + ("" if len(valori) == len(prove) else f"  [{len(valori)} prove su {len(prove)}]"))
    return righe


TESTA_TABELLA = ["| np | n_ctx_slot | latenza media | latenza max | throughput |", "|---|---|---|---|---|"]


def riga_tabella(prova: Prova) -> str:
    s = prova.riepilogo
    np = prova.configurazione.etichetta if prova.configurazione else fmt(prova.info.n_slot, "d")
    return (f"| {np} | {fmt(prova.info.n_ctx_slot, 'd')} | {fmt(s.latenza_media, '.2f s')} | "
            f"{fmt(s.latenza_max, '.2f s')} | {fmt(s.throughput, '.2f token/s')} |")


# Sweeps: lists of values, the table and the capacity curve ###################################
# `--parallele 1,2,4`, `--token 32,128`, `--ritmo 0.5,1,2` (and with --avvia, `--np 1,2,4`): one run
# per combination, then one table whose columns name what varied, and the capacity curve: aggregate
# throughput against latency, one point per value, with where the server saturates.

MAX_PUNTI = 100  # a grid larger than this needs --forza
VARIABILI = ("parallele", "token", "ritmo")  # the flags that take a list, in the order they nest
ASSI = ("ritmo", "parallele", "token", "np")  # which of them is the load along a curve, first found


def griglia(base: Piano, parallele: Optional[List[int]], token: List[int], ritmo: Optional[List[float]],
            seme: Optional[int]) -> List[Piano]:
    """One plan per combination of the listed values, the last flag varying fastest. --parallele is 4
    by default; with --ritmo it is only a cap, TETTO_RITMO unless given. A Poisson schedule without
    --seme gets a seed drawn here, which is printed and saved so that the run can be repeated."""
    if ritmo is not None and seme is None and base.arrivi == "poisson":
        import random

        seme = random.SystemRandom().randrange(10 ** 6)
    if parallele is None:
        parallele = [4] if ritmo is None else [min(TETTO_RITMO, base.richieste or TETTO_RITMO)]
    return [base._replace(parallele=p, token=t, ritmo=r, seme=seme)
            for p, t, r in itertools.product(parallele, token, ritmo or [None])]


def variate(piani: List[Piano]) -> List[str]:
    """The listed flags that take more than one value among the plans."""
    return [v for v in VARIABILI if len({getattr(p, v) for p in piani}) > 1]


def descrivi_punto(piano: Piano, piani: List[Piano]) -> str:
    return "  ".join(f"{v}={getattr(piano, v):g}" for v in variate(piani))


def chiavi_griglia(sessione: Sessione) -> List[str]:
    """What varied in the session: 'np' when --avvia started several servers, then the listed flags."""
    return (["np"] if len(sessione.opzioni.np or []) > 1 else []) + variate(sessione.piani)


def valore_punto(prova: Prova, chiave: str) -> str:
    return prova.configurazione.etichetta if chiave == "np" else f"{getattr(prova.piano, chiave):g}"


def percentile(valori: List[float], p: int) -> Optional[float]:
    """The p-th percentile, by statistics.quantiles(method="inclusive"): the method used everywhere."""
    import statistics

    if len(valori) < 2:
        return valori[0] if valori else None
    return statistics.quantiles(valori, n=100, method="inclusive")[p - 1]


def latenza_p90(prova: Prova) -> Optional[float]:
    return percentile([r.latenza for r in prova.esecuzione.risultati if r.riuscita], 90)


def in_volo(e: Esecuzione) -> List[Tuple[Campione, int]]:
    """The /slots samples taken while the load ran (from the first send to the last answer), each
    with the requests in flight at its time, from the client's own times: sent, not yet answered."""
    import bisect

    inizi, fini = sorted(r.inizio for r in e.risultati), sorted(r.fine for r in e.risultati)
    if not inizi:
        return []
    return [(c, bisect.bisect_right(inizi, c.t) - bisect.bisect_right(fini, c.t))
            for c in e.campioni if inizi[0] <= c.t <= fini[-1]]


def picco_coda(prova: Prova) -> Tuple[Optional[int], str]:
    """The most requests waiting for a slot at once, and where it comes from: /metrics'
    requests_deferred, else the requests in flight minus the busy slots at each sample."""
    if prova.riepilogo.picco_coda is not None:
        return prova.riepilogo.picco_coda, "requests_deferred"
    stime = [max(0, n - c.occupati) for c, n in in_volo(prova.esecuzione) if c.occupati is not None]
    return max(stime, default=None), "stima"


def tabella_griglia(prove: List[Prova], chiavi: List[str]) -> List[str]:
    """The sweep's table: a column per value that varied, then the figures of each run."""
    testa = chiavi + (["n_ctx_slot"] if "np" in chiavi else []) + [
        "throughput", "latenza media", "latenza p90", "latenza max", "picco slot occupati", "picco coda"]
    con_ritmo = any(p.piano.ritmo for p in prove)
    if con_ritmo:
        testa.append("ritmo ottenuto")
    righe = ["| " + " | ".join(testa) + " |", "|" + "---|" * len(testa)]
    fonti = set()
    for p in prove:
        s = p.riepilogo
        coda, fonte = picco_coda(p)
        fonti.add(fonte)
        celle = [valore_punto(p, c) for c in chiavi] + ([fmt(p.info.n_ctx_slot, "d")] if "np" in chiavi else []) + [
            fmt(s.throughput, ".2f token/s"), fmt(s.latenza_media, ".2f s"), fmt(latenza_p90(p), ".2f s"),
            fmt(s.latenza_max, ".2f s"), f"{fmt(s.picco, 'd')}/{fmt(p.info.n_slot, 'd')}", fmt(coda, "d")]
        if con_ritmo:
            ottenuto = fmt(ritmo_ottenuto(p.esecuzione), ".2f req/s")
            celle.append(ottenuto if not p.piano.ritmo or ritmo_tenuto(p) else f"{ottenuto} (non tenuto)")
        righe.append("| " + " | ".join(celle) + " |")
    if "stima" in fonti:
        righe.append("picco coda: richieste in volo meno slot occupati, a ogni lettura di /slots "
                     "(con --metrics sul server: requests_deferred)")
    return righe


def serie(prove: List[Prova], chiavi: List[str]) -> Tuple[str, List[Tuple[str, List[Prova]]]]:
    """The sweep's curves: the load (`asse`: --ritmo, else --parallele, else --token) and, for each
    combination of the other values, its runs in order of load, with a title."""
    asse = next(a for a in ASSI if a in chiavi)
    gruppi: Dict[str, List[Prova]] = {}
    for p in prove:
        titolo = "  ".join(f"{c}={valore_punto(p, c)}" for c in chiavi if c != asse)
        gruppi.setdefault(titolo, []).append(p)
    carico_di = (lambda p: p.configurazione.np) if asse == "np" else (lambda p: getattr(p.piano, asse))
    return asse, [(titolo, sorted(g, key=carico_di)) for titolo, g in gruppi.items()]


def saturazione(prove: List[Prova]) -> Optional[int]:
    """The first run, along a curve, whose throughput rose by less than 10% over the run before while
    its mean latency still rose: where the server stopped taking more load."""
    for i in range(1, len(prove)):
        prima, dopo = prove[i - 1].riepilogo, prove[i].riepilogo
        if None in (prima.throughput, dopo.throughput, prima.latenza_media, dopo.latenza_media):
            continue
        if dopo.throughput < 1.1 * prima.throughput and dopo.latenza_media > prima.latenza_media:
            return i
    return None


def curva(asse: str, prove: List[Prova], titolo: str, marche: Dict[str, str], larghezza: int = 80,
          altezza: int = 12) -> List[str]:
    """The capacity curve in the terminal: aggregate throughput across, latency up; each run's mean
    latency (with its value of the load beside it) and its p90, and the saturation marked."""
    punti = [(p, p.riepilogo.throughput, p.riepilogo.latenza_media, latenza_p90(p)) for p in prove]
    punti = [(p, x, y, y90) for p, x, y, y90 in punti if x is not None and y is not None]
    if not punti:
        return [f"curva di capacità{f' ({titolo})' if titolo else ''}: nessun punto misurato"]
    colonne = larghezza - 9
    x_max = max(x for _, x, _, _ in punti) * 1.15
    y_max = max(max(y, y90 or 0) for _, _, y, y90 in punti) * 1.1
    tela = [[" "] * colonne for _ in range(altezza)]

    def metti(x: float, y: float, testo: str) -> None:
        riga = altezza - 1 - round(y / y_max * (altezza - 1))
        col = round(x / x_max * (colonne - 1))
        for k, carattere in enumerate(testo[:colonne - col]):
            tela[riga][col + k] = carattere

    satura = saturazione(prove)
    for _, x, _, y90 in punti:
        if y90 is not None:
            metti(x, y90, marche["p90"])
    for p, x, y, _ in punti:
        marca = marche["saturazione"] if satura is not None and p is prove[satura] else marche["media"]
        metti(x, y, marca + valore_punto(p, asse))
    righe = [f"curva di capacità{f' ({titolo})' if titolo else ''}: throughput aggregato e latenza, "
             f"un punto per valore di {asse}", "latenza"]
    for i, riga in enumerate(tela):
        etichetta = f"{y_max:5.2f} s" if i == 0 else ("   0 s " if i == altezza - 1 else "")
        righe.append(f"{etichetta:>7} |" + "".join(riga).rstrip())
    righe.append(f"{'':7} +" + "-" * colonne)
    righe.append(f"{'':8}0{f'{x_max:.1f} token/s':>{colonne - 1}}")
    voci = f"{marche['media']}N latenza media al valore N  {marche['p90']} latenza p90"
    righe.append(f"legenda: {voci}" + (f"  {marche['saturazione']} saturazione" if satura is not None else ""))
    if satura is not None:
        righe.append(frase_saturazione(asse, prove, satura))
    return righe


def frase_saturazione(asse: str, prove: List[Prova], i: int) -> str:
    prima, dopo = prove[i - 1], prove[i]
    a, b = prima.riepilogo, dopo.riepilogo
    return (f"saturazione a {asse}={valore_punto(dopo, asse)}: da {asse}={valore_punto(prima, asse)} il throughput "
            f"è passato da {a.throughput:.1f} a {b.throughput:.1f} token/s ({b.throughput / a.throughput - 1:+.1%}, "
            f"meno del +10%), la latenza media da {a.latenza_media:.2f} a {b.latenza_media:.2f} s "
            f"({b.latenza_media / a.latenza_media - 1:+.0%})")


def svg_curva(asse: str, gruppi: List[Tuple[str, List[Prova]]], y: int, larghezza: int = 760) -> Tuple[List[str], int]:
    """The capacity curve as SVG elements from height y: one line of mean latency and one of p90 per
    curve, each point labelled with its value of the load, the saturation ringed. Returns the
    elements and the height below them."""
    sinistra, destra, alto = 70, 20, 260
    tutti = [p for _, g in gruppi for p in g if p.riepilogo.throughput is not None and p.riepilogo.latenza_media is not None]
    if not tutti:
        return [], y
    x_max = max(p.riepilogo.throughput for p in tutti) * 1.15
    y_max = max(max(p.riepilogo.latenza_media, latenza_p90(p) or 0) for p in tutti) * 1.1
    base = y + 24 + alto
    px = lambda v: sinistra + v / x_max * (larghezza - sinistra - destra)  # noqa: E731
    py = lambda v: base - v / y_max * alto  # noqa: E731
    parti = [f'<text x="{sinistra}" y="{y + 12}" font-weight="bold">curva di capacità: throughput aggregato e '
             f'latenza, un punto per valore di {asse}</text>',
             f'<line x1="{sinistra}" y1="{base}" x2="{larghezza - destra}" y2="{base}" stroke="#333"/>',
             f'<line x1="{sinistra}" y1="{base}" x2="{sinistra}" y2="{base - alto}" stroke="#333"/>',
             f'<text x="{sinistra - 4}" y="{base - alto + 10}" text-anchor="end">{y_max:.2f} s</text>',
             f'<text x="{sinistra - 4}" y="{base}" text-anchor="end">0 s</text>',
             f'<text x="{larghezza - destra}" y="{base + 16}" text-anchor="end">{x_max:.1f} token/s</text>',
             f'<text x="{sinistra}" y="{base + 16}">0</text>',
             f'<text x="{(sinistra + larghezza - destra) / 2}" y="{base + 16}" text-anchor="middle">throughput aggregato'
             '</text>',
             f'<text x="{sinistra - 4}" y="{base - alto / 2}" text-anchor="end">latenza</text>']
    colori = ("#264653", "#2a9d8f", "#e76f51", "#6a4c93", "#f4a261", "#8d99ae")
    for n, (titolo, prove) in enumerate(gruppi):
        colore = colori[n % len(colori)]
        prove = [p for p in prove if p in tutti]
        medie = [(px(p.riepilogo.throughput), py(p.riepilogo.latenza_media)) for p in prove]
        p90 = [(px(p.riepilogo.throughput), py(latenza_p90(p))) for p in prove if latenza_p90(p) is not None]
        parti.append(f'<polyline fill="none" stroke="{colore}" stroke-width="2" points="'
                     + " ".join(f"{a:.1f},{b:.1f}" for a, b in medie) + '"/>')
        parti.append(f'<polyline fill="none" stroke="{colore}" stroke-dasharray="4 3" points="'
                     + " ".join(f"{a:.1f},{b:.1f}" for a, b in p90) + '"/>')
        satura = saturazione(prove)
        for a, b in p90:
            parti.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="white" stroke="{colore}"/>')
        for i, (p, (a, b)) in enumerate(zip(prove, medie)):
            cifre = (f"{asse}={valore_punto(p, asse)}: {p.riepilogo.throughput:.1f} token/s, latenza media "
                     f"{p.riepilogo.latenza_media:.2f} s, p90 {fmt(latenza_p90(p), '.2f s')}, picco slot "
                     f"{fmt(p.riepilogo.picco, 'd')}, picco coda {fmt(picco_coda(p)[0], 'd')}")
            parti.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="4" fill="{colore}"><title>{testo_xml(cifre)}</title></circle>')
            parti.append(f'<text x="{a + (12 if i == satura else 7):.1f}" y="{b + 4:.1f}" fill="{colore}">'
                         f'{valore_punto(p, asse)}</text>')
            if i == satura:
                parti.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="9" fill="none" stroke="#e63946" stroke-width="2"/>')
                parti.append(f'<text x="{a - 13:.1f}" y="{b + 4:.1f}" text-anchor="end" fill="#e63946">saturazione</text>')
        if titolo:
            parti.append(f'<text x="{larghezza - destra}" y="{y + 40 + 16 * n}" text-anchor="end" fill="{colore}">'
                         f'{testo_xml(titolo)}</text>')
    y = base + 36
    parti.append(f'<text x="{sinistra}" y="{y}">linea piena: latenza media; tratteggio: latenza p90; '
                 f'a ogni punto il valore di {asse}</text>')
    return parti, y + 20


def spiegazione_griglia(asse: str, gruppi: List[Tuple[str, List[Prova]]]) -> List[str]:
    """--spiega on a sweep: where saturation came and why, from the figures; then Little's law,
    checked on every run."""
    frasi = []
    for titolo, prove in gruppi:
        dove = f" ({titolo})" if titolo else ""
        misurate = [p for p in prove if p.riepilogo.throughput is not None]
        if len(misurate) < 2:
            continue
        i = saturazione(prove)
        if i is None:
            a, b = misurate[0], misurate[-1]
            frasi.append(f"Curva{dove}: nessuna saturazione fino a {asse}={valore_punto(b, asse)} (il throughput è "
                         f"passato da {a.riepilogo.throughput:.1f} a {b.riepilogo.throughput:.1f} token/s): a ogni passo "
                         "è cresciuto almeno del 10%, o la latenza non è salita. Per trovarla, prova valori più grandi.")
            continue
        frasi.append(f"Curva{dove}: " + frase_saturazione(asse, prove, i) + ". " + perche_satura(prove[i - 1], prove[i]))
    for titolo, prove in gruppi if asse == "ritmo" else []:
        # Open loop: a server slower than the arrivals has a queue that grows for the whole run.
        for p in prove:
            arrivate, s = ritmo_ottenuto(p.esecuzione), p.riepilogo
            if arrivate and s.tempo_totale and s.riuscite / s.tempo_totale < 0.9 * arrivate:
                frasi.append(f"A ritmo={valore_punto(p, asse)}{f' ({titolo})' if titolo else ''} il server ha "
                             f"completato {s.riuscite / s.tempo_totale:.2f} richieste al secondo mentre ne arrivavano "
                             f"{arrivate:.2f}: è più lento degli arrivi, e la coda cresce finché dura la prova "
                             "(sovraccarico): la latenza dipende allora da quanto è lunga la prova.")
                break
    little = [r for r in (riga_little(p, asse) for _, prove in gruppi for p in prove) if r]
    if little:
        frasi.append("Legge di Little: le richieste in volo in media (contate a ogni lettura di /slots) devono "
                     "valere richieste al secondo × latenza media; con poche letture la media è grossolana.")
    return frasi + little


def perche_satura(prima: Prova, dopo: Prova) -> str:
    """Why the run `dopo` took no more than `prima`, from the figures: either the slots were all busy
    and the queue grew, or each request had a slot and every slot went slower (the cores are shared)."""
    coda_prima, coda = picco_coda(prima)[0], picco_coda(dopo)[0]
    s, n_slot = dopo.riepilogo, dopo.info.n_slot
    occupati = f"picco {fmt(s.picco, 'd')} su {fmt(n_slot, 'd')}"
    # The queue grew when the mean wait for a slot (from the server's own times) grew by more than a
    # tenth of the latency; without those times, when its peak grew.
    attese = [[a for a in map(attesa_coda, p.esecuzione.risultati) if a is not None] for p in (prima, dopo)]
    medie = [sum(a) / len(a) for a in attese] if all(attese) else None
    if medie is not None and s.latenza_media is not None:
        cresciuta = medie[1] - medie[0] > 0.1 * s.latenza_media
    else:
        cresciuta = coda is not None and coda > (coda_prima or 0)
    pieni = s.picco is not None and n_slot is not None and s.picco >= n_slot
    if cresciuta:
        frase = (f"Lì gli slot erano tutti occupati ({occupati}) e " if pieni else f"Lì ({occupati}) ") + (
            f"la coda è cresciuta fino a {fmt(coda, 'd')} richieste (prima {fmt(coda_prima, 'd')})")
        if medie is not None:
            frase += f"; l'attesa media in coda è passata da {medie[0]:.2f} a {medie[1]:.2f} s"
        return frase + ": una richiesta in più non trova uno slot libero e aspetta."
    velocita = [[r.tps for r in p.esecuzione.risultati if r.riuscita and r.tps is not None] for p in (prima, dopo)]
    frase = f"La coda non è cresciuta ({fmt(coda, 'd')} in attesa al massimo; {occupati})"
    if all(velocita):
        da, a = (sum(v) / len(v) for v in velocita)
        if a < 0.9 * da:
            return (frase + f", ma nel proprio slot ogni richiesta è scesa da {da:.1f} a {a:.1f} t/s: gli slot si "
                    "dividono gli stessi core, e la macchina non genera più token al secondo.")
    return frase + "."


def riga_little(prova: Prova, asse: str) -> Optional[str]:
    """Little's law on one run: the mean in flight at the samples against throughput (req/s) × mean latency."""
    s = prova.riepilogo
    letture = in_volo(prova.esecuzione)
    if not letture or not s.riuscite or not s.tempo_totale or s.latenza_media is None:
        return None
    media_in_volo = sum(n for _, n in letture) / len(letture)
    al_secondo = s.riuscite / s.tempo_totale
    attesa = al_secondo * s.latenza_media
    riga = (f"  {asse}={valore_punto(prova, asse)}: in volo {media_in_volo:.2f} su {len(letture)} letture; "
            f"{al_secondo:.2f} req/s × {s.latenza_media:.2f} s = {attesa:.2f} (scarto {media_in_volo / attesa - 1:+.0%})")
    server = [c.occupati + c.in_coda for c, _ in letture if c.occupati is not None and c.in_coda is not None]
    if server:
        riga += f"; il server ne contava {sum(server) / len(server):.2f} (slot occupati + in coda)"
    return riga


# The picture: --grafico (terminal) and --svg ##################################################

MARCHE_UNICODE = {"coda": "░", "prompt": "▒", "generazione": "█", "errore": "×", "ignoto": "▬",
                  "media": "●", "p90": "+", "saturazione": "◆"}  # the last three: the capacity curve
MARCHE_ASCII = {"coda": ".", "prompt": "-", "generazione": "#", "errore": "x", "ignoto": "=",
                "media": "o", "p90": "+", "saturazione": "*"}
LEGENDA = (("coda", "in coda"), ("prompt", "prompt"), ("generazione", "generazione"),
           ("errore", "fallita"), ("ignoto", "dettagli n/d"))


def fasi(r: Risultato) -> List[Tuple[str, float, float]]:
    """(phase, start, end) of a request: queue wait, prompt, generation, from the server's own
    times laid back from the answer's arrival. Without timings the whole span is 'ignoto'."""
    if not r.riuscita:
        return [("errore", r.inizio, r.fine)]
    if servizio(r) is None:
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


def svg(prove: List[Prova], curve: Optional[Tuple[str, List[Tuple[str, List[Prova]]]]] = None,
        chiavi: Sequence[str] = ()) -> str:
    """The same picture as a standalone SVG, one panel per run, for the deliverable; a sweep's
    capacity curve (`curve`: the load and the curves, from `serie`) comes first, and each panel
    says its point (`chiavi`: what varied)."""
    larghezza, sinistra, riga, destra = 760, 70, 18, 20
    pannelli, y = [], 10
    if curve is not None:
        pannelli, y = svg_curva(*curve, y, larghezza)
    for prova in prove:
        e = prova.esecuzione
        durata = max([r.fine for r in e.risultati] + [c.t for c in e.campioni] + [1e-9])
        scala = (larghezza - sinistra - destra) / durata
        titolo = riga_server(prova.info) + (f"  (-np {prova.configurazione.etichetta})" if prova.configurazione else "")
        titolo += "".join(f"  {c}={valore_punto(prova, c)}" for c in chiavi if c != "np")
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


# --json and --csv: every request in a file ###################################################

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


CAMPI_CSV = ("prova", "np", "parallele", "max_token", "ritmo", "indice", "token_prompt", "token_cache", "token",
             "latenza_s", "attesa_coda_s", "prompt_ms", "predicted_ms", "t_s_nel_slot", "primo_token_s", "tpot_s",
             "finish_reason", "errore", "inizio_s", "previsto_s", "ritardo_invio_s")


def riga_dati(r: Risultato) -> dict:
    return {"indice": r.indice, "token_prompt": r.token_prompt, "token": r.token, "latenza_s": r.latenza,
            "attesa_coda_s": attesa_coda(r), "prompt_ms": r.prompt_ms, "predicted_ms": r.predicted_ms,
            "t_s_nel_slot": r.tps, "primo_token_s": r.primo_token, "finish_reason": r.finish_reason,
            "errore": r.errore, "inizio_s": r.inizio, "fine_s": r.fine, "previsto_s": r.previsto,
            "ritardo_invio_s": None if r.previsto is None else r.inizio - r.previsto, "token_cache": r.token_cache,
            "tpot_s": tpot(r), "chunk_s": r.arrivi_chunk}


def testo_csv(prove: List[Prova]) -> str:
    import csv
    import io

    uscita = io.StringIO()
    scrittore = csv.DictWriter(uscita, CAMPI_CSV, extrasaction="ignore", lineterminator="\n")
    scrittore.writeheader()
    for numero, prova in enumerate(prove, 1):
        np = prova.configurazione.etichetta if prova.configurazione else prova.info.n_slot
        for r in prova.esecuzione.risultati:
            scrittore.writerow({"prova": numero, "np": np, "parallele": prova.piano.parallele,
                                "max_token": prova.piano.token, "ritmo": prova.piano.ritmo, **riga_dati(r)})
    return uscita.getvalue()


def testo_json(prove: List[Prova], piani: List[Piano], url: str, slo: Optional[Dict[str, float]] = None) -> str:
    """Every request, the /slots samples with their times, the server's props and the flags
    (never the API key), for plotting; in a sweep, every point with the values it was run at."""
    senza_testo = lambda piano: {k: v for k, v in piano._asdict().items() if k != "testo"}  # noqa: E731
    dati = {
        "carico": __version__, "url": url,
        "opzioni": senza_testo(piani[0]),
        "griglia": {v: sorted({getattr(p, v) for p in piani}) for v in variate(piani)},
        "prompt_file": piani[0].testo is not None,
        "prove": [{
            "np": p.configurazione.etichetta if p.configurazione else None,
            "piano": senza_testo(p.piano),
            "punto": {v: getattr(p.piano, v) for v in variate(piani)},
            "latenza_p90_s": latenza_p90(p),
            "dettagli": dati_dettagli(p, slo),
            "picco_coda": dict(zip(("valore", "fonte"), picco_coda(p))),
            "invii": {"ritmo_ottenuto_req_s": ritmo_ottenuto(p.esecuzione),
                      "ritardo_p99_s": percentile(ritardi_invio(p.esecuzione), 99),
                      "ritardo_max_s": max(ritardi_invio(p.esecuzione), default=None),
                      "trattenute_dal_tetto": p.esecuzione.trattenute,
                      "inviate": p.esecuzione.richieste} if p.piano.ritmo or p.piano.durata else None,
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

def descrivi_macchina(m: Macchina) -> str:
    parti = [f"{m.core} core"]
    if m.carico_medio is not None:
        parti.append(f"carico medio {m.carico_medio:.1f}")
    if m.cpu_occupata is not None:
        parti.append(f"CPU occupata al {m.cpu_occupata:.0%} prima della prova")
    return ", ".join(parti)


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
    if info.n_slot is not None and s.picco is not None:
        servite = "è stata servita" if s.picco == 1 else "sono state servite"
        partite = (f"Sono partite {min(parallele, e.richieste)} richieste insieme" if not prova.piano.ritmo else
                   f"Sono partite {e.richieste} richieste, {fmt(ritmo_ottenuto(e), '.2f')} al secondo,")
        frasi.append(f"{partite} e il server aveva {info.n_slot} slot: al massimo {s.picco} {servite} nello "
                     "stesso momento.")
    attese = [(attesa_coda(r), r) for r in ok if attesa_coda(r) is not None]
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
        import statistics

        media_slot = statistics.fmean(velocita)
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
    if fermate_prima(prova):
        frasi.append(frase_fermate(prova)[0].upper() + frase_fermate(prova)[1:] + ".")
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


# At the end of a session: the deliverable's table and the files ##############################

def tabella_e_file(sessione: Sessione) -> None:
    """The table (the deliverable's, or a sweep's with its curve and its explanation), then the files:
    written even after an error or an interruption."""
    o, prove = sessione.opzioni, sessione.prove
    curve, chiavi = None, []
    if variate(sessione.piani):
        chiavi = chiavi_griglia(sessione)
        curve = serie(prove, chiavi)
        righe = tabella_griglia(prove, chiavi)
        if o.grafico:
            for titolo, gruppo in curve[1]:
                righe += [""] + curva(curve[0], gruppo, titolo, marche_per(sys.stdout))
        if o.spiega:
            righe += [""] + spiegazione_griglia(*curve)
        print("\n".join(righe), flush=True)
    elif o.tabella or o.avvia:
        separa = [] if o.avvia or o.ripeti > 1 else [""]
        print("\n".join(separa + TESTA_TABELLA + [riga_tabella(p) for p in prove]), flush=True)
    file = [(o.file_json, lambda: testo_json(prove, sessione.piani, o.url, o.slo)),
            (o.file_csv, lambda: testo_csv(prove)), (o.file_svg, lambda: svg(prove, curve, chiavi))]
    for percorso, testo in file:
        if percorso:
            try:
                scrivi_file(percorso, testo())
            except OSError as exc:
                print(f"carico.py: errore: non riesco a scrivere '{percorso}': {exc.strerror or exc}",
                      file=sys.stderr)
                sessione.errore = True


# --avvia: the whole lab in one command ########################################################

class Configurazione(NamedTuple):
    """One server of a sweep: -np N, with or without --kv-unified."""
    np: int
    kv_unificata: bool = False

    @property
    def etichetta(self) -> str:
        return f"{self.np} kv" if self.kv_unificata else str(self.np)

    def argomenti(self) -> List[str]:
        return ["-np", str(self.np)] + (["--kv-unified"] if self.kv_unificata else [])


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
    """The server's command without -np, host and port, which carico.py adds itself."""
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


class ServerAvviato:
    """`COMMAND -np N --host H --port P`, started and waited for; always stopped on exit (success,
    error, Ctrl+C, a server that dies), with the tail of its log shown when it fails."""

    def __init__(self, comando: List[str], configurazione: Configurazione, url: str, attesa: float, stderr):
        parti = urllib.parse.urlsplit(url)
        self.argomenti = comando + configurazione.argomenti() + [
            "--host", parti.hostname, "--port", str(parti.port or 80)]
        self.configurazione, self.url, self.attesa, self.stderr = configurazione, url, attesa, stderr
        self.log = None  # its stdout and stderr, in a temporary file created when it starts
        self.proc = None  # subprocess.Popen

    def __enter__(self) -> ServerAvviato:
        try:
            self._avvia()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _avvia(self) -> None:
        """Refuse a port where a server already answers, start the command in its own session, then
        wait for /health while watching the process."""
        import shlex
        import subprocess
        import tempfile

        client = Client(self.url, timeout_info=2.0)
        try:
            client.chiama("GET", "/health")
            raise ErroreUtente(f"su {self.url} risponde già un server: fermalo, o scegli un'altra porta con --url")
        except ErroreRete:
            pass  # nothing there: the port is ours
        print(f"avvio: {shlex.join(self.argomenti)}", file=self.stderr, flush=True)
        self.log = tempfile.NamedTemporaryFile(prefix="carico-server-", suffix=".log", delete=False)
        if os.name == "posix":
            # Its own session: the terminal's Ctrl+C reaches carico.py, which stops the server itself.
            gruppo = dict(start_new_session=True, preexec_fn=muori_con_il_padre)
        else:
            gruppo = dict(creationflags=subprocess.CREATE_NEW_PROCESS_GROUP)
        try:
            self.proc = subprocess.Popen(self.argomenti, stdin=subprocess.DEVNULL, stdout=self.log,
                                         stderr=subprocess.STDOUT, **gruppo)
        except OSError as exc:
            raise ErroreUtente(f"non riesco ad avviare '{self.argomenti[0]}': {exc.strerror or exc}") from None
        aspetta_pronto(client, self.attesa, self.stderr, avviato=self)

    def controlla(self, quando: str) -> None:
        """An ErroreUtente with the tail of its log if the server has exited; `quando` says what happened."""
        if self.proc is not None and self.proc.poll() is not None:
            raise ErroreUtente(f"{quando} (codice {self.proc.returncode}); ultime righe del suo log:\n"
                               f"{self.coda_log()}")

    def coda_log(self, righe: int = 15) -> str:
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return "".join("  | " + r for r in f.readlines()[-righe:]).rstrip()

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
            if self.log is not None:
                self.log.close()
                with contextlib.suppress(OSError):
                    os.unlink(self.log.name)


def muori_con_il_padre():
    """In the started server: Linux sends it SIGTERM if carico.py dies, even by SIGKILL."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


# Plumbing #####################################################################################
# What a student does not need to read: the Italian phrases for what went wrong, signals, argparse
# in Italian, the help's width, writing a file safely.

def nota(testo: str) -> None:
    print(f"carico.py: nota: {testo}", file=sys.stderr, flush=True)


def descrivi_errore_rete(exc: Exception, timeout: float) -> str:
    """One Italian phrase for a failed exchange; never the exception's repr (no tracebacks)."""
    import http.client

    if isinstance(exc, socket.timeout):
        return f"nessuna risposta entro {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return "connessione rifiutata (nessun server in ascolto)"
    if isinstance(exc, socket.gaierror):
        return "host sconosciuto"
    if isinstance(exc, http.client.IncompleteRead):
        return "risposta troncata: la connessione si è chiusa a metà"
    if isinstance(exc, (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected)):
        return "connessione chiusa dal server prima della risposta"
    if isinstance(exc, http.client.HTTPException):
        return f"risposta HTTP non valida ({type(exc).__name__})"
    if isinstance(exc, OSError) and exc.strerror:
        return f"errore di rete: {exc.strerror}"
    return f"errore di rete: {type(exc).__name__}"


def testo_errore(status: int, errore: dict) -> str:
    """`HTTP 400 exceed_context_size_error: request (...)` from an error object {code, message, type}."""
    testo = f"HTTP {status}"
    if errore.get("type"):
        testo += f" {errore['type']}"
    if errore.get("message"):
        testo += f": {errore['message']}"
    return testo


def descrivi_errore_http(risposta: Risposta) -> str:
    """An answer that is not 200, from llama.cpp's error body {"error": {"code", "message", "type"}};
    for another body, its first words."""
    dati = leggi_json(risposta.corpo)
    errore = dati.get("error") if isinstance(dati, dict) else None
    if isinstance(errore, dict):
        return testo_errore(risposta.status, errore)
    if isinstance(errore, str):
        return f"HTTP {risposta.status}: {errore}"
    estratto = " ".join(risposta.corpo[:200].decode("utf-8", "replace").split())
    return f"HTTP {risposta.status}" + (f": {estratto[:80]}" if estratto else "")


def messaggio_chiave(client: Client) -> str:
    if client.con_chiave:
        return (f"il server su {client.base} ha rifiutato la chiave API (HTTP 401): "
                "controlla --api-key o la variabile LLAMA_API_KEY")
    return (f"il server su {client.base} richiede una chiave API (è stato avviato con --api-key): "
            "passala con --api-key CHIAVE o con la variabile LLAMA_API_KEY")


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

def chiave_api(testo: str) -> str:
    # Checked here, so that a key that cannot go in a header never reaches one (nor an error message).
    if not testo or not all(33 <= ord(c) < 127 for c in testo):
        raise argparse.ArgumentTypeError("la chiave API deve essere fatta di caratteri ASCII stampabili, senza spazi")
    return testo


class ParserItaliano(argparse.ArgumentParser):
    """argparse with its few English words said in Italian: `uso:` for `usage:`, and its error
    messages translated whole, so that a phrase is never half in one language."""

    ERRORI = (("expected one argument", "richiede un valore"),
              ("ignored explicit argument (.*)", r"non accetta valori (\1)"),
              ("expected at most one argument", "accetta al più un valore"),
              ("invalid choice: (.*)", r"scelta non valida: \1"),
              ("unrecognized arguments: (.*)", r"opzioni non riconosciute: \1"),
              ("ambiguous option: (\\S+) could match (.*)", r"opzione ambigua: \1 potrebbe essere \2"),
              ("the following arguments are required: (.*)", r"mancano le opzioni: \1"))

    def error(self, message):
        import re

        opzione = re.match(r"argument (\S+): (.*)$", message, re.S)
        prefisso, resto = (f"opzione {opzione.group(1)}: ", opzione.group(2)) if opzione else ("", message)
        for inglese, italiano in self.ERRORI:
            tradotto, n = re.subn(f"^{inglese}$", italiano, resto, flags=re.S)
            if n:
                resto = tradotto
                break
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: errore: {prefisso}{resto}\n")

    def format_usage(self):
        return super().format_usage().replace("usage: ", "uso: ", 1)

    def format_help(self):
        return super().format_help().replace("usage: ", "uso: ", 1)


def formato_aiuto(prog: str) -> argparse.HelpFormatter:
    # The width given here, so that argparse does not import shutil (5 ms of start-up) to ask it.
    try:
        larghezza = os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        larghezza = int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else 80
    return argparse.RawDescriptionHelpFormatter(prog, width=max(larghezza, 40) - 2)


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
        with contextlib.suppress(OSError):
            os.unlink(provvisorio)
        raise


if __name__ == "__main__":
    sys.exit(main())
