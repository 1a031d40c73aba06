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

Codici di uscita: 0 tutto bene; 1 server non raggiungibile o almeno una richiesta fallita;
2 opzioni sbagliate; 130 interrotto con Ctrl+C (143 con SIGTERM): si stampa comunque quello che
era già stato misurato.
"""

import argparse
import concurrent.futures
import dataclasses
import http.client
import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import urllib.parse
from typing import List, Optional, Sequence

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

@dataclasses.dataclass(frozen=True)
class Risposta:
    status: int
    corpo: bytes
    tipo: str  # Content-Type


class ErroreRete(Exception):
    """A request that got no HTTP answer; the message is Italian and ready to print."""


ANNULLATA = "annullata (interruzione)"  # the error of a request closed by Ctrl+C or SIGTERM


class Client:
    """Talks to one server. It never follows redirects (http.client does not) and keeps the
    connections in flight in a set, so that `annulla()` can close them from another thread:
    that is how Ctrl+C stops requests blocked in a read without leaving a thread behind."""

    def __init__(self, base: str, api_key: Optional[str] = None, timeout_info: float = TIMEOUT_INFO):
        parti = urllib.parse.urlsplit(base)
        self.timeout_info = timeout_info  # for everything but the chat requests
        self.base = base
        self._https = parti.scheme == "https"
        self._host = parti.hostname or ""
        self._porta = parti.port or (443 if self._https else 80)
        self._api_key = api_key
        self._aperte = set()
        self._lock = threading.Lock()
        self.annullato = threading.Event()

    def annulla(self) -> None:
        self.annullato.set()
        with self._lock:
            aperte = list(self._aperte)
        for conn in aperte:
            sock = conn.sock
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def chiama(self, metodo: str, percorso: str, dati=None, timeout: Optional[float] = None) -> Risposta:
        timeout = self.timeout_info if timeout is None else timeout
        classe = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = classe(self._host, self._porta, timeout=timeout)
        intestazioni = {"Accept": "application/json"}
        corpo = None
        if dati is not None:
            corpo = json.dumps(dati).encode("utf-8")
            intestazioni["Content-Type"] = "application/json"
        if self._api_key:
            intestazioni["Authorization"] = "Bearer " + self._api_key
        with self._lock:
            self._aperte.add(conn)
        try:
            try:
                conn.connect()
                if self.annullato.is_set():
                    raise ErroreRete(ANNULLATA)
                conn.request(metodo, percorso, body=corpo, headers=intestazioni)
                risposta = conn.getresponse()
                contenuto = risposta.read()
                return Risposta(risposta.status, contenuto, risposta.getheader("Content-Type", ""))
            except ErroreRete:
                raise
            except Exception as exc:
                if self.annullato.is_set():
                    raise ErroreRete(ANNULLATA) from None
                raise ErroreRete(descrivi_errore_rete(exc, timeout)) from None
        finally:
            with self._lock:
                self._aperte.discard(conn)
            conn.close()


def descrivi_errore_rete(exc: Exception, timeout: float) -> str:
    """One Italian phrase for a failed exchange; never the exception's repr (no tracebacks)."""
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


