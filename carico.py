#!/usr/bin/env python3
"""carico.py: genera carico su un server llama.cpp (Lab 04-03, "Carico e parallelismo").

Invia N richieste di chat insieme (ThreadPoolExecutor) a `llama serve` e
intanto legge /slots ogni 0,5 s; alla fine stampa, per ogni richiesta,
latenza, token generati e velocità nel proprio slot, poi il riepilogo: il
picco di slot occupati insieme, il tempo totale, la latenza media e massima,
il throughput aggregato.

Esempio (il lab):

  llama serve -hf ggml-org/Qwen3.5-0.8B-GGUF --host 127.0.0.1 --port 8080 -c 2048 -np 1 -t 3 -a qwen-0.8b
  python3 carico.py --url http://127.0.0.1:8080 --richieste 4 --parallele 4 --token 32

Ogni richiesta ha un prompt diverso e chiede al server di non usare la cache
dei prompt (cache_prompt: false), così nessuna prova, neanche ripetuta, ne
esce avvantaggiata; il "thinking" è spento, così i token generati sono tutti
risposta.

Codici di uscita: 0 tutto bene; 1 una richiesta fallita, un server assente, che smette
di rispondere o che non sa fare un'opzione (--prompt-token...), un file non scritto;
2 un'opzione sbagliata; 3 --turni: contesto esaurito e nient'altro fallito; 130 Ctrl+C,
143 SIGTERM (quanto misurato è stampato e salvato); 141 chi legge l'uscita la chiude (| head).
"""

# How to read this file: first the lab, in the order its data flows: 1. one request, 2. the /slots
# sampler, 3. the pool, 4. the summary and the report's lines, 5. one run in the order it prints, 6. the
# records, 7. small formatters and the peak from the server's timings, 8. main; then what a careful tool
# needs (HTTP, errors, signals, a busy machine, the notes, the flags). After the `# Oltre il lab` banner, the
# extras: they fill parameters and Sessione hooks whose default is the lab's code, keep their records in
# each record's `oltre` slot, and are named by the chapter only where a line says `seam` (six: SessioneOltre,
# Diretta, info_da_props, Sentinella, righe_server_andato, ParserItaliano).

from __future__ import annotations

import argparse, contextlib, errno, itertools, json, os, signal, socket, sys, threading, time, urllib.parse
from typing import Dict, Generator, Iterator, List, NamedTuple, Optional, Sequence, Tuple, Union

__version__ = "1.11.0"

# The eight prompts of the lab, one per request. Each opens with different words, so two requests
# share no prefix beyond the chat template's.
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
ND = "n/d"  # what the lab's lines show for a figure that was not measured


# 1. One request ###################################################################################

def prompt_per(indice: int) -> str:
    """Request i's prompt: the lab's i-th; past the eighth, the same behind a number."""
    base = PROMPTS[indice % len(PROMPTS)]
    return base if indice < len(PROMPTS) else f"{indice}. {base}"


def domanda_chat(prompt: str, piano: Piano) -> dict:
    """The JSON body one request POSTs to /v1/chat/completions."""
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": piano.max_token,
        # Thinking off, so that every generated token is answer (ignored by models without it).
        "chat_template_kwargs": {"enable_thinking": False},
        # No prompt cache, neither the slot's nor the one in the server's RAM: a rerun of the same
        # prompts computes them again, and is never flattered by the run before.
        "cache_prompt": False,
    }


def scambio_http(client: Client, metodo: str, percorso: str, dati=None, timeout: Optional[float] = None) -> Risposta:
    """One HTTP exchange on its own connection, `dati` as the JSON body: status and body within `timeout`."""
    corpo = None if dati is None else json.dumps(dati).encode("utf-8")
    with client.connessione(percorso, timeout) as (connessione, risposta_entro):
        connessione.request(metodo, percorso, corpo, client.intestazioni(corpo))
        return risposta_entro()


def invia(client: Client, indice: int, domanda: dict, timeout: float, t0: float, cifre=None) -> Risultato:
    """POST one request, timed from send to whole answer; never raises (a failure: a Risultato with its error)."""
    inizio = time.perf_counter() - t0
    try:
        risposta = scambio_http(client, "POST", CHAT, domanda, timeout)
        fine = time.perf_counter() - t0
        if risposta.status != 200:
            return Risultato(indice, inizio, fine, errore=descrivi_errore_http(risposta))
        return Risultato(indice, inizio, fine, **(cifre or cifre_completamento)(leggi_json(risposta.corpo)))
    except Exception as exc:  # a worker never raises
        return fallita(client, indice, inizio, time.perf_counter() - t0, exc)


# 2. The /slots sampler ############################################################################

def conta_occupati(dati) -> Optional[int]:
    """Busy slots in a /slots answer: `is_processing` true (this server), or `state` not 0 (older ones)."""
    slots = lista_slot(dati)
    if slots is None or not all("is_processing" in s or isinstance(s.get("state"), int) for s in slots):
        return None
    return sum(bool(s["is_processing"]) if "is_processing" in s else s["state"] != 0 for s in slots)


class Campionatore:
    """Reads /slots (and /metrics) every `intervallo` s in a thread, on a fixed schedule; a failure: a gap."""

    def __init__(self, client: Client, intervallo: float, info: InfoServer, al_campione=None, timer=time.perf_counter):
        self.campioni: List[Campione] = []
        self._client, self._intervallo, self._timer, self._info = client, intervallo, timer, info
        self._al_campione, self._t0, self._stop = al_campione, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._ciclo, name="campionatore", daemon=True)

    def avvia(self, t0: float) -> None:
        self._t0 = t0
        self._thread.start()

    def ferma(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _ciclo(self) -> None:
        prossimo = self._timer()
        legge = self._info.slots_disponibile or self._info.metrics_disponibile
        while True:
            dati = self._leggi("/slots", leggi_json) if self._info.slots_disponibile else None
            in_coda = self._leggi("/metrics", richieste_in_coda) if self._info.metrics_disponibile else None
            if not legge:  # nothing to read: only whether the server is still there (see Sentinella)
                self._leggi("/health", leggi_json)
            # The sample's time is when the answers arrived: what they say is the state then.
            campione = Campione(self._timer() - self._t0, conta_occupati(dati), in_coda)
            if self._al_campione is not None:  # on a terminal, the live line (the extras add each slot's context)
                campione = self._al_campione(campione, dati)
            if legge:
                self.campioni.append(campione)
            prossimo += self._intervallo
            adesso = self._timer()
            if prossimo < adesso:  # a reading that took periods: the next one now, the missed ones not made up
                prossimo += (adesso - prossimo) // self._intervallo * self._intervallo
            if self._stop.wait(max(0.0, prossimo - adesso)):
                return

    def _leggi(self, percorso: str, interpreta):
        try:  # a reading that hangs (a server stopped with it in flight) is a gap after a few periods, not 10 s
            risposta = self._client.chiama("GET", percorso, timeout=min(self._client.timeout_info,
                                                                         max(2.0, 4 * self._intervallo)))
        except ErroreRete:
            return None
        return interpreta(risposta.corpo) if risposta.status == 200 else None


# 3. The pool that fires the requests ##############################################################

class Lancio:
    """How the requests leave, the lab's way: all at once, `parallele` at a time (the extras': LancioOltre)."""
    oltre = None  # what an extra's way measured beside the requests (Esecuzione.oltre)

    def __init__(self, client: Client, piano: Piano, primo_prompt: int = 0):
        self.client, self.piano = client, piano
        self.domande = [domanda_chat(prompt_per(primo_prompt + i), piano) for i in range(piano.richieste)]

    def prepara(self, esecutore, futuri: list) -> None:
        """Before the clock: the workers started, so that it starts on threads that exist."""
        avvia_i_lavoratori(esecutore, min(self.piano.parallele, len(self.domande)))

    def lancia(self, futuri: list, esecutore, t0: float) -> None:
        for i, domanda in enumerate(self.domande):  # all submitted now: the pool runs `parallele` at a time
            futuri.append(esecutore.submit(invia, self.client, i, domanda, self.piano.timeout, t0))

    def ferma(self) -> None:
        """After the run, or a Ctrl+C before the clock: nothing left to stop."""


def esegui_carico(client: Client, piano: Piano, info: InfoServer, osservatore=None, lancio=None) -> Esecuzione:
    """Fire the requests while /slots is sampled; the clock starts at the first."""
    import concurrent.futures  # here: --help answers at once, and a run loads only what it uses
    lancio = lancio or Lancio(client, piano)
    futuri = []  # each request's future, in the order they were submitted
    campionatore = Campionatore(client, piano.intervallo, info, osservatore and osservatore.seguendo(futuri, piano))
    esecutore = concurrent.futures.ThreadPoolExecutor(max_workers=piano.parallele, thread_name_prefix="richiesta")
    with Chiusura(client, lancio, esecutore, campionatore, osservatore) as chiusura:  # Ctrl+C, SIGTERM: see there
        lancio.prepara(esecutore, futuri)
        t0 = chiusura.t0 = time.perf_counter()
        campionatore.avvia(t0)
        lancio.lancia(futuri, esecutore, t0)
        concurrent.futures.wait(futuri)
    # What an interruption closed is not a measurement: keep only the requests that ended by themselves.
    finite = sorted((f.result() for f in futuri if not f.cancelled()), key=lambda r: r.indice)
    return Esecuzione([r for r in finite if r.errore not in (ANNULLATA, NON_INVIATA)], campionatore.campioni,
                      len(futuri) if piano.richieste is None else piano.richieste, oltre=lancio.oltre,
                      lasciate=sum(r.errore == ANNULLATA for r in finite), **chiusura.esito)


# 4. The summary, and the report it prints #########################################################

def riassumi(esecuzione: Esecuzione, n_slot: Optional[int] = None) -> Riepilogo:
    """Mean and max latency over the successful requests; total time from the first request (t = 0) to
    the last answer; aggregate throughput = tokens generated / total time; the peaks of slots and queue."""
    ok = esecuzione.riuscite
    latenze = [r.latenza for r in ok]
    totale = max((r.fine for r in esecuzione.risultati), default=None)
    # Every request refused with an HTTP 4xx (the lab's step 4): none reached a slot's work, 0 is exact.
    rifiutate = len(esecuzione.risultati) == esecuzione.n_richieste > 0 and all(
        (r.errore or "").startswith("HTTP 4") for r in esecuzione.risultati)
    token = sum(r.token for r in ok) if (ok or rifiutate) and all(r.token is not None for r in ok) else None
    occupati = [c.occupati for c in esecuzione.campioni if c.occupati is not None]
    in_coda = [c.in_coda for c in esecuzione.campioni if c.in_coda is not None]
    # The peak: the most slots busy together, as one /slots reading saw it or as the server's timings
    # prove it, whichever is larger (Riepilogo.picco). Readings every 0.5 s miss a run shorter than a
    # second (on a GPU, every lab run); the timings do not: each answer says how long its slot spent on
    # it (prompt_ms + predicted_ms), so it was in its slot from `fine` minus that to `fine`.
    dai_tempi = (0, None) if rifiutate else picchi_dai_tempi(ok, n_slot)
    return Riepilogo(n_riuscite=len(ok), n_fallite=len(esecuzione.risultati) - len(ok),
                     non_completate=esecuzione.n_richieste - len(esecuzione.risultati), tempo_totale=totale,
                     latenza_media=media(latenze), latenza_max=max(latenze, default=None), token=token,
                     throughput=token / totale if token is not None and totale else None,
                     occupati_letti=max(occupati, default=None), occupati_dai_tempi=dai_tempi[0],
                     coda_letta=max(in_coda, default=None), coda_dai_tempi=dai_tempi[1],
                     interrotta_a=esecuzione.interrotta_a)


def rapporto(prova: Prova, riga=None, s: Optional[Riepilogo] = None, parallele: Optional[str] = None) -> List[str]:
    """The lab's lines after `server:`: one per request, a blank line, the summary (the extras give `s`...)."""
    e, riga, s = prova.esecuzione, riga or riga_richiesta, s or prova.riepilogo
    larghezza = len(str(max(e.n_richieste - 1, 0)))
    per_indice = {r.indice: r for r in e.risultati}
    righe, tagliate = [], tagliate_dal_contesto(prova)
    for i in range(e.n_richieste):
        if i in per_indice and not (e.server_andato and rifiutata(per_indice[i])):
            righe.append(riga(per_indice[i], larghezza) + segno_tagliata(per_indice[i], tagliate))
        elif i not in per_indice and e.interruzione:
            righe.append(f"  req {i:>{larghezza}}: non completata (interrotto)")
    parallele = parallele or str(prova.piano.parallele)
    if e.server_andato:  # seam: refused, unsent, why (righe_server_andato, after the banner)
        return righe + righe_server_andato(prova, larghezza, parallele, s)
    return righe + [""] + righe_riepilogo(s, e.n_richieste, parallele, prova.info) + riga_tagliate(prova)


def riga_server(info: InfoServer) -> str:
    return f"server: {fmt(info.n_slot, 'd')} slot, n_ctx per slot = {fmt(info.n_ctx_slot, 'd')}"


def riga_richiesta(r: Risultato, larghezza: int = 1, stima: str = "") -> str:  # stima: --stream's ~
    inizio_riga = f"  req {r.indice:>{larghezza}}: {r.latenza:6.2f} s"
    if not r.riuscita:
        return f"{inizio_riga}   errore: {r.errore}"
    return f"{inizio_riga} {stima + fmt(r.token, 'd'):>4} token  ({fmt(r.tps, '.1f')} t/s nel proprio slot)"


def righe_riepilogo(s: Riepilogo, richieste: int, parallele: str, info: InfoServer,
                    perche_non_completate: str = "interrotto") -> List[str]:
    """The summary: the sheet's three lines, the queue's peak where /metrics answers, then what did not succeed."""
    stima = "~" if s.token_stimati and s.token is not None else ""  # --stream without usage: a token a chunk
    righe = [
        f"richieste={richieste} parallele={parallele} slot={fmt(info.n_slot, 'd')}"
        f"  picco slot occupati insieme={fmt(s.picco, 'd')}",
        f"tempo totale {fmt(s.tempo_totale, '.2f s')}{fino_a(s)}  |  latenza media {fmt(s.latenza_media, '.2f s')},"
        f" max {fmt(s.latenza_max, '.2f s')}",
        f"throughput aggregato {stima}{fmt(s.throughput, '.2f token/s')}  ({generati(s, stima)})",
    ]
    if info.metrics_disponibile:  # the sheet's variant: "what does llamacpp:requests_deferred say?"
        fonte = "requests_deferred" if (s.coda_letta or 0) >= (s.coda_dai_tempi or 0) else "dai tempi del server"
        righe.append(f"picco richieste in coda ({fonte})={fmt(s.picco_coda, 'd')}")
    return righe + righe_non_riuscite(s, richieste, perche_non_completate)


def nota(testo: str) -> None:
    print(f"carico.py: nota: {testo}", file=sys.stderr, flush=True)


# 5. One run, in the order it prints ###############################################################

class Sessione:
    """One invocation: ask the server, run, print what was measured whatever stops it; `codice()`: the exit."""

    def __init__(self, piani: List[Piano], opzioni: Opzioni):
        self.piani, self.opzioni = piani, opzioni  # the lab: one plan; a sweep: one per point
        self.prove: List[Prova] = []
        self.codice_errore = 0  # the exit code when something the user must fix stopped it, or a file was not written
        self.arresto: Optional[int] = None  # stopped early: 130 (Ctrl+C), 143 (SIGTERM), 141 (stdout closed)

    def prova(self, client: Client, info: InfoServer, piano: Piano, configurazione: object = None) -> Prova:
        """One run, in the order it prints: the `server:` line, the load (the live line), the report, its notes."""
        occupati_prima = guarda_il_server(client, info)  # the lab asks for a quiet machine: is it?
        macchina = guarda_la_macchina(bool(occupati_prima))
        self.stampa_server(info)  # stdout: riga_server, at once
        esecuzione = esegui_carico(client, piano, info, self.osservatore(client, info), self.lancio(client, piano))
        prova = Prova(info, esecuzione, piano, configurazione, macchina, occupati_prima)
        self.prove.append(prova)  # before printing: a closed stdout must not lose it
        print("\n".join(self.rapporto(prova)), flush=True)  # stdout: rapporto(prova), the lines after `server:`
        for testo in self.note(prova):  # then the notes, on stderr
            nota(testo)
        prova = self.prove[-1] = guarda_dopo(prova)  # the machine again, just after
        self.dopo_la_prova(prova)
        if esecuzione.interruzione:  # Ctrl+C, SIGTERM: the session ends here (exit 130, 143)
            raise Interruzione(esecuzione.interruzione)
        if esecuzione.server_andato:  # exit 1
            raise ServerAndato(f"il server {client.base} ha smesso di rispondere durante la prova: controlla che "
                               "cosa l'ha fermato, riavvialo e ripeti la prova")
        return prova

    def esegui(self) -> int:
        try:
            self.corri()
        except ErroreUtente as exc:
            print(f"carico.py: errore: {exc}", file=sys.stderr)
            self.codice_errore = exc.codice
        except Interruzione as exc:  # the report of a run cut short says which requests did not end
            self.arresto = exc.codice
            print("carico.py: interrotto", file=sys.stderr)
        except BrokenPipeError:  # the reader went away (| head): stop; the files are still written
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            self.arresto = 141
        self.alla_fine()
        return self.codice()

    def corri(self) -> None:
        self.prova(*self.collega(), self.piani[0])

    def collega(self, url: Optional[str] = None) -> Tuple[Client, InfoServer]:
        client = Client(url or self.opzioni.url, self.opzioni.api_key, min(TIMEOUT_INFO, self.piani[0].timeout))
        info = interroga_server(client, self.opzioni.attesa_pronto, sys.stderr, self.con_props)
        for avviso in info.avvisi:
            nota(avviso)
        return client, info

    def codice(self) -> int:
        """0: every request answered; 1: one failed, or no server, or a file not written; 128 + a signal (2, 3: below)."""
        fallite = [r for p in self.prove for r in p.esecuzione.risultati if not r.riuscita]
        return self.arresto or self.codice_errore or (self.codice_fallite(fallite) if fallite else 0)

    # The hooks: what the lab does at these points; a session with extras does more.
    con_props = False  # /props asked even when /slots answers (--json keeps it)

    def osservatore(self, client: Client, info: InfoServer):
        """Who watches a run while it lasts: on a terminal, the live line (seam: class Diretta, after the banner)."""
        return Diretta(sys.stderr, info.n_slot, client.sentinella) if sys.stderr.isatty() else None

    def lancio(self, client: Client, piano: Piano) -> Lancio:
        return Lancio(client, piano)

    def stampa_server(self, info: InfoServer) -> None:
        print(riga_server(info), flush=True)

    def rapporto(self, prova: Prova) -> List[str]:
        return rapporto(prova)

    def note(self, prova: Prova) -> List[str]:
        return note(prova)

    def dopo_la_prova(self, prova: Prova) -> None:
        """After a run's lines: in the lab, nothing more."""

    def alla_fine(self) -> None:
        """After the runs, whatever stopped them: in the lab, nothing more."""

    def codice_fallite(self, fallite: List[Risultato]) -> int:
        return 1


# 6. The records they pass #########################################################################
# Piano (what to send) -> Risultato (one request) + Campione (one /slots reading) -> Esecuzione (the
# run) -> Prova (the run and its server) -> Riepilogo (its summary). `oltre`: the extras' slot.

# Timeouts, in seconds. Every network call has one, so that nothing can hang the tool.
TIMEOUT_INFO = 10.0  # /health, /slots, /props: the server answers them between two decode steps
TIMEOUT_RICHIESTA = 300.0  # one whole answer: it may wait in the server's queue behind the others
ATTESA_PRONTO = 120.0  # how long to wait for a server that is still loading its model


class Piano(NamedTuple):
    richieste: Optional[int] = 4  # how many requests in all (None with --durata, --turni: as many as get sent)
    parallele: int = 4  # how many in flight together: the pool's workers
    max_token: int = 32  # each request's max_tokens (--token)
    intervallo: float = 0.5  # seconds between two readings of /slots
    timeout: float = TIMEOUT_RICHIESTA  # the longest wait for one whole answer, queue included
    oltre: object = None  # the extras' slot


class Risultato(NamedTuple):
    """One request. Times are seconds from the start of the run (time.perf_counter)."""
    indice: int
    inizio: float  # when it was sent
    fine: float  # when its whole answer had arrived, or it failed
    token: Optional[int] = None  # tokens generated, from the server's usage
    tps: Optional[float] = None  # the server's timings.predicted_per_second: the speed in its own slot
    prompt_ms: Optional[float] = None  # the server's timings.prompt_ms: its slot's time on the prompt
    predicted_ms: Optional[float] = None  # the server's timings.predicted_ms: its slot's time generating
    errore: Optional[str] = None  # why it failed, in Italian; None when it succeeded
    token_prompt: Optional[int] = None  # the prompt's tokens, from usage
    token_cache: Optional[int] = None  # timings.cache_n: prompt tokens the server took from a cache (notes)
    finish_reason: Optional[str] = None  # stop (EOS: fewer tokens than asked, notes) or length
    oltre: object = None  # the extras' slot

    @property
    def latenza(self) -> float:
        return self.fine - self.inizio

    @property
    def riuscita(self) -> bool:
        return self.errore is None


class Campione(NamedTuple):
    t: float  # seconds from the start of the run, when the answers arrived
    occupati: Optional[int]  # busy slots; None when that reading failed
    in_coda: Optional[int] = None  # llamacpp:requests_deferred: requests waiting for a free slot
    contesto: Optional[tuple] = None  # each slot's (tokens held, n_ctx): the extras read it, see "Oltre il lab"


class Esecuzione(NamedTuple):
    risultati: List[Risultato]  # in request order; those cut short by Ctrl+C are left out
    campioni: List[Campione]
    n_richieste: int  # the requests the run numbered: the plan's (with --durata, those sent)
    interruzione: Optional[int] = None  # the exit code when Ctrl+C (130) or SIGTERM (143) cut it short
    oltre: object = None  # the extras' slot
    server_andato: Optional[Tuple[float, str]] = None  # the server stopped answering: when (s from the start), why
    interrotta_a: Optional[float] = None  # with `interruzione`: when the run was stopped (s from the start)
    lasciate: int = 0  # with `interruzione`: the requests in flight it closed (the server may go on with them)

    @property
    def riuscite(self) -> List[Risultato]:
        return [r for r in self.risultati if r.riuscita]


class InfoServer(NamedTuple):
    n_slot: Optional[int]
    n_ctx_slot: Optional[int]
    slots_disponibile: bool  # /slots answers: busy slots can be read while the load runs
    metrics_disponibile: bool = False  # /metrics answers: requests_deferred can be read too
    avvisi: tuple = ()  # Italian lines for stderr: what could not be seen
    props: Optional[dict] = None  # /props as the server gave it, for --json
    kv_unificata: Optional[bool] = None  # the slots share one context (--kv-unified); None: not known (by hand)
    llama_cpp: Optional[bool] = None  # /slots or /props answered as llama.cpp's (False: another server)


class Prova(NamedTuple):
    info: InfoServer
    esecuzione: Esecuzione
    piano: Piano = Piano()
    configurazione: object = None  # --avvia: the -np the server was started with (the extras')
    macchina: Optional[Macchina] = None  # how busy the machine was just before
    occupati_prima: Optional[int] = None  # the server's slots already busy then (guarda_il_server)
    macchina_dopo: Optional[Macchina] = None  # and just after: what worked beside the server during the run

    @property
    def riepilogo(self) -> Riepilogo:
        return riassumi(self.esecuzione, self.info.n_slot)


class Riepilogo(NamedTuple):
    n_riuscite: int
    n_fallite: int
    non_completate: int
    tempo_totale: Optional[float]  # from the first send (t = 0) to the last answer, failed or not
    latenza_media: Optional[float]  # over the successful requests
    latenza_max: Optional[float]
    token: Optional[int]  # generated by the successful ones; None when one did not say how many
    throughput: Optional[float]  # token / tempo_totale
    occupati_letti: Optional[int]  # the most busy slots one /slots reading saw
    occupati_dai_tempi: Optional[int]  # the most slots the server's own timings prove busy together (0: all refused)
    coda_letta: Optional[int]  # the most requests_deferred one /metrics reading saw
    coda_dai_tempi: Optional[int]  # the most requests the timings prove waiting for a slot together
    token_stimati: bool = False  # --stream without usage: some tokens are chunks (set by the extras, as the next)
    interrotte: int = 0  # --stream: of the failed, the answers the server ended without a finish_reason
    interrotta_a: Optional[float] = None  # Ctrl+C: when the run was stopped (tempo_totale: the last answer)

    @property
    def picco(self) -> Optional[int]:  # the larger of what the readings saw and what the timings prove
        return max((v for v in (self.occupati_letti, self.occupati_dai_tempi) if v is not None), default=None)

    @property
    def picco_coda(self) -> Optional[int]:  # likewise
        return max((v for v in (self.coda_letta, self.coda_dai_tempi) if v is not None), default=None)


# 7. The report's lines (pure: data -> lines), and the peak from the server's timings ##############

def media(valori: List[float]) -> Optional[float]:
    return sum(valori) / len(valori) if valori else None


def fmt(valore, formato: str) -> str:
    """`valore` formatted, with an optional unit after the format spec ('.2f s'); n/d for None."""
    spec, _, unita = formato.partition(" ")
    return ND if valore is None else format(valore, spec) + (f" {unita}" if unita else "")


def fino_a(s: Riepilogo) -> str:
    """After the total time of a run cut short: the figures' span is not how long the run lasted."""
    return "" if s.interrotta_a is None else f" (fino all'ultima risposta; prova interrotta a {s.interrotta_a:.2f} s)"


def generati(s: Riepilogo, stima: str) -> str:
    """The throughput's tokens, and what they leave out (chunks counted for tokens, requests cut by Ctrl+C)."""
    testo = f"{stima}{fmt(s.token, 'd')} token generati" + (": stima, un token per chunk con testo" if stima else "")
    if s.interrotta_a is not None and s.token is not None:  # nor all the run generated
        testo += ", solo dalle richieste completate: un limite inferiore"
    return testo


def righe_non_riuscite(s: Riepilogo, richieste: int, perche_non_completate: str) -> List[str]:
    righe = []
    if s.n_fallite:
        righe.append(f"richieste fallite: {s.n_fallite} su {richieste}" + {
            0: " (nessuna riuscita: niente da riassumere)", 1: " (il riepilogo conta solo 1 riuscita)"
        }.get(s.n_riuscite, f" (il riepilogo conta solo le {s.n_riuscite} riuscite)"))
    if s.interrotte:  # --stream: answers the server cut short are not latencies
        righe.append(f"  di cui interrotte dal server a metà risposta: {s.interrotte} (nessun chunk con "
                     "finish_reason: fuori da latenze e throughput)")
    if s.non_completate:
        righe.append(f"richieste non completate: {s.non_completate} su {richieste} ({perche_non_completate})")
    return righe


# The peak from the server's timings (see riassumi): each request in its slot, and waiting before it.
MARGINE = 0.02  # seconds trimmed from each end of those intervals: the client reads an answer a little late


def servizio(r: Risultato) -> Optional[float]:
    return None if r.prompt_ms is None or r.predicted_ms is None else (r.prompt_ms + r.predicted_ms) / 1000


def in_slot(r: Risultato) -> Optional[Tuple[float, float]]:
    """When the server's slot worked on a request, from its timings (never before it was sent)."""
    tempo = servizio(r)
    return None if tempo is None else (max(r.inizio, r.fine - tempo), r.fine)


def accorcia(estremi: Optional[Tuple[float, float]]) -> Optional[Tuple[float, float]]:
    """An interval read from the timings, MARGINE inside each end (a quarter of it, if it is short)."""
    if estremi is None or estremi[1] <= estremi[0]:
        return None
    margine = min(MARGINE, (estremi[1] - estremi[0]) / 4)
    return estremi[0] + margine, estremi[1] - margine


def gradini(nello_slot: list, in_attesa: list = ()) -> List[Tuple[float, float, int, int]]:
    """(from, to, in a slot, waiting) at each change of the counts; at one instant, closing first."""
    eventi = sorted((t, passo, tipo) for tipo, intervalli in enumerate((nello_slot, in_attesa))
                    for da, a in filter(None, intervalli) for t, passo in ((da, 1), (a, -1)))
    aperti = [0, 0]  # in a slot, waiting
    scalini = []
    for (t, passo, tipo), (dopo, _, _) in zip(eventi, eventi[1:]):
        aperti[tipo] += passo
        if dopo > t:
            scalini.append((t, dopo, *aperti))
    return scalini


def gradini_dai_tempi(ok: List[Risultato]) -> List[Tuple[float, float, int, int]]:
    slot = [(r.inizio, i) for r, i in zip(ok, map(in_slot, ok)) if i]  # (sent, (start, end) in its slot)
    return gradini([accorcia(i) for _, i in slot], [accorcia((inviata, i[0])) for inviata, i in slot])


def picchi_dai_tempi(ok: List[Risultato], n_slot: Optional[int]) -> Tuple[Optional[int], Optional[int]]:
    """The most slots busy together, and the most requests waiting while all were (one free: HTTP's wait)."""
    scalini = gradini_dai_tempi(ok)
    if not scalini:
        return None, None
    occupati = max(n for _, _, n, _ in scalini)
    coda = max((in_coda for _, _, n, in_coda in scalini if n_slot is None or n >= n_slot), default=0)
    return (occupati if n_slot is None else min(occupati, n_slot)), coda


# What the server says about itself ###########################################################

def interroga_server(client: Client, attesa: float, stderr, con_props: bool = False) -> InfoServer:
    """Before any load: is the server ready, how many slots of what context, can /slots and /metrics be read."""
    aspetta_pronto(client, attesa, stderr)
    risposta = chiedi(client, "/slots")
    slots = lista_slot(leggi_json(risposta.corpo)) if risposta.status == 200 else None
    info = InfoServer(len(slots), numero(slots[0].get("n_ctx"), int), conta_occupati(slots) is not None,
                      llama_cpp=True) if slots else None
    if info is None or not info.slots_disponibile or con_props:
        info = info_da_props(client, risposta, info)  # seam: no /slots, --json (after the banner)
    metrics = chiedi(client, "/metrics")
    return info._replace(metrics_disponibile=metrics.status == 200 and b"llamacpp:" in metrics.corpo)


def cifre_completamento(dati) -> dict:
    """A chat completion's figures: tokens, speed, the slot's times; a missing one is None, never guessed."""
    if dati is None:
        raise ErroreRichiesta("risposta non JSON dal server")
    if not isinstance(dati, dict) or not isinstance(dati.get("choices"), list):
        raise ErroreRichiesta("risposta non valida: la risposta non è un completamento di chat (manca choices)")
    usage = dati.get("usage") if isinstance(dati.get("usage"), dict) else {}
    timings = dati.get("timings") if isinstance(dati.get("timings"), dict) else {}
    token = numero(usage.get("completion_tokens"), int)
    token_prompt = numero(usage.get("prompt_tokens"), int)
    scelta = dati["choices"][0] if dati["choices"] and isinstance(dati["choices"][0], dict) else {}
    finish = scelta.get("finish_reason")
    return dict(token=token if token is not None else numero(timings.get("predicted_n"), int),
                tps=velocita_nello_slot(timings), prompt_ms=numero(timings.get("prompt_ms")),
                predicted_ms=numero(timings.get("predicted_ms")),
                token_prompt=token_prompt if token_prompt is not None else numero(timings.get("prompt_n"), int),
                token_cache=numero(timings.get("cache_n"), int),
                finish_reason=finish if isinstance(finish, str) else None)


# 8. main ##########################################################################################

class Opzioni(NamedTuple):
    url: str = "http://127.0.0.1:8080"
    api_key: Optional[str] = None  # --api-key, or the LLAMA_API_KEY variable
    attesa_pronto: float = ATTESA_PRONTO  # --attesa: how long to wait for a server loading its model
    oltre: object = None  # the extras' slot


def analizza_argomenti(argv: Optional[Sequence[str]]) -> Tuple[List[Piano], Opzioni]:
    """The plans (the lab: one) and the options, from one parse of the flags; a bad flag: exit 2."""
    parser = ParserItaliano(prog="carico.py", description=__doc__, add_help=False,  # seam: Italian, after the banner
                            usage="%(prog)s [--url URL] [--richieste N] [--parallele N] [--token N] [altre opzioni]")
    parser.nomi, gruppo = [], parser.add_argument_group("il lab")
    for nome, parametri in [
        ("--url", dict(type=lista_di(url_server, "ogni server una volta"), action="extend", metavar="URL",
                       help=f"radice del server llama.cpp (default: {Opzioni().url}); più server: A,B")),
        ("--richieste", dict(type=positivo(int, "un numero intero", 100000, " (le richieste sono preparate tutte "
                                           "in memoria prima della prova)"), metavar="N",
                             help="quante richieste inviare in tutto (default: 4)")),
        ("--parallele", dict(type=lista_di(intero_positivo), metavar="N",
                             help="quante richieste tenere in volo insieme (default: 4)")),
        ("--token", dict(type=lista_di(token_o_fascia), default=[32], metavar="N",
                         help="token da generare per richiesta, max_tokens; MIN-MAX: a caso (default: 32)")),
    ]:
        parser.nomi += gruppo.add_argument(nome, **parametri).option_strings
    SessioneOltre.aggiungi_opzioni(parser)  # seam: the extras' flags, the epilog (after the banner)
    a = parser.parse_args(argv)
    chiave = chiave_dall_ambiente(parser)  # the LLAMA_API_KEY variable
    piano = Piano(a.richieste or 4, (a.parallele or [4])[0], a.token[0])
    # One --url: the lab's server; a list (or --url again): several, the extras' (seam: SessioneOltre below)
    opzioni, date = Opzioni((a.url or [Opzioni().url])[0], a.api_key or chiave, a.attesa), a.parallele
    piani, opzioni = SessioneOltre.dalle_opzioni(parser, a, piano, opzioni) or ([piano], opzioni)  # seam: the extras'
    oltre_le_richieste = [p for p in piani if date and p.richieste and p.parallele > p.richieste]
    if oltre_le_richieste:  # nobody waits in the client, and at most that many reach the server together
        n, massimo = piani[0].richieste, oltre_le_richieste[-1].parallele
        nota(f"--parallele {', '.join(str(p.parallele) for p in oltre_le_richieste)} è più di --richieste {n}: partono "
             f"solo {n} richieste, quindi al più {n} in volo insieme (per {massimo}, --richieste {massimo})")
    return piani, opzioni


def main(argv: Optional[Sequence[str]] = None) -> int:
    for flusso in (sys.stdout, sys.stderr):
        if hasattr(flusso, "reconfigure"):  # a terminal that cannot encode Unicode gets '?', not an error
            flusso.reconfigure(errors="replace")
    try:
        piani, opzioni = analizza_argomenti(argv)
    except KeyboardInterrupt:  # Ctrl+C while the flags (and their files) are read: nothing was measured
        print("carico.py: interrotto", file=sys.stderr)
        return 130
    with segnali(al_segnale):
        return (Sessione if opzioni.oltre is None else SessioneOltre)(piani, opzioni).esegui()  # seam: see above


# What a careful tool needs: a server still loading, HTTP with a deadline, errors, Ctrl+C... ####

def aspetta_pronto(client: Client, attesa: float, stderr, avviato=None) -> None:
    """Ask /health until the server is ready (503: still loading the model), up to `attesa` seconds."""
    inizio = time.monotonic()
    avvisato = None  # when the user was last told that we wait
    while True:
        if avviato is not None:
            avviato.controlla("il server si è fermato durante l'avvio")
        zitto = threading.Timer(2.0, print, (f"il server {client.base} non risponde ancora: attendo fino a "
                                             f"{client.timeout_info:g} s...",), dict(file=stderr, flush=True))
        if avvisato is None and avviato is None:  # the first ask: a server that takes it and says nothing is said
            zitto.start()
        try:
            risposta = client.chiama("GET", "/health")
        except ErroreRete as exc:
            if avviato is None:
                raise ErroreUtente(perche_non_risponde(client, exc)) from None
            risposta = None  # just started: not listening yet
        finally:
            zitto.cancel()
        if risposta is not None and risposta.status == 401:
            raise ErroreUtente(messaggio_chiave(client))
        passati = time.monotonic() - inizio
        if risposta is not None and risposta.status != 503:
            if avvisato is not None:
                print(f"server pronto in {passati:.1f} s", file=stderr, flush=True)
            return
        if passati >= attesa:
            ancora = f": risponde ancora {descrivi_errore_http(risposta)}" if risposta is not None else ""
            perche = (f"; ultime righe del suo log:\n{avviato.coda_log()}" if avviato is not None
                      else ". Aspetta che finisca di caricare il modello e riprova")
            raise ErroreUtente(f"il server {client.base} non è pronto dopo {attesa:g} s (--attesa){ancora}{perche}")
        if avvisato is None or passati - avvisato >= 10:  # at first, then every 10 s
            cosa = "sta partendo" if risposta is None else "sta caricando il modello"  # not listening yet, or 503
            print(f"il server {client.base} {cosa}: attendo fino a {attesa:g} s..."
                  if avvisato is None else f"  attendo ancora il server... {passati:.0f} s", file=stderr, flush=True)
            avvisato = passati
        time.sleep(0.25)


def chiedi(client: Client, percorso: str, dati=None) -> Risposta:
    """GET a path of a server that is ready (POST, with `dati`); down or refusing the key is an ErroreUtente."""
    try:
        risposta = client.chiama("GET" if dati is None else "POST", percorso, dati)
    except ErroreRete as exc:
        raise ErroreUtente(f"nessuna risposta dal server {client.base} ({percorso}): {exc}") from None
    if risposta.status == 401:
        raise ErroreUtente(messaggio_chiave(client))
    return risposta


def numero(valore, tipo=float):  # a JSON number as `tipo` (int: whole numbers only); None for anything else
    ammessi = (int,) if tipo is int else (int, float)
    return tipo(valore) if isinstance(valore, ammessi) and not isinstance(valore, bool) and abs(valore) < float("inf") else None


def velocita_nello_slot(timings: dict) -> Optional[float]:
    """timings.predicted_per_second; a 1-token answer's 0.0 (no generation step, measured) is not a speed."""
    tps = numero(timings.get("predicted_per_second"))
    return tps if tps is not None and tps > 0 else None


def lista_slot(dati) -> Optional[List[dict]]:
    """The slots of a /slots answer: a list (this server), {"slots": [...]} or one bare slot (older ones)."""
    if isinstance(dati, dict):
        dati = dati.get("slots", [dati] if "id" in dati else None)
    if not isinstance(dati, list) or not all(isinstance(s, dict) for s in dati):
        return None
    return dati


def avvia_i_lavoratori(esecutore, quanti: int) -> int:
    """Start `quanti` workers and wait until each runs: the clock starts on threads that exist."""
    pronti = threading.Barrier(quanti + 1)
    try:
        for _ in range(quanti):
            esecutore.submit(pronti.wait)
        pronti.wait()
    except BaseException:  # Ctrl+C, while starting them or waiting: none may wait for a clock that never starts
        pronti.abort()
        raise
    return quanti


# HTTP: one exchange on its own connection, within a deadline ###################################

class Risposta(NamedTuple):
    status: int
    corpo: bytes


class Client:
    """One server, one connection per exchange (no stale keep-alive); sockets kept so that Ctrl+C stops them."""

    def __init__(self, base: str, api_key: Optional[str] = None, timeout_info: float = TIMEOUT_INFO):
        parti = urllib.parse.urlsplit(base)
        self.base, self.timeout_info, self.con_chiave = base, timeout_info, bool(api_key)
        self.https, self.host = parti.scheme == "https", parti.hostname
        self._porta = parti.port or (443 if self.https else 80)
        host = parti.netloc.rpartition("@")[2]
        self._intestazioni = {"Host": host if host.isascii() else host.encode("idna").decode("ascii"),
                              "Accept": "application/json", "Connection": "close",
                              "User-Agent": f"carico.py/{__version__}",
                              **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
        self._indirizzo = None  # the address that answered first (a getaddrinfo tuple)
        self.tls = None  # https: one ssl context for every exchange
        self._aperti, self._lock, self.annullato = set(), threading.Lock(), threading.Event()  # sockets in flight
        self.sentinella = Sentinella(self)  # seam: is the server still there? (after the banner)
        self.oltre: object = None  # the extras' slot (--stream's connections and reader...)

    chiama = scambio_http  # one exchange: see "1. One request"

    def intestazioni(self, corpo: Optional[bytes]) -> Dict[str, str]:
        return dict(self._intestazioni, **({"Content-Type": "application/json"} if corpo else {}))

    @contextlib.contextmanager
    def connessione(self, percorso: str, timeout: Optional[float] = None):
        """A connection, and its answer read by the deadline; a network error is an ErroreRete in Italian."""
        import http.client  # here, as concurrent.futures in esegui_carico
        timeout = self.timeout_info if timeout is None else timeout
        if self.annullato.is_set():  # Ctrl+C, or the server went away: nothing more is sent
            raise NonInviata(NON_INVIATA)
        scadenza = time.monotonic() + timeout
        connessione, sock = http.client.HTTPConnection(self.host, self._porta, timeout=timeout), None

        def risposta_entro() -> Risposta:
            sock.settimeout(max(0.001, scadenza - time.monotonic()))
            risposta = connessione.getresponse()  # the headers: without a stream, the whole wait is here
            self.sentinella.risposta()
            pezzi = []
            try:  # the end is a read too (late after the deadline); http.client may close the socket then
                while not risposta.isclosed():
                    resto = scadenza - time.monotonic()
                    if resto <= 0:
                        raise socket.timeout
                    sock.settimeout(resto)
                    pezzi.append(risposta.read1(65536))
                    if not pezzi[-1]:
                        break
            except socket.timeout:
                raise ErroreRete(f"risposta non completa entro {timeout:g} s") from None
            if risposta.length:  # bytes the Content-Length promised and the server did not send
                raise ErroreRete("risposta troncata: la connessione si è chiusa a metà")
            return Risposta(risposta.status, b"".join(pezzi))

        try:
            # http.client sends on it and does not connect again; it may close it once the answer says
            # `Connection: close` (llama.cpp's does), so carico lets it go by its own name.
            sock = connessione.sock = self._connetti(scadenza)
            yield connessione, risposta_entro
        except (OSError, http.client.HTTPException) as exc:
            if getattr(exc, "errno", None) == errno.EBADF:  # a socket carico closed itself: its fault, not the server's
                raise
            raise self.errore_di_rete(percorso, exc, descrivi_errore_rete(exc, timeout)) from None
        finally:
            if sock is not None:
                self.lascia(sock)
            connessione.close()

    def errore_di_rete(self, percorso: str, exc: Exception, testo: str) -> ErroreRete:
        eccezione = ErroreRete(testo)
        eccezione.rifiuto = self.sentinella.rifiuto(percorso, exc)
        return eccezione

    def _connetti(self, scadenza: float) -> socket.socket:
        """socket.create_connection's loop, written out only to register the socket before it connects."""
        indirizzi = [self._indirizzo] if self._indirizzo else socket.getaddrinfo(
            self.host, self._porta, type=socket.SOCK_STREAM)
        eccezione = None
        for indirizzo in indirizzi:
            sock = self.tieni(socket.socket(*indirizzo[:3]))
            try:
                sock.settimeout(max(0.001, scadenza - time.monotonic()))
                sock.connect(indirizzo[4])
                if self.annullato.is_set():
                    raise ConnectionAbortedError("richiesta annullata")
                self._indirizzo = indirizzo
                return con_tls(self, sock, scadenza) if self.https else sock  # https: see con_tls
            except OSError as exc:
                eccezione = exc
                self.lascia(sock)
        raise eccezione

    def tieni(self, sock: socket.socket) -> socket.socket:
        with self._lock:
            self._aperti.add(sock)
        return sock

    def lascia(self, sock: socket.socket) -> None:
        with self._lock:
            self._aperti.discard(sock)
        sock.close()

    def annulla(self) -> None:
        """Shut every socket in flight, connecting ones included, from any thread; later ones fail too."""
        self.annullato.set()
        with self._lock:
            aperti = list(self._aperti)
        for sock in aperti:
            with contextlib.suppress(OSError):  # already closed
                sock.shutdown(socket.SHUT_RDWR)


def con_tls(client: Client, sock: socket.socket, scadenza: float) -> socket.socket:
    """https: TLS on a connected socket, with a few seconds for the handshake (plain http never answers it)."""
    if client.tls is None:
        import ssl
        client.tls = ssl.create_default_context()
    sock.settimeout(min(3.0, max(0.001, scadenza - time.monotonic())))
    cifrato = client.tls.wrap_socket(sock, server_hostname=client.host)  # the name, checked against the certificate
    client.lascia(sock)
    return client.tieni(cifrato)


def leggi_json(corpo: bytes):
    try:
        return json.loads(corpo)  # bytes: json finds the UTF encoding itself
    except ValueError:  # UnicodeDecodeError included
        return None


# The errors carico.py raises, and what went wrong in Italian ##################################

class ErroreUtente(Exception):
    """A problem the user can fix (server down, wrong key...): one Italian line, exit 1."""
    codice = 1


class ServerAndato(ErroreUtente):
    """The server stopped answering during a run (see Sentinella): what was measured is reported and saved."""


class Interruzione(BaseException):
    """Ctrl+C or SIGTERM: stop sending, report what was measured, exit 128 + the signal."""

    codice = property(lambda self: self.args[0])


class ErroreRichiesta(Exception):
    """A request that got no usable answer; the message is Italian and ready to print."""


class ErroreRete(ErroreRichiesta):
    """No HTTP answer at all: refused, unknown host, timeout, connection closed."""


class NonInviata(ErroreRete):
    """A request that was never sent: Ctrl+C or a server gone had already stopped the run."""


def descrivi_errore_rete(exc: Exception, timeout: float) -> str:
    """One Italian phrase for a failed exchange; never the exception's repr (no tracebacks)."""
    import http.client, ssl

    frasi = ((socket.timeout, f"nessuna risposta entro {timeout:g} s"),
             (ConnectionRefusedError, "connessione rifiutata (nessun server in ascolto)"),
             (ConnectionAbortedError, "richiesta annullata"), (socket.gaierror, "host sconosciuto"),
             (http.client.IncompleteRead, "risposta troncata: la connessione si è chiusa a metà"),
             ((ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected),
              "connessione chiusa dal server prima della risposta"),
             (ssl.SSLError, f"errore TLS ({getattr(exc, 'reason', None) or type(exc).__name__})"),
             (http.client.HTTPException, f"risposta HTTP non valida ({type(exc).__name__})"))
    return next((frase for tipo, frase in frasi if isinstance(exc, tipo)),
                f"errore di rete: {getattr(exc, 'strerror', None) or type(exc).__name__}")


def testo_errore(status: int, errore: dict) -> str:
    """`HTTP 400 exceed_context_size_error: request (...)` from an error object {code, message, type}."""
    return f"HTTP {status}" + (f" {errore['type']}" if errore.get("type") else "") + (
        f": {errore['message']}" if errore.get("message") else "")


def descrivi_errore_http(risposta: Risposta) -> str:
    """An answer that is not 200: llama.cpp's error {"error": {...}}, or the first words of another body."""
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
    return (f"il server su {client.base} richiede una chiave API (è stato avviato con --api-key). "
            "Passala con --api-key CHIAVE o con la variabile LLAMA_API_KEY")


def fallita(client: Client, indice: int, inizio: float, fine: float, exc: Exception) -> Risultato:
    """A request that raised: what the server or the network said, as it is; else carico's own bug, said so."""
    if client.annullato.is_set() and not getattr(exc, "rifiuto", False):
        perso = client.sentinella.andato is not None  # else Ctrl+C: not a measurement
        return Risultato(indice, inizio, fine, errore=NON_INVIATA if isinstance(exc, NonInviata) else
                         IN_VOLO if perso else ANNULLATA)
    errore = str(exc) if isinstance(exc, ErroreRichiesta) else f"errore interno: {type(exc).__name__}: {exc}"
    return Risultato(indice, inizio, fine, errore=errore)


def perche_non_risponde(client: Client, exc: ErroreRete) -> str:
    """Why a server at --url does not answer /health, and what to do (an https:// URL to plain http)."""
    in_chiaro = client.base.replace("https://", "http://", 1)
    if client.https:
        with contextlib.suppress(ErroreRete):
            Client(in_chiaro, timeout_info=2.0).chiama("GET", "/health")
            return f"su {client.base} risponde un server in http semplice, non in https: usa --url {in_chiaro}"
    return f"nessuna risposta dal server {client.base}: {exc}. Avvia il server (llama serve ...) o correggi --url, poi riprova"


# A server that goes away (Sentinella watches for it) ##########################################

def rifiutata(r: Risultato) -> bool:
    """A request whose connection was refused: nothing listened, it never reached a server (see Sentinella)."""
    return r.errore == descrivi_errore_rete(ConnectionRefusedError(), 0)


NON_INVIATA = "non inviata: la prova era già ferma"
IN_VOLO = "in volo quando il server ha smesso di rispondere: nessuna risposta"


# Signals: Ctrl+C and SIGTERM ###################################################################

SEGNALI = (signal.SIGINT, signal.SIGTERM)


def al_segnale(numero_segnale, _frame):
    raise Interruzione(128 + numero_segnale)


ANNULLATA = "annullata (interruzione)"  # the error of a request closed by Ctrl+C: not a measurement

@contextlib.contextmanager
def segnali(gestore=None):
    """Ctrl+C and SIGTERM go to `gestore`; without one they wait, noted in the block's list (main thread)."""
    notati = []
    principale = threading.current_thread() is threading.main_thread()
    gestore = gestore or (lambda numero_segnale, _: notati.append(128 + numero_segnale))
    vecchi = {s: signal.signal(s, gestore) for s in SEGNALI} if principale else {}
    try:
        yield notati
    finally:
        for segnale, vecchio in vecchi.items():
            signal.signal(segnale, vecchio)


class Chiusura:
    """esegui_carico's guard: on Ctrl+C or SIGTERM those in flight are closed, the rest not sent; all it started
    stops with the signals held, so the report is never lost."""

    def __init__(self, client: Client, lancio: Lancio, esecutore, campionatore: Campionatore, osservatore=None):
        self.client, self.da_fermare, self.osservatore = client, (lancio, esecutore, campionatore), osservatore
        self.t0 = None  # the clock's start: a Ctrl+C before it, nothing measured

    def __enter__(self) -> Chiusura:
        self.client.sentinella.arma()  # from now on, refusals mean the server went away
        return self

    def __exit__(self, _tipo, exc, _traccia) -> bool:
        codice = exc.codice if isinstance(exc, Interruzione) else None
        if codice:
            self.client.annulla()  # the requests in flight return at once, marked ANNULLATA
        fermata = time.perf_counter()  # Ctrl+C, or every request done: what an interrupted run's report says
        lancio, esecutore, campionatore = self.da_fermare
        with segnali() as notati:  # a Ctrl+C now waits
            lancio.ferma()
            esecutore.shutdown(wait=True, cancel_futures=True)
            campionatore.ferma()
            if self.osservatore:
                self.osservatore.cancella()
            andato, _ = self.client.sentinella.andato, self.client.sentinella.arma(False)
        codice, t0 = codice or next(iter(notati), None), self.t0
        self.esito = dict(interruzione=codice, interrotta_a=fermata - t0 if codice and t0 is not None else None,
                          server_andato=(andato[0] - t0, andato[1]) if andato and t0 is not None else None)
        return isinstance(exc, Interruzione)


# /metrics: the server's own queue (llama serve --metrics) #####################################

def richieste_in_coda(corpo: bytes) -> Optional[int]:
    valore = leggi_metrica(corpo.decode("utf-8", "replace"), "requests_deferred")
    return None if valore is None else int(valore)


def leggi_metrica(testo: str, nome: str) -> Optional[float]:
    """`llamacpp:<nome> <value>` from /metrics' Prometheus text (values may look like 1.23457e+07)."""
    righe = [riga.split() for riga in testo.splitlines()]
    with contextlib.suppress(ValueError, StopIteration):
        return float(next(parti[1] for parti in righe if len(parti) == 2 and parti[0] == f"llamacpp:{nome}"))
    return None


# Is the machine quiet? The lab asks for it: the server shares the cores with what else runs. ####

SGUARDO_MACCHINA = 0.25  # how long the check watches the CPU before a run
LIBERA = 0.25  # under this share of all cores busy in that look, the CPU is said to be free; from 0.5, busy


class Macchina(NamedTuple):
    core: int
    carico_medio: Optional[float]  # 1-minute load average
    cpu_occupata: Optional[float]  # share of all cores busy over a short look, 0..1


def guarda_la_macchina(server_al_lavoro: bool = False) -> Macchina:
    """Look at the machine before a run, and say on stderr when it is busy (maybe the server's own work)."""
    macchina = osserva_macchina()
    motivo = macchina_occupata(macchina)
    if motivo:
        perche = ("anche dal server stesso, che sta ancora lavorando (vedi sopra): aspetta che finisca, chiudi i "
                  "processi pesanti e ripeti") if server_al_lavoro else (
                  "perché il server si divide i core. Chiudi i processi pesanti e ripeti")
        print(f"carico.py: attenzione: la macchina è già occupata ({motivo}): cifre forse falsate, {perche}",
              file=sys.stderr, flush=True)
    return macchina


def guarda_il_server(client: Client, info: InfoServer) -> Optional[int]:
    """Before a run, the slots already busy (a run stopped without --stream, another client), said on stderr."""
    if not info.slots_disponibile:
        return None
    risposta = chiedi(client, "/slots")
    occupati = conta_occupati(leggi_json(risposta.corpo)) if risposta.status == 200 else None
    if occupati:
        metriche = chiedi(client, "/metrics") if info.metrics_disponibile else None
        in_coda = richieste_in_coda(metriche.corpo) if metriche and metriche.status == 200 else None
        coda = f" e {quante(in_coda, 'richiesta', 'richieste')} in coda" if in_coda else ""
        print(f"carico.py: attenzione: il server sta già lavorando ({occupati} slot su {fmt(info.n_slot, 'd')} "
              f"occupati{coda} prima della prova): le cifre saranno falsate. Aspetta che finiscano (o riavvia il "
              "server) e ripeti", file=sys.stderr, flush=True)
    return occupati


def osserva_macchina(sguardo: Optional[float] = None) -> Macchina:
    try:
        carico_medio = os.getloadavg()[0]
    except (AttributeError, OSError):
        carico_medio = None
    prima, occupata = tempi_cpu(), None
    if prima is not None:
        time.sleep(SGUARDO_MACCHINA if sguardo is None else sguardo)
        dopo = tempi_cpu()
        if dopo is not None and dopo[1] > prima[1]:
            occupata = (dopo[0] - prima[0]) / (dopo[1] - prima[1])
    return Macchina(os.cpu_count() or 1, carico_medio, occupata)


def guarda_dopo(prova: Prova) -> Prova:
    """The look before cannot see what started after. Not after a failure: the server may still work on a request
    the client gave up on (--timeout)."""
    e = prova.esecuzione
    if e.interruzione or e.server_andato or prova.riepilogo.n_fallite:
        return prova
    prova = prova._replace(macchina_dopo=osserva_macchina())
    if macchina_occupata(prova.macchina_dopo) and not macchina_occupata(prova.macchina):
        nota(f"subito dopo la prova la macchina era occupata ({macchina_occupata(prova.macchina_dopo)}): forse "
             "anche durante, e le cifre possono esserne falsate")
    return prova


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
    """Why the machine looks busy, or None: the CPU share now (the load average, the fallback, counts a minute ago)."""
    if m.cpu_occupata is not None:
        return f"CPU occupata al {m.cpu_occupata:.0%}" if m.cpu_occupata >= 0.5 else None
    if m.carico_medio is not None and m.carico_medio >= max(1.0, 0.75 * m.core):
        return f"carico medio {m.carico_medio:.1f} su {m.core} core"
    return None


# What the run's figures mean: notes on stderr after every run ##################################
# What changes the meaning of the lab's figures, that its lines cannot show.

def quante(n: int, una: str, molte: str) -> str:
    """A count with its word in the right number: quante(1, "richiesta", "richieste") is '1 richiesta'."""
    return f"{n} {una if n == 1 else molte}"


def da_a(valori: List[int]) -> str:
    """`min-max` of some counts (one value if they agree, n/d if none)."""
    return ND if not valori else str(min(valori)) if min(valori) == max(valori) else f"{min(valori)}-{max(valori)}"


def note(prova: Prova, esatti: bool = False, cache_voluta: bool = False, conversazioni: bool = False,
         lasciate_generano: bool = True, n_slot: Optional[int] = None) -> List[str]:  # (the extras': SessioneOltre.note)
    e, s = prova.esecuzione, prova.riepilogo
    testi = []
    if prova.occupati_prima:
        testi.append(f"il server aveva già {quante(prova.occupati_prima, 'slot occupato', 'slot occupati')} prima "
                     "della prova. I tempi del server (slot occupati insieme, coda, attesa in coda) contano solo le "
                     "richieste di questa prova, /slots e /metrics anche le altre. L'attesa vera di ogni richiesta è "
                     "la sua attesa dello slot (attesa_slot_s in --csv e --json)")
    # n_slot: the fewest slots the requests in flight could meet (several servers: the smallest's)
    n_slot, in_volo = n_slot or prova.info.n_slot, min(prova.piano.parallele, e.n_richieste)
    if n_slot and not prova.occupati_prima and (s.coda_letta or 0) > max(in_volo - n_slot, 0):
        testi.append(f"requests_deferred ha visto {s.coda_letta} richieste in coda, questa prova al più "
                     f"{max(in_volo - n_slot, 0)}: le altre erano di un altro client, e le cifre ne sono falsate")
    letti = [c for c in e.campioni if c.occupati is not None]
    breve = s.tempo_totale is not None and s.tempo_totale < 2 * prova.piano.intervallo
    tutti = s.picco is not None and s.picco == prova.info.n_slot  # every slot seen busy: nothing to underestimate
    if s.occupati_dai_tempi is None and prova.info.slots_disponibile and (breve or len(letti) < 2) and not tutti:
        durata = (f"la prova è durata {s.tempo_totale:.2f} s, meno di due letture" if breve else
                  f"la prova ha avuto {quante(len(letti), 'lettura', 'letture')} di /slots")  # cut short: no duration
        testi.append(f"il picco di slot occupati può essere sottostimato: {durata} (--intervallo "
                     f"{prova.piano.intervallo:g}). Senza i tempi del server, viene solo dalle letture di /slots")
    if e.riuscite and all(in_slot(r) is None and r.tps is None for r in e.riuscite):  # not llama.cpp's answers
        testi.append("le risposte non hanno i timings di llama.cpp: velocità nel proprio slot, attese dello slot e "
                     "in coda, slot occupati dai tempi sono n/d" if prova.info.slots_disponibile else
                     "il server non ha dato né /slots né i suoi tempi (timings): velocità nel proprio slot, slot "
                     "occupati, attese dello slot e in coda sono n/d")
    testi.append(frase_corte(prova, esatti))
    chiave = sum(1 for r in e.risultati if (r.errore or "").startswith("HTTP 401"))
    if chiave:  # any request's 401, not only /health's
        testi.append(f"{quante(chiave, 'richiesta rifiutata', 'richieste rifiutate')} con HTTP 401: il server vuole "
                     "una chiave API. Passala con --api-key CHIAVE o con la variabile LLAMA_API_KEY (se l'hai già "
                     "passata, controllala)")
    dalla_cache = [r for r in e.risultati if r.token_cache]
    if dalla_cache and not cache_voluta:  # --turni, --prefisso: the cache is the experiment
        testi.append(f"il server ha preso dalla cache {sum(r.token_cache for r in dalla_cache)} token di prompt in "
                     f"{quante(len(dalla_cache), 'richiesta', 'richieste')}, anche se carico.py chiede cache_prompt: "
                     "false. Quei token non sono stati calcolati: la prova ne esce avvantaggiata. Riavvia il server "
                     "prima di ripeterla")
    testi.append(None if conversazioni else frase_kv_piena(prova))  # step 5's cost: a shared buffer, full
    if e.lasciate and lasciate_generano:  # not a stream, nor a server --avvia stops
        # Measured (b11434, -np 1): a closed request is cancelled 0.4-2 s later (its HTTP thread's poll); a stream, at once.
        lasciate = quante(e.lasciate, "richiesta lasciata", "richieste lasciate")
        testi.append(f"senza --stream il server può continuare a generare {lasciate} in volo (una per slot alla volta, "
                     "finché non le cancella). Aspetta qualche secondo prima di ripetere, o la prossima prova ne sarà falsata")
    return [testo for testo in testi if testo]


def fermate_prima(prova: Prova) -> List[Risultato]:
    """The successful requests the model ended before --token (finish_reason `stop`: EOS or a stop word)."""
    return [r for r in prova.esecuzione.riuscite
            if r.finish_reason == "stop" and r.token is not None and r.token < prova.piano.max_token]


def frase_corte(prova: Prova, esatti: bool = False) -> Optional[str]:
    """What stderr, --spiega and --dettagli say of answers shorter than --token: mostly empty, or some stopped early."""
    vuote = [r for r in prova.esecuzione.riuscite if r.token == 0]
    if vuote and len(vuote) * 2 >= len(prova.esecuzione.riuscite):  # half or more: the template, whatever --esatti
        return frase_vuote(prova, len(vuote))
    return frase_fermate(prova, esatti) if fermate_prima(prova) else None


def frase_fermate(prova: Prova, esatti: bool = False) -> str:
    """What stderr, --spiega and --dettagli say of the requests that stopped before --token."""
    corte, piano = fermate_prima(prova), prova.piano
    frase = (f"{quante(len(corte), 'richiesta', 'richieste')} su {len(prova.esecuzione.risultati)} "
             f"{'si è fermata' if len(corte) == 1 else 'si sono fermate'} prima di --token {piano.max_token} "
             f"(finish_reason stop, {da_a([r.token for r in corte])} token)")
    if esatti:
        return frase + ": il server non rispetta ignore_eos (--esatti)"
    n_ctx = prova.info.n_ctx_slot
    fuori = n_ctx is not None and any(r.token_prompt is not None and r.token_prompt + piano.max_token > n_ctx
                                      for r in corte)  # ignore_eos would not reach --token: the context ends first
    return (frase + ". Il throughput conta solo i token generati: non confrontarlo con prove che arrivano a --token. "
            + (f"Il prompt più --token {piano.max_token} non sta nei {n_ctx} token dello slot" if fuori else
               "--esatti li fa generare tutti" if prova.info.llama_cpp is not False else
               "--esatti (ignore_eos) li farebbe generare tutti su llama.cpp, ma altri server lo ignorano"))


def frase_vuote(prova: Prova, vuote: int) -> str:
    """The usual cause, a chat template: --esatti cannot mend it (and only llama.cpp honours ignore_eos)."""
    return (f"{vuote} risposte su {len(prova.esecuzione.riuscite)} hanno 0 token: il modello si ferma subito, e "
            "questa prova non misura la generazione. Di solito il template di chat del server non va con il modello: "
            "guarda il testo di una risposta. Il template viene dal GGUF o da --chat-template su llama.cpp, "
            "da --chat_format su llama-cpp-python" + (
                ". Con --esatti (ignore_eos) llama.cpp genera comunque --token token, ma il testo resta sbagliato"
                if prova.info.llama_cpp else ""))


# An answer the slot's context cut: finish_reason length as at --token, fewer tokens than asked, prompt and answer
# filling n_ctx (measured: 479 of 600 at -np 4, usage.total_tokens 512; `truncated` only in the log). No --esatti.

def tagliata_dal_contesto(r: Risultato, prova: Prova) -> bool:
    """Whether the slot's context cut an answer (as --turni says it: full at n_ctx - 1, the last token unstored)."""
    n_ctx = prova.info.n_ctx_slot
    return (r.riuscita and r.finish_reason == "length" and None not in (r.token, r.token_prompt, n_ctx)
            and r.token < prova.piano.max_token and r.token_prompt + r.token >= n_ctx - 1)


def tagliate_dal_contesto(prova: Prova) -> List[Risultato]:
    return [r for r in prova.esecuzione.riuscite if tagliata_dal_contesto(r, prova)]


def segno_tagliata(r: Risultato, tagliate: List[Risultato]) -> str:
    """After the sheet's fields on the `req` line of an answer the context cut, its evidence; '' for the others."""
    return f"  tagliata dal contesto: prompt {r.token_prompt} + {r.token} = {r.token_prompt + r.token} token" if (
        r in tagliate) else ""


def riga_tagliate(prova: Prova) -> List[str]:
    """After the lab's summary, when the context cut answers: how many, and what helps (never --esatti)."""
    n = len(tagliate_dal_contesto(prova))
    return [f"tagliate dal contesto dello slot ({prova.info.n_ctx_slot} token): {quante(n, 'risposta', 'risposte')} "
            f"su {len(prova.esecuzione.riuscite)} (finish_reason length); {cosa_aiuta(prova)}"] if n else []


def cosa_aiuta(prova: Prova) -> str:
    """What gives an answer more context: fewer slots only where each has its own share of -c."""
    kv = kv_saputa(prova)
    return ("aiuta un -c più grande" if kv or (prova.info.n_slot or 1) == 1 else
            "aiutano meno slot (-np) o un -c più grande" if kv is False else
            "aiuta un -c più grande o, senza --kv-unified, meno slot (-np)")


# How this llama.cpp says a request did not fit: the slot's context (400, when a slot takes it), or no room in the
# KV cache (500 to every request in flight: with --kv-unified, four long ones at -np 4 -c 2048 all failed, none queued).
CONTESTO_FINITO = {"exceed_context_size_error": "slot", "Context size has been exceeded": "kv"}
PERCHE_FINITO = {"slot": "il contesto dello slot è finito",
                  "kv": "il buffer KV condiviso fra gli slot (--kv-unified) è pieno"}


def contesto_finito(r: Risultato) -> Optional[str]:
    """`slot` or `kv` when the server said a request ran out of context (see CONTESTO_FINITO); else None."""
    return next((tipo for chiave, tipo in CONTESTO_FINITO.items() if r.errore and chiave in r.errore), None)


def kv_condivisa(prova: Prova) -> bool:
    """The slots share one KV buffer (--kv-unified): --avvia started the server so, or a 500 said it."""
    return prova.info.kv_unificata or any(contesto_finito(r) == "kv" for r in prova.esecuzione.risultati)


def kv_saputa(prova: Prova) -> Optional[bool]:
    """kv_condivisa, or None by hand with more slots: n_ctx per slot is the same whether they share -c or split it."""
    saputa = kv_condivisa(prova) or prova.info.n_slot == 1 or prova.info.kv_unificata is not None
    return kv_condivisa(prova) if saputa else None


def frase_kv_piena(prova: Prova) -> Optional[str]:
    """What a 500 "Context size has been exceeded." means, said once after the run, whoever started the server."""
    piene = sum(1 for r in prova.esecuzione.risultati if contesto_finito(r) == "kv")
    buffer = f"dei suoi {prova.info.n_ctx_slot} token" if prova.info.n_ctx_slot else "del buffer"
    return (f"{quante(piene, 'richiesta è fallita', 'richieste sono fallite')} con HTTP 500 \"Context size has been "
            f"exceeded.\": {PERCHE_FINITO['kv']}. Questo llama.cpp lo risponde solo con un buffer condiviso, se "
            f"le richieste in volo chiedono più {buffer}: falliscono tutte, nessuna in coda. Il buffer basta se i "
            "prompt in volo insieme ci stanno con le risposte: meno richieste insieme (--parallele, fino a una), "
            "prompt più corti o un -c più grande. Senza --kv-unified ogni slot ha -c diviso -np token: un prompt che "
            "non ci sta viene rifiutato (HTTP 400)") if piene else None


# The lab's flags, checked ######################################################################

def positivo(converti, cosa: str, massimo: float = float("inf"), perche: str = ""):
    """An argparse type: a number (int or float) greater than 0, and at most `massimo` (`perche`: why)."""
    def controlla(testo: str):
        try:
            valore = converti(testo)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{testo}' non è {cosa}") from None
        if not 0 < valore < float("inf"):
            raise argparse.ArgumentTypeError(f"deve essere maggiore di 0, non {testo}")
        if valore > massimo:
            raise argparse.ArgumentTypeError(f"al massimo {massimo:.0f}, non {testo}{perche}")
        return valore
    return controlla


intero_positivo = positivo(int, "un numero intero")
secondi_positivi = positivo(float, "un numero di secondi", 1e6, " (oltre 11 giorni)")


def url_server(testo: str) -> str:
    """The server's root, e.g. http://127.0.0.1:8080; a trailing / or /v1 is accepted and dropped."""
    try:
        parti = urllib.parse.urlsplit(testo.strip())
        parti.port  # raises ValueError for a port that is not a number
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{testo}' non è un URL valido") from None
    if parti.scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(f"'{testo}' deve iniziare con http:// o https:// (es. http://127.0.0.1:8080)")
    if not parti.hostname:
        raise argparse.ArgumentTypeError(f"'{testo}' non dice a quale host collegarsi")
    if parti.path.rstrip("/") not in ("", "/v1") or parti.query or parti.fragment:
        raise argparse.ArgumentTypeError(f"'{testo}' deve essere la radice del server, senza '{parti.path}' (per "
                                         "esempio http://127.0.0.1:8080)")
    return f"{parti.scheme}://{parti.netloc}"


def chiave_api(testo: str) -> str:
    # Checked here, so that a key that cannot go in a header never reaches one (nor an error message).
    if not testo or not all(33 <= ord(c) < 127 for c in testo):
        raise argparse.ArgumentTypeError("la chiave API deve essere fatta di caratteri ASCII stampabili, senza spazi")
    return testo


def chiave_dall_ambiente(parser: argparse.ArgumentParser) -> Optional[str]:
    chiave = os.environ.get("LLAMA_API_KEY")
    try:
        return chiave_api(chiave) if chiave else None
    except argparse.ArgumentTypeError as exc:
        parser.error(f"LLAMA_API_KEY: {exc}")


def lista_di(converti, perche: str = "ogni valore è un punto della griglia. Per ripetere una prova usa --ripeti"):
    """An argparse type: one value, or a comma-separated list of distinct values (a sweep)."""
    def controlla(testo: str) -> list:
        valori = [converti(voce.strip()) for voce in testo.split(",")]
        doppio = next((v for v in valori if valori.count(v) > 1), None)
        if doppio is not None:
            raise argparse.ArgumentTypeError(f"il valore {format(doppio, 'g') if isinstance(doppio, float) else doppio} "
                                             f"è ripetuto nella lista '{testo}': {perche}")
        return valori
    return controlla


def token_o_fascia(testo: str):
    """--token: N, or MIN-MAX (each request's max_tokens drawn between the two, by --seme); 32-32: a range of one."""
    if "-" not in testo.lstrip("-"):
        return intero_positivo(testo)
    da, _, a = testo.partition("-")
    if not (da.isdigit() and a.isdigit()):
        raise argparse.ArgumentTypeError(f"'{testo}' non è un intervallo di token (per esempio 16-64)")
    if not 0 < int(da) <= int(a):
        raise argparse.ArgumentTypeError(f"'{testo}': MIN-MAX vuole MIN almeno 1 e non più di MAX (per esempio "
                                         f"{min(int(da), int(a)) or 1}-{max(int(da), int(a), 1)})")
    return int(da), int(a)


# Oltre il lab ##################################################################################
# Below, each extra in its own section, opt-in; none changes the lab's lines. A plain lab run meets
# only the check for their flags, the Sentinella and, on a terminal, the live line.

EPILOGO = """\
esempi:
  python3 carico.py --ripeti 3 --tabella --stream --slo latenza=5,ttft=1
  python3 carico.py --parallele 1,2,4,8 --richieste 16 --grafico --spiega
  python3 carico.py --ritmo 0.5,1,2,4 --durata 30 --svg curva.svg --dettagli
  python3 carico.py --durata 60 --slo latenza=5 --capacita --json cap.json
  python3 carico.py --avvia "llama serve -m M.gguf -c 2048" --np 1,2,4,4kv
  python3 carico.py --parallele 4 --turni 4 --sistema 300 --dettagli
  python3 carico.py --confronta prima.json dopo.json

attesa in coda: il tempo in cui la richiesta aspettava con tutti gli slot
occupati; attesa dello slot (--json, --csv): dall'invio a quando uno slot la
prende (la coda più il viaggio), cioè latenza meno prompt e generazione.
Se il server ha --metrics, anche il picco della sua coda (requests_deferred).
"""


# The extras' flags ############################################################################

def token_o_zero(testo: str) -> int:
    """Tokens, 0 included (--prefisso 0: no shared prefix, the run to compare with)."""
    if not testo.isdigit():
        raise argparse.ArgumentTypeError(f"'{testo}' non è un numero di token (0 o più)")
    return int(testo)


def lunghezze_prompt(testo: str) -> List[Tuple[int, int]]:
    """`200`, `100-300` (uniform) or a sweep's `128,512`: each as (min, max) tokens."""
    lunghezze = []
    for voce in testo.split(","):
        da, trattino, a = voce.strip().partition("-")
        try:
            minimo, massimo = int(da), int(a if trattino else da)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{voce}' non è una lunghezza in token (per esempio 200, 100-300, "
                                             "128,512)") from None
        if not 0 < minimo <= massimo:
            raise argparse.ArgumentTypeError(f"'{voce}': le lunghezze sono token, almeno 1, e MIN non supera MAX")
        lunghezze.append((minimo, massimo))
    if len(lunghezze) > 1 and any(a != b for a, b in lunghezze):
        raise argparse.ArgumentTypeError("una lista di lunghezze fa una prova per valore: valori singoli, senza MIN-MAX")
    if len(set(lunghezze)) < len(lunghezze):
        raise argparse.ArgumentTypeError(f"un valore è ripetuto nella lista '{testo}'")
    return lunghezze


def lista_percentili(testo: str) -> List[Union[int, float]]:
    """`50,90,99.9`: distinct, in (0, 100), two decimals at most; a whole one an int (p99, not p99.0)."""
    try:
        percentili = [float(v) for v in testo.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{testo}' non è una lista di percentili (per esempio 50,90,99.9)") from None
    if not all(0 < p < 100 and round(p, 2) == p for p in percentili) or len(set(percentili)) < len(percentili):
        raise argparse.ArgumentTypeError(f"'{testo}': percentili fra 0 e 100 (esclusi), al più con due decimali "
                                         "(99.99), ognuno una volta")
    return [int(p) if p == int(p) else p for p in percentili]


def obiettivi_slo(testo: str) -> Dict[str, float]:
    """`latenza=5,ttft=1,tpot=0.1`, in seconds."""
    obiettivi = {}
    for voce in testo.split(","):
        chiave, uguale, valore = voce.strip().partition("=")
        if chiave not in CHIAVI_SLO or not uguale:
            raise argparse.ArgumentTypeError(f"'{voce.strip()}' non è un obiettivo: usa latenza=S, ttft=S o tpot=S "
                                             "(secondi), per esempio latenza=5,ttft=1,tpot=0.1")
        obiettivi[chiave] = secondi_positivi(valore.strip())
    return obiettivi


def file_scrivibile(testo: str) -> str:
    """Checked writable before any load is fired."""
    cartella = os.path.dirname(os.path.abspath(testo))
    if os.path.isdir(testo):
        raise argparse.ArgumentTypeError(f"'{testo}' è una cartella, non un file")
    if not os.path.isdir(cartella):
        raise argparse.ArgumentTypeError(f"la cartella '{cartella}' non esiste")
    if not os.access(cartella, os.W_OK) or (os.path.exists(testo) and not os.access(testo, os.W_OK)):
        raise argparse.ArgumentTypeError(f"non posso scrivere '{testo}' (permessi)")
    return testo


def lista_np(testo: str) -> List[Configurazione]:
    """`1,2,4,4kv`: `Nkv` adds --kv-unified (step 5); `auto` (-1): no -np, the server decides."""
    configurazioni = []
    for voce in testo.split(","):
        voce = voce.strip().lower()
        kv = voce.endswith("kv")
        try:
            np = -1 if voce == "auto" else int(voce[:-2] if kv else voce)
        except ValueError:
            raise argparse.ArgumentTypeError(f"'{voce}' non è un valore di -np (per esempio 1,2,4,4kv)") from None
        if np < 1 and np != -1 or np == -1 and kv:  # auto decides --kv-unified itself
            raise argparse.ArgumentTypeError(f"-np {voce} non ha senso: usa 1, 2, 4, 4kv... o auto (decide il server)")
        if Configurazione(np, kv) in configurazioni:
            raise argparse.ArgumentTypeError(f"il valore {voce} è ripetuto nella lista '{testo}': ogni valore è un "
                                             "server da avviare (per ripetere una prova usa --ripeti)")
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
    if doppie := sorted(gestite.intersection(p.split("=")[0] for p in parti)):
        raise argparse.ArgumentTypeError(
            f"non mettere {', '.join(doppie)} nel comando: -np viene da --np, host e porta da --url")
    return parti


# The flags beyond the lab's four, by --help's group: (title, description, [(names, keywords)]).
OPZIONI_OLTRE = (
    ("il server e le richieste", None, [
        ("--api-key", dict(type=chiave_api, metavar="CHIAVE", help="chiave API (se manca: LLAMA_API_KEY); "
                           "mai stampata")),
        ("--modello", dict(metavar="NOME", help="il campo model delle richieste (-a del server)")),
        ("--prompt-file", dict(metavar="FILE", help="il prompt di ogni richiesta (passo 4 del lab)")),
        ("--dataset", dict(metavar="FILE", help="richieste da JSONL (prompt o messages; con timestamp: "
                           "una traccia) o da ShareGPT")),
        ("--prefisso", dict(type=lista_di(token_o_zero), metavar="N", help="stessi N token in testa a ogni prompt "
                            "(/tokenize)")),
        ("--prompt-token", dict(type=lunghezze_prompt, metavar="N", help="prompt di N token esatti (/tokenize); "
                                "MIN-MAX: a caso")),
        ("--timeout", dict(type=secondi_positivi, default=TIMEOUT_RICHIESTA, metavar="S",
                           help="massimo per una risposta, coda compresa (%(default)g)")),
        ("--intervallo", dict(type=secondi_positivi, default=0.5, metavar="S",
                              help="ogni quanto leggere /slots, almeno 0.05 (%(default)g)")),
        ("--attesa", dict(type=secondi_positivi, default=ATTESA_PRONTO, metavar="S",
                          help="quanto aspettare un server che carica (%(default)g)")),
        ("--smista", dict(choices=("turno", "liberi"), metavar="MODO", help="con più --url: turno (default) o "
                          "liberi, al server con più slot liberi (default con --repliche)")),
    ]),
    ("ripetere e confrontare", None, [
        ("--ripeti", dict(type=intero_positivo, default=1, metavar="K", help="K prove: media e dispersione")),
        ("--tabella", dict(action="store_true", help="la riga della tabella del consegnato")),
    ]),
    ("ritmo, durata, griglie", "--parallele, --token, --ritmo, --prefisso, --prompt-token accettano una\n"
     "lista (1,2,4): una prova per valore (o combinazione), la tabella, la curva", [
        ("--ritmo", dict(type=lista_di(positivo(float, "un numero di richieste al secondo")), metavar="R",
                         help="R richieste al secondo (--parallele: il tetto)")),
        ("--arrivi", dict(choices=("poisson", "costanti"), metavar="MODO", help="con --ritmo: poisson "
                          "(default) o costanti")),
        ("--seme", dict(type=int, metavar="N", help="il seme del caso (arrivi, MIN-MAX)")),
        ("--durata", dict(type=secondi_positivi, metavar="S", help="invia per S secondi (non --richieste)")),
        ("--forza", dict(action="store_true", help="accetta una griglia di oltre 100 punti")),
        ("--capacita", dict(nargs="?", const=95.0, type=positivo(float, "una percentuale"), metavar="QUOTA",
                            help="il ritmo più alto entro --slo per QUOTA%% (95)")),
    ]),
    ("ogni cifra, esatta", None, [
        ("--dettagli", dict(action="store_true", help="percentili di latenza, attesa in coda, "
                            "TTFT, TPOT, ITL")),
        ("--slo", dict(type=obiettivi_slo, metavar="OBIETTIVI", help="latenza=5,ttft=1,tpot=0.1 (s): il "
                       "goodput")),
        ("--riscaldamento", dict(type=intero_positivo, default=0, metavar="N", help="N richieste prima, "
                                 "escluse dalle cifre")),
        ("--esatti", dict(action="store_true", help="ignore_eos: esattamente --token token a richiesta")),
        ("--percentili", dict(type=lista_percentili, metavar="P", help="quali (50,90,99.9): --dettagli, --json, "
                              "griglie")),
        ("--silenzioso", dict(action="store_true", help="niente riga dal vivo su stderr")),
    ]),
    ("vedere la prova", None, [
        ("--stream", dict(action="store_true", help="in streaming: il tempo al primo token (TTFT)")),
        ("--grafico", dict(action="store_true", help="disegna la prova (coda, prompt, generazione, slot)")),
        ("--svg", dict(type=file_scrivibile, metavar="FILE", help="lo stesso disegno in SVG")),
        ("--spiega", dict(action="store_true", help="legge la prova a parole")),
        ("--blocchi", dict(action="store_true", help="in una griglia, ogni prova per intero")),
    ]),
    ("salvare i dati", None, [
        ("--json", dict(type=file_scrivibile, metavar="FILE", help="tutto in JSON (anche i nomi di vLLM)")),
        ("--csv", dict(type=file_scrivibile, metavar="FILE", help="una riga per richiesta")),
        ("--confronta", dict(nargs=2, metavar=("A", "B"), help="due file di --json: la differenza va oltre "
                             "il rumore?")),
    ]),
    ("tutto il lab in un comando", None, [
        ("--avvia", dict(type=comando_server, metavar="COMANDO", help="avvia il server per ogni --np, misura, "
                         "lo ferma")),
        ("--np", dict(type=lista_np, metavar="LISTA", help="-np di --avvia (1,2,4; 4kv: --kv-unified; auto)")),
        ("--repliche", dict(type=lista_di(intero_positivo), metavar="LISTA", help="copie del server fra cui "
                            "dividere -np, -c e -t (1,2,4)")),
        ("--contesto-intero", dict(action="store_true", help="con --repliche: ogni copia il -c intero")),
    ]),
    ("il prezzo del parallelismo", "il contesto -c diviso fra gli slot: quanto ne tiene ognuno (--dettagli,\n"
     "--grafico, --svg); con --avvia, la cache KV dal log del server (-lv 4)", [
        ("--turni", dict(type=intero_positivo, metavar="K", help="conversazioni di K turni, una per "
                         "--parallele")),
        ("--sistema", dict(type=intero_positivo, metavar="N", help="con --turni: prompt di sistema di N token")),
    ]),
    ("aiuto", None, [
        ("-h --help", dict(action="help", help="mostra questo aiuto ed esce")),
        ("--version", dict(action="version", version=f"carico.py {__version__}", help="mostra la versione ed "
                           "esce")),
    ]),
)


class PianoOltre(NamedTuple):
    """What the extras change in what is sent; a field named as its flag is its value."""
    stream: bool = False
    modello: Optional[str] = None
    testo: Optional[str] = None  # --prompt-file: one prompt for every request
    ritmo: Optional[float] = None  # requests a second, sent by the clock (open loop)
    arrivi: str = "poisson"
    seme: Optional[int] = None
    durata: Optional[float] = None
    esatti: bool = False  # ignore_eos: every request generates exactly max_token
    tetto_predefinito: bool = False  # --ritmo without --parallele: `parallele` is TETTO_RITMO
    turni: Optional[int] = None  # each of the `parallele` users holds a conversation of K turns
    sistema: Optional[int] = None  # the conversations' system prompt, in tokens
    testo_sistema: Optional[str] = None  # that system prompt, made on the server's tokenizer
    prompt_token: Optional[Tuple[int, int]] = None  # each prompt's length in tokens, min and max
    prefisso: Optional[int] = None  # tokens every prompt opens with, the same for all (cache on)
    dataset: Optional[tuple] = None  # each request's (prompt or messages, max_tokens, timestamp)
    token_minimo: Optional[int] = None  # --token MIN-MAX: max_tokens drawn from MIN to max_token
    nome_dataset: Optional[str] = None  # --dataset's file and layout
    pezzi: Optional[tuple] = None  # exact prompts' text, each piece's start, where one may start

    @property
    def traccia(self) -> bool:
        """--dataset with timestamps: each request sent at its recorded time."""
        return bool(self.dataset) and self.dataset[0][2] is not None

    @property
    def al_tempo(self) -> bool:
        return self.ritmo is not None or self.durata is not None or self.traccia

    @property
    def da_lanciare(self) -> bool:
        """By a lanciatore: the clock, conversations, or each prompt made on leaving."""
        return self.al_tempo or any(v is not None for v in (
            self.turni, self.prompt_token, self.prefisso, self.dataset, self.token_minimo))


class RisultatoOltre(NamedTuple):
    chunk_s: Optional[Tuple[float, ...]] = None  # --stream: from send to each chunk with text (s)
    previsto: Optional[float] = None  # --ritmo: when the schedule meant to send it
    prompt_esatto: Optional[int] = None  # --prompt-token: its tokens by the server's tokenizer
    testo: Optional[str] = None  # the answer's text: a conversation (--turni) sends it back
    conversazione: Optional[int] = None  # --turni: whose conversation (0 to parallele - 1)
    turno: Optional[int] = None  # --turni: which of its turns (from 1)
    token_stimati: bool = False  # --stream without usage: `token` is the count of chunks with text
    server: Optional[int] = None  # several --url: which one answered it (from 0, in --url's order)
    ritardi: Tuple[float, ...] = ()  # --stream: each stamped read's lateness (s)
    incerti: Tuple[Tuple[int, float], ...] = ()  # (index, error bound) of each chunk read with a later one

    @property
    def primo_token(self) -> Optional[float]:
        return self.chunk_s[0] if self.chunk_s else None


class EsecuzioneOltre(NamedTuple):
    trattenute: int = 0  # --ritmo: requests sent late because --parallele were in flight
    ultimo_invio: Optional[float] = None  # --durata: when the last request left
    non_inviate: int = 0  # --ritmo with --durata: planned, the cap kept them from leaving in time
    in_ritardo: int = 0  # likewise, those carico was too late for: it woke past --durata (busy)
    server: tuple = ()  # several --url: each one's DelServer


class OpzioniOltre(NamedTuple):
    """Each field its flag's: what to print and save, how many runs, which servers."""
    ripeti: int = 1
    tabella: bool = False
    grafico: bool = False
    spiega: bool = False
    file_svg: Optional[str] = None
    file_json: Optional[str] = None
    file_csv: Optional[str] = None
    avvia: Optional[List[str]] = None  # the server's command, split as a shell would
    np: Optional[List[Configurazione]] = None  # with --avvia: one server per value
    repliche: Optional[List[int]] = None  # with --avvia: copies of the server that share each -np
    contesto_intero: bool = False  # each copy the whole -c (else divided: a slot holds as much in every layout)
    dettagli: bool = False
    blocchi: bool = False
    slo: Optional[Dict[str, float]] = None  # objective -> seconds
    riscaldamento: int = 0
    silenzioso: bool = False
    confronta: Optional[tuple] = None  # ((name, its runs as --json saved them), the same for B)
    percentili: Optional[List[Union[int, float]]] = None
    capacita: Optional[float] = None  # the share of requests (%) that must meet --slo
    server: Optional[List[str]] = None  # several --url: each server's root
    smista: str = "turno"  # which server each request goes to: a key of SMISTA


VUOTI = {Piano: PianoOltre(), Risultato: RisultatoOltre(), Esecuzione: EsecuzioneOltre(), Opzioni: OpzioniOltre()}


def oltre(record):
    """A record's `oltre` slot, or the defaults if None; a Client's made when needed."""
    if isinstance(record, Client):
        with record._lock:
            record.oltre = record.oltre or ClientOltre(record)
    return record.oltre if record.oltre is not None else VUOTI[type(record)]


class ClientOltre:
    def __init__(self, client: Client):
        self.pronte: List[socket.socket] = []  # --stream: connections opened before the clock
        self.richieste_pronte: Dict[int, bytes] = {}  # id of a request's JSON -> its bytes
        self.flussi = LettoreFlussi(client)
        self.pezzi: Dict[int, bytes] = {}  # /extras/tokenize (no pieces): each id's piece, once


def prompt_oltre(indice: int, piano: Piano) -> str:
    return oltre(piano).testo if oltre(piano).testo is not None else prompt_per(indice)


def domanda_oltre(prompt: str, piano: Piano) -> dict:
    return {**domanda_chat(prompt, piano), **campi_oltre(oltre(piano))}


def cifre_oltre(dati, chunk_s: Optional[List[float]] = None, **lettore) -> dict:
    """With the chunks' times and the text; no usage nor timings: a token a chunk, estimated."""
    cifre = cifre_completamento(dati)
    scelta = dati["choices"][0] if dati["choices"] and isinstance(dati["choices"][0], dict) else {}
    messaggio = scelta.get("message") if isinstance(scelta.get("message"), dict) else {}
    stimati = cifre["token"] is None and chunk_s is not None
    return dict(cifre, token=len(chunk_s) if stimati else cifre["token"], oltre=RisultatoOltre(
        tuple(chunk_s) if chunk_s is not None else None, testo=messaggio.get("content"), token_stimati=stimati,
        **lettore))


def invia_oltre(client: Client, indice: int, domanda: dict, timeout: float, t0: float) -> Risultato:
    if isinstance(client, Gruppo):
        return client.invia(indice, domanda, timeout, t0)
    if not domanda.get("stream"):
        return invia(client, indice, domanda, timeout, t0, cifre_oltre)
    inizio = time.perf_counter() - t0
    try:
        return ricevi_flusso(client, indice, domanda, timeout, t0)
    except Exception as exc:  # a worker never raises
        return fallita(client, indice, inizio, time.perf_counter() - t0, exc)


class LancioOltre(Lancio):
    """All at once (streams made ready before the clock), or by a lanciatore (the clock, --turni)."""

    def __init__(self, client: Client, piano: Piano, primo_prompt: int = 0, domande: Optional[List[dict]] = None):
        self.client, self.piano = client, piano
        self.lanciatore = lanciatore(piano, primo_prompt) if domande is None and oltre(piano).da_lanciare else None
        self.domande = [] if self.lanciatore else domande if domande is not None else [
            domanda_oltre(prompt_oltre(primo_prompt + i, piano), piano) for i in range(piano.richieste or 0)]
        self.partenza = Partenza(client) if oltre(piano).stream and self.domande and isinstance(client, Client) else None
        self.t0 = None

    def prepara(self, esecutore, futuri: list) -> None:
        if isinstance(self.client, Gruppo):
            self.client.nuova_prova()
        if self.domande:
            pronti = avvia_i_lavoratori(esecutore, min(self.piano.parallele, len(self.domande)))
            if self.partenza:
                self.partenza.prepara(esecutore, self.domande, pronti, self.piano.timeout, futuri)

    def lancia(self, futuri: list, esecutore, t0: float) -> None:
        self.t0 = t0
        if self.partenza:
            self.partenza.parti(t0)
        if self.lanciatore:
            self.oltre = self.lanciatore.lancia(futuri, esecutore, self.client, t0)
        for i, domanda in enumerate(self.domande[len(futuri):], len(futuri)):
            futuri.append(esecutore.submit(invia_oltre, self.client, i, domanda, self.piano.timeout, t0))

    def ferma(self) -> None:
        """After the run, or stopped before the clock; safe twice."""
        if self.partenza:
            self.partenza.ferma()
        if isinstance(self.client, Gruppo) and self.t0 is not None:
            self.oltre = (self.oltre or EsecuzioneOltre())._replace(server=self.client.della_prova(self.t0))


def campi_oltre(piano_oltre: PianoOltre) -> dict:
    campi = {}
    if piano_oltre.modello:
        campi["model"] = piano_oltre.modello
    if piano_oltre.esatti:
        campi["ignore_eos"] = True
    if piano_oltre.stream:
        campi.update(stream=True, stream_options={"include_usage": True})  # usage in the last chunk
    if piano_oltre.prefisso is not None:  # 0 too: the run to compare with, under the same cache
        campi["cache_prompt"] = True  # the cache is the experiment: a shared prefix is reused
    return campi


def opzioni_date(parser: argparse.ArgumentParser, a: argparse.Namespace) -> set:
    """The flags given, as typed (--prompt-file): those not at their default."""
    return {"--" + k.replace("_", "-") for k, v in vars(a).items() if v != parser.get_default(k)}


def oltre_il_lab(parser: argparse.ArgumentParser, a: argparse.Namespace) -> bool:
    """More than the lab's one run: a flag beyond its four, or a list of values."""
    liste = len(a.parallele or []) > 1 or len(a.token) > 1 or not isinstance(a.token[0], int) or len(a.url or []) > 1
    return liste or bool(opzioni_date(parser, a) - {"--url", "--richieste", "--parallele", "--token"})


# Flags that do not go together: (a flag, those it excludes, why; or what to say of the first given: {}).
ESCLUSIONI = (
    ("--durata", ("--richieste",), "con --durata si inviano richieste finché dura il tempo"),
    ("--dataset", ("--token MIN-MAX", "--prompt-file", "--prompt-token", "--prefisso", "--turni"),
     "le richieste vengono dal file"),
    ("--prefisso", ("--prompt-file", "--turni"), "il prefisso apre i prompt che fa carico.py"),
    ("--prompt-token", ("--prompt-file", "--turni"), "i prompt li fa l'una o l'altro"),
    ("--confronta", ("--avvia", "--turni", "--ritmo", "--durata", "--json", "--csv", "--svg", "--prompt-token"),
     "--confronta legge due file di risultati e non manda richieste: {} non serve"),
    ("--turni", ("--ritmo", "--durata", "--prompt-file", "--richieste"), "con --turni ogni utente (--parallele) "
     "tiene una conversazione, e le richieste sono i suoi turni"),
)


def leggi_opzioni_oltre(parser: argparse.ArgumentParser, a: argparse.Namespace, piano: Piano,
                        opzioni: Opzioni) -> Tuple[List[Piano], Opzioni]:
    rifiuta = parser.error
    if any(isinstance(t, tuple) for t in a.token) and (len(a.token) > 1 or a.turni is not None):
        rifiuta("--token MIN-MAX vale da solo: non in una lista, non con --turni")
    minimo = None
    if isinstance(a.token[0], tuple):  # --token MIN-MAX (--seme)
        minimo, a.token = a.token[0][0], [a.token[0][1]]
    if a.np is not None and a.avvia is None:
        rifiuta("--np va usato insieme a --avvia; senza, -np va nel comando del server (llama serve ... -np 4)")
    if a.repliche is not None:
        a.np = a.np or lista_np(str(max(a.repliche)))  # the copies' total: one slot each at the most copies
        if perche := perche_non_repliche(a.repliche, a.np, a.avvia, a.contesto_intero):
            rifiuta(perche)
        a.np = [c._replace(repliche=r) for c in a.np for r in a.repliche]  # a point per layout
    elif a.contesto_intero:
        rifiuta("--contesto-intero va usato insieme a --repliche: dice se ogni copia del server ha il -c intero")
    if a.avvia is not None and any(u.startswith("https://") for u in a.url or []):
        rifiuta("--avvia avvia llama serve in http semplice: usa --url http://...")
    if doppio := next((u for u in a.url or [] if a.url.count(u) > 1), None):
        rifiuta(f"--url {doppio} è ripetuto: ogni server una volta")
    coppie = itertools.combinations([(u, indirizzi_di(u)) for u in a.url], 2) if len(a.url or []) > 1 else ()
    if stessi := next(((u, v, i & j) for (u, i), (v, j) in coppie if i & j), None):
        rifiuta(f"--url {stessi[0]} e {stessi[1]} sono lo stesso server ({', '.join(sorted(stessi[2]))}): ogni server una "
                "volta")
    if a.avvia is not None and len(a.url or []) > 1:
        rifiuta("--avvia avvia un server solo: per più copie usa --repliche (porte libere scelte da carico.py)")
    if len(a.url or []) > 1 and a.turni is not None:
        rifiuta("--turni tiene ogni conversazione su un server solo: usa un --url")
    if a.smista and len(a.url or []) < 2 and a.repliche is None:
        rifiuta("--smista sceglie fra più server: dagli più --url (A,B) o, con --avvia, --repliche")
    # --repliche against one server's slots: a free slot anywhere, as that server's own queue would find one
    a.smista = a.smista or ("liberi" if a.repliche else "turno")
    if a.capacita is not None:
        if not a.slo or a.durata is None:
            rifiuta("--capacita cerca il ritmo più alto entro un obiettivo: servono --slo (per esempio latenza=5) e "
                   "--durata S, il tempo di ogni punto")
        if a.capacita > 100:
            rifiuta(f"--capacita {a.capacita:g}: è una percentuale di richieste, al più 100")
        di_troppo = {"--ritmo": len(a.ritmo or []) > 1, "--parallele": len(a.parallele or []) > 1,
                     "--token": len(a.token) > 1, "--turni": a.turni is not None, "--dataset": a.dataset is not None}
        if superflua := next((f for f, si in di_troppo.items() if si), None):
            rifiuta(f"--capacita sceglie da sé i ritmi da provare: {superflua} non serve "
                    "(--ritmo R, un valore solo, è il primo)")
        # from 1 req/s; steady arrivals (a seed: Poisson), so the rate sent is the rate asked
        a.ritmo = a.ritmo or [1.0]
        a.arrivi = a.arrivi or ("poisson" if a.seme is not None else "costanti")
    presenti = opzioni_date(parser, a) | ({"--token MIN-MAX"} if minimo is not None else set())
    for opzione, escluse, messaggio in ESCLUSIONI:
        altra = next((f for f in escluse if f in presenti), None)
        if opzione in presenti and altra:
            rifiuta(messaggio.format(altra) if "{}" in messaggio else f"{opzione} e {altra} si escludono: {messaggio}")
    a_caso = minimo is not None or bool(a.prompt_token) and a.prompt_token[0][0] != a.prompt_token[0][1]  # by --seme
    if a.ritmo is None and (a.arrivi is not None or a.seme is not None and not a_caso):
        rifiuta("--arrivi e --seme vanno usati insieme a --ritmo (o --seme con --prompt-token o --token MIN-MAX)")
    if a.seme is not None and a.arrivi == "costanti" and not a_caso:
        rifiuta("--seme vale per gli arrivi di Poisson: con --arrivi costanti gli orari sono fissi")
    if a.prefisso and a.prompt_token and max(a.prefisso) >= min(m for m, _ in a.prompt_token):
        rifiuta(f"--prefisso {max(a.prefisso)} non lascia posto al testo di ogni richiesta in --prompt-token "
               f"{min(m for m, _ in a.prompt_token)}: serve un --prefisso più corto")
    if a.intervallo < 0.05:
        rifiuta(f"opzione --intervallo: almeno 0.05 s, non {a.intervallo:g}: leggere /slots più spesso toglierebbe "
               "tempo al server che si vuole misurare")
    if a.durata is not None and a.durata < a.intervallo:
        rifiuta(f"opzione --durata: {a.durata:g} s è troppo breve per una prova: meno di una lettura di /slots "
               f"(--intervallo {a.intervallo:g} s)")
    if a.slo and not a.stream and set(a.slo) & {"ttft", "tpot"}:
        rifiuta("--slo: ttft e tpot si misurano solo in streaming: aggiungi --stream")
    if a.sistema is not None and a.turni is None:
        rifiuta("--sistema va usato insieme a --turni: è il prompt di sistema delle conversazioni")
    if a.turni is not None and (len(a.parallele or []) > 1 or len(a.token) > 1):
        rifiuta("--turni prova una conversazione per utente: --parallele e --token vogliono un valore solo")
    # Files read before any load: a bad one is a bad flag.
    testo = None if a.prompt_file is None else leggi_file("--prompt-file", a.prompt_file, rifiuta).strip()
    if testo == "":
        rifiuta(f"--prompt-file: '{a.prompt_file}' è vuoto")
    piano_oltre = PianoOltre(a.stream, a.modello, testo, arrivi=a.arrivi or "poisson", durata=a.durata, esatti=a.esatti,
                             tetto_predefinito=a.ritmo is not None and a.parallele is None, turni=a.turni,
                             sistema=a.sistema, token_minimo=minimo)
    if a.dataset is not None:  # all its requests unless --richieste (from the top, again)
        dataset, formato = leggi_dataset(a.dataset, rifiuta)
        if dataset[0][2] is not None and (a.ritmo is not None or a.durata is not None):
            rifiuta(f"--dataset '{a.dataset}' ha i timestamp: è una traccia; "
                   f"{'--ritmo' if a.ritmo is not None else '--durata'} non serve")
        if dataset[0][2] is not None and (a.richieste or 0) > len(dataset):
            rifiuta(f"--richieste {a.richieste}: la traccia '{a.dataset}' ne ha {len(dataset)}, con i loro orari")
        piano_oltre = piano_oltre._replace(dataset=dataset, nome_dataset=f"{a.dataset} ({formato})")
        piano = piano._replace(richieste=a.richieste or len(dataset))
        if piano_oltre.traccia and a.parallele is None:  # open loop: the cap only against a runaway
            piano_oltre = piano_oltre._replace(tetto_predefinito=True)
            a.parallele = [min(TETTO_RITMO, piano.richieste)]
    a.confronta = a.confronta and tuple((f, prove_salvate(f, rifiuta)) for f in a.confronta)
    if a.confronta and (diverse := senza_carico_comune(*a.confronta)):
        rifiuta(diverse)
    contate_all_invio = a.durata is not None or a.turni is not None  # as many requests as get sent
    base = piano._replace(richieste=None if contate_all_invio else piano.richieste, intervallo=a.intervallo,
                          timeout=a.timeout, oltre=piano_oltre)
    seme = 0 if a_caso and a.seme is None and a.ritmo is None else a.seme
    piani = griglia(base, a.parallele, a.token, a.ritmo, seme, a.prompt_token, a.prefisso)
    if a.capacita is not None and len(piani) > 1:
        rifiuta("--capacita cerca un ritmo per un carico solo: togli le liste (--prompt-token, --prefisso...)")
    a.np = a.np if a.np is not None or a.avvia is None else lista_np("1,2,4")
    punti = len(piani) * len(a.np or [None])
    if punti > MAX_PUNTI and not a.forza:
        rifiuta(f"la griglia ha {punti} punti, oltre {MAX_PUNTI}: accorcia le liste, o aggiungi --forza")
    griglia_con_flussi = a.stream and (len(piani) > 1 or len(a.np or []) > 1)  # shown in its table
    if a.percentili is not None and not (a.dettagli or a.json or griglia_con_flussi):
        rifiuta("--percentili da solo non cambia nulla: aggiungi --dettagli. Sceglie i percentili di --dettagli, del "
               "file di --json e della tabella di una griglia con --stream")
    a.server = a.url if len(a.url or []) > 1 else None
    opzioni_oltre = OpzioniOltre(**{campo: getattr(a, campo.replace("file_", "")) for campo in OpzioniOltre._fields})
    return piani, opzioni._replace(oltre=opzioni_oltre)


def leggi_file(opzione: str, percorso: str, rifiuta, leggi=lambda f: f.read()):
    try:
        with open(percorso, encoding="utf-8") as f:
            return leggi(f)
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or not JSON
        rifiuta(f"{opzione}: non riesco a leggere '{percorso}': {perche_os(exc)}")


# The session's extra steps ####################################################################

class SessioneOltre(Sessione):
    """Any extra asked: the lab's steps for each server, point and repeat."""

    @staticmethod
    def aggiungi_opzioni(parser: ParserItaliano) -> None:
        parser.epilog = EPILOGO
        for titolo, descrizione, opzioni in OPZIONI_OLTRE:
            gruppo = parser.add_argument_group(titolo, descrizione)
            for nomi, parametri in opzioni:
                parser.nomi += gruppo.add_argument(*nomi.split(), **parametri).option_strings

    @staticmethod
    def dalle_opzioni(parser: argparse.ArgumentParser, a: argparse.Namespace, piano: Piano,
                      opzioni: Opzioni) -> Optional[Tuple[List[Piano], Opzioni]]:
        return leggi_opzioni_oltre(parser, a, piano, opzioni) if oltre_il_lab(parser, a) else None

    def __init__(self, piani: List[Piano], opzioni: Opzioni):
        super().__init__(piani, opzioni)
        self.oltre: OpzioniOltre = opzioni.oltre
        self.con_props = bool(self.oltre.file_json)  # --json saves /props
        self.capacita: List[dict] = []  # --capacita's, for --json
        self.avviato: Optional[ServerAvviato] = None  # --avvia
        self.log_da = 0  # where the run begins in its log
        self.inviate = 0  # sent to this server: its next run's first prompt
        self.gruppo: Optional[Gruppo] = None  # several --url, or --repliche's copies
        self.copie: List[ServerAvviato] = []  # --avvia: the copies of this point's server (one without --repliche)
        self.memorie: Dict[Configurazione, Memoria] = {}  # --repliche: each point's RAM, the most read after a run

    def corri(self) -> None:
        o = self.oltre
        if o.confronta:  # no server
            print("\n".join(righe_confronto(*o.confronta)), flush=True)
            return
        for configurazione in o.np or [None]:
            with self.server(configurazione) as decisa:
                client, info = self.collega(decisa)
                primo = oltre(self.piani[0])
                for uno in self.gruppo.client if self.gruppo else [client]:
                    controlla_modello(uno, primo.modello)
                uno = self.gruppo.client[0] if self.gruppo else client  # several: the same model, one tokenizer
                if primo.sistema and not primo.testo_sistema:
                    self.piani = con_prompt_di_sistema(uno, self.piani)
                if not primo.pezzi and any(oltre(p).prompt_token or oltre(p).prefisso for p in self.piani):
                    self.piani = con_pezzi(uno, self.piani)  # server's tokenizer
                if o.riscaldamento:
                    riscalda(client, self.piani[0], info, o.riscaldamento)
                self.inviate = 0
                if o.capacita is not None:  # the rates are chosen as it goes
                    Capacita(self, client, info, decisa).cerca()
                    continue
                for piano in self.piani:
                    self.intestazione(piano, configurazione)
                    prove = self.ripetute(client, info, piano, decisa)
                    if o.ripeti > 1:
                        sola = len(self.piani) == 1 and not o.tabella  # else the table says it
                        print("\n".join(righe_ripetute(prove) + riga_occupata([Punto(prove)], []) * sola + [""]),
                              flush=True)
        if o.spiega and o.repliche:
            print("\n".join(righe_repliche(self.prove, self.memorie) + [""]), flush=True)
        if o.spiega and not o.repliche and (prima := da_confrontare(self.prove)) is not None:  # with --avvia
            print("\n".join(righe_ram(prima, *misura_ram(self.opzioni, prima)) + [""]), flush=True)

    @contextlib.contextmanager
    def server(self, configurazione: Optional[Configurazione]):
        if configurazione is None:
            yield None
            return
        url, attesa, r = self.opzioni.url, self.opzioni.attesa_pronto, configurazione.repliche
        with copie_avviate(self.oltre.avvia, configurazione, url, attesa, sys.stderr, self.oltre.contesto_intero) as copie:
            self.avviato, self.copie = copie[0], copie
            decisi = [server.decisioni() for server in copie]
            for i, (server, d) in enumerate(zip(copie, decisi)):
                una = configurazione._replace(np=configurazione.np // r, repliche=1)  # as one copy runs
                print(riga_decisioni(una, d) + (f" (copia {i + 1} di {r}, {server.url})" if r > 1 else ""), flush=True)
            deciso = decisi[0]._replace(n_slot=sum(d.n_slot or 0 for d in decisi) or None, cache_kv=sum(
                (d.cache_kv for d in decisi), ()), n_thread=None if any(d.n_thread is None for d in decisi) else sum(
                d.n_thread for d in decisi))  # the copies' KV caches and threads together
            nome = f"il server (-np {configurazione.etichetta})"
            quando = f"{nome} si è fermato durante la prova"
            try:
                yield configurazione._replace(deciso=deciso, kv_unificata=configurazione.kv_unificata or bool(
                    deciso.kv_unificata))
            except ServerAndato:
                for server in copie:
                    server.controlla(quando, attesa=5.0)
                raise ServerAndato(f"{nome} ha smesso di rispondere durante la prova ma non è uscito; ultime righe "
                                   f"del suo log:\n{copie[0].coda_log()}") from None
            finally:
                self.avviato, self.copie = None, []
            # A failed request may have seen the server die before its process exited.
            fallite = any(not r.riuscita for p in self.prove[-1:] for r in p.esecuzione.risultati)
            for server in copie:
                server.controlla(quando, attesa=2.0 if fallite else 0.0)

    def intestazione(self, piano: Piano, configurazione: Optional[Configurazione]) -> None:
        piani, np = self.piani, self.oltre.np or [None]
        totale = len(piani) * len(np)
        if totale > 1:
            n_punto = np.index(configurazione) * len(piani) + piani.index(piano) + 1
            descrizione = ", ".join(f"{c}={valore_di(c, piano, configurazione)}" for c in chiavi_griglia(self))
            print(f"punto {n_punto} di {totale}: {descrizione}")

    @property
    def in_breve(self) -> bool:
        """A run a line (its block in the files)."""
        return len(self.piani) > 1 and not (self.oltre.blocchi or self.oltre.dettagli)  # --np alone: the lab's blocks

    def ripetute(self, client: Client, info: InfoServer, piano: Piano,
                 configurazione: Optional[Configurazione]) -> List[Prova]:
        prove = []
        for ripetizione in range(self.oltre.ripeti):
            if self.avviato is not None:
                self.log_da = os.path.getsize(self.avviato.log.name)
            if self.oltre.ripeti > 1 and not self.in_breve:
                print(f"prova {ripetizione + 1} di {self.oltre.ripeti}")
            prove.append(self.prova(client, info, piano, configurazione))
            self.inviate += prove[-1].esecuzione.n_richieste
        return prove

    def log_della_prova(self) -> Optional[str]:
        """--avvia, at -lv 4: how the server reused its cache."""
        if self.avviato is None or self.avviato.proc.poll() is not None:
            return None
        return self.avviato.testo_log(self.log_da)

    def collega(self, configurazione: Optional[Configurazione] = None) -> Tuple[Client, InfoServer]:
        urls = [s.url for s in self.copie] if len(self.copie) > 1 else self.oltre.server or [self.opzioni.url]
        coppie = [super(SessioneOltre, self).collega(url) for url in urls]
        client, info, self.gruppo = *coppie[0], None
        if len(coppie) > 1:  # several servers: one client of the run
            client = self.gruppo = Gruppo([c for c, _ in coppie], [i for _, i in coppie], self.oltre.smista)
            info = info_del_gruppo(client.info)
        c = configurazione  # a shared context: asked (4kv) or in the server's log
        kv = None if c is None else c.kv_unificata or c.deciso.kv_unificata
        return client, info._replace(kv_unificata=kv)

    def osservatore(self, client: Client, info: InfoServer) -> Osservatore:
        return Osservatore(None if self.oltre.silenzioso else super().osservatore(client, info), self.gruppo)

    def lancio(self, client: Client, piano: Piano) -> LancioOltre:
        return LancioOltre(client, piano, self.inviate)

    def stampa_server(self, info: InfoServer) -> None:
        if not (self.in_breve and self.prove and self.prove[-1].info is info):
            kv = [f"  (--kv-unified: {info.n_ctx_slot} token di contesto condivisi fra i {info.n_slot} slot)"]
            print("\n".join([riga_server(info)] + kv * bool(info.kv_unificata) + (
                righe_del_gruppo(self.gruppo) if self.gruppo else [])), flush=True)

    def rapporto(self, prova: Prova) -> List[str]:
        e = prova.esecuzione
        if self.in_breve and not (e.interruzione or e.server_andato or prova.riepilogo.n_fallite):
            return [riga_breve(prova, sum(p.piano is prova.piano and p.info is prova.info for p in self.prove),
                               self.oltre.ripeti)]
        tetto = " (tetto predefinito)" if oltre(prova.piano).tetto_predefinito else ""
        return rapporto(prova, riga_oltre, riepilogo_oltre(prova), f"{prova.piano.parallele}{tetto}") + righe_per_server(
            prova)

    def note(self, prova: Prova) -> List[str]:
        piano_oltre, stimate = oltre(prova.piano), [r for r in prova.esecuzione.riuscite if oltre(r).token_stimati]
        return note(prova, piano_oltre.esatti, piano_oltre.turni is not None or piano_oltre.prefisso is not None,
                    bool(piano_oltre.turni), not piano_oltre.stream and prova.configurazione is None,
                    self.gruppo and min(i.n_slot or 0 for i in self.gruppo.info)) + ([
            f"il server non ha detto nel flusso quanti token ha generato (né usage né timings) per "
            f"{quante(len(stimate), 'richiesta', 'richieste')}. I loro token (segnati ~) sono una stima: uno per "
            "chunk con testo, ma un chunk può portarne più d'uno"] if stimate else []) + nota_lettore(
            prova, self.oltre.percentili or ())

    def codice_fallite(self, fallite: List[Risultato]) -> int:
        turni = any(oltre(p.piano).turni for p in self.prove)
        return 3 if turni and all(map(contesto_finito, fallite)) else 1

    def dopo_la_prova(self, prova: Prova) -> None:
        o, piano_oltre = self.oltre, oltre(prova.piano)
        if o.repliche and self.copie:  # the copies still run: what they hold now
            lette = [m for m in (memoria([s.proc.pid for s in self.copie]), self.memorie.get(prova.configurazione)) if m]
            self.memorie[prova.configurazione] = max(lette, key=lambda m: m.totale, default=None)  # grows with use
        andati = [d for d in oltre(prova.esecuzione).server if d.andato]
        righe = (righe_ritmo(prova) if piano_oltre.al_tempo else []) + righe_prompt_esatti(prova, self.log_della_prova())
        if piano_oltre.turni:
            righe += [""] + righe_conversazioni(prova)
        if o.dettagli:
            righe += [""] + righe_dettagli(prova, o.percentili) + righe_contesto(prova)
        if o.slo:
            righe += ([] if o.dettagli else [""]) + [riga_slo(prova, o.slo)]
        if o.grafico and prova.esecuzione.risultati:
            righe += [""] + grafico(prova, marche_per(sys.stdout))
        if o.spiega:
            righe += [""] + spiegazione(prova)
        if o.avvia or o.ripeti > 1 or len(self.piani) > 1:
            righe.append("")
        if righe and not self.in_breve:  # the rest in the files, and with --blocchi
            print("\n".join(righe), flush=True)
        for testo in note_ritmo(prova) if piano_oltre.ritmo or piano_oltre.traccia else []:
            nota(testo)
        letti = any(c.occupati is not None for c in prova.esecuzione.campioni)
        if (o.dettagli or o.grafico or o.file_svg or piano_oltre.turni) and letti and not letture_contesto(prova):
            nota("/slots non dice quanti token tiene ogni slot (n_prompt_tokens): il contesto per slot è n/d")
        if andati and not (prova.esecuzione.server_andato or prova.esecuzione.interruzione):  # the others went on: exit 1
            raise ServerAndato(f"{', '.join(d.base for d in andati)}: smesso di rispondere durante la prova, le "
                               "richieste dopo sono andate agli altri server. Controlla che cosa l'ha fermato e ripeti")

    def alla_fine(self) -> None:
        """Even after an error or a stop, whole (Ctrl+C waits)."""
        if self.prove:
            with segnali() as notati:
                tabella_e_file(self)
            self.arresto = self.arresto or next(iter(notati), None)


def riga_oltre(r: Risultato, larghezza: int = 1) -> str:
    riga = riga_richiesta(r, larghezza, "~" if oltre(r).token_stimati else "")
    return riga + (f"  primo token {oltre(r).chunk_s[0]:.2f} s" if r.riuscita and oltre(r).chunk_s else "")


def riepilogo_oltre(prova: Prova) -> Riepilogo:
    e = prova.esecuzione
    s = prova.riepilogo._replace(token_stimati=any(oltre(r).token_stimati for r in e.riuscite), interrotte=sum(
        tipo_errore(r.errore) == TRONCATA for r in e.risultati if not r.riuscita))
    return s._replace(coda_dai_tempi=coda_del_gruppo(prova)) if oltre(e).server else s


# When something goes wrong: what a lab run meets only then ####################################

# Stopped with Ctrl+C, llama serve closes its port at once but never answers the requests in flight,
# and keeps their connections open until they close (measured: ../shared/llama-server-api.md); a
# killed server resets them. Either way nothing more comes: waiting out --timeout, or sending more
# to a closed port (a closed loop does, thousands a second), measures nothing.

RIFIUTI_DI_FILA = 3  # refused (or reset) in a row, no answer between, before a knock at the port


class Sentinella:
    """Watches a run's exchanges; the server gone (`andato`), those in flight are closed at once
    (Client.annulla): the run ends within seconds."""

    def __init__(self, client: Client):
        self._client, self._lock = client, threading.Lock()
        self.arma(False)  # armed only during a run: a server still starting refuses too

    def arma(self, armata: bool = True) -> None:
        with self._lock:  # di_fila: refusals since the last answer, on which `percorsi`, `come`
            self.armata, self.di_fila, self.percorsi, self.come = armata, 0, set(), set()
            self.andato: Optional[Tuple[float, str]] = None  # (perf_counter() when found gone, why)

    def risposta(self) -> None:
        """An HTTP answer, any status: the server is there."""
        self.di_fila = 0

    def in_ascolto(self) -> bool:
        try:
            socket.create_connection((self._client.host, self._client._porta), timeout=2.0).close()
        except OSError as exc:
            return isinstance(exc, socket.timeout)  # slow is not gone
        return True

    def rifiuto(self, percorso: str, exc: Exception) -> bool:
        """A failed exchange; True: a refusal (or a reset) that counts."""
        import http.client

        if not self.armata or self._client.annullato.is_set():
            return False
        if isinstance(exc, socket.timeout):  # no answer in time: refused only if the port is shut
            if self.in_ascolto():
                return False
        elif not isinstance(exc, (ConnectionRefusedError, ConnectionResetError, BrokenPipeError,
                                  http.client.IncompleteRead)):
            return False
        with self._lock:
            self.di_fila += 1
            self.percorsi.add(percorso)
            self.come.add("rifiutata" if isinstance(exc, ConnectionRefusedError) else
                          "scaduta" if isinstance(exc, socket.timeout) else "chiusa")
            if self.di_fila < RIFIUTI_DI_FILA or self.andato is not None:
                return True
            # A server still there may reset a few; a killed one resets them a moment before the
            # kernel closes its port: knock again a moment later.
            if self.in_ascolto() and (time.sleep(0.25) or self.in_ascolto()):
                self.di_fila = 0
                return True
            di_fila = f"{self.di_fila} volte di fila, su {', '.join(sorted(self.percorsi))}"
            self.andato = (time.perf_counter(), f"connessione {' o '.join(sorted(self.come))} {di_fila}, e la porta non è "
                           "più in ascolto")
        self._client.annulla()
        return True


class ParserItaliano(argparse.ArgumentParser):
    """argparse in Italian; an option of `llama serve` named as such."""

    nomi: Sequence[str] = ()  # the flags' names, for the nearest to a mistyped one

    def __init__(self, **parametri):
        super().__init__(formatter_class=FormatoAiuto, **parametri)

    ERRORI = (("expected one argument", "richiede un valore"),
              ("ignored explicit argument (.*)", r"non accetta valori (\1)"),
              ("expected at most one argument", "accetta al più un valore"),
              ("expected (\\d+) arguments", r"richiede \1 valori"),
              ("invalid choice: (.*)", r"scelta non valida: \1"),
              ("unrecognized arguments: (.*)", r"opzioni non riconosciute: \1"),
              ("ambiguous option: (\\S+) could match (.*)", r"opzione ambigua: \1 potrebbe essere \2"),
              ("the following arguments are required: (.*)", r"mancano le opzioni: \1"))
    # `llama serve`'s options students give to carico.py.
    DEL_SERVER = ("--metrics", "--kv-unified", "-kvu", "-np", "--parallel", "-c", "--ctx-size", "-t", "--threads",
                  "-m", "--model", "-hf", "-ngl", "--no-slots", "--port", "--host", "-a", "--alias")

    def error(self, message):
        import re

        opzione = re.match(r"argument (\S+): (.*)$", message, re.S)
        prefisso, resto = (f"opzione {opzione.group(1)}: ", opzione.group(2)) if opzione else ("", message)
        resto = next((m.expand(italiano) for inglese, italiano in self.ERRORI
                      if (m := re.fullmatch(inglese, resto, re.S))), resto)
        ignote = re.match(r"unrecognized arguments: (.*)$", message)
        parole = ignote.group(1).split() if ignote else []
        del_server = [p for p in parole if p.split("=")[0] in self.DEL_SERVER]
        if del_server:
            cosa = "è un'opzione" if len(del_server) == 1 else "sono opzioni"
            resto += (f". {', '.join(del_server)} {cosa} di llama serve, non di carico.py: va nel comando che avvia "
                      "il server (o in --avvia \"llama serve ...\"; -np in --np)")
        elif ignote and not any(p.startswith("-") for p in parole):  # a value without its flag
            esempio = next((f"--url {p if '://' in p else 'http://' + p}" for p in parole
                            if "://" in p or re.match(r"[\w.-]+:\d+(/|$)", p)), "--richieste 4")  # host:port too
            resto += f" (un valore va dopo la sua opzione: {esempio}; elenco: --help)"
        elif ignote:  # a flag mistyped: carico's nearest, if one is near
            import difflib

            forse = [vicina for p in parole if p.startswith("-")
                     for vicina in difflib.get_close_matches(p.split("=")[0], self.nomi, n=1, cutoff=0.8)]
            resto += f" (forse {', '.join(dict.fromkeys(forse))}? l'elenco: --help)" if forse else ""
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: errore: {prefisso}{resto}\n")


def larghezza_di(terminale) -> int:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.get_terminal_size(terminale.fileno()).columns or 80
    return int(os.environ["COLUMNS"]) if os.environ.get("COLUMNS", "").isdigit() else 80


class FormatoAiuto(argparse.RawDescriptionHelpFormatter):
    def __init__(self, prog: str):
        # The width given, so that argparse does not import shutil (5 ms of start-up) to ask it.
        super().__init__(prog, width=max(larghezza_di(sys.stdout), 40) - 2)

    def add_usage(self, usage, actions, groups, prefix="uso: "):
        super().add_usage(usage, actions, groups, prefix)


def righe_server_andato(prova: Prova, larghezza: int, parallele: str, s: Optional[Riepilogo] = None) -> List[str]:
    e = prova.esecuzione
    inviate = {r.indice for r in e.risultati}
    rifiutate = [r.indice for r in e.risultati if rifiutata(r)]
    non_inviate = [] if e.interruzione else [i for i in range(e.n_richieste) if i not in inviate]
    righe, muto = [], "il server non rispondeva più"
    for indici, una, molte, perche in ((rifiutate, "rifiutata", "rifiutate", "nessun server in ascolto"),
                                       (non_inviate, "non inviata", "non inviate", muto)):
        if indici:
            righe.append(f"  req {numeri_in_tratti(indici)}: {len(indici)} richieste {molte}: {perche}" if len(indici) > 1
                         else f"  req {indici[0]:>{larghezza}}: {una}: {perche}")
    # Left open (a server stopped with Ctrl+C) or reset (a killed one): taken, never answered.
    in_volo = sum(r.errore in (IN_VOLO, descrivi_errore_rete(ConnectionResetError(), 0)) for r in e.risultati)
    riepilogo = righe_riepilogo(s or prova.riepilogo, e.n_richieste, parallele, prova.info, muto)
    return righe + [""] + riepilogo + [
        f"il server ha smesso di rispondere (accertato a {e.server_andato[0]:.2f} s): invii fermati"
        + (f", {quante(in_volo, 'richiesta in volo rimasta', 'richieste in volo rimaste')} senza risposta"
           if in_volo else "") + f". {maiuscola(e.server_andato[1])}"]


def numeri_in_tratti(indici: List[int]) -> str:
    """[0, 2, 4] -> "0, 2, 4", [3, 4, 5, 8] -> "3-5, 8"."""
    gruppi = [[i for _, i in g] for _, g in itertools.groupby(enumerate(indici), lambda p: p[1] - p[0])]
    return ", ".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in gruppi)


class ErroreOpzione(ErroreUtente):
    """A flag wrong for this server (--modello): exit 2; one it cannot honour: exit 1."""
    codice = 2


def perche_os(exc: Exception) -> str:
    perche = {errno.ENOENT: "non esiste", errno.EACCES: "permesso negato", errno.EISDIR: "è una cartella",
              errno.ENOTDIR: "una parte del percorso non è una cartella", errno.ENOSPC: "il disco è pieno"}
    return perche.get(getattr(exc, "errno", None)) or getattr(exc, "strerror", None) or str(exc)


# Servers that say less: /slots off, another server; /props for --json #########################

def info_da_props(client: Client, risposta_slots: Risposta, info: Optional[InfoServer]) -> InfoServer:
    """/slots not llama.cpp's (--no-slots, another server): the header from /props."""
    risposta = chiedi(client, "/props")
    props = leggi_json(risposta.corpo) if risposta.status == 200 else None
    props = props if isinstance(props, dict) else None
    if info is None and props is not None:
        impostazioni = props.get("default_generation_settings")
        n_ctx = numero(impostazioni.get("n_ctx"), int) if isinstance(impostazioni, dict) else None
        n_slot = numero(props.get("total_slots"), int)
        if n_slot is not None or n_ctx is not None:
            info = InfoServer(n_slot, n_ctx, False)
    if info is None:  # another server: what it answers, said once
        avvisi = (com_e_il_server(client, risposta_slots),)
        return InfoServer(None, None, False, avvisi=avvisi, props=props, llama_cpp=False)
    avvisi = ()
    if not info.slots_disponibile:
        spento = risposta_slots.status == 501
        perche = ("è disattivato (server avviato con --no-slots)" if spento else
                  f"non risponde come llama.cpp ({descrivi_errore_http(risposta_slots)})")
        avvisi = (f"/slots {perche}: gli slot occupati si ricavano solo dai tempi del server"
                  + ("" if spento else ", se li dà"),)
    return info._replace(avvisi=avvisi, props=props, llama_cpp=True)


def com_e_il_server(client: Client, risposta_slots: Risposta) -> str:
    """Not llama.cpp: the endpoints it answers, so what a run can give."""
    def risponde(percorso: str, campo: str) -> bool:
        try:
            return client.chiama("POST", percorso, {campo: "a"}).status == 200
        except ErroreRete:
            return False

    modelli = modelli_del_server(client)
    si = ([f"/v1/models ({', '.join(modelli)})"] if modelli else []) + [
        p for p, c in (("/tokenize", "content"), ("/extras/tokenize", "input")) if risponde(p, c)]
    no = ["/slots", "/props", "/metrics"] + (["/v1/models"] if not modelli else []) + (
        ["/tokenize"] if not any(p.endswith("tokenize") for p in si) else [])
    return (f"il server su {client.base} non è llama.cpp (/slots: HTTP {risposta_slots.status}). "
            + (f"Risponde a {', '.join(si)}; non a {', '.join(no)}" if si else f"Non risponde a nessuna strada "
               f"nota ({', '.join(no)}): controlla --url e la porta") + ". Slot, contesto e coda sono n/d: "
            "slot occupati e attesa vengono solo dai timings delle risposte, se ci sono")


def modelli_del_server(client: Client) -> Optional[List[str]]:
    """The ids /v1/models lists (llama.cpp: the alias -a, else the model's path)."""
    try:
        risposta = client.chiama("GET", "/v1/models")
    except ErroreRete:
        return None
    dati = leggi_json(risposta.corpo) if risposta.status == 200 else None
    elenco = dati.get("data") if isinstance(dati, dict) else None
    ids = [m.get("id") for m in elenco if isinstance(m, dict)] if isinstance(elenco, list) else []
    return [i for i in ids if isinstance(i, str)] or None


def controlla_modello(client: Client, modello: Optional[str]) -> None:
    """--modello not listed: a server with one model answers any name, measured as it."""
    nomi = modelli_del_server(client) if modello else None
    if nomi and modello not in nomi:
        raise ErroreOpzione(f"--modello {modello}: il server su {client.base} non ha questo modello; /v1/models "
                            f"elenca {', '.join(nomi)}")


# Where a request's time went: the server's own times ###########################################

# `attesa dello slot` (attesa_slot_s): from the send until a slot took it (queue and trip).
# `attesa in coda` (attesa_in_coda_s): its part with all slots busy.

def attesa_dello_slot(r: Risultato) -> Optional[float]:
    slot = in_slot(r)
    return None if slot is None else slot[0] - r.inizio


def attese_a_slot_pieni(ok: List[Risultato], n_slot: Optional[int]) -> Dict[int, float]:
    if not n_slot:
        return {}
    pieni = []  # the spans when every slot was busy
    for da, a, occupati, _ in gradini_dai_tempi(ok):
        if occupati < n_slot:
            continue
        if pieni and pieni[-1][1] == da:  # still full: the span goes on
            da = pieni.pop()[0]
        pieni.append((da, a))
    attese = {r.indice: accorcia((r.inizio, in_slot(r)[0])) for r in ok if in_slot(r)}
    return {i: sum(max(0.0, min(a, attesa[1]) - max(da, attesa[0])) for da, a in pieni)
            for i, attesa in attese.items() if attesa}


# --stream: the time to the first token, and between tokens ######################################
# As vLLM's benchmark defines them, but the first token is the first chunk with text: llama.cpp's
# first chunk, only the role, leaves when a slot takes the request: it would hide the prefill.

class ErroreNelFlusso(ErroreRichiesta):
    """An error inside a stream (`data: {"error": ...}`), or one cut short."""


# A stream is whole only when a chunk says why it ended (finish_reason). A server may end one early
# with `[DONE]` (llama-cpp-python, another request waiting) or close it: a failure.
TRONCATA = "il server ha interrotto la risposta"


# Streams are read here, not by http.client (a line at a time, a settimeout and a poll each, no
# kernel receive time: that needs recvmsg), nor by a thread each (a thousand woken per chunk cost
# several cores at 50,000 chunks/s). ONE thread (LettoreFlussi) keeps each recv with the kernel's
# time (SO_TIMESTAMPNS; two chunks in one read share the later stamp). Measured: 50,000 reads/s
# cost 16-20 us each; framing, stamps and JSON add ~13 us a read and, inline, put the reader a
# chunk's gap behind: that work waits for moments with nothing to read, a FETTA at a time.
SO_TIMESTAMPNS = 35  # Linux's number; Python's socket module does not name it
LETTURA = 65536  # bytes a read asks for: a burst of events in one read
SPAZIO_STAMPO = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0  # one stamp's room


def scarto_orologi() -> float:
    """time.time() - time.perf_counter() (kernel stamps are wall-clock), best of 5."""
    letture = []
    for _ in range(5):
        a, parete, b = time.perf_counter(), time.time(), time.perf_counter()
        letture.append((b - a, parete - (a + b) / 2))
    return min(letture)[1]


def stampi_del_kernel(sock: socket.socket) -> bool:
    """Linux stamps `sock`'s reads with their arrival; False: it cannot."""
    if not sys.platform.startswith("linux") or hasattr(sock, "cipher"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        return True
    except OSError:
        return False


class Flusso:
    """A streamed answer: LettoreFlussi feeds it, its worker waits on `finito`."""

    def __init__(self, sock: socket.socket, scadenza: float):
        self.sock, self.scadenza = sock, scadenza  # --timeout's end (monotonic)
        self.stampi, self.tls = stampi_del_kernel(sock), hasattr(sock, "pending")
        self.inviata = 0.0  # perf_counter
        self.richiesta, self.timeout = b"", 0.0  # Partenza's
        self.status: Optional[int] = None
        self.blocchi: List[Tuple[float, bytes]] = []  # (arrived at, bytes)
        # Reads not yet framed, flat (t, stamp or b"", bytes, ...): a tuple a read, at a thousand
        # streams, wakes the garbage collector, whose passes stop all threads tens of ms
        self.letture: list = []
        self.scarto, self.fine_trovata = 0.0, False
        self.ritardi: Dict[float, Optional[float]] = {}  # a read's time: its lateness (None: no stamp)
        self.esito: Optional[Tuple[dict, List[float], float]] = None  # leggi_flusso's, on a 200
        self.eccezione: Optional[BaseException] = None
        self.finito = threading.Event()
        self._buffer, self._coda = b"", b""  # bytes not yet framed; the body's tail (_fatto)
        self._a_pezzi, self._mancano, self._pezzo = False, None, 0
        self.solo_letture = False  # chunked, kernel stamps: _leggi's short way

    def letto(self, t: float, stampo: bytes, dati: bytes) -> bool:
        """True: may end."""
        self.letture += (t, stampo, dati)
        if self.status is not None and self._a_pezzi:
            return forse_la_fine(dati)
        if self.status is None and self.stampi and not self._buffer:
            # The usual first read (a thousand streams start at once): headers off here
            fine = dati.find(b"\r\n\r\n")
            if fine > 0 and dati.startswith(b"HTTP/1.1 200 ") and (
                    b"\r\ntransfer-encoding: chunked\r\n" in dati[:fine + 2].lower()):
                self.status, self._a_pezzi, self.solo_letture = 200, True, True
                corpo = dati[fine + 4:]
                self.letture[-3:] = (t, stampo, corpo) if corpo else ()  # b"" would say closed
                return bool(corpo) and forse_la_fine(corpo)
        return self.inquadra()

    def inquadra(self, scade: float = float("inf")) -> bool:
        """One read at least, until `scade`; True: ended."""
        letture, self.letture = self.letture, []
        for i in range(0, len(letture), 3):
            if i and time.perf_counter() >= scade:
                self.letture = letture[i:]
                break
            if not self.fine_trovata:  # bytes after the end are not the answer's
                t, stampo, dati = letture[i:i + 3]
                arrivo, ritardo = quando_arrivati(t, stampo, self.inviata, self.scarto)
                self.ritardi.setdefault(arrivo, ritardo)
                self.fine_trovata = self.arrivati(arrivo, dati)
        return self.fine_trovata

    def arrivati(self, t: float, dati: bytes) -> bool:
        """b"": closed; True once the answer ended."""
        if not dati:
            if self.status is None:  # as http.client's
                raise ConnectionResetError("connessione chiusa dal server prima della risposta")
            return True  # a body without a length; else cut short (leggi_flusso says so)
        if self.status is None:
            self._buffer += dati
            dati = self._testata()
            if self.status is None:
                return False
        if self._a_pezzi:
            dati, finito = self._togli_pezzi(dati)
        else:
            if self._mancano is not None:
                dati = dati[:self._mancano]
                self._mancano -= len(dati)
            finito = self._mancano == 0
        if dati:
            self.blocchi.append((t, dati))
        return finito or self._fatto(dati)

    def _testata(self) -> bytes:
        """Once all here (1xx skipped): the bytes after the headers."""
        while True:
            fine = self._buffer.find(b"\r\n\r\n")
            if fine < 0:
                if len(self._buffer) > 65536:
                    raise ErroreRete("risposta HTTP non valida (intestazioni troppo lunghe)")
                return b""
            testa, self._buffer = self._buffer[:fine].decode("latin-1"), self._buffer[fine + 4:]
            righe = testa.split("\r\n")
            parti = righe[0].split(None, 2)
            if len(parti) < 2 or not parti[0].startswith("HTTP/") or not parti[1].isdigit():
                raise ErroreRete("risposta HTTP non valida (BadStatusLine)")
            if int(parti[1]) >= 200:
                break
        campi = {k.strip().lower(): v.strip() for k, _, v in (r.partition(":") for r in righe[1:])}
        self._a_pezzi = "chunked" in campi.get("transfer-encoding", "").lower()
        lunghezza = campi.get("content-length", "")
        self._mancano = int(lunghezza) if lunghezza.isdigit() and not self._a_pezzi else None
        self.solo_letture = self._a_pezzi and self.stampi
        self.status, dopo, self._buffer = int(parti[1]), self._buffer, b""
        return dopo

    def _togli_pezzi(self, dati: bytes) -> Tuple[bytes, bool]:
        """By position: a late read brings dozens of chunks. _pezzo: bytes left in this chunk, -1
        when its CRLF is due."""
        buffer = self._buffer + dati if self._buffer else dati
        pos, carico_utile = 0, []
        while True:
            if self._pezzo > 0:
                fino = min(pos + self._pezzo, len(buffer))
                carico_utile.append(buffer[pos:fino])
                self._pezzo -= fino - pos
                pos = fino
                if self._pezzo:
                    break
                self._pezzo = -1
            fine_riga = buffer.find(b"\r\n", pos)
            if fine_riga < 0:
                if len(buffer) - pos > 1024:
                    raise ErroreRete("risposta HTTP non valida (chunk)")
                break
            riga, pos = buffer[pos:fine_riga], fine_riga + 2
            if self._pezzo == -1:  # the CRLF that closes a chunk's data
                if riga:
                    raise ErroreRete("risposta HTTP non valida (chunk)")
                self._pezzo = 0
                continue
            try:
                self._pezzo = int(riga.split(b";")[0].strip(), 16)
            except ValueError:
                raise ErroreRete("risposta HTTP non valida (chunk)") from None
            if self._pezzo == 0:  # the last chunk (trailers not read)
                self._buffer = b""
                return b"".join(carico_utile), True
        self._buffer = buffer[pos:]
        return b"".join(carico_utile), False

    def _fatto(self, dati: bytes) -> bool:
        """A whole `data: [DONE]` line (the end, even kept open) in the last bytes: all is slow."""
        coda = self._coda + dati
        self._coda = coda[-16:]
        if b"[DONE]" not in coda:
            return False
        ultimi = b""
        for _, pezzo in reversed(self.blocchi):
            if len(ultimi) > len(dati) + 256:
                ultimi = ultimi.partition(b"\n")[2]  # whole lines only
                break
            ultimi = pezzo + ultimi
        righe = ultimi.split(b"\n")[:-1]
        return any(r.strip().startswith(b"data:") and r.strip()[5:].strip() == b"[DONE]" for r in righe)

    def corpo(self) -> bytes:
        return b"".join(dati for _, dati in self.blocchi)


def forse_la_fine(dati: bytes) -> bool:
    """A read that may end a chunked body (under 16 bytes: a [DONE] cut, its `\n\n` in a chunk)."""
    return len(dati) < 16 or dati.endswith(b"\r\n\r\n") or b"[DONE]" in dati


class Giro:
    """A life of LettoreFlussi's thread: what it selects, reads (by number, with deadlines), may
    have ended (stream, its chiudi())."""

    def __init__(self):
        import collections
        import selectors

        self.selettore = selectors.DefaultSelector()
        self.attivi: Dict[int, Flusso] = {}
        self.scadenze: List[Tuple[float, int]] = []  # (deadline, stream's number), a heap
        self.da_chiudere = collections.deque()

    def un_passo(self, flusso: Flusso, passo) -> None:
        try:
            passo(flusso)
        except (NonInviata, OSError, ValueError) as exc:  # a failed send, a socket Ctrl+C closed
            self.fine(flusso, OSError(str(exc)) if isinstance(exc, ValueError) else exc)

    def da_leggere(self, flusso: Flusso) -> None:
        import heapq
        import selectors

        if flusso.sock.gettimeout() != 0.0:  # the start's are non-blocking already
            flusso.sock.setblocking(False)
        self.selettore.register(flusso.sock, selectors.EVENT_READ, flusso)
        self.attivi[flusso.numero] = flusso
        heapq.heappush(self.scadenze, (flusso.scadenza, flusso.numero))

    def da_inquadrare(self, flusso: Flusso) -> None:
        self.togli(flusso)
        self.da_chiudere.append((flusso, self.chiudi(flusso)))

    def chiudi(self, flusso: Flusso) -> Generator[None, None, None]:
        """A FETTA a next() (a read at least): 4,000 tokens at once held the reader 50 ms."""
        if flusso.finito.is_set():
            return
        try:
            while not flusso.inquadra(time.perf_counter() + FETTA):
                if not flusso.letture:
                    self.da_leggere(flusso)
                    return
                yield
            if flusso.status == 200:
                yield
                flusso.esito = yield from leggi_flusso(iter(flusso.blocchi))
        except Exception as exc:  # a bad framing, a socket closed meanwhile
            self.fine(flusso, exc)
        else:
            self.fine(flusso)

    def togli(self, flusso: Flusso) -> None:
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.selettore.unregister(flusso.sock)
        self.attivi.pop(getattr(flusso, "numero", None), None)

    def fine(self, flusso: Flusso, eccezione: Optional[BaseException] = None) -> None:
        self.togli(flusso)
        flusso.eccezione = eccezione
        flusso.finito.set()


class LettoreFlussi:
    RIPOSO = 1.0  # idle seconds before the thread ends: a run's next stream finds it

    def __init__(self, client: Client):
        self._client, self._lock = client, threading.Lock()
        self._nuovi: List[Flusso] = []  # not yet selected
        self._thread: Optional[threading.Thread] = None
        self._sveglia: Optional[Tuple[socket.socket, socket.socket]] = None
        self._svegliato = False  # a wake-up byte already sent

    def avvia(self) -> None:
        with self._lock:
            self._avvia()

    def _avvia(self) -> None:
        if self._thread is None:
            self._sveglia, self._svegliato = socket.socketpair(), False
            self._sveglia[0].setblocking(False)
            self._thread = threading.Thread(target=self._gira, args=(self._sveglia,), name="flussi", daemon=True)
            self._thread.start()
        if not self._svegliato:
            self._svegliato = True
            self._sveglia[1].send(b"\0")

    def segui(self, flusso: Flusso, partenza: Optional[Partenza] = None) -> None:
        """Sent now or at the start (Partenza), read to its end (`finito`)."""
        with self._lock:
            if partenza is not None and not partenza.partita:
                partenza.in_attesa.append(flusso)
                partenza.pronte.release()
                return
            self._nuovi.append(flusso)
            self._avvia()

    def parti(self, partenza: Partenza, t0: Optional[float]) -> None:
        """None sent once the run is stopped."""
        with self._lock:
            if partenza.partita:
                return
            partenza.t0, partenza.partita = t0 if t0 is not None else time.perf_counter(), True
            self._nuovi += partenza.in_attesa
            if partenza.in_attesa:
                self._avvia()

    def _gira(self, sveglia: Tuple[socket.socket, socket.socket]) -> None:
        import heapq
        import selectors

        giro, scarto = Giro(), scarto_orologi()
        selettore, attivi, da_chiudere = giro.selettore, giro.attivi, giro.da_chiudere
        scadenze = giro.scadenze
        selettore.register(sveglia[0], selectors.EVENT_READ, None)
        numeri, riposa_da = itertools.count(), time.monotonic()
        try:
            while True:
                with self._lock:
                    nuovi, self._nuovi, self._svegliato = self._nuovi, [], False
                    if not (nuovi or attivi or da_chiudere) and time.monotonic() - riposa_da >= self.RIPOSO:
                        self._thread = None
                        return
                for flusso in nuovi:  # the start's requests first, back to back (see Partenza)
                    flusso.numero, flusso.scarto = next(numeri), scarto
                    if flusso.richiesta:
                        giro.un_passo(flusso, self._invia)
                for flusso in nuovi:
                    if not flusso.finito.is_set():
                        giro.un_passo(flusso, giro.da_leggere)
                adesso = time.monotonic()
                while scadenze and (scadenze[0][1] not in attivi or scadenze[0][0] <= adesso):
                    flusso = attivi.get(heapq.heappop(scadenze)[1])
                    if flusso is not None:
                        giro.fine(flusso, socket.timeout())
                if len(scadenze) > 2 * len(attivi) + 64:  # ended streams' deadlines
                    scadenze[:] = [s for s in scadenze if s[1] in attivi]
                    heapq.heapify(scadenze)
                if attivi:
                    riposa_da = adesso
                attesa = scadenze[0][0] - adesso if scadenze else max(0.0, riposa_da + self.RIPOSO - adesso)
                pronti = selettore.select(0.0 if da_chiudere else attesa)
                for chiave, _ in pronti:
                    if chiave.data is None:
                        with contextlib.suppress(OSError):
                            sveglia[0].recv(4096)
                    else:
                        self._leggi(giro, chiave.data)
                if da_chiudere and not pronti:  # a slice of an end's work
                    try:
                        next(da_chiudere[0][1])
                    except StopIteration:
                        da_chiudere.popleft()
        finally:  # its own bug: no worker left waiting (a rest leaves streams since handed to the next)
            with self._lock:
                nuovi = []
                if self._thread is threading.current_thread():
                    nuovi, self._nuovi, self._thread = self._nuovi, [], None
            for flusso in list(attivi.values()) + [f for f, _ in da_chiudere] + nuovi:
                giro.fine(flusso, RuntimeError("il lettore dei flussi si è fermato"))
            selettore.close()
            for s in sveglia:
                s.close()

    def _invia(self, flusso: Flusso) -> None:
        if self._client.annullato.is_set():  # Ctrl+C before the start
            raise NonInviata(NON_INVIATA)
        flusso.scadenza = time.monotonic() + flusso.timeout  # --timeout counts from the send
        flusso.inviata = time.perf_counter()
        try:
            inviati = flusso.sock.send(flusso.richiesta)
        except OSError as exc:  # buffer full: all again (TLS wants the same bytes)
            if not da_riprovare(exc):
                raise
            inviati = 0
        if inviati < len(flusso.richiesta):
            flusso.sock.settimeout(max(0.001, flusso.scadenza - time.monotonic()))
            flusso.sock.sendall(flusso.richiesta[inviati:])
        flusso.richiesta = b""

    def _leggi(self, giro: Giro, flusso: Flusso) -> None:
        """TLS: till none is left decrypted."""
        if flusso.solo_letture:  # most chunks' read, inline: at 50,000/s each call counts
            try:
                dati, ausiliari, _, _ = flusso.sock.recvmsg(LETTURA, SPAZIO_STAMPO)
            except BlockingIOError:
                return
            except OSError as exc:
                giro.fine(flusso, exc)
                return
            stampo = ausiliari[0][2] if ausiliari and ausiliari[0][1] == SO_TIMESTAMPNS else b""
            flusso.letture += (time.perf_counter(), stampo, dati)
            if forse_la_fine(dati):
                giro.da_inquadrare(flusso)
            return
        try:
            while True:
                letto = leggi_con_tempo(flusso)
                if letto is None:
                    return
                prima = flusso.status
                forse_finito = flusso.letto(*letto)
                if prima is None and flusso.status is not None:
                    self._client.sentinella.risposta()
                if forse_finito:
                    giro.da_inquadrare(flusso)
                    return
                if not (flusso.tls and flusso.sock.pending()):
                    return
        except Exception as exc:  # for its worker to raise
            giro.fine(flusso, exc)


def leggi_con_tempo(flusso: Flusso) -> Optional[Tuple[float, bytes, bytes]]:
    """(read at, stamp or b"", bytes: b"" closed); None if nothing came."""
    try:
        if flusso.stampi:
            dati, ausiliari, _, _ = flusso.sock.recvmsg(LETTURA, SPAZIO_STAMPO)
            stampo = ausiliari[0][2] if ausiliari and ausiliari[0][1] == SO_TIMESTAMPNS else b""
        else:
            dati, stampo = flusso.sock.recv(LETTURA), b""
    except OSError as exc:
        if da_riprovare(exc):
            return None
        raise
    return time.perf_counter(), stampo, dati


def da_riprovare(exc: OSError) -> bool:
    """A non-blocking call failed only because it would wait (TLS: either way)."""
    ssl = sys.modules.get("ssl")  # imported by https (see con_tls)
    tls = (ssl.SSLWantReadError, ssl.SSLWantWriteError) if ssl else ()
    return isinstance(exc, (BlockingIOError, *tls))


def quando_arrivati(letto: float, stampo: bytes, inviata: float, scarto: float) -> Tuple[float, Optional[float]]:
    """The kernel's stamp (wall clock less `scarto`) and the read's lateness, else the read's time, None."""
    if len(stampo) >= 16:
        secondi, nano = int.from_bytes(stampo[:8], sys.byteorder), int.from_bytes(stampo[8:16], sys.byteorder)
        arrivo = secondi + nano / 1e9 - scarto
        if inviata - 0.001 <= arrivo <= letto + 0.001:  # else a clock that jumped
            return min(arrivo, letto), max(0.0, letto - arrivo)
    return letto, None


def apri_in_anticipo(client: Client, domande: List[dict], quanti_socket: int, timeout: float = TIMEOUT_INFO) -> None:
    """Before the clock (no connect in a stream's times): the requests' bytes, `quanti_socket`
    connections (one failing is left to its request; 0: the rest closed)."""
    stato = oltre(client)
    with client._lock:
        vecchie, stato.pronte = stato.pronte, []
    stato.richieste_pronte = {id(domanda): richiesta_in_flusso(client, domanda) for domanda in domande}
    for sock in vecchie:
        client.lascia(sock)
    if quanti_socket:
        stato.flussi.avvia()
    scadenza = time.monotonic() + timeout
    for _ in range(quanti_socket):
        try:
            sock = client._connetti(scadenza)
        except OSError:
            return
        stampi_del_kernel(sock)  # Linux stamps a moment after the first socket asks: ask early
        stato.pronte.append(sock)


class Partenza:
    """--stream: the first requests, sent at the start by the reader one after another. By their
    workers, 1,000 threads waking for the GIL took 0.1-0.3 s from first send to last."""

    def __init__(self, client: Client):
        self.client, self.t0 = client, 0.0
        self.partita, self.in_attesa = False, []  # the reader's lock guards these
        self.pronte = threading.Semaphore(0)  # one per stream handed to the reader before the start

    def prepara(self, esecutore, domande: List[dict], quanti_pronti: int, timeout: float, futuri: list) -> None:
        """The first `quanti_pronti` connected, to workers (to `futuri`), awaited at the start."""
        apri_in_anticipo(self.client, domande, quanti_pronti, timeout)
        futuri += [esecutore.submit(self.invia, i, domanda, timeout) for i, domanda in enumerate(domande[:quanti_pronti])]
        scadenza = time.monotonic() + TIMEOUT_INFO
        for _ in range(quanti_pronti):
            if not self.pronte.acquire(timeout=max(0.0, scadenza - time.monotonic())):
                return

    def parti(self, t0: float) -> None:
        oltre(self.client).flussi.parti(self, t0)

    def ferma(self) -> None:
        """After the run, or stopped before the clock: unused connections closed."""
        self.parti(None)
        apri_in_anticipo(self.client, [], 0)

    def invia(self, indice: int, domanda: dict, timeout: float) -> Risultato:
        try:
            return ricevi_flusso(self.client, indice, domanda, timeout, 0.0, self)
        except Exception as exc:  # a worker never raises; sent at the start, the clock's 0
            self.pronte.release()  # (failed before it reached the reader: the start need not wait)
            return fallita(self.client, indice, 0.0, time.perf_counter() - self.t0, exc)


def richiesta_in_flusso(client: Client, domanda: dict) -> bytes:
    """Its headers as http.client writes them."""
    corpo = json.dumps(domanda).encode("utf-8")
    intestazioni = {**client._intestazioni, "Accept-Encoding": "identity", "Content-Type": "application/json",
                    "Content-Length": str(len(corpo))}
    return (f"POST {CHAT} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in intestazioni.items()) +
            "\r\n").encode("latin-1") + corpo


def ricevi_flusso(client: Client, indice: int, domanda: dict, timeout: float, t0: float,
                  partenza: Optional[Partenza] = None) -> Risultato:
    """A streamed request, timed from its send; each chunk's and the end's time: its arrival."""
    if client.annullato.is_set():  # Ctrl+C, or the server went away: nothing more sent
        raise NonInviata(NON_INVIATA)
    stato = oltre(client)
    richiesta = stato.richieste_pronte.pop(id(domanda), None) or richiesta_in_flusso(client, domanda)
    scadenza, flusso = time.monotonic() + timeout, None
    try:
        with client._lock:
            sock = stato.pronte.pop() if stato.pronte else None
        sock = sock or client._connetti(scadenza)
        try:
            flusso = Flusso(sock, scadenza)
            if partenza is None:
                sock.settimeout(max(0.001, scadenza - time.monotonic()))
                flusso.inviata = time.perf_counter()
                sock.sendall(richiesta)
            else:  # sent at the start in one system call: non-blocking now, before the clock
                sock.setblocking(False)
                flusso.richiesta, flusso.timeout = richiesta, timeout
            stato.flussi.segui(flusso, partenza)
            flusso.finito.wait()  # the reader always sets it: the end, an error, the deadline
        finally:
            client.lascia(sock)
        if flusso.eccezione is not None:
            raise flusso.eccezione
    except OSError as exc:
        perche = descrivi_errore_rete(exc, timeout)
        if isinstance(exc, socket.timeout) and flusso and flusso.status is not None:  # headers came
            perche = f"risposta non completa entro {timeout:g} s"
        raise client.errore_di_rete(CHAT, exc, perche) from None
    if flusso.status != 200:
        raise ErroreRichiesta(descrivi_errore_http(Risposta(flusso.status, flusso.corpo())))
    dati, chunk, fine = flusso.esito  # parsed by the reader in a free moment
    t0 = partenza.t0 if partenza else t0
    inizio = flusso.inviata - t0
    return Risultato(indice, inizio, fine - t0, **cifre_oltre(dati, [t - flusso.inviata for t in chunk], ritardi=tuple(
        noti(flusso.ritardi.values())), incerti=incerti(chunk, fine, flusso)))


def incerti(chunk: List[float], fine: float, flusso: Flusso) -> Tuple[Tuple[int, float], ...]:
    """A chunk read with the next has its read's time: it came after the read before. With some, the last
    read with the end too: a late reader acks late, and TCP may hold the end (docs/flussi.md)."""
    uniti = [i for i in range(len(chunk) - 1) if chunk[i + 1] == chunk[i]]
    uniti += [len(chunk) - 1] if uniti and chunk[-1] == fine else []
    prima, dopo = {}, flusso.inviata
    for arrivo, ritardo in flusso.ritardi.items() if uniti else ():
        prima[arrivo], dopo = dopo, arrivo + (ritardo or 0.0)
    return tuple((i, chunk[i] - prima.get(chunk[i], flusso.inviata)) for i in uniti)


FETTA = 0.001  # seconds of end work (framing, parsing) between looks at the sockets
PEZZO = 128  # events parsed in one json.loads


def leggi_flusso(blocchi: Iterator[Tuple[float, bytes]]) -> Generator[None, None, Tuple[dict, List[float], float]]:
    """The `data:` lines as one completion, with each text chunk's time; a FETTA a next()."""
    righe, resto = [], b""  # (time, data) a line; a partial line waits for the next read
    fatto, scade = False, time.perf_counter() + FETTA
    for t, blocco in blocchi:
        if time.perf_counter() >= scade:
            yield
            scade = time.perf_counter() + FETTA
        *intere, resto = (resto + blocco).split(b"\n")
        for riga in intere:
            riga = riga.strip()
            if riga.startswith(b"data:"):  # else blank separators and ':' keep-alives
                righe.append((t, riga[5:].strip()))
                if fatto := righe[-1][1] == b"[DONE]":
                    break
        if fatto:
            break
    fino = len(righe) - 1 if fatto else len(righe)  # the events
    completamento = {"choices": [{}]}
    tempi, testo = [], []  # each text chunk's time; the text (a conversation sends it back)
    dati = [dato for _, dato in righe[:fino]]
    for inizio in range(0, len(dati), PEZZO):
        if time.perf_counter() >= scade:
            yield
            scade = time.perf_counter() + FETTA
        for (quando, _), evento in zip(righe[inizio:inizio + PEZZO], eventi_json(dati[inizio:inizio + PEZZO])):
            if evento is NON_JSON:
                raise ErroreNelFlusso("evento non JSON nel flusso")
            if not isinstance(evento, dict):
                continue
            if isinstance(evento.get("error"), dict):
                raise ErroreNelFlusso(testo_errore(evento["error"].get("code", 200), evento["error"]))
            for scelta in evento.get("choices") or []:
                delta = scelta.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    tempi.append(quando)
                    testo.append(delta.get("content") or "")
                if scelta.get("finish_reason"):
                    completamento["choices"] = [{"finish_reason": scelta["finish_reason"]}]
            for chiave in ("usage", "timings"):
                if isinstance(evento.get(chiave), dict):
                    completamento[chiave] = evento[chiave]
    if "finish_reason" not in completamento["choices"][0]:
        raise ErroreNelFlusso(f"{TRONCATA} dopo {fino} chunk (nessun finish_reason)")
    if not fatto:
        raise ErroreNelFlusso("flusso interrotto prima della fine (manca [DONE])")
    completamento["choices"][0]["message"] = {"role": "assistant", "content": "".join(testo)}
    return completamento, tempi, righe[fino][0]


NON_JSON = object()  # an event that is not JSON (None is JSON: null)


def eventi_json(dati: List[bytes]) -> list:
    """In one json.loads (one each costs as much again); failing, one each, or NON_JSON."""
    with contextlib.suppress(ValueError):  # UnicodeDecodeError included
        eventi = json.loads((b"[" + b",".join(dati) + b"]").decode("utf-8"))
        if len(eventi) == len(dati):  # else an event was not one JSON value ("1,2"): one at a time
            return eventi
    eventi = []
    for dato in dati:
        try:
            eventi.append(json.loads(dato.decode("utf-8")))
        except ValueError:
            eventi.append(NON_JSON)
    return eventi


def tpot(r: Risultato) -> Optional[float]:
    primo = oltre(r).primo_token
    if primo is None or r.token is None or r.token < 2:
        return None
    return (r.latenza - primo) / (r.token - 1)


def itl(r: Risultato) -> List[float]:
    """The gaps between chunks with text, as vLLM's: a chunk of two tokens is one gap."""
    chunk = oltre(r).chunk_s or ()
    return [b - a for a, b in zip(chunk, chunk[1:])]


def token_per_chunk(r: Risultato) -> Optional[float]:
    """Tokens per chunk with text, on average (llama.cpp sends one, others more)."""
    chunk = oltre(r).chunk_s
    return r.token / len(chunk) if chunk and r.token and not oltre(r).token_stimati else None


# The client's own error (docs/flussi.md): how late the reader was, the chunks of a stream read together,
# how far that can have moved each percentile; a note past SOGLIA (both 1 ms and 5% of the figure).
SOGLIA = (0.001, 0.05)


def errori_figure(ok: List[Risultato]) -> Dict[str, List[float]]:
    """Error bounds (s) of the streamed figures' values, in valori_figure's order."""
    errori = {"primo token": [], "TPOT": [], "ITL": []}
    for r in ok:
        e, n = dict(oltre(r).incerti), len(oltre(r).chunk_s)
        errori["primo token"].append(e.get(0, 0.0))
        errori["TPOT"] += [max(e.get(0, 0.0), e.get(n - 1, 0.0)) / (r.token - 1)] if tpot(r) is not None else []
        errori["ITL"] += [max(e.get(i, 0.0), e.get(i + 1, 0.0)) for i in range(n - 1)] if e else [0.0] * (n - 1)
    return errori


def spostamento(valori: List[float], errori: List[float], p: Union[int, float]) -> float:
    """How far the p-th percentile may be from the true one, each value off by at most its error: with m
    values off by more than d, the true one is within d of the recorded ones m ranks either side."""
    grandi = sorted((e for e in errori if e > 0), reverse=True)
    if not grandi or len(valori) < 2:
        return grandi[0] if grandi else 0.0
    v, h = sorted(valori), (len(valori) - 1) * p / 100

    def a(x: float) -> float:  # as `percentile` interpolates
        k = min(int(x), len(v) - 2)
        return v[k] + (x - k) * (v[k + 1] - v[k])

    limite, m, grandi = grandi[0], 1, grandi + [0.0]
    while h - m >= 0 and h + m <= len(v) - 1:
        limite = min(limite, grandi[m] + max(a(h + m) - a(h), a(h) - a(h - m)))
        if m == len(grandi) - 1:
            break
        m = min(2 * m, len(grandi) - 1)
    return limite


def dati_lettore(prova: Prova, percentili: Sequence[Union[int, float]] = ()) -> Optional[dict]:
    ok = [r for r in prova.esecuzione.riuscite if oltre(r).chunk_s]
    if not ok:
        return None
    ritardi, errori = [x for r in ok for x in oltre(r).ritardi], errori_figure(ok)
    valori = {f: sorted(v) for f, v in valori_figure(prova).items()}  # (sorted again: at once)
    limiti = {(f, p): spostamento(valori[f], errori[f], p) for f in errori for p in percentili or PERCENTILI_DETTAGLI
              if valori[f]}
    oltre_soglia = [(f, b) for (f, p), b in limiti.items() if b > max(SOGLIA[0], SOGLIA[1] * percentile(valori[f], p))]
    return {**{f"ritardo_lettore_{k}_ms": ms(percentile(ritardi, p) if p else max(ritardi, default=None))
               for k, p in (("p50", 50), ("p99", 99), ("max", 0))},
            "chunk_letti_insieme": sum(b == a for r in ok for a, b in zip(oltre(r).chunk_s, oltre(r).chunk_s[1:])),
            "spostamento_ms": {f"{f} p{p}": ms(b) for (f, p), b in limiti.items()},
            "oltre_la_soglia": {f: max(b for g, b in oltre_soglia if g == f) for f, _ in oltre_soglia}}


def frase_lettore(d: dict) -> str:
    ritardo = "n/d (il kernel non dà l'arrivo)" if d["ritardo_lettore_p99_ms"] is None else "p50 {:.1f}, p99 " \
        "{:.1f}, max {:.1f} ms".format(*(d[f"ritardo_lettore_{k}_ms"] for k in ("p50", "p99", "max")))
    return f"{d['chunk_letti_insieme']} chunk letti insieme a uno prima, letture dopo i loro ultimi byte {ritardo}"


def spostate(d: dict) -> str:
    figura, piu = max(d["spostamento_ms"].items(), key=lambda x: x[1])
    return f"cifre spostate al più di {piu:.2f} ms ({figura})" if piu else "nessuna cifra spostata"


def nota_lettore(prova: Prova, percentili: Sequence[Union[int, float]]) -> List[str]:
    d = dati_lettore(prova, percentili)
    if not (d and d["oltre_la_soglia"]):
        return []
    quanto = ", ".join(f"{f} fino a {b * 1000:.1f} ms" for f, b in d["oltre_la_soglia"].items())
    return [f"carico ha letto i flussi in ritardo: {frase_lettore(d)}. Il suo errore può spostare {quanto} "
            "(oltre 1 ms e il 5% della cifra). Per cifre fedeli: meno flussi, o carico su altri core o su un'altra macchina"]


# --ritmo and --durata: requests sent by the clock ##############################################

TETTO_RITMO = 256  # --ritmo without --parallele: at most so many in flight (a thread each)


def orari(piano_oltre: PianoOltre) -> Iterator[float]:
    """Every 1/ritmo s, or Poisson's gaps; a seme and rate, one schedule."""
    import random

    if piano_oltre.arrivi == "costanti":
        yield from (i / piano_oltre.ritmo for i in itertools.count())
    seme = piano_oltre.seme
    caso = random.Random(None if seme is None else f"{seme}:{piano_oltre.ritmo:g}")
    t = 0.0
    while True:
        yield t
        t += caso.expovariate(piano_oltre.ritmo)


class Programma(NamedTuple):
    """--ritmo at planned times (open loop), else one as each ends (closed), to --durata or
    --richieste. The first always leaves; the cap (--parallele) full, one waits, counted."""
    piano: Piano
    primo_prompt: int

    def lancia(self, futuri: list, esecutore, client: Client, t0: float) -> EsecuzioneOltre:
        piano, piano_oltre = self.piano, self.piano.oltre
        posti = threading.Semaphore(piano.parallele)
        tempi = (orari(piano_oltre) if piano_oltre.ritmo else (t for _, _, t in itertools.cycle(
            piano_oltre.dataset)) if piano_oltre.traccia else itertools.repeat(None))
        durata = piano_oltre.durata
        trattenute, ultimo, non_inviate, in_ritardo = 0, None, 0, 0
        for i, previsto in enumerate(tempi):
            if i == piano.richieste or None not in (previsto, durata) and previsto >= durata:
                break
            if previsto is not None and client.annullato.wait(max(0.0, t0 + previsto - time.perf_counter())):
                break  # the server went away (Ctrl+C interrupts the wait itself)
            # --durata is a promise: no request leaves after it, no wait for a place outlasts it
            preso = posti.acquire(blocking=False)
            trattenuta = not preso and previsto is not None
            if not preso:  # --parallele already in flight: wait for a place
                preso = posti.acquire(timeout=None if durata is None else max(0.0, t0 + durata - time.perf_counter()))
            finita = i and durata is not None and time.perf_counter() - t0 >= durata
            if client.annullato.is_set() or not preso or finita:
                if preso:
                    posti.release()
                if previsto is not None and not client.annullato.is_set():  # the unsent, and why
                    mancate = 1 + sum(1 for _ in itertools.takewhile(lambda t: t < durata, tempi))
                    non_inviate, in_ritardo = (mancate, 0) if not preso else (0, mancate)
                break
            futuro = esecutore.submit(self.invia_al_tempo, client, i, previsto, t0)
            futuro.add_done_callback(lambda _: posti.release())
            futuri.append(futuro)
            ultimo, trattenute = time.perf_counter() - t0, trattenute + trattenuta
        return EsecuzioneOltre(trattenute, ultimo, non_inviate, in_ritardo)

    def invia_al_tempo(self, client: Client, indice: int, previsto: Optional[float], t0: float) -> Risultato:
        """Its prompt made as it leaves (never all at once)."""
        domanda, lunghezza = domanda_di(indice, self.piano, self.primo_prompt)
        r = invia_oltre(client, indice, domanda, self.piano.timeout, t0)
        return r._replace(oltre=oltre(r)._replace(previsto=previsto, prompt_esatto=lunghezza))


def ritardo_invio(r: Risultato) -> Optional[float]:
    return None if oltre(r).previsto is None else r.inizio - oltre(r).previsto


def ritardi_invio(e: Esecuzione) -> List[float]:
    return noti(map(ritardo_invio, e.risultati))


def orari_previsti(e: Esecuzione) -> List[float]:
    return noti(oltre(r).previsto for r in e.risultati)


def ritardi_p99_max(e: Esecuzione) -> str:
    ritardi = ritardi_invio(e)
    return (f"p99 {fmt(ms(percentile(ritardi, 99)), '.1f ms')}, "
            f"max {fmt(ms(max(ritardi, default=None)), '.1f ms')}")


def ritmo_di(tempi: List[float]) -> Optional[float]:
    durata = max(tempi) - min(tempi) if tempi else 0
    return (len(tempi) - 1) / durata if durata > 0 else None


def invii_al_secondo(prova: Prova) -> Optional[float]:
    """Requests sent a second; --durata: over its window (8 in 6 s: 1.33)."""
    finestra, risultati = finestra_durata(prova), prova.esecuzione.risultati
    return len(risultati) / finestra if finestra else ritmo_di([r.inizio for r in risultati])


def finestra_durata(prova: Prova) -> Optional[float]:
    durata, fermata = oltre(prova.piano).durata, prova.esecuzione.interrotta_a
    return min(durata, fermata) if durata and fermata else durata


def ms(secondi: Optional[float]) -> Optional[float]:
    return None if secondi is None else secondi * 1000


def noti(valori) -> list:
    return [v for v in valori if v is not None]


def programma(prova: Prova) -> Tuple[int, Optional[float]]:
    """--ritmo: the requests the schedule held in the window, and their rate."""
    e, finestra = prova.esecuzione, finestra_durata(prova)
    previsti = orari_previsti(e)
    n = len(previsti) + oltre(e).non_inviate + oltre(e).in_ritardo
    return n, n / finestra if finestra else ritmo_di(previsti)


def righe_ritmo(prova: Prova) -> List[str]:
    e, piano_oltre = prova.esecuzione, oltre(prova.piano)
    righe, scosta = [], ""
    if piano_oltre.ritmo or piano_oltre.traccia:  # the schedule, then the sends
        previsti = orari_previsti(e)
        if piano_oltre.ritmo:
            poisson = piano_oltre.arrivi == "poisson"
            arrivi = f"arrivi di Poisson, seme {piano_oltre.seme}" if poisson else "arrivi costanti"
            nel_programma, programmato = programma(prova)
            detto = f"ritmo chiesto {piano_oltre.ritmo:g} req/s ({arrivi}): nel programma {fmt(programmato, '.2f')}"
            if poisson and programmato and abs(programmato / piano_oltre.ritmo - 1) >= 0.05:
                scosta = (f". Intervalli estratti a caso: su {quante(nel_programma, 'richiesta', 'richieste')} il "
                          "programma si scosta dal chiesto")
        else:
            detto = (f"traccia di {piano_oltre.nome_dataset}: {quante(len(previsti), 'invio', 'invii')} in "
                         f"{fmt(max(previsti, default=None), '.2f s')} nel file ({fmt(ritmo_di(previsti), '.2f req/s')})")
        su = "sul programma" if piano_oltre.ritmo else "sugli orari"
        inviate = fmt(invii_al_secondo(prova), ".2f req/s")
        righe.append(f"{detto}, inviate davvero {inviate}{scosta}. Ritardo degli invii {su}: "
                     f"{ritardi_p99_max(e)}")
    if piano_oltre.durata:
        tetto = f"il tetto di --parallele {prova.piano.parallele} era pieno fino alla fine"
        tardi = "carico.py era in ritardo sul programma oltre la fine di --durata"
        perche = ((oltre(e).non_inviate, tetto), (oltre(e).in_ritardo, tardi))
        righe.append(f"in {piano_oltre.durata:g} s (--durata): inviate {quante(e.n_richieste, 'richiesta', 'richieste')}, "
                     f"{len(e.riuscite)} con risposta. "
                     + "".join(f"{n} del programma non inviate ({p}). " for n, p in perche if n)
                     + f"L'ultimo invio a {fmt(oltre(e).ultimo_invio, '.2f s')}, l'ultima risposta a "
                     f"{fmt(prova.riepilogo.tempo_totale, '.2f s')} (il tempo totale)")
    return righe


def ritardo_perdonato(prova: Prova) -> float:
    """Lateness still on time: max(10 ms, mean gap / 10)."""
    ritmo = oltre(prova.piano).ritmo or ritmo_di(orari_previsti(prova.esecuzione))  # a trace's mean
    return max(0.010, 0.1 / ritmo) if ritmo else 0.010


def ritmo_tenuto(prova: Prova) -> bool:
    o, p99 = oltre(prova.esecuzione), percentile(ritardi_invio(prova.esecuzione), 99)
    return not (o.trattenute or o.non_inviate or o.in_ritardo) and (
        p99 is None or p99 <= ritardo_perdonato(prova))


def note_ritmo(prova: Prova) -> List[str]:
    e, piano = prova.esecuzione, prova.piano
    if ritmo_tenuto(prova):
        return []
    inviate = fmt(invii_al_secondo(prova), ".2f req/s")
    chiesto = f"{piano.oltre.ritmo:g} req/s" if piano.oltre.ritmo else "gli orari della traccia"
    alza = f": si sono inviate {inviate}, non {chiesto}. {maiuscola(chi_ha_frenato(prova))}"
    trattenute, non_inviate = oltre(e).trattenute, oltre(e).non_inviate
    tetto = f"il tetto di --parallele ({piano.parallele} in volo)"
    if non_inviate and not trattenute:
        return [f"{tetto} è rimasto pieno fino alla fine di --durata. {non_partite(non_inviate)}{alza}"]
    if trattenute:
        mai = (f". {quante(non_inviate, 'altra non è partita', 'altre non sono partite')} prima della fine di --durata"
               if non_inviate else "")
        return [f"{quante(trattenute, 'richiesta', 'richieste')} su {len(e.risultati)} "
                f"{'è partita' if trattenute == 1 else 'sono partite'} in ritardo: {tetto} era "
                f"pieno{mai}{alza}"]
    in_ritardo = oltre(e).in_ritardo
    tardi = f". {non_partite(in_ritardo)} prima della fine di --durata" if in_ritardo else ""
    return [f"il client non ha tenuto il ritmo chiesto: le cifre valgono per {inviate} inviate, non per {chiesto}. Invii "
            f"in ritardo sul programma: {ritardi_p99_max(e)}{tardi}"]


def non_partite(n: int) -> str:
    return quante(n, "richiesta del programma non è partita",
                  "richieste del programma non sono partite")


def il_tetto_ha_frenato(prova: Prova) -> Optional[bool]:
    """The cap full: the limit? False: the server was (cap >= slots, all seen busy)."""
    n_slot, picco = prova.info.n_slot, prova.riepilogo.picco
    if n_slot is not None and prova.piano.parallele < n_slot:
        return True
    return False if None not in (n_slot, picco) and picco >= n_slot else None


def chi_ha_frenato(prova: Prova) -> str:
    tetto, n_slot, parallele = il_tetto_ha_frenato(prova), prova.info.n_slot, prova.piano.parallele
    if tetto:
        return (f"il server aveva slot liberi ({parallele} in volo su {n_slot} slot): alza --parallele (fino a {n_slot}). "
                "Se non basta, il limite è il server")
    if tetto is False:
        occupati = "il suo slot era occupato" if n_slot == 1 else f"i suoi {n_slot} slot erano tutti occupati"
        return (f"il limite è il server, non il tetto: {occupati} e ha completato"
                f" {fmt(cadenze(prova)['richieste_s'], '.2f req/s')}. Più --parallele sposterebbe solo l'attesa nella "
                "sua coda")
    quanti = "il server non dice quanti slot ha" if n_slot is None else (
        f"né le letture né i tempi del server hanno visto occupati tutti i suoi {n_slot} slot")
    return (f"non si sa se il limite è il tetto o il server ({quanti}). Se il server ha più di {parallele} slot, alza "
            "--parallele; se no il limite è il server")


def attese_del_tetto(prova: Prova) -> Dict[int, float]:
    """--ritmo, the cap full: how late those it held left, beyond ritardo_perdonato."""
    e = prova.esecuzione
    if not oltre(e).trattenute:
        return {}
    soglia = ritardo_perdonato(prova)
    return {r.indice: ritardo_invio(r) for r in e.riuscite if (ritardo_invio(r) or 0.0) > soglia}


def latenza_dal_previsto(r: Risultato) -> float:
    """--ritmo: from the planned send to the answer, as its user saw (no coordinated omission)."""
    previsto = oltre(r).previsto
    return r.latenza if previsto is None else r.fine - previsto


# --dettagli, --slo, --esatti: every figure, exact to the token #################################

METODO = 'statistics.quantiles(method="inclusive")'  # see `percentile`
CHIAVI_SLO = {"latenza": "latenza", "ttft": "primo token", "tpot": "TPOT"}


def percentile(valori: List[float], p: Union[int, float]) -> Optional[float]:
    """The p-th percentile, by METODO everywhere; one with decimals (99.9) on a finer grid."""
    import statistics

    if len(valori) < 2:
        return valori[0] if valori else None
    n = 100
    while abs(p * n / 100 - round(p * n / 100)) > 1e-6:
        n *= 10
    return statistics.quantiles(valori, n=n, method="inclusive")[round(p * n / 100) - 1]


def valori_figure(prova: Prova) -> Dict[str, List[float]]:
    ok = prova.esecuzione.riuscite
    valori = {"latenza": [r.latenza for r in ok]}
    if oltre(prova.piano).ritmo or oltre(prova.piano).traccia:
        valori["latenza dal previsto"] = [latenza_dal_previsto(r) for r in ok]
    valori["attesa in coda"] = list(attese_in_coda(prova).values())
    if oltre(prova.esecuzione).trattenute:  # the cap's wait in the client: a wait too
        valori["attesa del tetto"] = noti(map(ritardo_invio, ok))
    if any(oltre(r).chunk_s is not None for r in ok):  # --stream
        valori["primo token"] = noti(oltre(r).primo_token for r in ok)
        valori["TPOT"] = noti(map(tpot, ok))
        valori["ITL"] = [g for r in ok for g in itl(r)]
    return valori


PERCENTILI_DETTAGLI = (50, 90, 99)  # unless --percentili; --json keeps these and the chosen


def riassunto(valori: List[float], percentili: Sequence[int] = PERCENTILI_DETTAGLI) -> Dict[str, Optional[float]]:
    return {"min": min(valori, default=None), "media": media(valori),
            **{f"p{p}": percentile(valori, p) for p in percentili}, "max": max(valori, default=None), "n": len(valori)}


def tipo_errore(errore: str) -> str:
    """A failure's kind, counted: `HTTP 400 exceed_context_size_error`, or the phrase before ':'."""
    return TRONCATA if errore.startswith(TRONCATA) else errore.split(":")[0]


def cadenze(prova: Prova) -> dict:
    """The run's counts and (`_s`) each a second of its total time; None: nobody gave it."""
    ok, durata = prova.esecuzione.riuscite, prova.riepilogo.tempo_totale
    prompt = [r.token_prompt for r in ok]
    conti = {"richieste": len(ok), "token_prompt": None if None in prompt else sum(prompt),
             "token_generati": prova.riepilogo.token}
    conti["token"] = None if None in conti.values() else conti["token_prompt"] + conti["token_generati"]
    return {**conti, **{f"{nome}_s": n / durata if durata and n is not None else None for nome, n in conti.items()}}


def dati_dettagli(prova: Prova, slo: Optional[Dict[str, float]] = None, percentili: Sequence[int] = ()) -> dict:
    """What --dettagli prints, as data (--json has it always)."""
    from collections import Counter

    risultati = prova.esecuzione.risultati
    fallite = Counter(tipo_errore(r.errore) for r in risultati if not r.riuscita)
    per_chunk = noti(map(token_per_chunk, risultati))
    tutti = sorted(set(PERCENTILI_DETTAGLI) | set(percentili))
    c = cadenze(prova)  # no request answered: no rate, n/d (vLLM's names say 0 requests/s)
    al_secondo = {k: c[k + "_s"] if c["richieste"] else None for k in ("richieste", "token_prompt", "token_generati")}
    dati = {"metodo_percentili": METODO, "figure_s": {nome: riassunto(v, tutti) for nome, v in valori_figure(prova).items()},
            "al_secondo": al_secondo, "fallite_per_tipo": dict(fallite), "fermate_prima_di_token": len(fermate_prima(prova)),
            "tagliate_dal_contesto": len(tagliate_dal_contesto(prova)),
            "token_dalla_cache": sum(r.token_cache or 0 for r in risultati),
            "token_per_chunk": {"min": min(per_chunk), "media": media(per_chunk),
                                "max": max(per_chunk)} if per_chunk else None}
    lettore = dati_lettore(prova, tutti)
    if lettore:  # --stream
        dati.update({k: v for k, v in lettore.items() if k != "oltre_la_soglia"})
    if slo:
        dati["slo"] = dict(zip(("obiettivi", "rispettate", "quota", "goodput_richieste_s", "goodput_token_s",
                                "dal_previsto"), (slo,) + goodput(prova, slo)))
    return dati


# vLLM's `bench serve` names, `<mean|median|std|pNN>_<ttft|tpot|itl|e2el>_ms`, with its statistics
# (population std, numpy's percentiles), so a script for vLLM reads carico's. Unlike vLLM, on purpose:
# TTFT and ITL count chunks with text; total_input_tokens is usage.prompt_tokens (chat template in);
# a figure nobody measured (no --stream) is None, not 0.
FIGURE_VLLM = {"ttft": "primo token", "tpot": "TPOT", "itl": "ITL", "e2el": "latenza"}


def riassunto_vllm(prova: Prova, percentili: Sequence[int] = (99,)) -> dict:
    """Under vLLM's names: duration in s, times in ms."""
    import statistics

    c = cadenze(prova)
    dati = {"duration": prova.riepilogo.tempo_totale, "completed": c["richieste"],
            "failed": len(prova.esecuzione.risultati) - c["richieste"],
            "total_input_tokens": c["token_prompt"], "total_output_tokens": c["token_generati"],
            "request_throughput": c["richieste_s"], "output_throughput": c["token_generati_s"],
            "total_token_throughput": c["token_s"]}
    valori = valori_figure(prova)
    for nome, figura in FIGURE_VLLM.items():
        in_ms = [v * 1000 for v in valori.get(figura, [])]
        dati.update({f"mean_{nome}_ms": media(in_ms),
                     f"median_{nome}_ms": statistics.median(in_ms) if in_ms else None,
                     f"std_{nome}_ms": statistics.pstdev(in_ms) if in_ms else None,
                     **{f"p{p}_{nome}_ms": percentile(in_ms, p) for p in percentili}})
    return dati


def righe_dettagli(prova: Prova, percentili: Optional[Sequence[int]] = None) -> List[str]:
    percentili = percentili or PERCENTILI_DETTAGLI
    d = dati_dettagli(prova, percentili=percentili)
    colonne = ("min", "media", *(f"p{p}" for p in percentili), "max")
    larghezze = [-24] + [9] * len(colonne)
    righe = [f"dettagli (percentili: {METODO})", in_colonne(["", *colonne], larghezze)]
    for nome, cifre in d["figure_s"].items():
        scala, formato, unita = (1000, ".1f", "ms") if nome in ("TPOT", "ITL") else (1, ".2f", "s")
        valori = [fmt(None if cifre[c] is None else cifre[c] * scala, formato) for c in colonne]
        righe.append(in_colonne([f"{nome} ({unita})", *valori], larghezze))
    a = d["al_secondo"]
    righe.append(f"  richieste/s {fmt(a['richieste'], '.2f')}  token di prompt/s {fmt(a['token_prompt'], '.1f')}  "
                 f"token generati/s {fmt(a['token_generati'], '.1f')}")
    if d["fallite_per_tipo"]:
        righe.append("  fallite per tipo: " + "; ".join(f"{n} {tipo}" for tipo, n in d["fallite_per_tipo"].items()))
    per_chunk = d["token_per_chunk"]
    if per_chunk and per_chunk["max"] > 1.05:
        cifre = ", ".join(f"{k} {per_chunk[k]:.1f}" for k in ("min", "media", "max"))
        righe.append(f"  token per chunk (per richiesta): {cifre}: un intervallo ITL copre "
                     "più di un token")
    if d["fermate_prima_di_token"]:
        righe.append(f"  {frase_corte(prova, oltre(prova.piano).esatti)}")
    if "spostamento_ms" in d:
        righe.append(f"  lettore dei flussi: {frase_lettore(d)}: {spostate(d)}")
    return righe


def scritti_slo(slo: Dict[str, float]) -> str:
    return ", ".join(f"{CHIAVI_SLO[k]} <= {v:g} s" for k, v in slo.items())


def riga_slo(prova: Prova, slo: Dict[str, float]) -> str:
    rispettate, quota, al_s, token_s, dal_previsto = goodput(prova, slo)
    return (f"SLO ({scritti_slo(slo)}): rispettati da {quante(rispettate, 'richiesta', 'richieste')} su {len(prova.esecuzione.risultati)} "
            f"({fmt(quota, '.0%')}); goodput {fmt(al_s, '.2f req/s')}, {fmt(token_s, '.1f token/s')}"
            + (". Latenza e primo token contati dall'orario previsto, perché il ritmo non è stato tenuto"
               if dal_previsto else ""))


def goodput(prova: Prova, slo: Dict[str, float]) -> Tuple[int, Optional[float], Optional[float], Optional[float], bool]:
    """Those meeting every objective, their share, vLLM's goodput (req/s, token/s), if from the plan."""
    o = oltre(prova.piano)
    dal_previsto = bool(o.ritmo or o.traccia) and not ritmo_tenuto(prova)
    ritardo = lambda r: latenza_dal_previsto(r) - r.latenza if dal_previsto else 0.0  # noqa: E731
    misura = {"latenza": lambda r: r.latenza + ritardo(r),
              "ttft": lambda r: None if oltre(r).primo_token is None else oltre(r).primo_token + ritardo(r),
              "tpot": lambda r: 0.0 if r.token == 1 else tpot(r)}
    risultati, totale = prova.esecuzione.risultati, prova.riepilogo.tempo_totale
    buone = [r for r in risultati if r.riuscita and all(
        (valore := misura[k](r)) is not None and valore <= v for k, v in slo.items())]
    quota = len(buone) / len(risultati) if risultati else None
    token = [r.token for r in buone]
    al_s = len(buone) / totale if totale else None
    token_s = sum(token) / totale if totale and None not in token else None
    return len(buone), quota, al_s, token_s, dal_previsto


def riscalda(client: Client, piano: Piano, info: InfoServer, n: int) -> None:
    """--riscaldamento: n requests of their own before the run, left out of every figure."""
    quante_n = quante(n, "richiesta", "richieste")
    print(f"riscaldamento: {quante_n} prima della prova, escluse dalle cifre",
          file=sys.stderr, flush=True)
    testo = oltre(piano).testo
    domande = [domanda_oltre(testo if testo is not None else f"(riscaldamento {i + 1}) {prompt_per(i)}", piano)
               for i in range(n)]
    # All sent at once, as the lab's: a plan without extras, the requests already made with them.
    semplice = piano._replace(richieste=n, oltre=None)
    esecuzione = esegui_carico(client, semplice, info, lancio=LancioOltre(client, semplice, domande=domande))
    if esecuzione.interruzione:
        raise Interruzione(esecuzione.interruzione)
    fallite = [r for r in esecuzione.risultati if not r.riuscita]
    if fallite:
        nota(f"riscaldamento: {len(fallite)} su {quante_n} "
             f"{'fallita' if n == 1 else 'fallite'} (la prima: {fallite[0].errore})")


# The live line: the run seen while it lasts, on a terminal #####################################

class Diretta:
    """A line on a terminal's stderr at each /slots reading, cleared at the end: stdout untouched."""

    def __init__(self, stderr, n_slot: Optional[int], sentinella: Sentinella):
        self.stderr, self.n_slot, self.sentinella = stderr, n_slot, sentinella
        self._futuri, self._piano, self._generati = [], Piano(), 0  # _generati: tokens shown last

    def seguendo(self, futuri: list, piano: Piano):
        self._futuri, self._piano = futuri, piano
        return self.aggiorna

    def riga(self, c: Campione, dati_slots) -> str:
        futuri = list(self._futuri)  # one atomic copy: the sender may be adding to it
        finite = [f.result() for f in futuri if f.done() and not f.cancelled()]
        # Answers and /slots are read at slightly different moments: a request ending in between
        # counts twice, or not at all, for a frame. The count shown never goes back.
        self._generati = max(self._generati, sum(r.token or 0 for r in finite) + token_in_corso(dati_slots))
        stima_coda = c.in_coda  # requests_deferred, when /metrics is there
        if stima_coda is None and c.occupati is not None:  # else: sent (`parallele` at most), not in a slot
            stima_coda = max(0, min(len(futuri) - len(finite), self._piano.parallele) - c.occupati)
        totale = self._piano.richieste if self._piano.richieste is not None else len(futuri)
        conto = f"[{len(finite):>{len(str(totale))}}/{totale}]"
        if self.sentinella.andato or self.sentinella.di_fila:  # said while it happens
            stato = ("ha smesso di rispondere: fermo gli invii" if self.sentinella.andato
                     else f"non risponde ({quante(self.sentinella.di_fila, 'rifiuto', 'rifiuti')} di fila)")
            return f"{conto} il server {stato}  {c.t:.1f} s"
        return (f"{conto} slot occupati {fmt(c.occupati, 'd')}/{fmt(self.n_slot, 'd')}"
                f"  in coda {fmt(stima_coda, 'd')}  generati {self._generati} token  "
                f"{self._generati / c.t if c.t > 0 else 0:.1f} t/s  {c.t:.1f} s")

    def aggiorna(self, c: Campione, dati_slots) -> Campione:
        self.stderr.write(f"\r{self.riga(c, dati_slots)[:larghezza_di(self.stderr) - 1]}\033[K")
        self.stderr.flush()
        return c

    def cancella(self) -> None:
        self.stderr.write("\r\033[K")
        self.stderr.flush()


def token_in_corso(dati) -> int:
    prossimi = [slot.get("next_token") for slot in lista_slot(dati) or [] if slot.get("is_processing")]
    return sum(numero(p[0].get("n_decoded"), int) or 0 for p in prossimi
               if isinstance(p, list) and p and isinstance(p[0], dict))


# --ripeti and --tabella: the same load again, and the deliverable's table ######################

def tabella_md(testa: List[str], righe: List[List[str]]) -> List[str]:
    linee = [f"| {' | '.join(celle)} |" for celle in [testa, *righe]]
    return [linee[0], "|" + "---|" * len(testa), *linee[1:]]


def in_colonne(celle: Sequence[str], larghezze: Sequence[int], tra: str = "") -> str:
    allineate = [f"{c:>{n}}" if n >= 0 else f"{c:<{-n}}" for c, n in zip(celle, larghezze)]
    return "  " + tra.join(allineate + list(celle[len(larghezze):]))


def riga_breve(prova: Prova, ripetizione: int, ripeti: int) -> str:
    s, quale = prova.riepilogo, f"prova {ripetizione} di {ripeti}: " if ripeti > 1 else ""
    return (f"{quale}{quante(prova.esecuzione.n_richieste, 'richiesta', 'richieste')} in {fmt(s.tempo_totale, '.2f s')}, "
            f"latenza media {fmt(s.latenza_media, '.2f s')}, {fmt(s.throughput, '.1f token/s')}"
            + (f"; nel programma {fmt(programma(prova)[1], '.2f req/s')}, inviate davvero "
               f"{fmt(invii_al_secondo(prova), '.2f')}" if oltre(prova.piano).ritmo else "") + con_tagliate(Punto([prova])))


def nota_tagliate(prove: List[Prova]) -> List[str]:
    tagliate = [p for p in prove if tagliate_dal_contesto(p)]  # the most slots' advice
    return [f"tagliate dal contesto: risposte fermate dal contesto pieno dello slot (finish_reason length); "
            f"{cosa_aiuta(max(tagliate, key=lambda p: p.info.n_slot or 1))}"] if tagliate else []


def righe_ripetute(prove: List[Prova]) -> List[str]:
    cifre = (("latenza media", "s", "latenza_media"), ("latenza max (media dei massimi)", "s", "latenza_max"),
             ("throughput aggregato", "token/s", "throughput"))
    intere, escluse = [p for p in prove if not p.esecuzione.interruzione], anomale(prove)
    contate = len(intere) - len(escluse)
    righe = [f"su {quante(contate, 'prova', 'prove')}: media ±intervallo di confidenza al 95% (t di Student; "
             "deviazione standard, min-max)"] + [frase_esclusa(prove, p, mediana) for p, mediana in escluse]
    for nome, unita, campo in cifre:
        valori = Punto(intere).cifre(campo)
        if not valori:
            righe.append(in_colonne([nome, ND], [-31], " "))
            continue
        rumore = (f"±{fmt(ic95(valori), '.2f')} (dev.std {dispersione(valori):.2f}, "
                  f"{min(valori):.2f}-{max(valori):.2f})")
        mancanti = "" if len(valori) == contate else f"  [{quante(len(valori), 'prova', 'prove')} su {contate}]"
        righe.append(in_colonne([nome, f"{media(valori):.2f}", unita, rumore + mancanti], [-31, 7, -8], " "))
    return righe


INTERROTTA = " (interrotta)"  # beside a run cut short, in every table


def etichetta_np(prova: Prova) -> Optional[str]:
    """As --avvia started it (`4 kv`, `auto`), else the slots."""
    if prova.configurazione is not None:
        return prova.configurazione.etichetta
    return None if prova.info.n_slot is None else str(prova.info.n_slot)


def riga_tabella(punto: Punto, dopo_np: str, memorie: Optional[Dict[Configurazione, Memoria]] = None) -> List[str]:
    prova = punto.prove[0]
    c = prova.configurazione
    np = fmt(etichetta_np(prova), "s")
    kv = [fmt(c.deciso.kv_mib if c.deciso else None, ".2f")] if c else []
    kv += [fmt(memorie.get(c) and memorie[c].totale, ".0f")] if memorie else []  # --repliche
    return [np + dopo_np, fmt(prova.info.n_ctx_slot, "d"), *kv, fmt(punto.latenza, ".2f s"),
            fmt(punto.latenza_max, ".2f s"), fmt(punto.throughput, ".2f token/s") + con_tagliate(punto)]


def con_tagliate(punto: Punto) -> str:
    n = sum(len(tagliate_dal_contesto(p)) for p in punto.intere)
    return f" ({n} tagliate dal contesto)" if n else ""


def tabella_consegnato(prove: List[Prova], memorie: Optional[Dict[Configurazione, Memoria]] = None) -> List[str]:
    """--repliche: the RAM the copies held (smaps_rollup, shared pages once) in a column of its own."""
    kv = ["KV MiB"] * any(p.configurazione for p in prove) + ["RAM MiB"] * bool(memorie)
    righe = []
    for punto in punti_di(prove):
        escluse = [id(p) for p, _ in anomale(punto.prove)]
        righe += [riga_tabella(Punto([p]), INTERROTTA if p.esecuzione.interruzione else " (esclusa)" * (id(p) in escluse),
                               memorie) for p in punto.prove]
        if len(punto.prove) > 1:
            righe.append(riga_tabella(punto, f" (media di {len(punto.intere)})", memorie))
    copie = [f"np {c.etichetta}: {c.descrizione} (--repliche); " for c in memorie or () if c.repliche > 1][:1]
    return tabella_md(["np", "n_ctx_slot", *kv, "latenza media", "latenza max", "throughput"], righe) + [
        "".join(copie) + "RAM: le copie insieme, la più alta letta a fine prova (/proc/PID/smaps_rollup), le pagine "
        "condivise (i pesi) contate una volta"] * bool(memorie)


# Sweeps: lists of values, the table, the capacity curve #######################################
# `--parallele 1,2,4`, `--np 1,2,4`...: a run per combination (and --ripeti), one table, one curve.

MAX_PUNTI = 100  # a grid larger than this needs --forza
VARIABILI = ("parallele", "token", "ritmo", "prompt", "prefisso")  # the lists, as they nest
ASSI = ("ritmo", "parallele", "token", "prompt", "prefisso", "np")  # the curve's: first that varied
ASSI_DI_CARICO = ("ritmo", "parallele")  # only along these can the server saturate
PASSO_MINIMO = 1.1  # a load grown by under 10% is the same load, not a step


def griglia(base: Piano, parallele: Optional[List[int]], token: List[int], ritmo: Optional[List[float]],
            seme: Optional[int], prompt: Optional[List[Tuple[int, int]]] = None,
            prefisso: Optional[List[int]] = None) -> List[Piano]:
    """The last flag fastest; Poisson without --seme: a seed drawn, printed, saved."""
    if ritmo is not None and seme is None and base.oltre.arrivi == "poisson":
        import random

        seme = random.SystemRandom().randrange(10 ** 6)
    if parallele is None:
        parallele = [4] if ritmo is None else [min(TETTO_RITMO, base.richieste or TETTO_RITMO)]
    return [base._replace(parallele=p, max_token=t,
                          oltre=base.oltre._replace(ritmo=r, seme=seme, prompt_token=n, prefisso=c))
            for p, t, r, n, c in itertools.product(parallele, token, ritmo or [None], prompt or [None], prefisso or [None])]


def valore_di(chiave: str, piano: Piano, configurazione: Optional[Configurazione] = None) -> str:
    return configurazione.etichetta if chiave == "np" else fmt(valore_numerico(chiave, piano), "g")


def valore_numerico(chiave: str, piano: Piano):
    piano_oltre = oltre(piano)
    return {"parallele": piano.parallele, "token": piano.max_token, "ritmo": piano_oltre.ritmo,
            "prompt": piano_oltre.prompt_token and piano_oltre.prompt_token[0], "prefisso": piano_oltre.prefisso}[chiave]


def variate(piani: List[Piano]) -> List[str]:
    return [v for v in VARIABILI if len({valore_numerico(v, p) for p in piani}) > 1]


def chiavi_griglia(sessione: Sessione) -> List[str]:
    return (["np"] if len(sessione.opzioni.oltre.np or []) > 1 else []) + variate(sessione.piani)


class Punto:
    """The runs (--ripeti) of one load on one server, combined."""

    def __init__(self, prove: List[Prova]):
        self.prove, self.piano = prove, prove[0].piano
        self.escluse = anomale(prove) if len(prove) > 1 else []  # (run, the others' median)
        self.intere = [p for p in prove
                       if not (p.esecuzione.interruzione or any(p is q for q, _ in self.escluse))] or prove
        self._riepiloghi: Dict[int, Riepilogo] = {}  # by id(run): Prova.riepilogo computes anew

    riuscite = property(lambda self: [r for p in self.intere for r in p.esecuzione.riuscite])

    def valori(self, prendi) -> List[float]:
        return [v for v in (prendi(p) for p in self.intere) if v is not None]

    def cifre(self, campo: str) -> List[float]:
        return self.valori(lambda p: getattr(self._riepiloghi.get(id(p)) or self._riepiloghi.setdefault(
            id(p), p.riepilogo), campo))

    throughput = property(lambda self: media(self.cifre("throughput")))
    latenza = property(lambda self: media(self.cifre("latenza_media")))
    latenza_p90 = property(lambda self: media(self.valori(latenza_p90)))
    latenza_max = property(lambda self: media(self.cifre("latenza_max")))
    picco = property(lambda self: max(self.cifre("picco"), default=None))
    picco_coda = property(lambda self: max(self.cifre("picco_coda"), default=None))
    velocita_slot = property(lambda self: velocita_media_slot(self.riuscite))
    inviate_davvero = property(lambda self: media(self.valori(invii_al_secondo)))
    misurato = property(lambda self: self.throughput is not None and self.latenza is not None)
    completo = property(lambda self: any(not p.esecuzione.interruzione for p in self.prove))  # else a lower bound
    velocita_prompt = property(lambda self: media([
        (r.token_prompt - (r.token_cache or 0)) / (r.prompt_ms / 1000) for r in self.riuscite
        if r.token_prompt is not None and r.prompt_ms]))

    @property
    def figure(self) -> Dict[str, List[float]]:
        insieme: Dict[str, List[float]] = {}
        for q in self.intere:
            for nome, valori in valori_figure(q).items():
                insieme.setdefault(nome, []).extend(valori)
        return insieme

    attesa_media = property(lambda self: media(self.figure["attesa in coda"]))

    def valore(self, chiave: str) -> str:
        return valore_di(chiave, self.piano, self.prove[0].configurazione)

    def nome(self, asse: str) -> str:  # "parallele=4"
        return f"{asse}={self.valore(asse)}"

    def carico(self, asse: str) -> Optional[float]:
        """Requests really in flight together, or really sent a second."""
        if asse == "parallele":
            return min(self.piano.parallele, self.piano.richieste or self.piano.parallele)
        if asse == "ritmo":
            return self.inviate_davvero or oltre(self.piano).ritmo
        return None


def anomale(prove: List[Prova]) -> List[Tuple[Prova, float]]:
    """Only with two others: of two runs apart, either may be odd."""
    import statistics

    valori = [(p, v) for p in prove if not p.esecuzione.interruzione
              for v in [p.riepilogo.throughput] if v is not None]
    return [(p, mediana) for i, (p, v) in enumerate(valori) if len(valori) > 2
            for mediana in [statistics.median(w for j, (_, w) in enumerate(valori) if j != i)]
            if v < 0.5 * mediana]


def frase_esclusa(prove: List[Prova], prova: Prova, mediana: float) -> str:
    """Its speed in a slot, not its spread (a quiet run's differ too)."""
    altre = [r for q in prove if q is not prova and not q.esecuzione.interruzione for r in q.esecuzione.riuscite]
    dopo = prova.macchina_dopo
    macchina = ("" if dopo is None else f"; subito dopo CPU al {dopo.cpu_occupata:.0%}" if dopo.cpu_occupata is not None
                else "" if dopo.carico_medio is None else f"; subito dopo carico medio {dopo.carico_medio:.1f}")
    return (f"prova {next(i for i, q in enumerate(prove, 1) if q is prova)} esclusa dalla media: "
            f"{prova.riepilogo.throughput:.2f} token/s, meno di metà della mediana delle altre ({mediana:.2f}). Nel "
            f"proprio slot {fmt(velocita_media_slot(prova.esecuzione.riuscite), '.1f')} t/s contro "
            f"{fmt(velocita_media_slot(altre), '.1f')}{macchina}")


def dispersione(valori: List[float]) -> float:
    import statistics

    return statistics.stdev(valori) if len(valori) > 1 else 0.0


def t_critico(gl: float) -> float:
    """Two-sided 95%, any gl ≥ 1 (Welch's too): t = √gl·tan φ where k·∫₀^φ cos^(gl-1) = 0.475 (error < 0.01%)."""
    import math

    gl = min(gl, 1e6)
    k = math.exp(math.lgamma(gl / 2 + 0.5) - math.lgamma(gl / 2)) / math.pi ** 0.5
    basso, alto = 0.0, math.atan(13 / gl ** 0.5)
    for _ in range(40):
        phi = (basso + alto) / 2
        area = k * phi / 96 * sum((2 + 2 * (i % 2) if 0 < i < 32 else 1) * math.cos(i * phi / 32) ** (gl - 1)
                                  for i in range(33))
        basso, alto = (phi, alto) if area < 0.475 else (basso, phi)
    return gl ** 0.5 * math.tan(basso)


def ic95(valori: List[float]) -> Optional[float]:
    return t_critico(len(valori) - 1) * dispersione(valori) / len(valori) ** 0.5 if len(valori) > 1 else None


def diversi(a: List[float], b: List[float]) -> Optional[bool]:
    if len(a) < 2 or len(b) < 2:
        return None
    t, gl = welch(a, b)
    return abs(t) > t_critico(gl)


def raggruppa(cose: list, chiave) -> Dict[object, list]:  # in the order each key first comes
    gruppi: Dict[object, list] = {}
    for cosa in cose:
        gruppi.setdefault(chiave(cosa), []).append(cosa)
    return gruppi


def punti_di(prove: List[Prova]) -> List[Punto]:
    return [Punto(g) for g in raggruppa(prove, lambda p: (p.configurazione, p.piano)).values()]


def latenza_p90(prova: Prova) -> Optional[float]:
    return percentile([r.latenza for r in prova.esecuzione.riuscite], 90)


PERCENTILI_GRIGLIA = (50, 90)  # a sweep's table, per streamed figure, unless --percentili


def tabella_griglia(punti: List[Punto], chiavi: List[str], percentili: Optional[Sequence[int]] = None) -> List[str]:
    cache = "prefisso" in chiavi
    prefill = "prompt" in chiavi or cache
    testa = chiavi + ["n_ctx_slot"] * ("np" in chiavi) + ["throughput", "latenza media", "latenza p90", "latenza max"]
    testa += ["dalla cache (media)"] * cache + ["prompt t/s (server)"] * prefill
    testa += ["t/s nel proprio slot", "picco slot occupati", "picco coda"]
    flussi = [(f, p) for f in ("primo token", "TPOT", "ITL") for p in percentili or PERCENTILI_GRIGLIA] if any(
        oltre(r).chunk_s is not None for punto in punti for r in punto.riuscite) else []
    testa += [f"{'TTFT' if f == 'primo token' else f} p{p}" for f, p in flussi]
    con_ritmo = any(oltre(p.piano).ritmo for p in punti)
    testa += ["inviate davvero"] * con_ritmo
    corpo = []
    for punto in punti:
        p, escluse = punto.prove[0], punto.escluse
        ripetute = len(punto.intere) > 1
        rumore = f" ±{fmt(ic95(punto.cifre('throughput')), '.2f')}" * ripetute
        throughput = fmt(punto.throughput, ".2f token/s") + rumore + con_tagliate(punto)
        dalla_cache = [r.token_cache for r in punto.riuscite if r.token_cache is not None]
        celle = [punto.valore(c) for c in chiavi] + [fmt(p.info.n_ctx_slot, "d")] * ("np" in chiavi)
        celle += [throughput] + [fmt(x, ".2f s") for x in (punto.latenza, punto.latenza_p90, punto.latenza_max)]
        celle += [fmt(media(dalla_cache), ".0f")] * cache + [fmt(punto.velocita_prompt, ".1f")] * prefill
        celle += [fmt(punto.velocita_slot, ".1f"), f"{fmt(punto.picco, 'd')}/{fmt(p.info.n_slot, 'd')}",
                  fmt(punto.picco_coda, "d")]
        figure = punto.figure if flussi else {}  # pooled once for all the point's percentiles
        celle += [fmt(percentile(figure.get(f, []), pc), ".3f s") if f == "primo token"
                  else fmt(ms(percentile(figure.get(f, []), pc)), ".1f ms") for f, pc in flussi]
        if con_ritmo:
            tenuto = all(ritmo_tenuto(q) for q in punto.intere)
            celle.append(fmt(punto.inviate_davvero, ".2f req/s") + " (non tenuto)" * (not tenuto))
        if any(q.esecuzione.interruzione for q in punto.prove):
            celle[0] += INTERROTTA
        if ripetute or escluse:
            celle[0] += f" (media di {len(punto.intere)}" + (f", {len(escluse)} esclusa" if escluse else "") + ")"
        corpo.append(celle)
    righe = tabella_md(testa, corpo)
    righe.append("picco coda: richieste in attesa di uno slot, dai tempi del server (e da requests_deferred con "
                 "--metrics, il maggiore dei due)")
    if any(len(punto.intere) > 1 for punto in punti):
        righe.append("(media di N): throughput, latenze e inviate davvero sono medie delle N prove (latenza max: "
                     "dei massimi). Le altre cifre vengono dalle richieste delle N prove insieme "
                     "(t/s nel proprio slot: token generati sul tempo nello slot), i picchi sono il più alto. ±: "
                     "l'intervallo di confidenza al 95% del throughput (t di Student)")
    if any(punto.escluse for punto in punti):
        righe.append("esclusa: una prova sotto metà del throughput mediano delle altre dello stesso punto, fuori dalle "
                     "medie (detta dopo le sue prove)")
    return righe


Curve = List[Tuple[str, List[Punto]]]  # (title, points) for each curve


def serie(punti: List[Punto], chiavi: List[str], asse: Optional[str] = None) -> Tuple[str, Curve]:
    asse = asse or next(a for a in ASSI if a in chiavi)
    gruppi = raggruppa(punti, lambda punto: ", ".join(punto.nome(c) for c in chiavi if c != asse))
    ordine = ((lambda q: q.prove[0].configurazione.ordine) if asse == "np"
              else (lambda q: valore_numerico(asse, q.piano)))
    return asse, [(titolo, sorted(g, key=ordine)) for titolo, g in gruppi.items()]


def passi(punti: List[Punto], asse: str) -> Iterator[Tuple[Punto, Punto, float]]:
    """(before, after, load ratio); `before` is the last point that grew by PASSO_MINIMO."""
    prima = None
    for punto in punti:
        if not punto.carico(asse) or not punto.throughput or punto.latenza is None:
            continue
        crescita = punto.carico(asse) / prima.carico(asse) if prima is not None else None
        if crescita is not None:
            yield prima, punto, crescita
        if crescita is None or crescita >= PASSO_MINIMO:
            prima = punto


def saturazione(punti: List[Punto], asse: str) -> Optional[Tuple[Punto, Punto]]:
    """The first step where the throughput gained under a quarter of the load's growth and the mean
    latency rose (Welch 95%, else by 10%); never one the throughput later climbed over."""
    for prima, dopo, crescita in passi(punti, asse):
        if risalito_dopo(punti[punti.index(dopo):], asse):
            continue
        in_piu = dopo.throughput / prima.throughput - 1
        salita = diversi(prima.cifre("latenza_media"), dopo.cifre("latenza_media"))
        if salita is None:
            salita = dopo.latenza - prima.latenza > 0.1 * prima.latenza
        if crescita >= PASSO_MINIMO and in_piu < 0.25 * (crescita - 1) and salita and dopo.latenza > prima.latenza:
            return prima, dopo
    return None


def risalito_dopo(punti: List[Punto], asse: str) -> bool:
    return any(b.throughput / a.throughput - 1 >= 0.25 * (crescita - 1) and crescita >= PASSO_MINIMO
               and diversi(a.cifre("throughput"), b.cifre("throughput")) is not False
               for a, b, crescita in passi(punti, asse))


def errore_standard(a: List[float], b: List[float]) -> Tuple[float, float]:
    """Of the difference of two means, and its Welch-Satterthwaite degrees of freedom."""
    import statistics

    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0:
        return 0.0, float("inf")
    return (va + vb) ** 0.5, (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))


def guadagno(asse: str, prima: Punto, dopo: Punto) -> Optional[Tuple[float, float, float]]:
    """Throughput gain, half its 95% interval, a quarter of the load's growth (token/s); or None."""
    a, b = prima.cifre("throughput"), dopo.cifre("throughput")
    if len(a) < 2 or len(b) < 2:
        return None
    es, gl = errore_standard(a, b)
    quarto = 0.25 * (dopo.carico(asse) / prima.carico(asse) - 1) * prima.throughput
    return media(b) - media(a), t_critico(gl) * es, quarto


def dubbio_saturazione(asse: str, prima: Punto, dopo: Punto) -> Optional[str]:
    if len(prima.intere) < 2 or len(dopo.intere) < 2:
        return "una prova per punto: il rumore non è misurato, e un solo passo rumoroso basta a farla sembrare"
    misura = guadagno(asse, prima, dopo)
    if misura is None:  # the other runs of the point failed whole: no throughput of theirs
        return "una sola prova con un throughput in un punto (le altre sono fallite): il rumore non è misurato"
    differenza, mezzo, soglia = misura
    if differenza + mezzo >= soglia:
        return (f"il guadagno di throughput ({differenza:+.1f} ±{mezzo:.1f} token/s al 95%) può arrivare a un quarto "
                f"del carico in più ({soglia:.1f} token/s)")
    return None


def stessi_carichi(punti: List[Punto], asse: str) -> List[str]:
    frasi = []
    for prima, dopo, crescita in passi(punti, asse):
        if crescita < PASSO_MINIMO:
            richieste = dopo.piano.richieste
            perche = (f"con {quante(richieste, 'richiesta', 'richieste')} in tutto non ne partono più di {richieste} "
                      "insieme" if asse == "parallele" and richieste and dopo.piano.parallele >= richieste
                      else f"il carico è cresciuto di {crescita - 1:.0%}, meno del {PASSO_MINIMO - 1:.0%}")
            frasi.append(f"{dopo.nome(asse)} porta lo stesso carico di {prima.nome(asse)}"
                         f" ({perche}): non è un passo della curva.")
    return frasi


class Saturazione(NamedTuple):
    """`dubbio` None: certain; `sovraccarico`: at `dopo` the server first fell behind."""
    prima: Optional[Punto]
    dopo: Punto
    dubbio: Optional[str]
    sovraccarico: bool = False
    occupata: Optional[str] = None  # busy ends: no verdict


def poche_per_una_coda(punto: Punto, asse: str) -> bool:  # too few to build a queue: no verdict
    return asse == "ritmo" and min(p.esecuzione.n_richieste for p in punto.intere) < MINIMO_SOVRACCARICO


def verdetto_saturazione(punti: List[Punto], asse: str) -> Optional[Saturazione]:
    """The one verdict lines, marks and explanation say; no later than the first overload."""
    misurati = [p for p in punti if p.misurato and not poche_per_una_coda(p, asse)]
    satura = saturazione(misurati, asse)
    if asse == "ritmo":
        for i, punto in enumerate(misurati):
            visti = [v for v in map(sovraccarico, punto.intere) if v]
            if visti and (satura is None or misurati.index(satura[1]) >= i):  # the overload is the stronger evidence
                dubbio = None if any(v.certo for v in visti) else visti[0].dubbio
                poi = next((p for p in misurati[i + 1:] if any(v and v.certo for v in map(sovraccarico, p.intere))), None)
                if dubbio is not None and poi is not None:  # said, so that no block below contradicts the doubt
                    dubbio += f"; a {poi.nome(asse)} invece il sovraccarico è accertato"
                return senza_occupati(asse, Saturazione(misurati[i - 1] if i else None, punto, dubbio, True))
    if satura is None:
        return None
    return senza_occupati(asse, Saturazione(*satura, dubbio_saturazione(asse, *satura)))


def punti_occupati(asse: str, *punti: Optional[Punto]) -> Optional[str]:
    nomi = [p.nome(asse) for p in punti if p and any(map(occupata_intorno, p.prove))]  # a run left out too
    return ", ".join(nomi) or None


def senza_occupati(asse: str, verdetto: Saturazione) -> Saturazione:
    dove = punti_occupati(asse, verdetto.prima, verdetto.dopo)
    return verdetto._replace(dubbio=nessun_verdetto(dove), occupata=dove) if dove else verdetto


def nessun_verdetto(dove: str) -> str:
    return f"nessun verdetto sulla saturazione, la macchina era occupata a {dove}"


def frase_saturazione(asse: str, verdetto: Saturazione) -> str:
    prima, dopo = verdetto.prima, verdetto.dopo
    if verdetto.occupata:  # figures the output itself says do not count
        return verdetto.dubbio
    if verdetto.sovraccarico:
        inviate = " e ".join(fmt(p.inviate_davvero, ".2f") for p in (prima, dopo) if p is not None)
        fra = f"fra {prima.nome(asse)} e {dopo.nome(asse)}; " if prima else ""
        frase = (f"saturazione entro {dopo.nome(asse)} ({fra}inviate davvero {inviate} req/s). Lì il "
                 "server non tiene il ritmo degli arrivi: la coda cresce lungo la prova (sovraccarico)")
        return frase if verdetto.dubbio is None else f"forse {frase}. Non è accertato: {verdetto.dubbio}"
    crescita = dopo.carico(asse) / prima.carico(asse)
    verso = "solo" if dopo.throughput >= prima.throughput else "sceso"  # "solo" of a fall reads as a small rise
    numeri = (f"da {prima.nome(asse)} carico ×{crescita:.1f}, throughput {verso} da "
              f"{prima.throughput:.1f} a {dopo.throughput:.1f} token/s ({dopo.throughput / prima.throughput - 1:+.1%}). "
              f"La latenza media è salita da {prima.latenza:.2f} a {dopo.latenza:.2f} s "
              f"({dopo.latenza / prima.latenza - 1:+.0%}")
    if verdetto.dubbio is None:
        return (f"saturazione a {dopo.nome(asse)}: {numeri}), oltre il rumore (Welch 95% su "
                f"{len(prima.intere)} e {len(dopo.intere)} prove)")
    consiglio = "--ripeti 3" if min(len(prima.intere), len(dopo.intere)) < 3 else "--ripeti 5, o più richieste per punto"
    return (f"forse saturazione a {dopo.nome(asse)}, non accertata: {numeri}). Ma {verdetto.dubbio}. "
            f"Per deciderlo: {consiglio}")


def perche_satura(prima: Punto, dopo: Punto) -> str:
    """k slots sharing the cores divide one's speed by k at most (batching: less, never more)."""
    attese, velocita = (prima.attesa_media, dopo.attesa_media), (prima.velocita_slot, dopo.velocita_slot)
    coda = (", e la coda è rimasta vuota" if dopo.picco_coda == 0 and prima.picco_coda in (0, None) else
            f", e la coda è arrivata a {fmt(dopo.picco_coda, 'd')} (prima {fmt(prima.picco_coda, 'd')})")
    frasi = [f"Lì gli slot occupati insieme erano al massimo {fmt(dopo.picco, 'd')} su "
             f"{fmt(dopo.prove[0].info.n_slot, 'd')}{coda}"]
    if None not in attese and max(attese) < 0.005:  # 0.00 s both: none waited, said as such
        frasi.append("nessuna richiesta ha aspettato uno slot")
    elif None not in attese:
        cresciuta = attese[1] - attese[0] > 0.1 * dopo.latenza
        frasi.append(f"l'attesa media in coda è passata da {attese[0]:.2f} a {attese[1]:.2f} s" + (
            ": una richiesta in più non trova uno slot libero e aspetta" if cresciuta else ", poco"))
    if None not in velocita and velocita[1] < 0.9 * velocita[0]:
        occupata = next(filter(None, map(occupata_intorno, prima.intere + dopo.intere)), None)
        if occupata:  # the machine's own work may have slowed the slots: not said to be the slots'
            perche = (f", ma la macchina era già occupata in una delle due prove ({occupata}). La discesa può "
                      "venire da lì")
        elif None in (prima.picco, dopo.picco):  # how many slots were at work together is not known
            perche = ""
        elif dopo.picco > prima.picco and velocita[1] < 0.75 * velocita[0] * prima.picco / dopo.picco:
            perche = (f": più di quanto spieghi la divisione dei core fra {dopo.picco} slot (circa "
                      f"{velocita[0] * prima.picco / dopo.picco:.1f} t/s l'uno). Forse altro lavorava sulla macchina "
                      "durante la prova")  # the look before each run cannot see a load that started after it
        elif dopo.picco > prima.picco:
            perche = ": gli slot si dividono gli stessi core" + (
                ", e la macchina non genera più token al secondo" if dopo.throughput <= 1.1 * prima.throughput else "")
        else:
            perche = ", con gli stessi slot al lavoro insieme: non è la divisione dei core fra gli slot"
        frasi.append(f"nel proprio slot ogni richiesta è scesa da {velocita[0]:.1f} a {velocita[1]:.1f} t/s{perche}")
    return ". ".join(maiuscola(f) for f in frasi) + "."


class Sovraccarico(NamedTuple):
    completate: float
    arrivate: float
    attesa_prima: float
    attesa_dopo: float
    certo: bool = True

    @property
    def dubbio(self) -> Optional[str]:
        return None if self.certo else ("l'attesa cresciuta non si separa dal rumore delle attese (Welch 95%): una "
                                        "--durata più lunga lo decide")


MINIMO_SOVRACCARICO = 6  # answers a run needs to tell an overload: a first and a last third of two each


def sovraccarico(prova: Prova) -> Optional[Sovraccarico]:
    """While sending, over 10% fewer completed than arrived, and the last third waited for a slot
    longer than the first by more than a request's time in its slot."""
    e = prova.esecuzione
    if not oltre(prova.piano).al_tempo:
        return None
    ok = sorted(e.riuscite, key=lambda r: r.inizio)
    inizi = sorted(r.inizio for r in e.risultati)
    if len(ok) < MINIMO_SOVRACCARICO or inizi[-1] <= inizi[0]:
        return None
    fine = oltre(prova.piano).durata or inizi[-1]  # the window they were sent in, as "inviate davvero" counts it
    arrivate = invii_al_secondo(prova)
    completate = sum(1 for r in ok if inizi[0] < r.fine <= fine) / (fine - inizi[0])
    attese = attese_in_coda(prova)
    in_ordine = [attese[r.indice] for r in ok if r.indice in attese]
    terzo, servizi = len(in_ordine) // 3, [t for t in map(servizio, ok) if t]
    if completate >= 0.9 * arrivate or terzo < 2 or not servizi:
        return None
    prima, dopo = in_ordine[:terzo], in_ordine[-terzo:]
    if media(dopo) - media(prima) <= media(servizi):
        return None
    return Sovraccarico(completate, arrivate, media(prima), media(dopo), bool(diversi(prima, dopo)))


def frase_sovraccarico(visto: Sovraccarico) -> str:
    frase = (f"finché si inviava, il server ha completato {visto.completate:.2f} richieste al secondo e ne arrivavano "
             f"{visto.arrivate:.2f}. L'attesa in coda è cresciuta da {visto.attesa_prima:.2f} s (primo terzo delle "
             f"richieste) a {visto.attesa_dopo:.2f} s (ultimo terzo)")
    if not visto.certo:
        return frase + f". Forse sovraccarico, non accertato: {visto.dubbio}."
    return frase + ". Il server è più lento degli arrivi (sovraccarico): la latenza dipende da quanto dura la prova."


def rapporti_np(punti: List[Punto], chiavi: List[str]) -> List[str]:
    if "np" not in chiavi:
        return []
    altre = [c for c in chiavi if c != "np"]
    righe, vantaggi = [], []
    for titolo, gruppo in serie(punti, chiavi, "np")[1]:  # each in the order of its servers
        misurati = [p for p in gruppo if p.throughput and p.completo]
        if len(misurati) < 2:
            continue
        base = misurati[0]
        voci = [f"np {p.valore('np')} / np {base.valore('np')} ×{p.throughput / base.throughput:.2f}"
                for p in misurati[1:]]
        vantaggi.append((titolo, misurati[-1].throughput / base.throughput, misurati[-1], base))
        righe.append(f"throughput{f' a {titolo}' if titolo else ''}: " + ", ".join(voci)
                     + ("" if altre or base.valore("np") != "1" or "4" not in [p.valore("np") for p in misurati]
                        or base.piano.max_token != Piano().max_token  # the lab's: --token 32
                        else " (nel lab, su 6 vCPU senza GPU: np 4 / np 1 ×2)"))  # like for like
    if altre == ["token"] and len(vantaggi) > 1:
        (da, r_da, *pd), (a, r_a, *pa) = vantaggi[0], vantaggi[-1]
        # The noise of a ratio of ratios: the four means' relative 95% intervals, added in quadrature.
        relativi = [ic95(p.cifre("throughput")) for p in pd + pa]
        rumore = (None if None in relativi else
                  sum((h / p.throughput) ** 2 for h, p in zip(relativi, pd + pa)) ** 0.5)
        soglia = max(0.1, rumore or 0.0)
        entro = "entro il 10%" if soglia == 0.1 else f"entro il rumore (±{rumore:.0%} al 95%)"
        oltre_soglia = not r_da / (1 + soglia) <= r_a <= (1 + soglia) * r_da
        verso = (f"è rimasto lo stesso, {entro}" if max(r_a / r_da, r_da / r_a) <= 1.1 else  # over 10%: not "same"
                 ("è cresciuto" if r_a > r_da else "è calato")
                 + ("" if oltre_soglia else f" ma non è accertato (rumore ±{rumore:.0%} al 95%)"))
        if rumore is None:  # one run a point: the noise is not measured, and two identical sweeps can disagree
            verso = "forse " + verso
        righe.append(f"con risposte più lunghe ({da} -> {a}) il vantaggio del batching {verso}: ×{r_da:.2f} -> ×{r_a:.2f}"
                     + (f" (oltre il rumore: ±{rumore:.0%} al 95%)" if rumore is not None and oltre_soglia else ""))
    if righe and any(len(p.intere) < 2 for p in punti if p.throughput):  # said once, before the first ratio
        righe.insert(0, "una prova per punto: questi rapporti possono cambiare da un'esecuzione all'altra; con --ripeti 3 "
                        "si misura il rumore e diventano una risposta")
    return righe


def occupata_intorno(prova: Prova) -> Optional[str]:
    sguardi = (prova.macchina, prova.macchina_dopo)
    return next(filter(None, (macchina_occupata(m) for m in sguardi if m)), None)


def riga_occupata(punti: List[Punto], chiavi: List[str]) -> List[str]:
    occupati = {", ".join(p.nome(c) for c in chiavi): motivo for p in punti for q in p.prove
                for motivo in [occupata_intorno(q)] if motivo}
    if not occupati:
        return []
    dove = f" a {('; ' if len(chiavi) > 1 else ', ').join(occupati)}" if chiavi else ""  # --ripeti alone: its runs
    return [f"la macchina era occupata{dove} ({next(iter(occupati.values()))}): quelle cifre"
            f"{' e i rapporti' if chiavi else ''} non valgono, ripeti a macchina tranquilla"]

TITOLO_CURVA = "curva di capacità: throughput aggregato e latenza, un punto per valore di "


class Scala(NamedTuple):
    x_da: float  # throughput at the left edge: 0, unless that would crush every point to the right
    x_a: float
    y_a: float  # latency at the top; the bottom is 0


def segni_curva(asse: str, gruppi: Curve) -> Tuple[Optional[Scala], List[tuple]]:
    """The axes (None: no point measured) and per curve its title, points with their TTFT p50, verdict,
    and the point marked saturated (only without doubt)."""
    segni = []
    for titolo, punti in gruppi:
        coppie = [(p, percentile(p.figure.get("primo token", []), 50)) for p in punti if p.misurato]
        verdetto = verdetto_saturazione(punti, asse)
        satura = verdetto.dopo if verdetto is not None and verdetto.dubbio is None else None
        segni.append((titolo, coppie, verdetto, satura))
    misurati = [p for _, punti, _, _ in segni for p, _ in punti]
    if not misurati:
        return None, segni
    x = [p.throughput for p in misurati]
    y_a = max(max(p.latenza, p.latenza_p90 or 0) for p in misurati) * 1.1 or 1.0
    if min(x) > 0.5 * max(x):  # from 0, every point would sit in the right half: show a window around them,
        # never narrower than a third of the largest value, so that a difference of noise stays small
        margine = max(0.1 * (max(x) - min(x)), (max(x) / 3 - (max(x) - min(x))) / 2)
        return Scala(max(0.0, min(x) - margine), max(x) + margine, y_a), segni
    return Scala(0.0, max(x) * 1.15 or 1.0, y_a), segni


def curva(asse: str, gruppi: Curve, marche: Dict[str, str], frasi: bool = True) -> List[str]:
    scala, segni = segni_curva(asse, gruppi)
    if scala is None:
        return ["curva di capacità: nessun punto misurato"]
    colonne = LARGHEZZA_TERMINALE - 9  # the latency's figures on the left
    altezza = 12
    tela = [[" "] * colonne for _ in range(altezza)]

    def metti(x: float, y: Optional[float], testo: str) -> None:
        if y is None:
            return
        riga = altezza - 1 - round(y / scala.y_a * (altezza - 1))
        col = round((x - scala.x_da) / (scala.x_a - scala.x_da) * (colonne - 1))
        for k, carattere in enumerate(testo[:colonne - col]):
            tela[riga][col + k] = carattere

    lettere = "abcdefghijklmnopqrstuvwxyz" if len(gruppi) > 1 else ""
    for n, (titolo, punti, verdetto, satura) in enumerate(segni):
        for p, ttft in punti:
            metti(p.throughput, ttft, marche["ttft"])
            metti(p.throughput, p.latenza_p90, marche["p90"])
        marca = lettere[n % 26] if lettere else marche["media"]
        for p, _ in punti:
            metti(p.throughput, p.latenza, (marche["saturazione"] if p is satura else marca) + p.valore(asse))
    con_ttft = any(ttft is not None for _, punti, _, _ in segni for _, ttft in punti)
    sature = [(titolo, verdetto) for titolo, _, verdetto, _ in segni if verdetto is not None]
    asse_y = {0: f"{scala.y_a:5.2f} s", altezza - 1: "   0 s "}
    righe = [TITOLO_CURVA + asse, "latenza"]
    righe += [f"{asse_y.get(i, ''):>7} |" + "".join(riga).rstrip() for i, riga in enumerate(tela)]
    righe.append(f"{'':7} +" + "-" * colonne)
    sinistra = f"{scala.x_da:.1f}" if scala.x_da else "0"
    righe.append(f"{'':8}{sinistra}{f'{scala.x_a:.1f} token/s':>{colonne - len(sinistra)}}")
    voci = ("  ".join(f"{lettere[n % 26]}N: {titolo}" for n, (titolo, _) in enumerate(gruppi)) if lettere
            else f"{marche['media']}N latenza media al valore N")
    righe.append(f"legenda: {voci}  {marche['p90']} latenza p90" + (f"  {marche['ttft']} primo token p50" if con_ttft else "")
                 + (f"  {marche['saturazione']} saturazione" if any(v.dubbio is None for _, v in sature) else ""))
    if frasi:  # with --spiega the sentence is in the explanation, once
        righe += [(f"{titolo}: " if titolo else "") + frase_saturazione(asse, v) for titolo, v in sature]
    return righe


def svg_curva(asse: str, gruppi: Curve, y: int) -> Tuple[List[str], int]:
    scala, segni = segni_curva(asse, gruppi)
    if scala is None:
        return [], y
    sinistra, destra = ASSE_SVG
    alto = 260
    base = y + 24 + alto
    px = lambda v: sinistra + (v - scala.x_da) / (scala.x_a - scala.x_da) * (destra - sinistra)  # noqa: E731
    py = lambda v: base - v / scala.y_a * alto  # noqa: E731
    linea = lambda punti: " ".join(f"{a:.1f},{b:.1f}" for a, b in punti)  # noqa: E731
    parti = [scritta(sinistra, y + 12, TITOLO_CURVA + asse, font_weight="bold"),
             elemento("line", x1=sinistra, y1=base, x2=destra, y2=base, stroke="#333"),
             elemento("line", x1=sinistra, y1=base, x2=sinistra, y2=base - alto, stroke="#333"),
             scritta(sinistra - 4, base - alto + 10, f"{scala.y_a:.2f} s", text_anchor="end"),
             scritta(sinistra - 4, base, "0 s", text_anchor="end"),
             scritta(destra, base + 16, f"{scala.x_a:.1f} token/s", text_anchor="end"),
             scritta(sinistra, base + 16, f"{scala.x_da:.1f}" if scala.x_da else "0"),
             scritta((sinistra + destra) / 2, base + 16, "throughput aggregato", text_anchor="middle"),
             scritta(sinistra - 4, base - alto / 2, "latenza", text_anchor="end")]
    colori = ("#264653", "#2a9d8f", "#e76f51", "#6a4c93", "#f4a261", "#8d99ae")
    for n, (titolo, punti, verdetto, satura) in enumerate(segni):
        colore = colori[n % len(colori)]
        medie = [(px(p.throughput), py(p.latenza)) for p, _ in punti]
        p90 = [(px(p.throughput), py(p.latenza_p90)) for p, _ in punti if p.latenza_p90 is not None]
        parti += [elemento("polyline", fill="none", stroke=colore, stroke_width=2, points=linea(medie)),
                  elemento("polyline", fill="none", stroke=colore, stroke_dasharray="4 3", points=linea(p90))]
        parti += [elemento("circle", cx=a, cy=b, r=3, fill="white", stroke=colore) for a, b in p90]
        parti += [elemento("rect", titolo=f"{p.nome(asse)}: primo token p50 {ttft:.3f} s",
                           x=px(p.throughput) - 3, y=py(ttft) - 3, width=6, height=6, fill=colore)
                  for p, ttft in punti if ttft is not None]  # --stream
        for (p, _), (a, b) in zip(punti, medie):
            cifre = (f"{p.nome(asse)}: {p.throughput:.1f} token/s, latenza media {p.latenza:.2f} s, "
                     f"p90 {fmt(p.latenza_p90, '.2f s')}, prove {len(p.intere)}")
            parti += [elemento("circle", titolo=cifre, cx=a, cy=b, r=4, fill=colore),
                      scritta(a + (12 if p is satura else 7), b + 4, p.valore(asse), fill=colore)]
            if p is satura:
                parti += [elemento("circle", cx=a, cy=b, r=9, fill="none", stroke="#e63946", stroke_width=2),
                          scritta(a - 13, b + 4, "saturazione", text_anchor="end", fill="#e63946")]
            elif any(map(occupata_intorno, p.prove)):  # as the table's line says
                parti.append(scritta(a - 8, b + 4, "macchina occupata", text_anchor="end", fill="#888"))
            elif verdetto is not None and p is verdetto.dopo and not verdetto.occupata:
                # not certain: said as such, not ringed; busy: no verdict, none drawn
                parti.append(scritta(a - 8, b + 4, "forse saturazione", titolo=verdetto.dubbio, text_anchor="end",
                                     fill="#888"))
        if titolo:
            parti.append(scritta(destra, y + 40 + 16 * n, titolo, text_anchor="end", fill=colore))
    y = base + 36
    parti.append(scritta(sinistra, y, "linea piena: latenza media; tratteggio: latenza p90; quadratini: primo token "
                         f"p50 (con --stream); a ogni punto il valore di {asse}"))
    return parti, y + 20


def spiegazione_griglia(asse: str, gruppi: Curve) -> List[str]:
    frasi = [frase for titolo, punti in gruppi for frase in spiegazione_curva(asse, titolo, punti)]
    for titolo, punti in gruppi:  # open loop: a server behind the arrivals has a queue that keeps growing
        punto, visto = next(((p, v) for p in punti for v in map(sovraccarico, p.intere) if v), (None, None))
        if visto:
            chiavi = punto.nome(asse) + (f", {titolo}" if titolo else "")
            frasi.append(f"A {chiavi} l'attesa in coda è cresciuta da {visto.attesa_prima:.2f} a "
                         f"{visto.attesa_dopo:.2f} s, ma la macchina era occupata: nessun verdetto sul sovraccarico."
                         if punti_occupati(asse, punto)
                         else f"A {chiavi}, " + frase_sovraccarico(visto))
    return frasi


def spiegazione_curva(asse: str, titolo: str, punti: List[Punto]) -> List[str]:
    capo = f"Curva ({titolo}): " if titolo else "Curva: "
    misurati = [p for p in punti if p.misurato]
    if len(misurati) < 2:
        return []
    frasi = []
    poche = [p for p in misurati if poche_per_una_coda(p, asse)]
    if poche:  # the real reason, not noise: say it, and judge only on the points that could show a queue
        misurati = [p for p in misurati if not poche_per_una_coda(p, asse)]
        durata = -(-2 * MINIMO_SOVRACCARICO // min(oltre(p.piano).ritmo for p in poche))
        # one point left is enough when its queue grew: an overload is a verdict of its own
        giudicabili = len(misurati) > 1 or bool(misurati and verdetto_saturazione(misurati, asse))
        esito = "Quei punti restano fuori dal verdetto" if giudicabili else "Nessun verdetto sulla saturazione"
        frasi.append(f"{capo}a {asse}={', '.join(p.valore(asse) for p in poche)} "
                     f"solo {da_a([q.esecuzione.n_richieste for p in poche for q in p.intere])} richieste a prova, troppo "
                     f"poche per vedere se la coda cresce. {esito}: usa --durata {durata:g} o più.")
        if not giudicabili:
            return frasi
    frasi += stessi_carichi(misurati, asse)
    if asse not in ASSI_DI_CARICO:
        return frasi + [f"{capo}cambiando {asse} il carico non cresce, e non si parla di saturazione. "
                        + confronto_velocita(asse, misurati[0], misurati[-1])]
    verdetto = verdetto_saturazione(misurati, asse)
    if verdetto is None:
        return frasi + [capo + senza_saturazione(asse, misurati)]
    return frasi + [capo + frase_saturazione(asse, verdetto) + "."
                    + (" " + perche_satura(verdetto.prima, verdetto.dopo) if verdetto.prima and not verdetto.sovraccarico
                       and not verdetto.occupata else "")]


def senza_saturazione(asse: str, misurati: List[Punto]) -> str:
    a, b = misurati[0], misurati[-1]
    occupata_a = punti_occupati(asse, *misurati)
    if occupata_a:  # "fino a" rests on every point: none may be one the output discounts
        return f"{nessun_verdetto(occupata_a)}."
    passati = [(x, y, c) for x, y, c in passi(misurati, asse) if c >= PASSO_MINIMO]
    piatti = [(x, y) for x, y, c in passati if y.throughput / x.throughput - 1 < 0.25 * (c - 1)]
    piatto = next(((x, y) for x, y in piatti if not risalito_dopo(misurati[misurati.index(y):], asse)), None)
    fino = f"nessuna saturazione fino a {b.nome(asse)}"
    if piatto is not None:  # the throughput stopped following the load; no rise of the latency confirmed
        x, y = piatto
        prove = [len(x.intere), len(y.intere)]
        misura = guadagno(asse, x, y)
        forse = misura and misura[0] + misura[1] >= misura[2]  # the gain's interval reaches the quarter
        return (f"{fino.replace('saturazione', 'saturazione accertata')}. Da {x.nome(asse)} a {y.valore(asse)} il "
                f"throughput {'forse ' * bool(forse)}non ha seguito il carico ({x.throughput:.1f} → "
                f"{y.throughput:.1f} token/s" + (f", guadagno {misura[0]:+.1f} ±{misura[1]:.1f} al 95%" if forse else "")
                + f"). La latenza media ({x.latenza:.2f} → {y.latenza:.2f} s) "
                + ("è salita meno del 10%, su una prova per punto: --ripeti 3" if min(prove) < 2
                   else f"sale del {y.latenza / x.latenza - 1:.0%} ma con {da_a(prove)} prove a punto non è "
                   "accertato: --ripeti 5" if y.latenza > 1.1 * x.latenza else
                   "non è salita oltre il rumore (Welch 95%): --ripeti 5") + " lo decide.")
    # categorical only when each step that followed the load did so beyond its repeats' noise
    incerti = [(x, y, m) for x, y, _ in passati if (x, y) not in piatti
               for m in [guadagno(asse, x, y)] if m and m[0] - m[1] < m[2]]
    salito = f"Il throughput è salito da {a.throughput:.1f} a {b.throughput:.1f} token/s"
    ogni = "ripreso dopo ogni passo piatto." if piatti else "a ogni passo di almeno un quarto del carico."
    if any(len(p.intere) < 2 for p in misurati):
        return f"forse {fino}. {salito}, {ogni} Indicativo: una prova per punto (--ripeti 3 misura il rumore)."
    if incerti:
        x, y, (d, m, q) = incerti[0]
        return (f"forse {fino}, non accertata. Da {x.nome(asse)} a {y.valore(asse)} il guadagno di throughput "
                f"({d:+.1f} ±{m:.1f} token/s al 95%) può stare sotto un quarto del carico ({q:.1f}): --ripeti 5 lo "
                "decide.")
    return f"{fino}. {salito}, {ogni}"


def confronto_velocita(asse: str, a: Punto, b: Punto) -> str:
    throughput = f"Il throughput è passato da {a.throughput:.1f} a {b.throughput:.1f} token/s."
    if not (a.velocita_slot and b.velocita_slot):
        senza = a if not a.velocita_slot else b
        return (f"A {senza.nome(asse)} la velocità nel proprio slot è n/d: il server non la dà per una "
                f"risposta di un token. {throughput}")
    return (f"Da {a.nome(asse)} a {b.nome(asse)} la velocità nel proprio slot è passata "
            f"da {a.velocita_slot:.1f} a {b.velocita_slot:.1f} t/s (da {1000 / a.velocita_slot:.1f} a "
            f"{1000 / b.velocita_slot:.1f} ms per token). {throughput}")


def riga_little(prova: Prova) -> Optional[str]:
    """L = λ × W; client against server (--metrics): "coincidono" only within one request."""
    import bisect

    e, s = prova.esecuzione, prova.riepilogo
    inizi, fini = sorted(r.inizio for r in e.risultati), sorted(r.fine for r in e.risultati)
    letture = [c for c in e.campioni if c.occupati is not None and c.in_coda is not None and inizi and
               inizi[0] <= c.t <= fini[-1]]
    coppie = [(bisect.bisect_right(inizi, c.t) - bisect.bisect_right(fini, c.t), c.occupati + c.in_coda)
              for c in letture]  # (in flight for the client, held by the server) at each reading
    if len(coppie) < 2 or not s.n_riuscite or not s.tempo_totale or s.latenza_media is None:
        return None
    al_secondo = s.n_riuscite / s.tempo_totale
    client, server = (media(v) for v in zip(*coppie))
    scarti = [c - v for c, v in coppie]
    differenza, mezzo = media(scarti), ic95(scarti)
    riga = (f"Legge di Little (L = λ × W): in volo {al_secondo * s.latenza_media:.2f} ({al_secondo:.2f} completate/s × "
            f"{s.latenza_media:.2f} s). Alle stesse {len(coppie)} letture in volo {client:.2f} per il client, {server:.2f} "
            "per il server (slot occupati + requests_deferred). ")
    fase = letture_in_fase(prova, [c.t for c in letture], inizi)
    if fase is not None:
        ritardo, periodo = fase
        return riga + (f"Non si confrontano: le letture (ogni {prova.piano.intervallo:g} s) cadono tutte a {ritardo:.2f} s "
                       f"dall'ultimo invio (arrivi costanti, uno ogni {periodo:.2f} s). Con --intervallo "
                       f"{round(0.74 * prova.piano.intervallo, 2):g} non sarebbero in fase")
    if len(coppie) < 3:  # the noise is not measured: nothing to conclude, nothing said
        return None
    quanto = f"{differenza:+.2f} ±{mezzo:.2f} al 95% su {len(coppie)} letture"
    if abs(differenza) > mezzo and abs(differenza) >= 0.1:
        if differenza > 0:
            return riga + (f"{differenza:.2f} in media erano inviate ma non ancora nel server ({quanto}): in viaggio, "
                           "in lettura o in attesa di una connessione")
        return riga + (f"Il server ne contava {quanto[1:]} in più: di un altro client, di una prova interrotta o lasciate "
                       "per --timeout")
    if abs(differenza) + mezzo < 1:
        return riga + f"Coincidono, entro il rumore delle letture ({quanto}: meno di una richiesta)"
    return None  # within the noise, and not within one request: nothing to conclude


def letture_in_fase(prova: Prova, tempi: List[float], inizi: List[float]) -> Optional[Tuple[float, float]]:
    """Phase-locked to --arrivi costanti: their phases' mean resultant length (1 alike, ~1/√n
    spread) over 0.8. (Their mean delay after the last send, the period), or None."""
    import bisect
    import cmath

    piano_oltre = oltre(prova.piano)
    tempi = [t for t in tempi if inizi[0] <= t <= inizi[-1]]  # while sending: after, nothing to lock to
    if not piano_oltre.ritmo or piano_oltre.arrivi != "costanti" or len(tempi) < 3:
        return None
    periodo = 1 / piano_oltre.ritmo
    if abs(media([cmath.exp(2j * cmath.pi * (t - inizi[0]) / periodo) for t in tempi])) < 0.8:
        return None
    return media([t - inizi[bisect.bisect_right(inizi, t) - 1] for t in tempi]), periodo


# --capacita: the highest rate the server holds within the objective ############################
# The rate doubles until a point fails (under --capacita% within --slo, or an overload: a longer run
# would fail), then is bisected within 20%. Uncertain, and said, under 20 requests or a margin under
# twice the noise of a share of that many.

PASSO_CAPACITA, MAX_PUNTI_CAPACITA, MIN_RICHIESTE_CAPACITA = 1.2, 12, 20


class Capacita:

    def __init__(self, sessione: SessioneOltre, client: Client, info: InfoServer,
                 configurazione: Optional[Configurazione]):
        self.sessione, self.oltre = sessione, sessione.oltre
        self.client, self.info, self.configurazione = client, info, configurazione
        self.punti: List[Tuple[float, List[Prova], bool]] = []  # (rate, its runs, held)
        self.etichetta = configurazione and configurazione.etichetta  # None: the server at --url

    def prove(self, ritmo: Optional[float] = None) -> List[Prova]:  # every point's runs, or one rate's
        return [p for r, prove, _ in self.punti if ritmo in (None, r) for p in prove]

    def cerca(self) -> None:
        o, base = self.oltre, self.sessione.piani[0]
        ritmo, tiene, cade = base.oltre.ritmo, None, None
        while len(self.punti) < MAX_PUNTI_CAPACITA:
            print(f"capacità, punto {len(self.punti) + 1}: ritmo={ritmo:.3g} req/s", flush=True)
            piano = base._replace(oltre=base.oltre._replace(ritmo=ritmo))
            prove = self.sessione.ripetute(self.client, self.info, piano, self.configurazione)
            regge = quota_slo(prove, o.slo) >= o.capacita / 100 and not any(map(sovraccarico, prove))
            self.punti.append((ritmo, prove, regge))
            tiene, cade = (ritmo, cade) if regge else (tiene, ritmo)
            if cade is None:
                ritmo *= 2
            elif tiene is None:
                if ritmo / 2 * base.oltre.durata < 2:  # under two requests a point
                    break
                ritmo /= 2
            elif cade / tiene <= PASSO_CAPACITA:
                break
            else:
                ritmo = float(f"{(tiene * cade) ** 0.5:.3g}")  # the middle, on the scale the rates grow on
        righe = self.righe(tiene, cade)
        print("\n".join(righe + [""]), flush=True)
        self.sessione.capacita.append({
            "np": self.etichetta, "risposta": righe[0],
            "regge_req_s": tiene, "cade_req_s": cade, "quota_chiesta": o.capacita / 100,
            "slo": o.slo, "incerta": next((r for r in righe if r.startswith("incerta")), None),
            "punti": [{"ritmo": r, "quota_slo": quota_slo(prove, o.slo), "sovraccarico": any(map(sovraccarico, prove)),
                       "regge": regge} for r, prove, regge in self.punti]})

    def righe(self, tiene: Optional[float], cade: Optional[float]) -> List[str]:
        o = self.oltre
        durata = sum(p.riepilogo.tempo_totale or 0 for p in self.prove())
        tutte = [r for p in self.prove() for r in p.esecuzione.risultati]
        if tutte and not any(r.riuscita for r in tutte):
            risposta = "n/d: tutte le richieste sono fallite (vedi le righe req)"
        elif tiene is None:
            risposta = "nessun ritmo provato lo rispetta" + self.neanche_da_sola()
        elif cade is None:
            risposta = (f"almeno {tiene:.3g} req/s: nessun punto è caduto entro il limite di "
                        f"{MAX_PUNTI_CAPACITA} punti")
        else:
            inviate = Punto(self.prove(tiene)).inviate_davvero
            risposta = (f"{tiene:.3g} req/s (inviate davvero {fmt(inviate, '.2f')}). Fra {tiene:.3g}, che lo rispetta, "
                        f"e {cade:.3g}, che no")
            if cade / tiene > PASSO_CAPACITA:
                risposta += f": la precisione del 20% non è raggiunta in {MAX_PUNTI_CAPACITA} punti"
        server = f" (-np {self.etichetta})" if self.etichetta else ""
        ritmi = [r for r, _, _ in self.punti]
        righe = [f"capacità{server} sotto lo SLO ({scritti_slo(o.slo)}, per il {o.capacita:g}% delle richieste): {risposta}. "
                 f"Provati {quante(len(self.punti), 'punto', 'punti')} in {durata:.0f} s, da {min(ritmi):.3g} a "
                 f"{max(ritmi):.3g} req/s"]
        in_ordine = sorted(self.punti, key=lambda x: x[0])
        punti = [Punto(prove) for _, prove, _ in in_ordine]  # one a rate: each rate has its plan
        corpo = [[f"{ritmo:.3g}", fmt(punto.inviate_davvero, ".2f req/s"), str(richieste_di(prove)),
                  f"{quota_slo(prove, o.slo):.0%}", fmt(punto.throughput, ".1f token/s"),
                  fmt(punto.latenza_p90, ".2f s"), segno_sovraccarico(prove), "regge" if regge else "no"]
                 for (ritmo, prove, regge), punto in zip(in_ordine, punti)]
        righe += tabella_md(["ritmo", "inviate davvero", "richieste", "entro lo SLO", "throughput", "latenza p90",
                             "sovraccarico", "esito"], corpo)
        righe += self.incertezza(tiene)
        if o.grafico and len(punti) > 1:
            righe += [""] + curva(*serie(punti, ["ritmo"]), marche_per(sys.stdout), frasi=False)
        return righe

    def neanche_da_sola(self) -> str:
        for chiave, soglia in self.oltre.slo.items():
            valori = [v for p in self.prove() for v in valori_figure(p).get(CHIAVI_SLO[chiave], [])]
            if valori and min(valori) > soglia:
                return (f". Anche la richiesta più veloce misurata ha {CHIAVI_SLO[chiave]} {min(valori):.2f} s, oltre i "
                        f"{soglia:g} s dello SLO. Una richiesta da sola non è più veloce, quindi nessun ritmo può "
                        "rispettarlo: serve uno SLO più largo, o meno --token")
        return ""

    def incertezza(self, tiene: Optional[float]) -> List[str]:
        if tiene is None:
            return []
        prove = self.prove(tiene)
        n = richieste_di(prove)
        if n < MIN_RICHIESTE_CAPACITA:
            return [f"incerta: a {tiene:.3g} req/s solo {quante(n, 'richiesta', 'richieste')} (meno di "
                    f"{MIN_RICHIESTE_CAPACITA}): allunga --durata"]
        quota, obiettivo = quota_slo(prove, self.oltre.slo), self.oltre.capacita / 100
        rumore = 2 * (obiettivo * (1 - obiettivo) / n) ** 0.5
        if quota - obiettivo < rumore:
            return [f"incerta: a {tiene:.3g} req/s il {quota:.0%} entro lo SLO, contro il {obiettivo:.0%} chiesto: "
                    f"una differenza dentro il rumore di {n} richieste (±{rumore:.0%}). Con --ripeti o una --durata "
                    "più lunga si misura meglio"]
        return []


def segno_sovraccarico(prove: List[Prova]) -> str:
    visti = [v for v in map(sovraccarico, prove) if v]
    if visti:
        return "sì" if any(v.certo for v in visti) else "forse"
    return "no" if any(len(p.esecuzione.riuscite) >= MINIMO_SOVRACCARICO for p in prove) else ND


def richieste_di(prove: List[Prova]) -> int:
    return sum(len(p.esecuzione.risultati) for p in prove)


def quota_slo(prove: List[Prova], slo: Dict[str, float]) -> float:
    totale = richieste_di(prove)
    return sum(goodput(p, slo)[0] for p in prove) / totale if totale else 0.0


# The picture: --grafico (terminal) and --svg ###################################################

LARGHEZZA_TERMINALE = 80  # --grafico's and the capacity curve's columns
MARCHE_UNICODE = {"viaggio": "·", "coda": "░", "prompt": "▒", "generazione": "█", "errore": "×", "ignoto": "▬",
                  "media": "●", "p90": "+", "saturazione": "◆",  # these three: the capacity curve
                  "livelli": " ▁▂▃▄▅▆▇█", "ttft": "▴"}  # a slot's context, empty to full; the curve's first token
MARCHE_ASCII = {"viaggio": ",", "coda": ".", "prompt": "-", "generazione": "#", "errore": "x", "ignoto": "=",
                "media": "o", "p90": "+", "saturazione": "*", "livelli": " .:-=+*%@", "ttft": "^"}
LEGENDA = (("viaggio", "prima dello slot, con slot liberi"), ("coda", "in coda"), ("prompt", "prompt"), ("generazione", "generazione"),
           ("errore", "fallita"), ("ignoto", "dettagli n/d"))


def fasi(r: Risultato, attese: Dict[int, float]) -> List[Tuple[str, float, float]]:
    """(phase, start, end) by the server's times; the queue only with every slot busy, else the trip."""
    if not r.riuscita:
        return [("errore", r.inizio, r.fine)]
    slot = in_slot(r)
    if slot is None:
        return [("ignoto", r.inizio, r.fine)]
    fine_prompt = r.fine - r.predicted_ms / 1000
    coda_da = max(r.inizio, slot[0] - attese.get(r.indice, 0.0))
    tutte = [("viaggio", r.inizio, coda_da), ("coda", coda_da, slot[0]), ("prompt", slot[0], fine_prompt),
             ("generazione", fine_prompt, r.fine)]
    return [f for f in tutte if f[2] > f[1] or f[0] == "generazione"]


class Tratto(NamedTuple):
    """A piece of a lane: when, what (a phase, slot, contesto), how much (None: unknown), title."""
    da: float
    a: float
    tipo: str
    valore: Optional[int]
    titolo: str


def disegno(prova: Prova) -> Tuple[List[Tuple[str, List[Tratto]]], List[Tratto], Optional[str], list]:
    attese = attese_in_coda(prova)
    richieste = [(f"req {r.indice}", [Tratto(da, a, fase, None, f"{fase} {a - da:.3f} s")
                                      for fase, da, a in fasi(r, attese)]) for r in prova.esecuzione.risultati]
    return (richieste, *slot_nel_tempo(prova), corsie_contesto(prova))


def valore_fra(tratti: List[Tratto], da: float, a: float) -> Optional[int]:
    """The most a lane held between two times; None where nothing, or a 0 beside an unknown piece (a
    failed request in flight does not prove an idle slot)."""
    valori = [t.valore for t in tratti if t.da < a and da < t.a]
    n = max((v for v in valori if v is not None), default=None)
    return None if n == 0 and None in valori else n


def slot_nel_tempo(prova: Prova) -> Tuple[List[Tratto], Optional[str]]:
    e = prova.esecuzione
    intervalli = [i for i in map(in_slot, e.riuscite) if i]
    letti = [c for c in e.campioni if c.occupati is not None]
    istanti = sorted({0.0, fine_asse(e), float("inf")} | {c.t for c in e.campioni})
    if intervalli:  # the readings' times split the steps too, as intervals of no length
        tetto = prova.riepilogo.occupati_dai_tempi or len(intervalli)
        scalini = [(da, a, min(tetto, n)) for da, a, n, _ in gradini(intervalli, [(t, t) for t in istanti])]
        ignoti = [Tratto(r.inizio, r.fine, "slot", None, "") for r in e.risultati if not r.riuscita]
        fonte = "dai tempi del server"
    elif letti:
        ultima = lambda t: ([None] + [c.occupati for c in letti if c.t <= t])[-1]  # noqa: E731 (None: no reading yet)
        scalini = [(da, a, ultima(da)) for da, a in zip(istanti, istanti[1:])]
        ignoti, fonte = [], "/slots"
    else:
        return [], None
    tratti = [Tratto(da, a, "slot", n, f"{quante(n, 'slot occupato', 'slot occupati')} da {da:.2f} s") for da, a, n in scalini if n is not None]
    return tratti + ignoti, fonte


def marche_per(flusso) -> Dict[str, str]:
    codifica = getattr(flusso, "encoding", None) or "ascii"
    try:
        "".join(MARCHE_UNICODE.values()).encode(codifica)
        return MARCHE_UNICODE
    except (UnicodeEncodeError, LookupError):
        return MARCHE_ASCII


def fine_asse(e: Esecuzione) -> float:
    return max([r.fine for r in e.risultati] + [c.t for c in e.campioni] + [1e-9])


def fasi_viste(richieste: list, fine: float) -> set:
    return {t.tipo for _, tratti in richieste for t in tratti if t.tipo != "viaggio" or t.a - t.da >= fine / 80}


def grafico(prova: Prova, marche: Dict[str, str]) -> List[str]:
    e = prova.esecuzione
    etichetta = max(8, len(f"req {e.n_richieste - 1} "))
    colonne = LARGHEZZA_TERMINALE - etichetta
    fine = fine_asse(e)
    passo = fine / colonne
    richieste, slot, fonte, contesto = disegno(prova)

    def riga(nome: str, celle) -> str:
        return f"{nome:<{etichetta}}" + "".join(celle).rstrip()

    def valori(tratti: List[Tratto]) -> List[Optional[int]]:
        return [valore_fra(tratti, col * passo, (col + 1) * passo) for col in range(colonne)]
    righe = [f"{'':<{etichetta}}0 s{f'{fine:.2f} s':>{colonne - 3}}"]
    for nome, tratti in richieste:
        barra = [" "] * colonne
        for t in tratti:
            primo, ultimo = round(t.da / passo), min(colonne, round(t.a / passo))
            if t.tipo in ("generazione", "errore", "ignoto"):
                primo = min(primo, ultimo - 1)  # always visible, however short
            for col in range(max(primo, 0), ultimo):
                barra[col] = marche[t.tipo]
        righe.append(riga(nome, barra))
    viste = fasi_viste(richieste, fine)
    voci = [f"{marche[fase]} {nome}" for fase, nome in LEGENDA if fase in viste]
    if fonte:
        righe.append(riga("slot", [" " if n is None else str(n) if n < 10 else "+" for n in valori(slot)]))
        voci.append(f"cifre: slot occupati ({fonte})")
    tenuti = [valori(tratti) for nome, _, tratti in contesto if nome != "tutti"]
    tenuti.append([None if None in n else sum(n) for n in zip(*tenuti)])  # tutti: the rows above
    for (nome, n_ctx, _), celle in zip(contesto, tenuti):  # full: at n_ctx, or the shared buffer
        nome = "ctx tutti" if nome == "tutti" else nome
        righe.append(riga(nome, [" " if n is None else livello(n, n_ctx, marche) for n in celle]))
    if contesto:
        livelli = marche["livelli"]
        voce = f"{livelli[1]}..{livelli[8]} contesto dello slot fino a n_ctx {contesto[0][1]} (/slots)"
        voci.append(voce + "; tutti: la somma, fino al buffer condiviso" * (contesto[-1][0] == "tutti"))
    return righe + a_capo("legenda: ", voci, LARGHEZZA_TERMINALE)


def a_capo(prima: str, voci: List[str], larghezza: int) -> List[str]:
    righe = [prima + voci[0]] if voci else [prima]
    for voce in voci[1:]:
        if len(righe[-1]) + 2 + len(voce) <= larghezza:
            righe[-1] += "  " + voce
        else:
            righe.append(" " * len(prima) + voce)
    return righe


COLORI_SVG = {"viaggio": "#f2f2f2", "coda": "#d9d9d9", "prompt": "#f4a261", "generazione": "#2a9d8f", "errore": "#e63946",
              "ignoto": "#8d99ae", "slot": "#264653", "contesto": "#8ab17d"}
LARGHEZZA_SVG = 760
ASSE_SVG = (70, 740)  # px: where the time and throughput axes run; left of them, the lanes' names


def elemento(nome: str, testo: str = "", titolo: str = "", **attributi) -> str:
    """An SVG element: stroke_width is stroke-width, floats one decimal, text escaped."""
    import html

    dentro = html.escape(testo, quote=False)
    if titolo:
        dentro += f"<title>{html.escape(titolo, quote=False)}</title>"
    valori = {k: f"{v:.1f}" if isinstance(v, float) else v for k, v in attributi.items()}
    apertura = nome + "".join(f' {k.replace("_", "-")}="{v}"' for k, v in valori.items())
    return f"<{apertura}>{dentro}</{nome}>" if dentro else f"<{apertura}/>"


def scritta(x, y, testo: str, **attributi) -> str:
    return elemento("text", testo, x=x, y=y, **attributi)


def rettangolo(t: Tratto, scala: float, y, alto) -> str:
    return elemento("rect", titolo=t.titolo, x=ASSE_SVG[0] + t.da * scala, y=y, width=max(t.a - t.da, 0) * scala,
                    height=alto, fill=COLORI_SVG[t.tipo])


def barre(tratti: List[Tratto], pieno: int, scala: float, y: int, alto: int) -> List[str]:
    return [rettangolo(t, scala, y + alto - h, h)
            for t in tratti if t.valore for h in [alto * min(1.0, t.valore / pieno)]]


def svg(prove: List[Prova], curve: Optional[Tuple[str, Curve]] = None,
        chiavi: Sequence[str] = ()) -> str:
    sinistra, destra = ASSE_SVG
    pannelli, y = svg_curva(*curve, 10) if curve is not None else ([], 10)
    viste, fonti, riempiti = set(), set(), False  # phases, slots' sources, a context
    for prova in prove:
        fine = fine_asse(prova.esecuzione)
        scala = (destra - sinistra) / fine
        titolo = riga_server(prova.info) + (f"  (-np {etichetta_np(prova)})" if prova.configurazione else "")
        titolo += "".join(f"  {c}={valore_di(c, prova.piano, prova.configurazione)}" for c in chiavi if c != "np")
        pannelli.append(scritta(sinistra, y + 12, titolo, font_weight="bold"))
        y += 22
        richieste, slot, fonte, contesto = disegno(prova)
        viste |= fasi_viste(richieste, fine)
        for nome, tratti in richieste:
            pannelli.append(scritta(4, y + 13, nome))
            pannelli += [rettangolo(t, scala, y + 2, 14) for t in tratti]
            y += 18
        if fonte:
            fonti.add(fonte)
            slot = [t for t in slot if t.a <= fine]  # the terminal's last column may reach past the end
            massimo, alto = max([t.valore for t in slot if t.valore] + [1]), 40
            y += 4
            pannelli += [scritta(4, y + alto / 2, "slot"),
                         scritta(4, y + alto / 2 + 14, f"max {massimo}", font_size=10),
                         elemento("rect", x=sinistra, y=y, width=fine * scala, height=alto, fill="#f4f4f4")]
            pannelli += barre(slot, massimo, scala, y, alto)
            y += alto + 6
        for nome, n_ctx, tratti in contesto:  # under a dashed line at n_ctx
            pannelli.append(scritta(4, y + 13, nome))
            pannelli += barre(tratti, n_ctx, scala, y, 18)
            pannelli.append(elemento("line", titolo=f"n_ctx {n_ctx}", x1=sinistra, y1=y, x2=sinistra + fine * scala,
                                     y2=y, stroke="#e63946", stroke_dasharray="4 3"))
            y += 22
        riempiti = riempiti or bool(contesto)
        pannelli += [elemento("line", x1=sinistra, y1=y, x2=destra, y2=y, stroke="#333"),
                     scritta(sinistra, y + 14, "0 s"),
                     scritta(destra, y + 14, f"{fine:.2f} s", text_anchor="end")]
        y += 28
    x = sinistra
    voci = [(fase, nome) for fase, nome in LEGENDA if fase in viste]
    voci += [("slot", f"slot occupati ({' e '.join(sorted(fonti))})")] * bool(fonti)
    voci += [("contesto", "contesto per slot, fino alla linea di n_ctx (/slots)")] * riempiti
    for fase, nome in voci:
        if x > sinistra and x + 24 + 8 * len(nome) > LARGHEZZA_SVG:
            x, y = sinistra, y + 18
        pannelli += [elemento("rect", x=x, y=y, width=12, height=12, fill=COLORI_SVG[fase]),
                     scritta(x + 16, y + 11, nome)]
        x += 24 + 8 * len(nome)
    altezza = y + 24
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{LARGHEZZA_SVG}" height="{altezza}" '
            f'viewBox="0 0 {LARGHEZZA_SVG} {altezza}" font-family="monospace" font-size="12" shape-rendering="crispEdges">\n'
            f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(pannelli) + "\n</svg>\n")


# At the end of a session: the tables and the files ##############################################

def tabella_e_file(sessione: Sessione) -> None:
    """The files first: a reader gone at the table (| head) loses no file."""
    o, prove = sessione.opzioni.oltre, sessione.prove
    curve, chiavi, righe = None, chiavi_griglia(sessione), []
    punti = punti_di(prove)
    if chiavi and (variate(sessione.piani) or not (o.tabella or o.avvia)):
        curve = serie(punti, chiavi)
        righe = tabella_griglia(punti, chiavi, o.percentili)
    elif (o.tabella or o.avvia) and o.capacita is None:  # --capacita: its own table of the points tried
        righe = ([] if o.avvia or o.ripeti > 1 else [""]) + tabella_consegnato(prove, sessione.memorie)
    if righe:
        righe += rapporti_np(punti, chiavi) + riga_occupata(punti, chiavi) + nota_tagliate(prove) * sessione.in_breve
    if curve and o.grafico:
        righe += [""] + curva(*curve, marche_per(sys.stdout), frasi=not o.spiega)
    if curve and o.spiega:
        righe += [""] + spiegazione_griglia(*curve)

    file = [(o.file_json, lambda: testo_json(prove, sessione.piani, sessione.opzioni.url, o.slo, o.percentili or (),
                                             sessione.capacita)),
            (o.file_csv, lambda: testo_csv(prove)), (o.file_svg, lambda: svg(prove, curve, chiavi))]
    for percorso, testo in file:
        if percorso:
            try:
                scrivi_file(percorso, testo())
            except OSError as exc:
                print(f"carico.py: errore: non riesco a scrivere '{percorso}': {perche_os(exc)}",
                      file=sys.stderr)
                sessione.codice_errore = sessione.codice_errore or 1
    if righe:
        try:
            print("\n".join(righe), flush=True)
        except BrokenPipeError:  # the reader went away: the files are written, the exit says it
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sessione.arresto = sessione.arresto or 141


CAMPI_CSV = ("prova", "np", "parallele", "max_token", "ritmo", "indice", "token_prompt", "token_cache", "token",
             "latenza_s", "attesa_slot_s", "attesa_in_coda_s", "prompt_ms", "predicted_ms", "t_s_nel_slot",
             "primo_token_s", "tpot_s", "finish_reason", "errore", "inizio_s", "previsto_s", "ritardo_invio_s", "conversazione", "turno",
             "prompt_esatto", "interrotta", "interrotta_a_s", "tagliata_dal_contesto", "server")


def righe_dati(prova: Prova) -> List[dict]:
    in_coda = attese_in_coda(prova)
    return [riga_dati(r, in_coda, tagliata_dal_contesto(r, prova)) for r in prova.esecuzione.risultati]


def riga_dati(r: Risultato, in_coda: Dict[int, float], tagliata: bool = False) -> dict:
    letto = oltre(r)
    return {"indice": r.indice, "token_prompt": r.token_prompt, "token": r.token, "latenza_s": r.latenza,
            "attesa_slot_s": attesa_dello_slot(r), "attesa_in_coda_s": in_coda.get(r.indice),
            "prompt_ms": r.prompt_ms, "predicted_ms": r.predicted_ms,
            "t_s_nel_slot": r.tps, "primo_token_s": letto.primo_token, "finish_reason": r.finish_reason,
            "tagliata_dal_contesto": tagliata,
            "errore": r.errore, "inizio_s": r.inizio, "fine_s": r.fine, "previsto_s": letto.previsto,
            "ritardo_invio_s": None if letto.previsto is None else r.inizio - letto.previsto,
            "token_cache": r.token_cache, "tpot_s": tpot(r), "chunk_s": letto.chunk_s,
            "conversazione": letto.conversazione, "turno": letto.turno, "prompt_esatto": letto.prompt_esatto,
            "token_stimati": letto.token_stimati, "server": letto.server}


def dati_piano(piano: Piano) -> dict:
    """A plan as the files keep it, without the texts (the flags say where they came from)."""
    testi = dict(testo=None, testo_sistema=None, pezzi=None, dataset=None)
    dati = {**piano._asdict(), **oltre(piano)._replace(**testi)._asdict()}
    return {k: v for k, v in dati.items() if k != "oltre"}


def testo_csv(prove: List[Prova]) -> str:
    import csv
    import io

    uscita = io.StringIO()
    scrittore = csv.DictWriter(uscita, CAMPI_CSV, extrasaction="ignore", lineterminator="\n")
    scrittore.writeheader()
    for n, prova in enumerate(prove, 1):
        della_prova = {"prova": n, "np": etichetta_np(prova), "parallele": prova.piano.parallele,
                       "max_token": prova.piano.max_token, "ritmo": oltre(prova.piano).ritmo,
                       "interrotta": prova.esecuzione.interruzione is not None,
                       "interrotta_a_s": prova.esecuzione.interrotta_a}
        scrittore.writerows({**della_prova, **riga} for riga in righe_dati(prova))
    return uscita.getvalue()


def testo_json(prove: List[Prova], piani: List[Piano], url: str, slo: Optional[Dict[str, float]] = None,
               percentili: Sequence[int] = (), capacita: Sequence[dict] = ()) -> str:
    """Everything a plot needs, never the API key."""
    escluse = [id(p) for punto in punti_di(prove) for p, _ in punto.escluse]
    dati = {
        "carico": __version__, "url": url,
        "opzioni": dati_piano(piani[0]),
        "griglia": {v: sorted({valore_numerico(v, p) for p in piani}) for v in variate(piani)},
        "prompt_file": oltre(piani[0]).testo is not None,
        "prove": [{
            "np": p.configurazione and etichetta_np(p),  # None: the server at --url
            "piano": dati_piano(p.piano),
            "punto": {v: valore_numerico(v, p.piano) for v in variate(piani)},
            "latenza_p90_s": latenza_p90(p),
            "dettagli": dati_dettagli(p, slo, percentili),
            "vllm": riassunto_vllm(p, sorted({99, *percentili})),
            "invii": {"al_secondo": invii_al_secondo(p),
                      "ritardo_p99_s": percentile(ritardi_invio(p.esecuzione), 99),
                      "ritardo_max_s": max(ritardi_invio(p.esecuzione), default=None),
                      "trattenute_dal_tetto": oltre(p.esecuzione).trattenute,
                      "non_inviate_dal_tetto": oltre(p.esecuzione).non_inviate,
                      "non_inviate_in_ritardo": oltre(p.esecuzione).in_ritardo,
                      "inviate": p.esecuzione.n_richieste} if oltre(p.piano).al_tempo else None,
            "server": {"n_slot": p.info.n_slot, "n_ctx_slot": p.info.n_ctx_slot, "kv_unificata": kv_saputa(p),
                       "props": p.info.props},
            "macchina": p.macchina and p.macchina._asdict(),
            "macchina_dopo": p.macchina_dopo and p.macchina_dopo._asdict(),
            "esclusa_dalla_media": id(p) in escluse,  # see `anomale`
            "slot_occupati_prima": p.occupati_prima,
            "riepilogo": {**(insieme := riepilogo_oltre(p))._asdict(), "picco": insieme.picco,
                          "picco_coda": insieme.picco_coda,
                          "tagliate_dal_contesto": len(tagliate_dal_contesto(p))},
            "richieste": righe_dati(p),
            "campioni": [c._asdict() for c in p.esecuzione.campioni],
            "interrotta": p.esecuzione.interruzione is not None,
            "server_andato": p.esecuzione.server_andato and dict(zip(("t_s", "perche"), p.esecuzione.server_andato)) or next(
                (dict(t_s=d.andato[0], perche=d.andato[1], url=d.base) for d in oltre(p.esecuzione).server if d.andato),
                None),  # several servers: the first gone, the run went on
            "per_server": [{"url": d.base, "n_slot": d.info.n_slot, "n_ctx_slot": d.info.n_ctx_slot, "richieste": n,
                            "andato_s": d.andato and d.andato[0], **s._asdict(), "throughput": throughput,
                            "picco": s.picco, "picco_coda": s.picco_coda} for d, n, s, throughput in per_server(p)],
        } for p in prove],
    }
    if capacita:
        dati["capacita"] = list(capacita)
    if len(prove) == 1:  # vLLM's names at the top too, where a script for vLLM looks
        dati.update(riassunto_vllm(prove[0], sorted({99, *percentili})))
    return json.dumps(dati, indent=2, ensure_ascii=False) + "\n"


def scrivi_file(percorso: str, testo: str) -> None:
    """All or nothing (a temporary file renamed), the mode a shell redirect would give."""
    import tempfile

    try:
        modo = os.stat(percorso).st_mode & 0o777
    except OSError:
        maschera = os.umask(0)
        os.umask(maschera)
        modo = 0o666 & ~maschera
    fd, provvisorio = tempfile.mkstemp(prefix=".carico-", dir=os.path.dirname(os.path.abspath(percorso)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(testo)
        os.chmod(provvisorio, modo)
        os.replace(provvisorio, percorso)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(provvisorio)
        raise


# --spiega: the run read out for a student ######################################################

def descrivi_macchina(m: Macchina, dopo: Optional[Macchina] = None) -> str:
    parti = [f"{m.core} core"]
    if m.carico_medio is not None:
        parti.append(f"carico medio {m.carico_medio:.1f}")
    if m.cpu_occupata is not None:
        parti.append(f"CPU occupata al {m.cpu_occupata:.0%} prima della prova" + (
            f", al {dopo.cpu_occupata:.0%} subito dopo" if dopo and dopo.cpu_occupata is not None else ""))
    return ", ".join(parti)


def spiegazione(prova: Prova) -> List[str]:
    e, s, info, piano = prova.esecuzione, riepilogo_oltre(prova), prova.info, prova.piano
    ok, non_inviate, tagliata = e.riuscite, oltre(e).non_inviate, e.server_andato or e.interruzione
    if not ok:
        primo = e.risultati[0].errore if e.risultati else "interrotta"
        fallite = (f"L'unica richiesta non è andata a buon fine ({primo})" if e.n_richieste == 1 else
                   f"Nessuna delle {e.n_richieste} richieste è andata a buon fine (la prima: {primo})")
        return [f"{fallite}: non ci sono cifre da leggere."] + frase_contesto_stretto(prova)
    frasi = []
    if info.n_slot is not None and s.picco is not None:
        insieme = min(piano.parallele, e.n_richieste)
        if e.n_richieste == 1:
            partite = "È partita una sola richiesta"
        elif oltre(piano).ritmo:
            partite = (f"Sono partite {e.n_richieste} richieste, "
                       f"{fmt(invii_al_secondo(prova), '.2f')} al secondo,")
        elif insieme < e.n_richieste:  # a new one as one ends
            partite = f"Le richieste sono partite {'una' if insieme == 1 else insieme} alla volta (--parallele {insieme})"
        else:
            partite = f"Sono partite {insieme} richieste insieme"
        frasi.append(f"{partite} su {info.n_slot} slot: al massimo "
                     f"{quante(s.picco, 'servita', 'servite')} nello stesso momento.")
    server = oltre(e).server
    for d in (d for d in server if d.andato and not e.server_andato):  # one of several: the run went on
        rimasti = [x.info.n_slot for x in server if not x.andato or x.andato[0] > d.andato[0]]
        altri = "all'altro server" if len(rimasti) == 1 else "agli altri server"
        frasi.append(f"{d.base} non rispondeva più a {d.andato[0]:.2f} s: da lì le richieste sono andate {altri}, "
                     f"{fmt(None if None in rimasti else sum(rimasti), 'd')} slot in tutto.")
    if None not in (s.occupati_dai_tempi, s.occupati_letti) and s.occupati_dai_tempi > s.occupati_letti:
        frasi.append(f"Il picco di {s.occupati_dai_tempi} viene dai tempi del server: /slots (letto ogni "
                     f"{piano.intervallo:g} s) ne ha visti {s.occupati_letti}.")
    attese = {r.indice: a for r in ok if (a := attesa_dello_slot(r)) is not None}
    tetto = attese_del_tetto(prova)
    if attese:
        in_coda = attese_in_coda(prova)
        aspettato = [r for r in ok if in_coda.get(r.indice, 0.0) > 0]
        if prova.occupati_prima:  # its timings miss the others' work
            lenta = max(attese, key=attese.get)
            latenza = next(r.latenza for r in ok if r.indice == lenta)
            frasi.append(f"Il server aveva già altre richieste prima della prova, invisibili nei suoi tempi. Dall'invio "
                         f"allo slot la più lenta, la req {lenta}, ha aspettato {attese[lenta]:.2f} s su "
                         f"{latenza:.2f} s di latenza ({attese[lenta] / latenza:.0%}).")
        elif aspettato:
            r = max(aspettato, key=lambda q: in_coda[q.indice])
            frasi.append(f"{quante(len(aspettato), 'richiesta', 'richieste')} su {len(ok)} "
                         f"{'ha' if len(aspettato) == 1 else 'hanno'} aspettato in coda uno slot libero. La più "
                         f"sfortunata, la req {r.indice}: {in_coda[r.indice]:.2f} s in coda su {r.latenza:.2f} s di "
                         f"latenza ({in_coda[r.indice] / r.latenza:.0%}).")
        elif not (tetto or non_inviate or tagliata):
            massima = max(attese.values())
            perche = "il viaggio" if massima < VIAGGIO_MAX else "il server finiva un passo per gli altri slot"
            frasi.append(f"Nessuna richiesta ha aspettato uno slot: dall'invio al più {massima:.2f} s ({perche}).")
    if non_inviate and not tetto:  # the cap full to the end: how many and why, once (note_ritmo)
        frasi.append("Il server ha visto meno carico di quello chiesto: vedi la nota su stderr.")
    if tetto:
        peggiore = max(tetto, key=tetto.get)
        frasi.append(f"{quante(len(tetto), 'richiesta', 'richieste')} su {len(ok)} {'ha' if len(tetto) == 1 else 'hanno'} "
                     f"aspettato nel client un posto (tetto di --parallele: {piano.parallele} in volo). La req "
                     f"{peggiore} è partita {tetto[peggiore]:.2f} s dopo l'orario previsto. "
                     f"Contando quell'attesa, la latenza dal previsto ha p50 "
                     f"{percentile([latenza_dal_previsto(r) for r in ok], 50):.2f} s.")
    if s.occupati_dai_tempi is None and s.occupati_letti is None and (deduzione := una_alla_volta(ok)):
        frasi.append(deduzione)
    velocita, media_slot = [r.tps for r in ok if r.tps is not None], velocita_media_slot(ok)
    if velocita and media_slot and s.throughput is not None:
        lenta, veloce = f"{min(velocita):.1f}", f"{max(velocita):.1f}"
        gamma = f", {lenta}-{veloce}" if lenta != veloce else ""
        frasi.append(f"Insieme {s.throughput:.1f} token/s: {volte(s.throughput / media_slot)} volte uno slot "
                     f"({media_slot:.1f} t/s in media{gamma}).")
    if info.n_ctx_slot is not None:
        frasi.append({True: f"I {info.n_slot} slot condividevano {info.n_ctx_slot} token di contesto (--kv-unified).",
                      False: f"Ogni slot aveva {info.n_ctx_slot} token di contesto.",
                      None: f"Ogni slot: {info.n_ctx_slot} token di contesto, suoi o condivisi da tutti con "
                            "--kv-unified (da qui non si vede)."
                      }[kv_saputa(prova)])
        if r := piu_lunga(ok):
            frasi.append(f"La richiesta più lunga: {r.token_prompt} + {r.token} = {r.token_prompt + r.token} token di "
                         f"{info.n_ctx_slot}. Un prompt che non ci sta è rifiutato (HTTP 400), una risposta tagliata.")
    if frase := frase_corte(prova, oltre(piano).esatti):  # the cut: the block says them
        frasi.append(maiuscola(frase) + ".")
    # never "al massimo 0 richieste"; not again when the timings said it
    if s.picco_coda == 0 and info.metrics_disponibile and not attese:
        frasi.append("Nessuna richiesta ha aspettato uno slot: le letture di requests_deferred in /metrics hanno "
                     "sempre trovato la coda vuota.")
    elif s.picco_coda and info.metrics_disponibile:
        frasi.append(f"Al massimo {quante(s.picco_coda, 'richiesta ha', 'richieste hanno')} aspettato uno slot nello "
                     "stesso momento" + (f". Le letture di requests_deferred in /metrics ne hanno viste al massimo "
                                         f"{s.coda_letta}: nessuna è caduta nel momento peggiore."
                                         if (s.coda_letta or 0) < s.picco_coda else " (requests_deferred)."))
    if tagliata:
        perche = (f"il server ha smesso di rispondere a {e.server_andato[0]:.2f} s" if e.server_andato else
                  "è stata interrotta" + (f" a {e.interrotta_a:.2f} s" if e.interrotta_a is not None else ""))
        frasi.append(f"La prova si è fermata prima della fine ({perche}). Le richieste senza risposta non sono in "
                     "nessuna cifra: il throughput è un limite inferiore. Sovraccarico e legge di Little non si giudicano.")
    else:
        if visto := sovraccarico(prova):
            frasi.append(maiuscola(frase_sovraccarico(visto)))
        if little := riga_little(prova):
            frasi.append(little + ".")
    if lettore := dati_lettore(prova):
        frasi.append(f"Il lettore dei flussi di carico: {frase_lettore(lettore)}. {maiuscola(spostate(lettore))}" + (
            ": oltre 1 ms e il 5% della cifra, vedi la nota." if lettore["oltre_la_soglia"] else "."))
    m, dopo = prova.macchina, prova.macchina_dopo
    motivo, occupata_dopo = m and macchina_occupata(m), dopo and macchina_occupata(dopo)
    quieta_dopo = None if occupata_dopo else dopo
    if m is not None and not motivo:
        if m.cpu_occupata is not None and m.cpu_occupata >= LIBERA:
            frasi.append(f"CPU al {m.cpu_occupata:.0%} prima della prova ({m.core} core): né libera né occupata; se le "
                         "cifre sembrano strane, ripeti.")
        elif m.carico_medio is not None and round(m.carico_medio, 1) >= 0.75 * m.core:  # as printed: 1.49 is "1.5"
            frasi.append(f"La CPU era libera appena prima della prova ({descrivi_macchina(m, quieta_dopo)}). Il carico "
                         "medio, più alto, conta anche il minuto prima.")
        else:
            frasi.append(f"La macchina era tranquilla prima della prova ({descrivi_macchina(m, quieta_dopo)}).")
    if motivo or occupata_dopo:  # the note on stderr says why, once
        frasi.append(f"Macchina occupata {'prima della' if motivo else 'subito dopo la'} prova: vedi la nota su stderr.")
    return frasi


def frase_contesto_stretto(prova: Prova) -> List[str]:
    """The lab's step 4 read out."""
    import re

    letti = [m for r in prova.esecuzione.risultati if (m := re.search(
        r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)", r.errore or ""))]
    if not letti:
        return []
    chiesti, contesto = max(int(m.group(1)) for m in letti), int(letti[0].group(2))
    frase = (f"La richiesta chiedeva {chiesti} token di contesto (prompt e template della chat), lo slot ne "
             f"aveva {contesto}: il server la rifiuta prima di generare (HTTP 400). Senza --kv-unified ogni slot ha -c "
             f"diviso -np token. Con meno slot (-np 1), o con --kv-unified dove ogni slot vede tutto -c, la stessa "
             f"richiesta ci sta, se -c basta.")
    insieme, slot = min(prova.piano.parallele, prova.piano.richieste or 1), prova.info.n_slot or 1
    if insieme > 1 and slot > 1 and insieme * chiesti > contesto * slot:  # -c is the slots' contexts together
        quante_insieme = max(1, contesto * slot // chiesti)
        frase += (f" Ma con --kv-unified le {insieme} richieste in volo insieme si dividono tutto -c (qui {contesto * slot} "
                  f"token) e ne chiedono {insieme} × {chiesti}. llama.cpp le rifiuta tutte (HTTP 500, context size "
                  "exceeded): " + ("ne sta una alla volta (--parallele 1)" if quante_insieme == 1 else
                                   f"ne stanno {quante_insieme} insieme (--parallele {quante_insieme})")
                  + ", se resta posto per le risposte.")
    return [frase]


VIAGGIO_MAX = 0.1  # s from the send to a free slot that are the trip (HTTP, parsing); longer: a busy server


def una_alla_volta(ok: List[Risultato]) -> Optional[str]:
    ordinate = sorted(ok, key=lambda r: r.fine)
    coppie = [(a, b) for a, b in zip(ordinate, ordinate[1:]) if b.inizio < a.fine]  # b was in flight while a was
    if len(ordinate) < 3 or len(coppie) < 2:
        return None
    piu_veloce = min(r.latenza for r in ordinate)
    if piu_veloce <= 0 or min(b.fine - a.fine for a, b in coppie) < 0.5 * piu_veloce:
        return None
    distacchi = [b.fine - a.fine for a, b in zip(ordinate, ordinate[1:])]
    distacco = (f"circa {media(distacchi):.2f} s" if max(distacchi) <= 1.5 * min(distacchi) else  # alike: their mean
                f"da {min(distacchi):.2f} a {max(distacchi):.2f} s")
    latenze = ", ".join(f"{r.latenza:.2f}" for r in ordinate[:6]) + (", ..." if len(ordinate) > 6 else "")
    return (f"Dal lato del client (il server non dà né /slots né i suoi tempi): le richieste erano in volo insieme, "
            f"ma le risposte sono arrivate una dopo l'altra. Distavano {distacco} l'una dall'altra (latenze "
            f"{latenze} s): ognuna è la precedente più il tempo di servirne una. Il server le ha dunque servite una "
            "alla volta, le altre in coda: è una deduzione dalle latenze, non una misura del server.")


def piu_lunga(riuscite: List[Risultato]) -> Optional[Risultato]:
    """The one that held the most context (one request's: the two maxima may not add up)."""
    misurate = [r for r in riuscite if r.token_prompt is not None and r.token is not None]
    return max(misurate, key=lambda r: r.token_prompt + r.token, default=None)


def velocita_media_slot(riuscite: List[Risultato]) -> Optional[float]:
    """Weighted by generation time: short answers do not pull it up."""
    pesate = [(r.tps, r.predicted_ms / 1000) for r in riuscite if r.tps is not None and r.predicted_ms]
    return sum(v * secondi for v, secondi in pesate) / sum(secondi for _, secondi in pesate) if pesate else None


def volte(rapporto: float) -> str:
    """A ratio for 'N volte': never '0.0 volte' (a slow --ritmo leaves slots idle)."""
    return f"{rapporto:.1f}" if rapporto >= 0.1 else f"{rapporto:.2f}" if rapporto >= 0.01 else "meno di 0.01"


def maiuscola(frase: str) -> str:
    return frase[:1].upper() + frase[1:]


# Several servers: --url A,B (or --url A --url B) ################################################
# The lab's run sees them as one client (Gruppo): its /slots is every server's slots, its queue their sum,
# and each request goes to one server, chosen as it leaves (--smista). Each server's own figures: DelServer.

SMISTA = {"turno": "a turno", "liberi": "al server con più slot liberi"}  # --smista's choices


class DelServer(NamedTuple):
    """One server of several, in one run."""
    base: str
    info: InfoServer
    campioni: List[Campione]  # its own /slots and /metrics readings, at the run's readings
    andato: Optional[Tuple[float, str]] = None  # it stopped answering: when (s from the start), why
    inviate: int = 0  # the requests sent to it, answered or not (Ctrl+C)


class Gruppo:
    """Several servers as one client of the lab's run: each request to one of them, every /slots read at once."""

    def __init__(self, client: List[Client], info: List[InfoServer], smista: str = "turno"):
        self.client, self.info, self.smista = client, info, smista
        self.base, self.con_chiave = ", ".join(c.base for c in client), any(c.con_chiave for c in client)
        self.timeout_info, self.oltre = min(c.timeout_info for c in client), None
        self.sentinella, self.annullato = SentinellaGruppo(client), threading.Event()
        self._lock, self._giro = threading.Lock(), itertools.count()
        self.in_volo = [0] * len(client)  # carico's own requests at each server now
        self.altri = [0] * len(client)  # busy slots its latest /slots reading saw beyond carico's requests then
        self.nuova_prova()

    def nuova_prova(self) -> None:
        self.campioni: List[List[Campione]] = [[] for _ in self.client]
        self.inviate = [0] * len(self.client)
        self._letti = {"/slots": [None] * len(self.client), "/metrics": [None] * len(self.client)}

    def annulla(self) -> None:
        self.annullato.set()
        for client in self.client:
            client.annulla()

    def scegli(self) -> int:
        """The next request's server, among those still there: in turn, or the one with the most free slots
        counted from carico's own requests in flight (a reading 0.5 s old would send a burst to one), plus the
        slots its latest /slots reading saw busy beyond them (another client's); ties in turn."""
        with self._lock:
            vivi = [k for k, c in enumerate(self.client) if not c.annullato.is_set()] or [0]
            giro = next(self._giro) % len(vivi)
            k = vivi[giro] if self.smista == "turno" else max(vivi[giro:] + vivi[:giro], key=lambda k: (
                self.info[k].n_slot or 1) - self.in_volo[k] - self.altri[k])
            self.in_volo[k] += 1
            self.inviate[k] += 1
        return k

    def invia(self, indice: int, domanda: dict, timeout: float, t0: float) -> Risultato:
        if self.annullato.is_set():  # set before any server's: a worker the stop freed sends nothing more
            adesso = time.perf_counter() - t0
            return Risultato(indice, adesso, adesso, errore=NON_INVIATA)
        k = self.scegli()
        r = invia_oltre(self.client[k], indice, domanda, timeout, t0)  # never raises
        with self._lock:
            self.in_volo[k] -= 1
            self.inviate[k] -= r.errore == NON_INVIATA  # stopped as it left
        return r._replace(oltre=oltre(r)._replace(server=k))

    def chiama(self, metodo: str, percorso: str, dati=None, timeout: Optional[float] = None) -> Risposta:
        """GET /slots, /metrics, /health of every server still there, as one answer (one failing: status 0,
        a gap); any other path: the first server's."""
        if percorso not in ("/slots", "/metrics", "/health"):
            return self.client[0].chiama(metodo, percorso, dati, timeout)
        letti, status = self._letti.get(percorso, [None] * len(self.client)), 200
        for k, client in enumerate(self.client):
            if client.annullato.is_set():  # gone: no slots, no queue
                letti[k] = None
                continue
            miei = self.in_volo[k]
            try:
                risposta = client.chiama(metodo, percorso, dati, timeout)
            except ErroreRete:
                risposta = Risposta(0, b"")
            status = risposta.status if status == 200 else status
            leggi = leggi_json if percorso == "/slots" else richieste_in_coda
            letti[k] = leggi(risposta.corpo) if risposta.status == 200 else None
            if percorso == "/slots" and conta_occupati(letti[k]) is not None:
                self.altri[k] = max(0, conta_occupati(letti[k]) - max(miei, self.in_volo[k]))  # sent meanwhile: carico's
        if percorso == "/metrics":
            in_coda = [v for v, c in zip(letti, self.client) if not c.annullato.is_set()]
            corpo = f"llamacpp:requests_deferred {sum(in_coda)}" if None not in in_coda else ""
        else:
            corpo = json.dumps([s for v in letti for s in lista_slot(v) or []])
        return Risposta(status, corpo.encode())

    def registra(self, campione: Campione) -> None:
        """The sampler's reading just made, each server's share (Osservatore's hook calls it)."""
        for k, (slots, in_coda) in enumerate(zip(*self._letti.values())):
            self.campioni[k].append(Campione(campione.t, conta_occupati(slots), in_coda))

    def della_prova(self, t0: float) -> tuple:
        andati = [c.sentinella.andato for c in self.client]
        return tuple(DelServer(c.base, i, campioni, a and (a[0] - t0, a[1]), n) for c, i, campioni, a, n
                     in zip(self.client, self.info, self.campioni, andati, self.inviate))


class SentinellaGruppo:
    """The run stops only when every server has gone away."""
    di_fila = 0

    def __init__(self, client: List[Client]):
        self._client = client

    def arma(self, armata: bool = True) -> None:
        for client in self._client:
            client.sentinella.arma(armata)

    @property
    def andato(self) -> Optional[Tuple[float, str]]:
        andati = [c.sentinella.andato for c in self._client]
        return max(andati) if all(andati) else None


def indirizzi_di(url: str) -> set:
    """Where url's host:port leads (localhost, 127.0.0.1, 0.0.0.0 and ::ffff:127.0.0.1 alike); only url itself if its
    host is not found."""
    import ipaddress

    def dove(indirizzo: str):
        ip = ipaddress.ip_address(indirizzo.split("%")[0])
        ip = getattr(ip, "ipv4_mapped", None) or ip
        return ipaddress.ip_address("::1" if ip.version == 6 else "127.0.0.1") if ip.is_unspecified else ip
    parti = urllib.parse.urlsplit(url)
    porta = parti.port or (443 if parti.scheme == "https" else 80)
    try:
        return {f"{dove(a[4][0])}:{porta}" for a in socket.getaddrinfo(parti.hostname, porta, type=socket.SOCK_STREAM)}
    except (OSError, UnicodeError, ValueError):
        return {url}


def info_del_gruppo(info: List[InfoServer]) -> InfoServer:
    """The servers' slots together; n_ctx per slot where they agree; never one KV buffer for all (each copy of
    --kv-unified shares its own among its slots: n/d, not a sentence about one buffer)."""
    def comune(valori):
        return valori[0] if len(set(valori)) == 1 else None
    return InfoServer(None if None in (i.n_slot for i in info) else sum(i.n_slot for i in info),
                      comune([i.n_ctx_slot for i in info]), all(i.slots_disponibile for i in info),
                      all(i.metrics_disponibile for i in info), kv_unificata=comune([i.kv_unificata for i in info]) and None,
                      llama_cpp=comune([i.llama_cpp for i in info]))


def righe_del_gruppo(gruppo: Gruppo) -> List[str]:
    """After `server:`, each server's slots, and how the requests are spread."""
    return [f"  {c.base}: {fmt(i.n_slot, 'd')} slot, n_ctx per slot = {fmt(i.n_ctx_slot, 'd')}"
            for c, i in zip(gruppo.client, gruppo.info)] + [f"  richieste {SMISTA[gruppo.smista]} (--smista "
                                                            f"{gruppo.smista})"]


def per_server(prova: Prova) -> List[Tuple[DelServer, int, Riepilogo, Optional[float]]]:
    """Each server's share of the run: its requests, their summary as the lab's, its throughput (its tokens over
    the run's total time: the servers' add up to the run's)."""
    e, parti = prova.esecuzione, []
    for k, d in enumerate(oltre(e).server):
        sue = [r for r in e.risultati if oltre(r).server == k]
        n = max(len(sue), d.inviate)  # with Ctrl+C, some never answered
        s = riassumi(Esecuzione(sue, d.campioni, n), d.info.n_slot)
        parti.append((d, n, s, None if s.token is None or not e.risultati else s.token / max(
            r.fine for r in e.risultati)))
    return parti


def attese_in_coda(prova: Prova) -> Dict[int, float]:
    """Each request's wait while every slot of its server was busy (several servers: each its own)."""
    ok, server = prova.esecuzione.riuscite, oltre(prova.esecuzione).server
    return {i: a for k, n_slot in enumerate([d.info.n_slot for d in server] if server else [prova.info.n_slot])
            for i, a in attese_a_slot_pieni([r for r in ok if not server or oltre(r).server == k], n_slot).items()}


def coda_del_gruppo(prova: Prova) -> int:
    """The most requests the timings prove waiting together: each waits for a slot of ITS server, so each server's
    queue (while all its slots were busy) is summed at each instant, never the run's over all the slots."""
    e, eventi = prova.esecuzione, []
    for k, d in enumerate(oltre(e).server):
        for da, a, n, coda in gradini_dai_tempi([r for r in e.riuscite if oltre(r).server == k]):
            if coda and (d.info.n_slot is None or n >= d.info.n_slot):
                eventi += [(da, coda), (a, -coda)]
    return max(itertools.accumulate(passo for _, passo in sorted(eventi)), default=0)


def righe_per_server(prova: Prova) -> List[str]:
    righe, parti = [], per_server(prova)
    for d, n, s, throughput in parti:
        andato = f"; non rispondeva più a {d.andato[0]:.2f} s" if d.andato else ""
        coda = f", coda {fmt(s.picco_coda, 'd')}" if d.info.metrics_disponibile else ""
        mancano = "".join(f", {quante(k, una, molte)}" for k, una, molte in ((s.n_fallite, "fallita", "fallite"), (
            s.non_completate, "non completata", "non completate")) if k)  # non completate: Ctrl+C
        inviate = f"  {d.base}: {quante(n, 'richiesta', 'richieste')} ({quante(s.n_riuscite, 'riuscita', 'riuscite')}"
        righe.append(inviate + mancano + ")" + andato if not s.n_riuscite else f"{inviate}{mancano}), picco "
                     f"{fmt(s.picco, 'd')}/{fmt(d.info.n_slot, 'd')} slot{coda}, latenza media {fmt(s.latenza_media, '.2f s')}"
                     f", max {fmt(s.latenza_max, '.2f s')}, quota del throughput {fmt(throughput, '.2f token/s')}{andato}")
    ferme = prova.esecuzione.n_richieste - sum(n for _, n, _, _ in parti)  # Ctrl+C before they left
    altre = {0: "", 1: " (l'altra non è partita)"}.get(ferme, f" (le altre {ferme} non sono partite)")
    return [f"per server{altre}:"] + righe if righe else []


def picco_in_un_server(punto: Punto) -> Optional[int]:
    """The most slots busy together on one server: batching is within a server, never across copies."""
    picchi = [s.picco for p in punto.intere for _, _, s, _ in per_server(p)] or [p.riepilogo.picco for p in punto.intere]
    return max((v for v in picchi if v is not None), default=None)


def righe_repliche(prove: List[Prova], memorie: Dict[Configurazione, Memoria]) -> List[str]:
    """--spiega after --repliche: copies against slots at the same total, figure by figure, with its certainty."""
    tutti = [p for p in punti_di(prove) if p.prove[0].configurazione is not None and p.misurato]
    punti, interrotti = [p for p in tutti if p.completo], [p.prove[0].configurazione.descrizione for p in tutti
                                                             if not p.completo]  # a lower bound: never compared
    fuori = f"interrotta con {', '.join(interrotti)}, una cifra che è solo un limite inferiore"
    if len({p.prove[0].configurazione.repliche for p in punti}) < 2:
        return [f"Copie o slot? Nessun confronto: {fuori}."] if interrotti else []
    nome = {id(p): p.prove[0].configurazione.descrizione for p in punti}
    contesti = {p.prove[0].info.n_ctx_slot for p in punti}
    righe = [f"Copie o slot? {fmt(punti[0].prove[0].info.n_slot, 'd')} slot in tutto, " + (
        f"{fmt(contesti.pop(), 'd')} token di contesto a slot in ogni disposizione." if len(contesti) == 1 else
        "contesto a slot " + ", ".join(f"{fmt(p.prove[0].info.n_ctx_slot, 'd')} con {nome[id(p)]}" for p in punti)
        + ": il confronto non è a parità di contesto.")] + [f"  Fuori dal confronto: {fuori}."] * bool(interrotti)
    thread = {id(p): p.prove[0].configurazione.deciso and p.prove[0].configurazione.deciso.n_thread for p in punti}
    core = max((q.macchina.core for p in punti for q in p.prove if q.macchina), default=os.cpu_count()) or 0
    if None not in thread.values() and (len(set(thread.values())) > 1 or max(thread.values()) > core):
        righe.append(f"  Attenzione, thread diversi (dai log, su {core} core): " + ", ".join(
            f"{thread[id(p)]} con {nome[id(p)]}{' (più dei core)' * (thread[id(p)] > core)}" for p in punti)
            + ". Le cifre misurano anche questo, non solo copie contro slot.")
    occupata = [nome[id(p)] for p in punti if any(map(occupata_intorno, p.prove))]
    if occupata:  # figures the output itself says do not count
        righe.append(f"  Nessun verdetto su throughput e latenza: la macchina era occupata con {', '.join(occupata)}.")
    for cifra, primato, chiave, meglio in () if occupata else (("Throughput", "più alto", "throughput", max),
                                                               ("Latenza media", "più bassa", "latenza_media", min)):
        valore = (lambda p: p.throughput) if chiave == "throughput" else (lambda p: p.latenza)
        primo, altri, accertato = meglio(punti, key=valore), [], True
        for p in (q for q in punti if q is not primo):
            rapporto = max(valore(primo) / valore(p), valore(p) / valore(primo))
            diverso = diversi(primo.cifre(chiave), p.cifre(chiave))
            accertato = accertato and bool(diverso)
            certezza = ("" if diverso is None else ", oltre il rumore" if diverso else
                        ", non accertato" if rapporto > 1.1 else ", entro il rumore")
            altri.append(f"{valore(p):.2f} con {nome[id(p)]} (×{rapporto:.2f}{certezza})")
        unita = "token/s" if chiave == "throughput" else "s"
        testa = f"{cifra} {primato}" if accertato else f"{cifra}, nessun vincitore accertato"  # beyond the noise or not
        righe.append(f"  {testa}: {nome[id(primo)]}, {valore(primo):.2f} {unita}; " + ", ".join(altri) + ".")
    righe.append("  Nel proprio slot (dai tempi del server): " + ", ".join(
        f"{fmt(p.velocita_slot, '.1f')} t/s con {nome[id(p)]}" for p in punti) + ".")
    righe.append("  Slot occupati insieme in un server (il batching, mai fra copie): " + ", ".join(
        f"{fmt(picco_in_un_server(p), 'd')} con {nome[id(p)]}" for p in punti) + ".")
    misurate = [(p, memorie.get(p.prove[0].configurazione)) for p in punti]
    if all(m is not None for _, m in misurate):
        righe.append("  RAM: " + ", ".join(f"{m.totale:.0f} MiB con {nome[id(p)]}" + (
            f" ({m.condivisa:.0f} condivisi fra le copie)" if len(m.privata) > 1 else "")
            for p, m in misurate) + ".")
    if any(len(p.intere) < 2 for p in punti):
        righe.append("  Una prova per disposizione: con --ripeti 3 si misura il rumore, e i confronti dicono se lo "
                     "superano.")
    return righe


# --avvia: the whole lab in one command ##########################################################

class Configurazione(NamedTuple):
    """One point of a sweep: -np N in all (-1: `auto`, no -np), maybe --kv-unified, over `repliche` copies of the
    server (each -np N / repliche); what its log said it decided."""
    np: int
    kv_unificata: bool = False
    deciso: Optional[Decisioni] = None
    repliche: int = 1

    @property
    def etichetta(self) -> str:
        kv = " kv" if self.kv_unificata else ""
        if self.repliche > 1:
            return f"{self.repliche}x{self.np // self.repliche}{kv}"
        return "auto" if self.np == -1 else f"{self.np}{kv}"

    @property
    def descrizione(self) -> str:
        uno = " ".join(self.argomenti()) or "-np auto"
        return f"un server {uno}" if self.repliche == 1 else f"{self.repliche} copie da {uno}"

    @property
    def ordine(self) -> tuple:
        """By -np, --kv-unified after, auto last (never the ratios' base); then by copies."""
        return self.np == -1, self.np, self.kv_unificata, self.repliche

    def argomenti(self) -> List[str]:
        """One copy's."""
        np = ["-np", str(self.np // self.repliche)] if self.np != -1 else []
        return np + (["--kv-unified"] if self.kv_unificata else [])


FERMATA = 15.0  # s a started server gets to stop on SIGTERM; then it is killed


class ServerAvviato:
    """`COMMAND -np N --host H --port P`, always stopped on exit."""

    def __init__(self, comando: List[str], configurazione: Configurazione, url: str, attesa: float, stderr):
        parti = urllib.parse.urlsplit(url)
        # -lv 4: this llama.cpp logs the KV cache it allocated only from there. The cost, measured
        # on b11434: about 30 log lines a request (7 at -lv 3), none per token.
        verbosa = {"-lv", "--log-verbosity", "-v", "--verbose"} & {p.split("=")[0] for p in comando}
        self.argomenti = comando + configurazione.argomenti() + ([] if verbosa else ["-lv", "4"]) + [
            "--host", parti.hostname, "--port", str(parti.port or 80)]
        self.chiavi = chiavi_api(comando)  # shown as ***
        self.url, self.attesa, self.stderr = url, attesa, stderr
        self.log = self.proc = None  # its stdout and stderr; the process
        self.scadenza: Optional[float] = None  # stopped with others (--repliche): one deadline for all

    def __enter__(self) -> ServerAvviato:
        import shlex
        import subprocess
        import tempfile

        client = Client(self.url, timeout_info=2.0)
        with contextlib.suppress(ErroreRete):  # the port is free
            client.chiama("GET", "/health")
            raise ErroreUtente(f"su {self.url} risponde già un server: fermalo, o scegli un'altra porta con --url")
        mostrati = [(a, nascoste(a, self.chiavi)) for a in self.argomenti]  # masked before quoting: a quote moves no key
        print(f"avvio: {' '.join(shlex.quote(a) if m == a else m for a, m in mostrati)}", file=self.stderr, flush=True)
        if os.name == "posix":
            # Its own session: Ctrl+C reaches carico.py, which stops the server.
            gruppo = dict(start_new_session=True, preexec_fn=muori_con_il_padre)
        else:
            gruppo = dict(creationflags=subprocess.CREATE_NEW_PROCESS_GROUP)
        try:
            self.log = tempfile.NamedTemporaryFile(prefix="carico-server-", suffix=".log", delete=False)
            try:
                self.proc = subprocess.Popen(self.argomenti, stdin=subprocess.DEVNULL, stdout=self.log,
                                             stderr=subprocess.STDOUT, **gruppo)
            except OSError as exc:
                nel_path = (" (non è nel PATH: installa il server, o scrivi il suo percorso intero in --avvia)"
                            if exc.errno == errno.ENOENT and os.sep not in self.argomenti[0] else "")
                raise ErroreUtente(f"non riesco ad avviare '{self.argomenti[0]}': {perche_os(exc)}{nel_path}") from None
            aspetta_pronto(client, self.attesa, self.stderr, avviato=self)
        except BaseException:
            self.__exit__()
            raise
        return self

    def controlla(self, quando: str, attesa: float = 0.0) -> None:
        import subprocess

        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(attesa)
        if self.proc.returncode is not None:
            raise ErroreUtente(f"{quando} {uscita(self.proc.returncode)}; ultime righe del suo log:\n{self.coda_log()}")

    def testo_log(self, da: int = 0) -> str:
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            f.seek(da)
            return f.read()

    def decisioni(self) -> Decisioni:
        return leggi_decisioni(self.testo_log())

    def coda_log(self) -> str:
        return nascoste("".join("  | " + r for r in self.testo_log().splitlines(True)[-15:]).rstrip(), self.chiavi)

    def __exit__(self, *exc) -> None:
        import subprocess

        with segnali() as notati:  # a Ctrl+C waits for the server to stop
            if self.proc is not None and self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=FERMATA if self.scadenza is None else max(self.scadenza - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            if self.log is not None:
                self.log.close()
                with contextlib.suppress(OSError):
                    os.unlink(self.log.name)
        if notati and (not exc or exc[0] is None):
            raise Interruzione(notati[0])


def chiavi_api(comando: List[str]) -> List[str]:
    """The API keys of --api-key (lists too) and LLAMA_API_KEY, longest first."""
    dati = [p for prima, p in zip([""] + comando, comando) if prima == "--api-key"] + [
        p.partition("=")[2] for p in comando if p.startswith("--api-key=")] + [os.environ.get("LLAMA_API_KEY", "")]
    return sorted({c for d in dati for c in (d, *d.split(",")) if c}, key=lambda c: (-len(c), c))


def nascoste(testo: str, chiavi: List[str]) -> str:
    """Each key *** where it is a word of its own (a key 'e' leaves 'llama-server' alone)."""
    import re

    for chiave in chiavi:
        testo = re.sub(rf"(?<![^\s='\",]){re.escape(chiave)}(?![^\s'\",])", "***", testo)
    return testo


def uscita(codice: int) -> str:
    try:
        nome = signal.Signals(-codice).name if codice < 0 else None
    except ValueError:
        return f"(ucciso dal segnale {-codice})"
    portabile = "compilato per un'altra CPU: ricompilalo portabile (cmake -DGGML_NATIVE=OFF)"
    crash = f". Il server è andato in crash. Se accade all'avvio, forse è {portabile}"
    perche = {"SIGILL": f". Questa CPU non esegue un'istruzione del server, {portabile}",
              "SIGKILL": ". Spesso è il sistema, senza più memoria (guarda dmesg)",
              **dict.fromkeys(("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE"), crash)}
    return f"(codice {codice})" if nome is None else f"(ucciso da {nome}){perche.get(nome, '')}"


def muori_con_il_padre():
    """In the started server: Linux sends it SIGTERM if carico.py dies, even of SIGKILL."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# --repliche: copies of one server ###############################################################
# The other way to serve N users on one machine: k servers of N/k slots. Each copy has its own KV cache and
# compute buffers and never batches with the others; -np, -c and -t are divided so the totals stay as asked
# (-t rounded down, at least 1 a copy: more copies than threads run more threads than asked, and say so).

CONTESTO, THREAD = ("-c", "--ctx-size"), ("-t", "--threads")


def valore_nel_comando(comando: List[str], nomi: Tuple[str, ...]) -> Optional[str]:
    """The last value of an option (`-c N` or `-c=N`): the one the server keeps."""
    valore = None
    for prima, parte in zip([""] + comando, comando):
        nome, uguale, dopo = parte.partition("=")
        if prima in nomi or uguale and nome in nomi:
            valore = parte if prima in nomi else dopo
    return valore


def intero_nel_comando(comando: List[str], nomi: Tuple[str, ...]) -> Optional[int]:
    """An option's value if it is a positive integer (-c 0, -t -1: the server decides)."""
    with contextlib.suppress(TypeError, ValueError):  # None, or not a number
        if (valore := int(valore_nel_comando(comando, nomi))) > 0:
            return valore
    return None


def senza_opzione(comando: List[str], nomi: Tuple[str, ...]) -> List[str]:
    return [parte for prima, parte in zip([""] + comando, comando)
            if prima not in nomi and parte.partition("=")[0] not in nomi]


def perche_non_repliche(repliche: List[int], configurazioni: List[Configurazione], avvia: Optional[List[str]],
                        intero: bool) -> Optional[str]:
    if avvia is None:
        return "--repliche va usato insieme a --avvia: le copie del server le avvia carico.py"
    if any(c.np == -1 for c in configurazioni):
        return "--repliche divide -np fra le copie: con --np auto non c'è un numero da dividere"
    for r, c in itertools.product(repliche, configurazioni):
        if c.np % r:
            return (f"--repliche {r} divide -np {c.np}? no: {r} copie da -np {c.np / r:g} (ogni valore di --repliche "
                    "deve dividere ogni --np)")
    contesto = valore_nel_comando(avvia, CONTESTO)
    if max(repliche) > 1 and not intero and intero_nel_comando(avvia, CONTESTO) is None:
        manca = f"-c {contesto} non è un numero da dividere" if contesto else "manca -c N nel comando di --avvia"
        return f"--repliche divide -c fra le copie (a ogni slot lo stesso contesto): {manca} (o --contesto-intero)"
    return None


def copia_del_comando(comando: List[str], configurazione: Configurazione,
                      intero: bool = False) -> Tuple[List[str], List[str]]:
    """One copy's command (-np, host and port: ServerAvviato's) and the notes to print about it."""
    r, copia, note = configurazione.repliche, list(comando), []
    for nomi in (CONTESTO, THREAD) if r > 1 else ():
        valore, nome = intero_nel_comando(comando, nomi), nomi[0]
        if nomi == CONTESTO and intero:
            continue
        if valore is None:  # -t only: a -c to divide was checked with the flags
            dato = valore_nel_comando(comando, nomi)
            note.append(f"{'senza -t nel comando' if dato is None else f'con -t {dato}'} ognuna delle {r} copie usa "
                        "i thread predefiniti del server: si contendono i core (-t N li divide fra le copie)")
            continue
        ogni = max(valore // r, 1)
        copia = senza_opzione(copia, nomi) + [nome, str(ogni)]
        if valore % r:
            in_tutto = f", {r * ogni} thread in tutto su {valore} chiesti" + ": si contendono i core" * (valore < r)
            note.append(f"{nome} {valore} non si divide fra {r} copie: ogni copia {nome} {ogni}"
                        + in_tutto * (nomi == THREAD))
    return copia, note


def url_libero(url: str) -> str:
    """url with a port free on its host (the system's pick for port 0)."""
    parti = urllib.parse.urlsplit(url)
    famiglia, tipo, _, _, indirizzo = socket.getaddrinfo(parti.hostname, 0, type=socket.SOCK_STREAM)[0]
    with socket.socket(famiglia, tipo) as s:
        s.bind(indirizzo)
        porta = s.getsockname()[1]
    host = f"[{parti.hostname}]" if ":" in parti.hostname else parti.hostname
    return urllib.parse.urlunsplit(parti._replace(netloc=f"{host}:{porta}"))


@contextlib.contextmanager
def copie_avviate(comando: List[str], configurazione: Configurazione, url: str, attesa: float, stderr,
                  intero: bool = False) -> Iterator[List[ServerAvviato]]:
    """The copies, the first on url's port, started one after the other; all stopped on the way out, however."""
    copia, note = copia_del_comando(comando, configurazione, intero)
    for testo in note:
        print(f"carico.py: nota: {testo}", file=stderr, flush=True)
    with contextlib.ExitStack() as avviate:
        copie: List[ServerAvviato] = []
        for i in range(configurazione.repliche):
            server = ServerAvviato(copia, configurazione, url if i == 0 else url_libero(url), attesa, stderr)
            copie.append(avviate.enter_context(server))
        try:
            yield copie
        finally:
            scadenza = time.monotonic() + FERMATA
            for server in copie:  # all told first: they stop together, a hung one killed when the first would be
                server.scadenza = scadenza
                if server.proc.poll() is None:
                    server.proc.terminate()


class Memoria(NamedTuple):
    """What the copies cost in RAM while they run, MiB, as the kernel counts it."""
    privata: Tuple[float, ...]  # each copy's own pages: KV cache, compute buffers, repacked weights
    rss: Tuple[float, ...]  # each copy's resident pages, shared ones included (summed, counted once a copy)
    condivisa: float  # the pages a copy shares (the mapped weights, the same in each), counted once
    totale: float  # the copies together: the private pages, plus the shared ones once


def memoria(pids: List[int], radice: str = "/proc") -> Optional[Memoria]:
    """From /proc/PID/smaps_rollup (Linux); None elsewhere, or when a process is gone. The shared pages are Rss
    less the private ones, the most any copy has: each maps the same weights. Not Pss, which splits a page among
    every process mapping it: another server on the same model file would hide part of the weights."""
    letti = []
    for pid in pids:
        try:
            with open(os.path.join(radice, str(pid), "smaps_rollup"), encoding="ascii") as f:
                campi = dict(riga.split(":", 1) for riga in f if riga.rstrip().endswith(" kB"))
            letti.append({k: int(campi[k].split()[0]) / 1024 for k in ("Rss", "Private_Clean", "Private_Dirty")})
        except (OSError, KeyError, ValueError):
            return None
    if not letti:
        return None
    privata = tuple(m["Private_Clean"] + m["Private_Dirty"] for m in letti)
    condivisa = max(m["Rss"] - p for m, p in zip(letti, privata))
    return Memoria(privata, tuple(m["Rss"] for m in letti), condivisa, sum(privata) + condivisa)


# --confronta: two result files side by side ####################################################
# With --ripeti runs in each file, Welch's t-test (unequal variances: fits few runs) says if a
# difference is beyond the noise, at 95%; with one run a file, it is only indicative.

# Six figures at 95%: between identical servers, one false "beyond" in four.

# The figures compared: (name and unit, where a run of --json keeps it, scale). With --stream, TTFT and TPOT.
FIGURE_CONFRONTO = (
    ("throughput aggregato (token/s)", ("riepilogo", "throughput"), 1),
    ("latenza media (s)", ("riepilogo", "latenza_media"), 1),
    ("latenza p90 (s)", ("latenza_p90_s",), 1),
    ("latenza max (s)", ("riepilogo", "latenza_max"), 1),
    ("primo token p50 (s)", ("dettagli", "figure_s", "primo token", "p50"), 1),
    ("TPOT p50 (ms)", ("dettagli", "figure_s", "TPOT", "p50"), 1000),
)
# What makes two runs the same load (np apart: the servers are what is compared), and the flag that sets it.
OPZIONI_DI_CARICO = {"parallele": "--parallele", "max_token": "--token", "token_minimo": "--token MIN",
                     "richieste": "--richieste", "ritmo": "--ritmo", "arrivi": "--arrivi", "durata": "--durata",
                     "stream": "--stream", "esatti": "--esatti", "turni": "--turni", "sistema": "--sistema",
                     "prompt_token": "--prompt-token", "prefisso": "--prefisso", "nome_dataset": "--dataset"}


def prove_salvate(percorso: str, rifiuta) -> List[dict]:
    dati = leggi_file("--confronta", percorso, rifiuta, json.load)
    prove = dati.get("prove") if isinstance(dati, dict) else None
    if not isinstance(prove, list) or not all(isinstance(p, dict) and isinstance(p.get("riepilogo"), dict)
                                              for p in prove):
        rifiuta(f"--confronta: '{percorso}' non è un file di risultati di carico.py (--json)")
    intere = [p for p in prove if not p.get("interrotta")]
    if not intere:
        rifiuta(f"--confronta: '{percorso}' non ha prove intere da confrontare: ripeti la misura fino in fondo con "
                "--json. Una prova interrotta (Ctrl+C, un server che non risponde più) non si confronta")
    return intere


def salvato(prova: dict, chiavi: Sequence[str]):
    valore = prova
    for chiave in chiavi:
        valore = valore.get(chiave) if isinstance(valore, dict) else None
    return valore


def carico_salvato(prova: dict) -> tuple:
    return tuple(json.dumps(salvato(prova, ("piano", k))) for k in OPZIONI_DI_CARICO)


def welch(a: List[float], b: List[float]) -> Tuple[float, float]:
    es, gl = errore_standard(a, b)
    if es == 0:  # each file's values all the same: compared as they are, not as means that may round apart
        return (float("inf") if a[0] != b[0] else 0.0), gl
    return (media(b) - media(a)) / es, gl


def oltre_il_rumore(a: List[float], b: List[float]) -> str:
    if len(a) < 2 or len(b) < 2:
        return "indicativa: meno di due prove con questa cifra in un file (con --ripeti 3 si misura il rumore)"
    t, gl = welch(a, b)  # gl may be inf: printed as such
    return (("oltre il rumore" if abs(t) > t_critico(gl) else f"non accertata, con {len(a)} e {len(b)} prove"
             if abs(media(b) - media(a)) > 0.1 * abs(media(a)) + 1e-9 else "entro il rumore")  # over 10% (not the
            # float sum's last bit: 3.12's sum() compensates), not "no change"
            + f" (Welch 95%: t {t:.2f}, gl {gl:.2f}, soglia {t_critico(gl):.2f})")


def righe_confronto(a: Tuple[str, List[dict]], b: Tuple[str, List[dict]]) -> List[str]:
    """Each load both files measured, server by server, figure by figure; loads never pooled."""
    (nome_a, prove_a), (nome_b, prove_b) = a, b
    gruppi_a, gruppi_b = (raggruppa(prove, lambda p: (carico_salvato(p), str(p.get("np"))))
                          for prove in (prove_a, prove_b))  # (load, np) -> its runs
    coppie = [(ga, gb) for (carico_a, _), ga in gruppi_a.items() for (carico_b, _), gb in gruppi_b.items()
              if carico_a == carico_b]
    larghezze = (-31, 10, 10, 8)  # the figure, A, B, B/A; then, two spaces on, the verdict
    righe = []
    for gruppo_a, gruppo_b in coppie:
        righe += [f"confronto: A = {nome_a} ({descrivi_prove(gruppo_a)}), B = {nome_b} ({descrivi_prove(gruppo_b)})",
                  in_colonne(["cifra", "A", "B", "B/A"], larghezze) + "  differenza"]
        cifre = []
        for nome, chiavi, scala in FIGURE_CONFRONTO:
            va, vb = ([v * scala for v in (numero(salvato(p, chiavi)) for p in g) if v is not None]
                      for g in (gruppo_a, gruppo_b))
            if va and vb:
                ma, mb = media(va), media(vb)
                quoziente = f"×{mb / ma:.2f}" if ma else ND
                celle = in_colonne([nome, f"{ma:.3f}", f"{mb:.3f}", quoziente], larghezze)
                cifre.append(f"{celle}  {oltre_il_rumore(va, vb)}")
        righe += cifre or ["  nessuna cifra che abbiano tutti e due (nessuna richiesta riuscita?)"]
        occupate = [(nome, motivo) for nome, g in (("A", gruppo_a), ("B", gruppo_b)) for p in g
                    for chiave in ("macchina", "macchina_dopo") for motivo in [macchina_salvata(p.get(chiave))] if motivo]
        if occupate:  # a run beside a load: its figures may be the load's, not the server's
            righe.append(f"  la macchina era occupata in una prova di {occupate[0][0]} ({occupate[0][1]}): il confronto "
                         "non vale, ripeti a macchina tranquilla")
        righe.append("")
    sole = [f"{nome} ({descrivi_prove(g)})" for nome, gruppi_di, altri in ((nome_a, gruppi_a, gruppi_b),
                                                                         (nome_b, gruppi_b, gruppi_a))
            for (quale, _), g in gruppi_di.items() if quale not in {c for c, _ in altri}]
    if sole:  # a load only one file measured: said, never compared
        righe += [f"non confrontate, senza lo stesso carico nell'altro file: {'; '.join(sole)}", ""]
    return righe[:-1]


def macchina_salvata(salvata) -> str:
    try:
        return macchina_occupata(Macchina(**salvata)) if isinstance(salvata, dict) else ""
    except TypeError:  # a file of another version
        return ""


def senza_carico_comune(a: Tuple[str, List[dict]], b: Tuple[str, List[dict]]) -> Optional[str]:
    (nome_a, prove_a), (nome_b, prove_b) = a, b
    if {carico_salvato(p) for p in prove_a} & {carico_salvato(p) for p in prove_b}:
        return None

    def valori(prove: List[dict], chiave: str) -> List[str]:  # as the flag would say them
        letti = {json.dumps(salvato(p, ("piano", chiave))) for p in prove}
        return sorted({"no" if v in ("null", "false") else "sì" if v == "true" else
                       "-".join(map(str, json.loads(v))) if v.startswith("[") else v.strip('"') for v in letti})
    diverse = [f"{flag} (A {', '.join(va)}, B {', '.join(vb)})" for chiave, flag in OPZIONI_DI_CARICO.items()
               for va, vb in [(valori(prove_a, chiave), valori(prove_b, chiave))] if va != vb]
    return (f"--confronta: {nome_a} e {nome_b} non si confrontano: " + (
        "differiscono " + "; ".join(diverse) if diverse else "le prove di ciascuno differiscono fra loro")
            + ". Rifai le prove con le stesse opzioni, cambiando solo il server o -np")


def descrivi_prove(prove: List[dict]) -> str:
    piano = prove[0].get("piano") if isinstance(prove[0].get("piano"), dict) else {}
    kv = " kv" if salvato(prove[0], ("server", "kv_unificata")) else ""
    np = prove[0].get("np") or f"{salvato(prove[0], ('server', 'n_slot'))}{kv}"
    contesto = salvato(prove[0], ("server", "n_ctx_slot"))
    token = piano.get("max_token") if piano.get("token_minimo") is None else f"{piano['token_minimo']}-{piano.get('max_token')}"
    return (f"np {np}" + (f", n_ctx per slot {contesto}" if contesto else "") + f", parallele {piano.get('parallele')}, "
            f"token {token}: " + quante(len(prove), "prova", "prove"))


# The price of parallelism: each slot's context, conversations, what the server decided ##########
# On this llama.cpp a busy slot's n_prompt_tokens counts its prompt and the tokens decoded so far
# (measured: 55 = 34 + 21, then 182 = 34 + 148): adding n_decoded counts them twice. It counts a prompt
# as the slot feeds it, before the KV cache holds it: with --kv-unified the sum over the slots is what
# they ask of the shared buffer, and can pass it.

def contesto_degli_slot(dati) -> Optional[tuple]:
    """Each slot's (tokens of its task, n_ctx), 0 when idle; None where the server does not say."""
    contesto = []
    for slot in lista_slot(dati) or []:
        occupato = conta_occupati([slot])  # busy as the lab decides it: is_processing, or an older server's state
        n_ctx, tenuti = numero(slot.get("n_ctx"), int), numero(slot.get("n_prompt_tokens"), int)
        if not n_ctx or occupato is None or (occupato and tenuti is None):
            return None
        contesto.append((tenuti if occupato else 0, n_ctx))
    return tuple(contesto) or None


class Osservatore(NamedTuple):
    diretta: Optional[Diretta]
    gruppo: Optional[Gruppo] = None  # several --url: each server's share of each reading

    def seguendo(self, futuri: list, piano: Piano):
        aggiorna = self.diretta.seguendo(futuri, piano) if self.diretta else None

        def al_campione(campione: Campione, dati) -> Campione:
            campione = campione._replace(contesto=contesto_degli_slot(dati))
            if self.gruppo:
                self.gruppo.registra(campione)
            return aggiorna(campione, dati) if aggiorna else campione
        return al_campione

    def cancella(self) -> None:
        if self.diretta:
            self.diretta.cancella()


def letture_contesto(prova: Prova) -> List[Campione]:
    campioni = prova.esecuzione.campioni
    if any(c.contesto is None and c.occupati for c in campioni):
        return []
    return [c for c in campioni if c.contesto is not None]


def somma(contesto: tuple) -> int:
    return sum(t for t, _ in contesto)


def righe_contesto(prova: Prova) -> List[str]:
    letture = letture_contesto(prova)
    if not letture:
        return ["  contesto per slot: n/d (/slots non dice quanti token tiene ogni slot)"]
    if not any(c.occupati for c in letture):  # every reading fell before or after the work: a 0 would be false
        righe = [f"  contesto per slot: nessuna lettura di /slots (ogni {prova.piano.intervallo:g} s) ha visto uno slot "
                 "al lavoro"]
    else:
        righe = [f"  contesto per slot (token del compito di ogni slot, prompt e generati: il picco fra le letture di "
                 f"/slots, ogni {prova.piano.intervallo:g} s):"]
        server = oltre(prova.esecuzione).server  # several: each slot by its server's name and its own id
        nomi = [f"{d.base} slot {j}" for d in server for j in range(d.info.n_slot or 0)] or [
            f"slot {i}" for i in range(len(letture[0].contesto))]
        tutti = [c for c in letture if len(c.contesto) == len(nomi)] if server else letture  # a server gone: not its
        for nome, i in zip(nomi, range(len(tutti[0].contesto) if tutti else 0)):
            picco, n_ctx = max(c.contesto[i][0] for c in tutti), tutti[0].contesto[i][1]
            righe.append(f"    {nome}: {picco} di {n_ctx} token ({picco / n_ctx:.0%})")
        if kv_condivisa(prova):
            chiesti, n_ctx = max(map(somma, (c.contesto for c in letture))), letture[0].contesto[0][1]
            righe.append(f"    somma sugli slot: {chiesti} token chiesti al buffer che condividono (--kv-unified), "
                         f"di {n_ctx} ({chiesti / n_ctx:.0%})")
    if r := piu_lunga(prova.esecuzione.riuscite):
        righe.append(f"    la richiesta più lunga, dalle risposte: req {r.indice}, {r.token_prompt + r.token} token "
                     f"({r.token_prompt} di prompt + {r.token} generati)")
    return righe


def livello(tenuti: int, n_ctx: int, marche: Dict[str, str]) -> str:  # a full block only at n_ctx
    return marche["livelli"][min(8, max(tenuti > 0, 8 * tenuti // n_ctx))]


def corsie_contesto(prova: Prova) -> List[Tuple[str, int, List[Tratto]]]:
    letture = letture_contesto(prova)
    if not any(t for c in letture for t, _ in c.contesto):  # no slot held a token: no picture of it
        return []
    fino = [c.t for c in letture[1:]] + [fine_asse(prova.esecuzione)]
    corsie = [(f"ctx {i}", f"slot {i}", n_ctx, [c.contesto[i][0] if i < len(c.contesto) else 0 for c in letture])
              for i, (_, n_ctx) in enumerate(letture[0].contesto)]
    if kv_condivisa(prova):
        corsie.append(("tutti", "tutti gli slot", letture[0].contesto[0][1], [somma(c.contesto) for c in letture]))
    return [(etichetta, n_ctx, [Tratto(c.t, a, "contesto", n, f"{nome}: {n} di {n_ctx} token a {c.t:.2f} s")
                                for c, a, n in zip(letture, fino, tenuti)])
            for etichetta, nome, n_ctx, tenuti in corsie]


# --turni and --sistema: conversations that outgrow the slot ####################################

class Conversazioni(NamedTuple):
    """--turni: each user resends the whole history each turn, cache on, until --turni or a failure."""
    piano: Piano
    primo_prompt: int

    def messaggio_utente(self, utente: int, turno: int) -> dict:
        testo = PROMPTS[(utente + turno) % len(PROMPTS)]
        return {"role": "user", "content": f"(utente {self.primo_prompt + utente}, domanda {turno + 1}) {testo}"}

    def lancia(self, futuri: list, esecutore, client: Client, t0: float) -> EsecuzioneOltre:
        import concurrent.futures

        piano, turni = self.piano, self.piano.oltre.turni
        storie = {}  # each turn's future -> (user, turn from 0, the messages it sent)

        def invia_turno(indice: int, domanda: dict, utente: int, turno: int) -> Risultato:
            r = invia_oltre(client, indice, domanda, piano.timeout, t0)
            return r._replace(oltre=oltre(r)._replace(conversazione=utente, turno=turno + 1))

        def manda(utente: int, turno: int, messaggi: list) -> None:
            domanda = {**domanda_oltre("", piano), "messages": messaggi, "cache_prompt": True}
            futuro = esecutore.submit(invia_turno, len(futuri), domanda, utente, turno)
            futuri.append(futuro)
            storie[futuro] = (utente, turno, messaggi)

        sistema = [{"role": "system", "content": piano.oltre.testo_sistema}] if piano.oltre.testo_sistema else []
        for utente in range(piano.parallele):
            manda(utente, 0, sistema + [self.messaggio_utente(utente, 0)])
        while storie:
            finiti, _ = concurrent.futures.wait(list(storie), return_when=concurrent.futures.FIRST_COMPLETED)
            for futuro in finiti:
                utente, turno, messaggi = storie.pop(futuro)
                r = futuro.result()
                if r.riuscita and turno + 1 < turni and not client.annullato.is_set():
                    risposta = {"role": "assistant", "content": oltre(r).testo or ""}
                    manda(utente, turno + 1, messaggi + [risposta, self.messaggio_utente(utente, turno + 1)])
        return EsecuzioneOltre()


def lanciatore(piano: Piano, primo_prompt: int):
    return Conversazioni(piano, primo_prompt) if piano.oltre.turni else Programma(piano, primo_prompt)


def tokenizza(client: Client, testo: str) -> List[bytes]:
    """`testo` in the server's pieces, as bytes (maybe half a UTF-8 character); none: exit 1."""
    risposta = chiedi(client, "/tokenize", {"content": testo, "with_pieces": True})
    if risposta.status == 404 and (altrove := tokenizza_extras(client, testo)) is not None:  # not llama.cpp's
        return altrove
    dati = leggi_json(risposta.corpo) if risposta.status == 200 else None
    token = dati.get("tokens") if isinstance(dati, dict) else None
    try:  # a piece is text, or the bytes of half a character as a list of numbers
        return [t["piece"].encode("utf-8") if isinstance(t["piece"], str) else bytes(t["piece"]) for t in token]
    except (TypeError, KeyError, ValueError):  # no list, no pieces, not llama.cpp's /tokenize
        raise ErroreUtente(f"il server su {client.base} non conta i token con /tokenize ({descrivi_errore_http(risposta)}"
                           + ("; né con /extras/tokenize" if risposta.status == 404 else "")
                           + "). --sistema, --prompt-token e --prefisso hanno bisogno del suo tokenizzatore") from None


def tokenizza_extras(client: Client, testo: str) -> Optional[List[bytes]]:
    """llama-cpp-python's /extras/tokenize (BOS first) and /extras/detokenize; None without them."""
    try:
        risposta = client.chiama("POST", "/extras/tokenize", {"input": testo})
        dati = leggi_json(risposta.corpo) if risposta.status == 200 else None
        ids = dati.get("tokens") if isinstance(dati, dict) else None
        if not isinstance(ids, list) or not all(numero(i, int) is not None for i in ids):
            return None
        for i in (i for i in ids if i not in oltre(client).pezzi):
            pezzo = leggi_json(client.chiama("POST", "/extras/detokenize", {"tokens": [i]}).corpo)
            if not isinstance(pezzo, dict) or not isinstance(pezzo.get("text"), str):
                return None
            oltre(client).pezzi[i] = pezzo["text"].encode("utf-8")
    except ErroreRete:
        return None
    pezzi = [oltre(client).pezzi[i] for i in ids]
    return pezzi[1:] if pezzi and not pezzi[0] else pezzi  # the BOS: an empty piece


def pezzi_del_server(client: Client, quanti: int) -> List[bytes]:
    fonte = " ".join(PROMPTS)
    pezzi = tokenizza(client, fonte)
    while 0 < len(pezzi) < quanti:
        fonte = " ".join([fonte] * (quanti // len(pezzi) + 2))
        pezzi = tokenizza(client, fonte)
    return pezzi


def testo_di_token(client: Client, n: int) -> str:
    """A text of exactly n tokens, counted again (a cut may merge two pieces)."""
    pezzi = pezzi_del_server(client, n + 3)
    for k in [k for k in (n, n - 1, n + 1, n - 2, n + 2) if 0 < k <= len(pezzi)]:
        testo = b"".join(pezzi[:k]).decode("utf-8", "replace")
        if len(tokenizza(client, testo)) == n:
            return testo
    raise ErroreUtente(f"--sistema {n}: il tokenizzatore del server non dà un testo di esattamente {n} token")


def con_prompt_di_sistema(client: Client, piani: List[Piano]) -> List[Piano]:
    testo = testo_di_token(client, oltre(piani[0]).sistema)
    return [p._replace(oltre=p.oltre._replace(testo_sistema=testo)) for p in piani]


# --prompt-token: prompts of exact lengths, counted by the server's own tokenizer ##################
# /tokenize: any model, offline (the peers download a tokenizer). Once a session a long text is cut into
# its pieces; a prompt of L tokens is L pieces from a word start, a different one per request (about 80
# on gemma-3, then they repeat), so consecutive prompts differ from their first token.

def con_pezzi(client: Client, piani: List[Piano]) -> List[Piano]:
    lunghezze = [oltre(p).prompt_token for p in piani if oltre(p).prompt_token]
    piu_lungo = max([b for _, b in lunghezze] + [oltre(p).prefisso or 0 for p in piani] + [1])
    pezzi = pezzi_del_server(client, piu_lungo + 1)
    prime = {}  # one start per distinct first piece (where a word starts): no two requests in a row open alike
    for i, pezzo in enumerate(pezzi):
        if pezzo.startswith(b" "):
            prime.setdefault(pezzo, i)
    if prime and max(prime.values()) + piu_lungo >= len(pezzi):  # room after the last start
        pezzi = pezzi_del_server(client, max(prime.values()) + piu_lungo + 1)
    if len(prime) < 2:  # a tokenizer that keeps the blank apart, or at a word's end
        raise ErroreUtente("--prompt-token: il tokenizzatore del server non dà pezzi che aprano parole diverse: "
                            "non so fare prompt che non condividano l'inizio")
    fatti = b"".join(pezzi), tuple(itertools.accumulate(map(len, pezzi), initial=0)), tuple(prime.values())
    esatte = [("--prompt-token", minimo) for minimo, massimo in lunghezze if minimo == massimo]
    esatte += [("--prefisso", oltre(p).prefisso) for p in piani if oltre(p).prefisso]
    for opzione, n in dict.fromkeys(esatte):
        if len(tokenizza(client, taglia(fatti, 0, n))) != n:
            raise ErroreUtente(f"{opzione} {n}: il tokenizzatore del server non ricompone un testo di "
                                f"esattamente {n} token")
    return [p._replace(oltre=p.oltre._replace(pezzi=fatti)) for p in piani]


def taglia(pezzi: tuple, indice: int, lunghezza: int) -> str:
    """Request `indice`'s exact prompt: `lunghezza` pieces from its own word start."""
    testo, inizi, aperture = pezzi
    primo = aperture[indice % len(aperture)]
    return testo[inizi[primo]:inizi[primo + lunghezza]].decode("utf-8", "replace")


def prompt_di(indice: int, piano: Piano, primo_prompt: int = 0) -> Tuple[str, Optional[int]]:
    """Request `indice`'s prompt and (--prompt-token) its length; from `primo_prompt`: a repeat's are new."""
    piano_oltre = oltre(piano)
    prefisso = piano_oltre.prefisso or 0  # --prefisso: the same opening, from the first start, then its own text
    comune = taglia(piano_oltre.pezzi, 0, prefisso) if prefisso else ""
    if piano_oltre.prompt_token is None:
        return comune + (" " if prefisso else "") + prompt_oltre(primo_prompt + indice, piano), None
    import random

    lunghezza = random.Random(f"{piano_oltre.seme or 0}:{indice}").randint(*piano_oltre.prompt_token)
    proprio = 1 + (primo_prompt + indice) % (len(piano_oltre.pezzi[2]) - 1)  # never the prefix's own start
    return comune + taglia(piano_oltre.pezzi, proprio, lunghezza - prefisso), lunghezza


def domanda_di(indice: int, piano: Piano, primo_prompt: int = 0) -> Tuple[dict, Optional[int]]:
    dataset, minimo = oltre(piano).dataset, oltre(piano).token_minimo
    if dataset is None:
        prompt, lunghezza = prompt_di(indice, piano, primo_prompt)
        domanda = domanda_oltre(prompt, piano)
        if minimo is not None:  # --token MIN-MAX: by --seme and the request's place in its run, as the lengths
            import random

            domanda["max_tokens"] = random.Random(f"token {oltre(piano).seme or 0}:{indice}").randint(minimo, piano.max_token)
        return domanda, lunghezza
    # A trace is replayed as it is (a repeat too: the same requests at the same times); a dataset moves on.
    testo, massimo, _ = dataset[(indice if oltre(piano).traccia else primo_prompt + indice) % len(dataset)]
    domanda = domanda_oltre(testo if isinstance(testo, str) else "", piano)
    if not isinstance(testo, str):
        domanda["messages"] = [{"role": ruolo, "content": contenuto} for ruolo, contenuto in testo]
    if massimo is not None:
        domanda["max_tokens"] = massimo
    return domanda, None


def leggi_dataset(percorso: str, rifiuta) -> Tuple[tuple, str]:
    """--dataset: JSONL (`prompt` or `messages`, `max_tokens`, `timestamp`) or ShareGPT; a bad line: exit 2."""
    testo, dove = leggi_file("--dataset", percorso, rifiuta), f"--dataset: '{percorso}'"
    intero = None  # not one JSON document: JSONL
    with contextlib.suppress(ValueError):
        intero = json.loads(testo)
    if isinstance(intero, list):  # ShareGPT: [{"conversations": [{"from": "human", "value": ...}, ...]}, ...]
        domande = [next((t["value"] for t in c["conversations"] if isinstance(t, dict) and t.get("from") in ("human", "user")
                         and isinstance(t.get("value"), str) and t["value"]), None)
                   for c in intero if isinstance(c, dict) and isinstance(c.get("conversations"), list)]
        richieste = tuple((d, None, None) for d in domande if d)
        if not richieste:
            rifiuta(f"{dove} non ha conversazioni con una domanda (il formato di ShareGPT)")
        senza = len(intero) - len(richieste)
        saltate = (f"; {quante(senza, 'conversazione', 'conversazioni')} su {len(intero)} senza una domanda "
                   f"(from human), {'saltata' if senza == 1 else 'saltate'}") if senza else ""
        return richieste, "ShareGPT" + saltate
    richieste = [voce_dataset(riga, f"{dove}, riga {n}", rifiuta)
                 for n, riga in enumerate(testo.splitlines(), 1) if riga.strip()]
    if not richieste:
        rifiuta(f"{dove} è vuoto: nessuna richiesta")
    istanti = [t for _, _, t in richieste]
    if None in istanti and any(t is not None for t in istanti):
        rifiuta(f"{dove}: il timestamp c'è su alcune righe e non su altre")
    if istanti[0] is not None and any(b < a for a, b in zip(istanti, istanti[1:])):
        rifiuta(f"{dove}: i timestamp devono crescere riga dopo riga")
    if istanti[0] is not None and istanti[-1] - istanti[0] > 86400:
        rifiuta(f"{dove}: la traccia dura più di un giorno ({istanti[-1] - istanti[0]:.0f} s)")
    return tuple((p, m, None if t is None else t - istanti[0]) for p, m, t in richieste), "JSONL"


def voce_dataset(riga: str, dove: str, rifiuta) -> tuple:
    try:
        voce = json.loads(riga)
    except ValueError:
        rifiuta(f"{dove}: non è JSON (il file è JSONL, un oggetto JSON per riga con prompt o "
                "messages, o il JSON di ShareGPT)")
    if not isinstance(voce, dict):
        rifiuta(f"{dove}: ogni riga è un oggetto JSON, con prompt o messages")
    testo = voce.get("prompt", voce.get("messages"))
    messaggi_validi = isinstance(testo, list) and testo and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in testo)
    if not (isinstance(testo, str) and testo.strip() or messaggi_validi):
        rifiuta(f"{dove}: serve prompt (un testo) o messages (una lista di {{role, content}})")
    massimo, orario = voce.get("max_tokens"), voce.get("timestamp")
    if massimo is not None and (numero(massimo, int) is None or massimo < 1):
        rifiuta(f"{dove}: max_tokens deve essere un intero positivo, non {json.dumps(massimo)}")
    if orario is not None and (numero(orario) is None or orario < 0):
        rifiuta(f"{dove}: timestamp deve essere un numero di secondi, non {json.dumps(orario)}")
    # messages kept as (role, content) pairs: a plan is a value (hashable), never a shared, mutable list
    return (testo if isinstance(testo, str) else tuple((m["role"], m["content"]) for m in testo)), massimo, orario


def righe_prompt_esatti(prova: Prova, log: Optional[str] = None) -> List[str]:
    righe, piano_oltre, ok = [], oltre(prova.piano), prova.esecuzione.riuscite
    if piano_oltre.token_minimo is not None:
        generati = [r.token for r in ok if r.token is not None]
        righe.append(f"token chiesti a caso fra {piano_oltre.token_minimo} e {prova.piano.max_token} (seme {piano_oltre.seme or 0}): "
                     f"generati {da_a(generati)}")
    if piano_oltre.dataset is not None and not piano_oltre.traccia:
        righe.append(f"richieste da {piano_oltre.nome_dataset}: {len(piano_oltre.dataset)} richieste nel file, "
                     f"{prova.esecuzione.n_richieste} inviate")
    prefisso = piano_oltre.prefisso
    if prefisso is not None:
        dalla_cache = [r.token_cache for r in ok if r.token_cache is not None]
        if dalla_cache:
            righe.append((f"prefisso comune di {prefisso} token" if prefisso else "nessun prefisso comune, per confronto")
                         + f" (cache_prompt acceso): dalla cache {media(dalla_cache):.0f} token di prompt per richiesta "
                         f"in media ({da_a(dalla_cache)})" + perche_senza_prefisso(prova, log))
    misurati = [r for r in ok if oltre(r).prompt_esatto and r.token_prompt]
    if not misurati:
        return righe
    chiesti = [oltre(r).prompt_esatto for r in misurati]
    sopra = [r.token_prompt - oltre(r).prompt_esatto for r in misurati]
    a_caso = f" (a caso, seme {piano_oltre.seme or 0})" if piano_oltre.prompt_token[0] != piano_oltre.prompt_token[1] else ""
    return righe + [f"prompt: {da_a(chiesti)} token{a_caso}"
                    + f", contati dal tokenizzatore del server; il template della chat ne aggiunge {da_a(sopra)} "
                    f"(prompt_tokens {da_a([r.token_prompt for r in misurati])})"]


def perche_senza_prefisso(prova: Prova, log: Optional[str]) -> str:
    """--prefisso: why requests reused under half of it: taken before anyone computed it, or (the log,
    -lv 4) a restored checkpoint or a redone prompt (sliding-window models, gemma-3)."""
    prefisso, ok = oltre(prova.piano).prefisso, prova.esecuzione.riuscite
    poche = [r for r in ok if r.token_cache is not None and r.token_cache < prefisso / 2]
    if not poche:
        return ""
    fine_prompt = {r.indice: r.fine - r.predicted_ms / 1000 for r in ok if r.predicted_ms is not None}
    presto = [r for r in poche if in_slot(r) is not None  # its slot began before any other had the prompt computed
              and all(in_slot(r)[0] < t for i, t in fine_prompt.items() if i != r.indice)]
    frase = f". {len(poche)} su {len(ok)} ne hanno presi meno della metà del prefisso"
    prima = " prima che un altro avesse calcolato il prefisso"
    if len(presto) == len(poche):
        return frase + (": i loro slot le hanno prese" if len(poche) > 1 else ": il suo slot l'ha presa") + prima
    import re

    prese_prima = f" ({len(presto)} prese da uno slot{prima})" if presto else ""
    ripristini = [int(n) for n in re.findall(r"restored context checkpoint \(.*?n_tokens = (\d+)", log or "")]
    da_capo = len(re.findall(r"forcing full prompt re-processing", log or ""))
    if not ripristini and not da_capo:
        return frase + prese_prima + (". Il log del server non dice perché" if log is not None else
                                      ". Le risposte non dicono perché: con --avvia carico legge il log del server, "
                                      "che lo dice")
    visto = [f"ha ripristinato un checkpoint del contesto {quante(len(ripristini), 'volta', 'volte')} (restored "
             f"context checkpoint, n_tokens {da_a(ripristini)}). Da lì ha ricalcolato il prompt"] if ripristini else []
    visto += [f"ha ricalcolato tutto il prompt {quante(da_capo, 'volta', 'volte')} (forcing full prompt "
              "re-processing)"] if da_capo else []
    deciso = prova.configurazione.deciso if prova.configurazione else None
    swa = deciso is not None and any(nome == "SWA" for nome, *_ in deciso.cache_kv)
    return (frase + prese_prima + ". Il log del server dice che " + ". Dice anche che ".join(visto)
            + (". Il modello ha strati a finestra scorrevole (la cache SWA nel log): la loro cache non si accorcia al "
               "prefisso comune, si riusa solo fino a un checkpoint" if swa else ""))


def cache_ereditata(prova: Prova) -> List[Risultato]:
    """--turni: first turns that reused cache before any answer: an earlier run's, on the same server."""
    prima_risposta = min((r.fine for r in prova.esecuzione.risultati), default=None)  # None only with no turn at all
    return [r for r in prova.esecuzione.riuscite if oltre(r).turno == 1 and (r.token_cache or 0) > APERTURA_MAX
            and r.inizio < prima_risposta]


APERTURA_MAX = 16  # tokens a new prompt may share with any other: the chat template's opening, a few on gemma-3


def righe_conversazioni(prova: Prova) -> List[str]:
    e, piano_oltre, utenti = prova.esecuzione, oltre(prova.piano), prova.piano.parallele
    stream = any(oltre(r).chunk_s is not None for r in e.riuscite)
    condiviso = " condivisi fra gli slot (--kv-unified)" if kv_condivisa(prova) else " per slot"
    testa = ["turno", "riuscite", "token di prompt", "dalla cache", "latenza media"] + ["primo token"] * stream
    larghezze = [len(t) for t in testa]
    righe = [f"conversazioni: {quante(utenti, 'utente', 'utenti')} da {quante(piano_oltre.turni, 'turno', 'turni')}"
             + (f", prompt di sistema di {piano_oltre.sistema} token" if piano_oltre.sistema else "")
             + f"; contesto {fmt(prova.info.n_ctx_slot, 'd')} token{condiviso}",
             in_colonne(testa, larghezze, "  ")]
    for turno in range(1, piano_oltre.turni + 1):
        ok = [r for r in e.riuscite if oltre(r).turno == turno]
        cache = [r.token_cache for r in ok if r.token_cache is not None]
        prompt = da_a([r.token_prompt for r in ok if r.token_prompt is not None])
        primi = [oltre(r).primo_token for r in ok if oltre(r).primo_token is not None]
        celle = [str(turno), f"{len(ok)}/{utenti}", prompt, fmt(media(cache), ".0f"),
                 fmt(media([r.latenza for r in ok]), ".2f s"), fmt(media(primi), ".2f s")]
        righe.append(in_colonne(celle[:len(testa)], larghezze, "  "))
    for utente in range(utenti):
        suoi = [r for r in e.risultati if oltre(r).conversazione == utente]
        if suoi and not (ultimo := suoi[-1]).riuscita:
            perche = PERCHE_FINITO.get(contesto_finito(ultimo), "è fallito")
            righe.append(f"  utente {utente}: fermo al turno {oltre(ultimo).turno}, {perche}: {ultimo.errore}")
        troncati = [r for r in suoi if r.riuscita and r.finish_reason == "length" and r.token is not None
                    and r.token < prova.piano.max_token]
        for r in troncati:  # "length" before --token: the slot's context ended
            righe.append(f"  utente {utente}: al turno {oltre(r).turno} la risposta si è fermata a {r.token} token di "
                         f"{prova.piano.max_token}" + (": lo slot era pieno" if tagliata_dal_contesto(r, prova) else "")
                         + " (finish_reason length)")
    if ereditata := cache_ereditata(prova):
        righe.append(f"  al turno 1 {quante(len(ereditata), 'richiesta ha', 'richieste hanno')} preso dalla cache "
                     f"{da_a([r.token_cache for r in ereditata])} token prima che questa prova avesse una "
                     "risposta. Vengono da una prova precedente sullo stesso server: quei turni ne escono più veloci. "
                     "Per una prova da zero riavvia il server")
    letture = letture_contesto(prova)
    if any(contesto_finito(r) == "kv" for r in e.risultati) and any(c.occupati for c in letture):
        chiesti, n_ctx = max(map(somma, (c.contesto for c in letture))), letture[0].contesto[0][1]
        righe.append(f"  il buffer condiviso: le letture di /slots hanno visto gli slot chiedergli insieme fino a "
                     f"{chiesti} token di {n_ctx} ({chiesti / n_ctx:.0%})")
    in_fondo = len({oltre(r).conversazione for r in e.riuscite if oltre(r).turno == piano_oltre.turni})
    finite = sum(1 for r in e.risultati if contesto_finito(r))
    righe.append(f"  arrivate all'ultimo turno: {in_fondo} su {utenti}" + (
        f"; {quante(finite, 'richiesta non è entrata', 'richieste non sono entrate')} nel contesto" if finite else ""))
    return righe


# What the server decided: its log, read with --avvia ###########################################

class Decisioni(NamedTuple):
    """What the server said at start-up it decided; None where its log is silent."""
    n_slot: Optional[int] = None
    n_ctx_slot: Optional[int] = None
    kv_unificata: Optional[bool] = None
    cache_kv: tuple = ()  # each KV cache: (its name, MiB, cells, layers), printed at -lv 4
    n_thread: Optional[int] = None  # the threads it decodes on (its -t, or as many as the cores it sees)

    @property
    def kv_mib(self) -> Optional[float]:
        return sum(c[1] for c in self.cache_kv) if self.cache_kv else None


def leggi_decisioni(log: str) -> Decisioni:
    import re

    scelta = re.search(r"n_slots = (\d+), n_ctx_slot = (\d+), kv_unified = '(\w+)'", log)
    cache, nome = [], "KV"
    for riga in log.splitlines():
        creata = re.search(r"creating\s+(\S+) KV cache", riga)
        misura_kv = re.search(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers", riga)
        if creata:
            nome = creata.group(1)
        elif misura_kv:
            cache.append((nome, float(misura_kv.group(1)), int(misura_kv.group(2)), int(misura_kv.group(3))))
            nome = "KV"
    scelte = (int(scelta[1]), int(scelta[2]), scelta[3] == "true") if scelta else (None, None, None)
    thread = re.search(r"n_threads = (\d+)", log)
    return Decisioni(*scelte, tuple(cache), thread and int(thread[1]))


def riga_decisioni(configurazione: Configurazione, d: Decisioni) -> str:
    kv = ND if d.kv_unificata is None else str(d.kv_unificata).lower()
    return (f"il server (-np {configurazione.etichetta}) ha deciso, dal suo log: {fmt(d.n_slot, 'd')} slot, "
            f"n_ctx per slot {fmt(d.n_ctx_slot, 'd')}, kv_unified {kv}, cache KV {fmt(d.kv_mib, '.2f MiB')}")


def con_contesto(comando: List[str], n_ctx: int) -> List[str]:
    return senza_opzione(comando, CONTESTO) + ["-c", str(n_ctx)]


CONVERSAZIONI_RAM, TOKEN_RAM = 4, 4096  # the lab's question: 4 conversations of 4096 tokens each


def da_confrontare(prove: List[Prova]) -> Optional[Configurazione]:
    """The RAM question's reference."""
    avviate = [p.configurazione for p in prove if p.configurazione and p.configurazione.deciso]
    return next((c for c in avviate if c.np == CONVERSAZIONI_RAM), avviate[0]) if avviate else None


# The question's own servers: -np 4 at -c 16384, each slot 4096; and the same with one shared buffer.
SERVER_RAM = (Configurazione(CONVERSAZIONI_RAM), Configurazione(CONVERSAZIONI_RAM, kv_unificata=True))


def misura_ram(opzioni: Opzioni, prima: Configurazione) -> Tuple[List[Tuple[Configurazione, Optional[Decisioni]]], str]:
    if prima.deciso.kv_mib is None:
        return [], "il log del server non scrive la cache KV (questo llama.cpp la scrive da -lv 4)"
    comando, misurate, perche = con_contesto(opzioni.oltre.avvia, CONVERSAZIONI_RAM * TOKEN_RAM), [], ""
    for configurazione in SERVER_RAM:
        try:
            with ServerAvviato(comando, configurazione, opzioni.url, opzioni.attesa_pronto, sys.stderr) as server:
                misurate.append((configurazione, server.decisioni()))
        except ErroreUtente as exc:
            misurate.append((configurazione, None))
            perche = perche or (f"il server non è partito con {' '.join(configurazione.argomenti())} -c "
                                f"{CONVERSAZIONI_RAM * TOKEN_RAM}: {str(exc).splitlines()[0]}")
    return misurate, perche


def righe_ram(prima: Configurazione, misurate: List[Tuple[Configurazione, Optional[Decisioni]]],
              perche_nd: str) -> List[str]:
    """The lab's RAM question, measured (SWA caches do not scale)."""
    d, chiesto = prima.deciso, CONVERSAZIONI_RAM * TOKEN_RAM
    n_ctx = None if d.n_ctx_slot is None else d.n_ctx_slot * (1 if d.kv_unificata else d.n_slot or 1)
    righe = [f"La domanda del lab: {CONVERSAZIONI_RAM} conversazioni da {TOKEN_RAM} token.",
             f"  Servono -c {chiesto}: {CONVERSAZIONI_RAM} slot da {TOKEN_RAM} (-np {CONVERSAZIONI_RAM}), o lo stesso "
             f"-c con --kv-unified, dove però le conversazioni si contendono un solo buffer."]
    nd = f"n/d ({perche_nd or 'il log del server non la scrive'})"
    if not any(g is not None and g.kv_mib is not None for _, g in misurate) or not n_ctx or not d.kv_mib:
        return righe + [f"  La cache KV: {nd}."]
    righe.append(f"  La cache KV, misurata: il server di questa sessione (-np {prima.etichetta}, -c {n_ctx}) ha allocato "
                 f"{d.kv_mib:.2f} MiB; avviato con -c {chiesto}:")
    ferme = []  # SWA caches that did not grow
    for c, g in misurate:
        nome_server = " ".join(c.argomenti())
        if g is None or g.kv_mib is None:
            righe.append(f"    {nome_server}: {nd}")
            continue
        righe.append(f"    {nome_server}: {g.kv_mib:.2f} MiB ({g.kv_mib - d.kv_mib:+.2f} MiB, x{g.kv_mib / d.kv_mib:.1f}"
                     f" per x{chiesto / n_ctx:g} token di contesto)")
        globali = max((celle for nome, _, celle, _ in g.cache_kv if nome != "SWA"), default=None)
        for nome, mib, celle, strati in g.cache_kv:
            righe.append(f"      cache {nome} ({strati} strati): {mib:.2f} MiB, {celle} celle per flusso")
            if nome == "SWA" and globali and celle < 0.9 * globali:
                ferme.append(f"con {nome_server} la cache SWA ({strati} strati) si ferma a {celle} celle")
        if (c.np, c.kv_unificata) == (prima.np, prima.kv_unificata) and chiesto > n_ctx:  # only -c differs
            in_piu = (g.kv_mib - d.kv_mib) * 1024 / (chiesto - n_ctx)  # KiB per token
            righe.append(f"      per token di contesto: {d.kv_mib * 1024 / n_ctx:.1f} KiB in media a -c {n_ctx}; ogni "
                         f"token in più fino a -c {chiesto} ne costa {in_piu:.1f} KiB (la differenza fra i due avvii)")
    if ferme:
        righe.append(f"  Non cresce come il contesto: {'; '.join(ferme)}. Quegli strati guardano solo una "
                     "finestra scorrevole degli ultimi token; cresce la cache degli strati che guardano tutto il "
                     "contesto. Per questo la cifra è misurata e non moltiplicata.")
    return righe


if __name__ == "__main__":
    sys.exit(main())