def leggi_json(risposta: Risposta):
    """The body as JSON, or None when it is not JSON."""
    try:
        return json.loads(risposta.corpo.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def descrivi_errore_http(risposta: Risposta) -> str:
    """`HTTP 400 exceed_context_size_error: request (...) exceeds ...`, from llama.cpp's error body
    {"error": {"code", "message", "type"}}; for another body, its first words."""
    testo = f"HTTP {risposta.status}"
    dati = leggi_json(risposta)
    errore = dati.get("error") if isinstance(dati, dict) else None
    if isinstance(errore, dict):
        tipo, messaggio = errore.get("type"), errore.get("message")
        if tipo:
            testo += f" {tipo}"
        if messaggio:
            testo += f": {messaggio}"
        return testo
    if isinstance(errore, str):
        return f"{testo}: {errore}"
    estratto = " ".join(risposta.corpo[:200].decode("utf-8", "replace").split())
    if estratto:
        testo += f": {estratto[:80]}"
    return testo


# What the server says about itself ############################################################

@dataclasses.dataclass(frozen=True)
class InfoServer:
    n_slot: Optional[int]
    n_ctx_slot: Optional[int]
    slots_disponibile: bool  # /slots answers, so the peak of busy slots can be sampled
    avvisi: tuple = ()  # Italian lines for stderr: what could not be seen


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


def messaggio_chiave(client: Client, con_chiave: bool) -> str:
    if con_chiave:
        return (f"il server su {client.base} ha rifiutato la chiave API (HTTP 401): "
                "controlla --api-key o la variabile LLAMA_API_KEY")
    return (f"il server su {client.base} richiede una chiave API (è stato avviato con --api-key): "
            "passala con --api-key CHIAVE o con la variabile LLAMA_API_KEY")


def chiedi(client: Client, percorso: str, attesa: float, stderr, timer=time.monotonic) -> Risposta:
    """GET a path before the load. While the server answers 503 (model still loading) ask again
    every second, saying so once, up to `attesa` seconds. A server that is down is an ErroreUtente."""
    inizio = timer()
    avvisato = False
    while True:
        try:
            risposta = client.chiama("GET", percorso)
        except ErroreRete as exc:
            raise ErroreUtente(f"nessuna risposta dal server {client.base}: {exc}. "
                               "Avvia il server (llama serve ...) o correggi --url, poi riprova") from None
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


def interroga_server(client: Client, attesa: float, stderr) -> InfoServer:
    """Before any load: is the server there and ready, and how many slots of what context."""
    chiedi(client, "/health", attesa, stderr)
    risposta = chiedi(client, "/slots", attesa, stderr)
    if risposta.status == 401:
        raise ErroreUtente(messaggio_chiave(client, bool(client._api_key)))
    info = info_da_slots(leggi_json(risposta)) if risposta.status == 200 else None
    if info is not None and info.slots_disponibile:
        return info
    avvisi = []
    if risposta.status == 501:
        avvisi.append("/slots è disattivato (server avviato con --no-slots): "
                      "il picco di slot occupati non si può misurare (n/d)")
    else:
        avvisi.append(f"/slots non risponde come llama.cpp ({descrivi_errore_http(risposta)}): "
                      "il picco di slot occupati non si può misurare (n/d)")
    if info is None:
        props = chiedi(client, "/props", attesa, stderr)
        if props.status == 401:
            raise ErroreUtente(messaggio_chiave(client, bool(client._api_key)))
        info = info_da_props(leggi_json(props)) if props.status == 200 else None
        if info is None:
            avvisi.append("neanche /props risponde come llama.cpp: numero di slot e contesto n/d "
                          "(il server non sembra llama.cpp)")
            info = InfoServer(None, None, False)
    return dataclasses.replace(info, slots_disponibile=False, avvisi=tuple(avvisi))


# The load: requests and the /slots sampler ####################################################

@dataclasses.dataclass(frozen=True)
class Risultato:
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

    @property
    def latenza(self) -> float:
        return self.fine - self.inizio

    @property
    def riuscita(self) -> bool:
        return self.errore is None


@dataclasses.dataclass(frozen=True)
class Campione:
    t: float  # seconds from the start of the run
    occupati: Optional[int]  # busy slots, None when that sample failed


def prompt_per(indice: int, testo: Optional[str] = None) -> str:
    """Request i's prompt: the lab's i-th, and past 8 the same ones behind a number, so that they
    stay distinct and share at most a digit of prefix."""
    if testo is not None:
        return testo
    base = PROMPTS[indice % len(PROMPTS)]
    return base if indice < len(PROMPTS) else f"{indice}. {base}"


def corpo_richiesta(prompt: str, token: int) -> dict:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": token,
        # Thinking off, so that every generated token is answer (ignored by models without it).
        "chat_template_kwargs": {"enable_thinking": False},
    }


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


def invia(client: Client, indice: int, prompt: str, token: int, timeout: float, t0: float,
          timer=time.perf_counter) -> Risultato:
    """One request, timed from send to full answer. Never raises: a failure is a Risultato with
    its error text, so that one bad request does not stop the others."""
    inizio = timer() - t0
    try:
        risposta = client.chiama("POST", "/v1/chat/completions", corpo_richiesta(prompt, token), timeout)
        fine = timer() - t0
        if risposta.status != 200:
            return Risultato(indice, inizio, fine, errore=descrivi_errore_http(risposta))
        dati = leggi_json(risposta)
        if dati is None:
            return Risultato(indice, inizio, fine, errore="risposta non JSON dal server")
        return Risultato(indice, inizio, fine, **leggi_completamento(dati))
    except ErroreRete as exc:
        return Risultato(indice, inizio, timer() - t0, errore=str(exc))
    except Exception as exc:  # a worker never raises
        return Risultato(indice, inizio, timer() - t0, errore=f"risposta non valida: {exc}")


class Campionatore:
    """Reads /slots every `intervallo` seconds in a background thread, on a fixed schedule (the
    time a read takes does not stretch the period). A failed read is kept as a gap, not a zero."""

    def __init__(self, client: Client, intervallo: float, t0: float, timer=time.perf_counter):
        self.campioni: List[Campione] = []
        self._client, self._intervallo, self._t0, self._timer = client, intervallo, t0, timer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ciclo, name="campionatore-slots", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _ciclo(self) -> None:
        prossimo = self._timer()
        while True:
            t = self._timer() - self._t0
            try:
                risposta = self._client.chiama("GET", "/slots")
                occupati = conta_occupati(leggi_json(risposta)) if risposta.status == 200 else None
            except ErroreRete:
                occupati = None
            self.campioni.append(Campione(t, occupati))
            prossimo += self._intervallo
            if self._stop.wait(max(0.0, prossimo - self._timer())):
                return


@dataclasses.dataclass(frozen=True)
class Esecuzione:
    risultati: List[Risultato]  # in request order; those never sent are missing
    campioni: List[Campione]
    richieste: int
    interrotta: Optional[int] = None  # exit code when Ctrl+C/SIGTERM stopped it


def esegui_carico(client: Client, richieste: int, parallele: int, token: int, timeout: float,
                  intervallo: float, campiona: bool, testo: Optional[str] = None,
                  timer=time.perf_counter) -> Esecuzione:
    """Fire the requests, all submitted at once to `parallele` workers, while /slots is sampled.
    On Ctrl+C or SIGTERM the requests in flight are closed and the ones not sent are cancelled."""
    t0 = timer()
    risultati = {}
    interrotta = None
    campionatore = Campionatore(client, intervallo, t0, timer) if campiona else None
    esecutore = concurrent.futures.ThreadPoolExecutor(max_workers=parallele, thread_name_prefix="richiesta")
    try:
        if campionatore:
            campionatore.__enter__()
        futuri = {esecutore.submit(invia, client, i, prompt_per(i, testo), token, timeout, t0, timer): i
                  for i in range(richieste)}
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
    return Esecuzione(ordinati, campionatore.campioni if campionatore else [], richieste, interrotta)


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


# The report: pure formatting, data -> str #####################################################

@dataclasses.dataclass(frozen=True)
class Riepilogo:
    riuscite: int
    fallite: int
    non_completate: int
    tempo_totale: Optional[float]
    latenza_media: Optional[float]
    latenza_max: Optional[float]
    token: Optional[int]  # None when some successful answer did not say how many
    throughput: Optional[float]
    picco: Optional[int]


def riassumi(esecuzione: Esecuzione) -> Riepilogo:
    """Mean and max latency over the successful requests; total time from the first submit (t=0)
    to the last successful answer; aggregate throughput = their tokens / total time."""
    ok = [r for r in esecuzione.risultati if r.riuscita]
    fallite = len(esecuzione.risultati) - len(ok)
    latenze = [r.latenza for r in ok]
    totale = max((r.fine for r in ok), default=None)
    token = sum(r.token for r in ok) if ok and all(r.token is not None for r in ok) else None
    throughput = token / totale if token is not None and totale else None
    letti = [c.occupati for c in esecuzione.campioni if c.occupati is not None]
    return Riepilogo(len(ok), fallite, esecuzione.richieste - len(esecuzione.risultati), totale,
                     statistics.mean(latenze) if latenze else None, max(latenze, default=None),
                     token, throughput, max(letti, default=None))


def fmt(valore, formato: str) -> str:
    return ND if valore is None else format(valore, formato)


def riga_server(info: InfoServer) -> str:
    return f"server: {fmt(info.n_slot, 'd')} slot, n_ctx per slot = {fmt(info.n_ctx_slot, 'd')}"


def riga_richiesta(r: Risultato, larghezza: int = 1) -> str:
    testa = f"  req {r.indice:>{larghezza}}: {r.latenza:6.2f} s"
    if not r.riuscita:
        return f"{testa}   errore: {r.errore}"
    return f"{testa} {fmt(r.token, 'd'):>4} token  ({fmt(r.tps, '.1f')} t/s nel proprio slot)"


def righe_riepilogo(s: Riepilogo, richieste: int, parallele: int, info: InfoServer) -> List[str]:
    righe = [
        f"richieste={richieste} parallele={parallele} slot={fmt(info.n_slot, 'd')}"
        f"  picco slot occupati insieme={fmt(s.picco, 'd')}",
        f"tempo totale {fmt(s.tempo_totale, '.2f')} s  |  latenza media {fmt(s.latenza_media, '.2f')} s,"
        f" max {fmt(s.latenza_max, '.2f')} s",
        f"throughput aggregato {fmt(s.throughput, '.2f')} token/s  ({fmt(s.token, 'd')} token generati)",
    ]
    if s.fallite:
        righe.append(f"richieste fallite: {s.fallite} su {richieste}" + {
            0: " (nessuna riuscita: niente da riassumere)", 1: " (il riepilogo conta solo 1 riuscita)"
        }.get(s.riuscite, f" (il riepilogo conta solo le {s.riuscite} riuscite)"))
    if s.non_completate:
        righe.append(f"richieste non completate: {s.non_completate} su {richieste} (interrotto)")
    return righe


def rapporto(esecuzione: Esecuzione, parallele: int, info: InfoServer) -> List[str]:
    """The lab's lines after the header: one per request, a blank line, the summary. After an
    interruption the requests that did not end get a line that says so."""
    larghezza = len(str(max(esecuzione.richieste - 1, 0)))
    per_indice = {r.indice: r for r in esecuzione.risultati}
    righe = []
    for i in range(esecuzione.richieste):
        if i in per_indice:
            righe.append(riga_richiesta(per_indice[i], larghezza))
        elif esecuzione.interrotta:
            righe.append(f"  req {i:>{larghezza}}: non completata (interrotto)")
    righe.append("")
    righe += righe_riepilogo(riassumi(esecuzione), esecuzione.richieste, parallele, info)
    return righe


# Command line #################################################################################

def intero_positivo(testo: str) -> int:
    try:
        valore = int(testo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{testo}' non è un numero intero") from None
    if valore < 1:
        raise argparse.ArgumentTypeError(f"deve essere almeno 1, non {valore}")
    return valore


def secondi_positivi(testo: str) -> float:
    try:
        valore = float(testo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{testo}' non è un numero di secondi") from None
    if not valore > 0 or valore == float("inf"):
        raise argparse.ArgumentTypeError(f"deve essere maggiore di 0, non {testo}")
    return valore


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
    # Checked here so that http.client never raises with the key inside its message.
    if not testo or not all(33 <= ord(c) < 127 for c in testo):
        raise argparse.ArgumentTypeError("la chiave API deve essere fatta di caratteri ASCII stampabili, senza spazi")
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


def analizza_argomenti(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = _Parser(prog="carico.py", description=__doc__, add_help=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser._optionals.title = "opzioni"
    parser.add_argument("-h", "--help", action="help", help="mostra questo aiuto ed esce")
    parser.add_argument("--version", action="version", version=f"carico.py {__version__}",
                        help="mostra la versione ed esce")
    parser.add_argument("--url", type=url_server, default="http://127.0.0.1:8080",
                        help="radice del server llama.cpp (default: %(default)s)")
    parser.add_argument("--richieste", type=intero_positivo, default=4,
                        help="quante richieste inviare in tutto (default: %(default)s)")
    parser.add_argument("--parallele", type=intero_positivo, default=4,
                        help="quante richieste tenere in volo insieme (default: %(default)s)")
    parser.add_argument("--token", type=intero_positivo, default=32,
                        help="token da generare per richiesta, max_tokens (default: %(default)s)")
    parser.add_argument("--prompt-file", metavar="FILE",
                        help="manda il testo di FILE come prompt di ogni richiesta (il passo 4 del lab)")
    parser.add_argument("--api-key", type=chiave_api, metavar="CHIAVE", default=None,
                        help="chiave API del server (--api-key di llama serve); "
                             "se manca si usa la variabile LLAMA_API_KEY. Non viene mai stampata")
    parser.add_argument("--timeout", type=secondi_positivi, default=TIMEOUT_RICHIESTA, metavar="S",
                        help="secondi massimi di attesa di una risposta, coda compresa (default: %(default)g)")
    parser.add_argument("--intervallo", type=secondi_positivi, default=0.5, metavar="S",
                        help="ogni quanti secondi leggere /slots (default: %(default)g)")
    parser.add_argument("--attesa", type=secondi_positivi, default=ATTESA_CARICAMENTO, metavar="S",
                        help="per quanti secondi aspettare un server che sta ancora caricando il modello "
                             "(default: %(default)g)")
    argomenti = parser.parse_args(argv)
    if argomenti.api_key is None and os.environ.get("LLAMA_API_KEY"):
        try:
            argomenti.api_key = chiave_api(os.environ["LLAMA_API_KEY"])
        except argparse.ArgumentTypeError as exc:
            parser.error(f"LLAMA_API_KEY: {exc}")
    if argomenti.prompt_file is not None:
        try:
            with open(argomenti.prompt_file, encoding="utf-8") as f:
                argomenti.testo = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"--prompt-file: non riesco a leggere '{argomenti.prompt_file}': "
                         f"{getattr(exc, 'strerror', None) or exc}")
        if not argomenti.testo:
            parser.error(f"--prompt-file: '{argomenti.prompt_file}' è vuoto")
    else:
        argomenti.testo = None
    return argomenti


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
        return _esegui(argomenti)
    except Interruzione as exc:
        print("carico.py: interrotto", file=sys.stderr)
        return exc.codice
    except ErroreUtente as exc:
        print(f"carico.py: errore: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader went away (`| head -1`): no noise, and no second error when Python flushes.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        for segnale, gestore in precedenti.items():
            signal.signal(segnale, gestore)


def _esegui(argomenti: argparse.Namespace) -> int:
    client = Client(argomenti.url, argomenti.api_key, min(TIMEOUT_INFO, argomenti.timeout))
    info = interroga_server(client, argomenti.attesa, sys.stderr)
    for avviso in info.avvisi:
        print(f"carico.py: nota: {avviso}", file=sys.stderr)
    print(riga_server(info), flush=True)
    esecuzione = esegui_carico(client, argomenti.richieste, argomenti.parallele, argomenti.token,
                               argomenti.timeout, argomenti.intervallo, info.slots_disponibile,
                               argomenti.testo)
    for riga in rapporto(esecuzione, argomenti.parallele, info):
        print(riga)
    sys.stdout.flush()
    durata = riassumi(esecuzione).tempo_totale
    if info.slots_disponibile and durata is not None and durata < 2 * argomenti.intervallo:
        print(f"carico.py: nota: la prova è durata {durata:.2f} s, meno di due letture di /slots "
              f"(--intervallo {argomenti.intervallo:g}): il picco di slot occupati può essere sottostimato",
              file=sys.stderr)
    if esecuzione.interrotta:
        print(f"carico.py: interrotto: {len(esecuzione.risultati)} richieste su {esecuzione.richieste} "
              "completate, le altre annullate", file=sys.stderr)
        return esecuzione.interrotta
    return 0 if all(r.riuscita for r in esecuzione.risultati) else 1


if __name__ == "__main__":
    sys.exit(main())
