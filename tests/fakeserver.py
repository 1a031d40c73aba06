"""A fake llama.cpp server, faithful where carico.py can tell (see ../shared/llama-server-api.md).

N slots and an unbounded FIFO deferred queue; a per-token time that grows with the number of busy
slots (the cores are shared, as on a CPU); `usage` and `timings` in every answer; /health, /slots,
/props and /metrics; 400 exceed_context_size_error when a slot takes a prompt that does not fit;
501 for a disabled endpoint; 503 while "loading"; 401 without the API key. Streams are sent as
server-sent events in chunked transfer encoding, as llama.cpp sends them, and a request whose
client closes the connection stops generating and frees its slot, as llama.cpp's does. `override`
replaces any path with a scripted handler, for the faults a real server cannot stage on demand.

The context, as this llama.cpp version handles it (measured): a free slot is picked by the longest
common prefix with its last prompt; /slots' `n_prompt_tokens` of a busy slot counts the prompt and
the tokens decoded so far; an answer that reaches the slot's context stops there (finish_reason
length); with --kv-unified, when the busy slots together outgrow the shared buffer, every request in
flight fails with 500 "Context size has been exceeded."; /tokenize counts with the stand-in rule.
"""

import dataclasses
import json
import re
import select
import socket
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Dict, List, Optional

TEMPLATE_TOKENS = 11  # what the chat template adds to a prompt, as in the lab's step 4
APERTURA_TEMPLATE = 4  # the template's opening, the same for every prompt: what the cache reuses of a new one


def conta_token(testo: str) -> int:
    """A stand-in tokenizer: one token per word or punctuation mark."""
    return len(re.findall(r"\w+|[^\w\s]", testo))


def pezzi_token(testo: str) -> List[str]:
    """The stand-in tokenizer's pieces: each word or mark with the blanks before it (joined, the text)."""
    return re.findall(r"\s*(?:\w+|[^\w\s])", testo)


KV_KIB_PER_CELLA_E_STRATO = 1  # the fake's KV cache: 1 KiB per cell per layer, as gemma-3-270m's f16 cache


@dataclasses.dataclass
class Config:
    n_slot: int = 1
    n_ctx: int = 2048  # total, split among the slots unless kv_unified
    kv_unified: bool = False
    s_per_token: float = 0.005  # one generation step with one busy slot
    s_per_prompt_token: float = 0.0002
    slots: bool = True  # False = --no-slots
    metrics: bool = False
    api_key: Optional[str] = None
    loading_s: float = 0.0  # answers 503 "Loading model" for this long after start
    alias: str = "fake-model"
    eos_dopo: Optional[int] = None  # the model's answer ends (EOS, finish_reason stop) after this many tokens
    rispetta_ignore_eos: bool = True  # False: a server that ignores the request's ignore_eos
    rispetta_cache_prompt: bool = True  # False: a server that reuses its prompt cache even when asked not to
    ritardo_ingresso: float = 0.0  # seconds a chat request spends read but not yet queued (in neither count)
    tiene_le_richieste: bool = True  # False: no prompts and bodies kept (a run of 10,000 long prompts)
    lunghezze: Optional[List[int]] = None  # with tiene_le_richieste False: each chat prompt's token count
    # As llama-cpp-python's server (measured, see llama-server-api.md): a stream ended early with `data: [DONE]`
    # after this many tokens and no finish_reason in any chunk; and streams with neither usage nor timings.
    flusso_interrotto_dopo: Optional[int] = None
    usage_nei_flussi: bool = True
    # Stopped mid-run, as llama serve on Ctrl+C (measured): at the N-th chat request the listener closes (new
    # connections refused) and the requests in flight are never answered, their connections left open;
    # with spegni_uccidendo, as a killed server: their connections reset.
    spegni_dopo: Optional[int] = None
    spegni_uccidendo: bool = False
    # Another OpenAI-compatible server, as llama-cpp-python 0.3.36's (measured): 404 on every llama.cpp endpoint
    # (/health, /slots, /props, /metrics, /tokenize), no timings, usage only in answers not streamed, the
    # tokenizer at /extras/tokenize (ids, the BOS first) with /extras/detokenize, any `model` echoed back.
    # Its chat that answers 0 tokens and ignores ignore_eos: eos_dopo=0, rispetta_ignore_eos=False.
    altro_server: bool = False
    # The share of a decode step that each busy slot adds: 0.5, two slots decode 1.33 times as fast as one; 0.1,
    # 1.8 times (a GPU's batch), a gain that a loaded machine's noise cannot hide.
    quota_per_slot: float = 0.5

    @property
    def n_ctx_slot(self) -> int:
        return self.n_ctx if self.kv_unified else self.n_ctx // self.n_slot


@dataclasses.dataclass
class Slot:
    id: int
    busy: bool = False
    id_task: Optional[int] = None
    n_prompt: int = 0
    n_cache: int = 0  # of n_prompt, the tokens reused from the slot's cache
    n_decoded: int = 0
    n_remain: int = 0
    parole: Optional[List[str]] = None  # the last prompt's words: what its prompt cache holds


class ServerHTTP(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        """A client gone mid-answer (the tests stop clients and servers mid-run) is not the fake's error: no
        traceback on the stderr that the tests read for carico.py's own."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeLlama:
    def __init__(self, config: Optional[Config] = None, override: Optional[Dict[str, Callable]] = None,
                 indirizzo=("127.0.0.1", 0)):
        self.config = config or Config()
        self.override = dict(override or {})
        self.slots = [Slot(i) for i in range(self.config.n_slot)]
        self.coda = deque()  # deferred tickets, FIFO
        self.cond = threading.Condition()
        self.prompts: List[str] = []  # every chat prompt received, in arrival order
        self.bodies: List[dict] = []
        self.richieste_ricevute: List[tuple] = []  # (path, headers) of every request, in arrival order
        self.abbandonate = 0  # chat requests stopped because the client closed the connection
        self.tokens_predicted_total = 0
        self.prompt_tokens_total = 0
        self.n_task = 0
        self.picco_occupati = 0
        self.registro: Optional[str] = None  # a file that gets each chat prompt, one JSON string a line
        self.arrivi: List[float] = []  # time.perf_counter() when each chat request's headers were read
        self.in_volo = 0  # chat requests queued or in a slot
        self.picco_in_volo = 0
        self.kv_esaurito = 0  # --kv-unified: how many times the busy slots outgrew the shared buffer
        self.letture_slots: List[list] = []  # every /slots answer it gave, in order
        self.inizio = time.monotonic()
        self.spento, self.chiuso = threading.Event(), threading.Event()  # see Config.spegni_dopo; close()
        self.pezzi_per_id: Dict[int, str] = {}  # Config.altro_server: what /extras/detokenize gives back
        ThreadingHTTPServer.request_queue_size = 256  # 64 clients connect at once in the large run
        self.server = ServerHTTP(indirizzo, self._handler_class())
        self.server.daemon_threads = True
        self.server.fake = self  # scripted handlers reach the fake through h.server.fake
        # A short poll: shutdown() waits for it, and the tests start and stop many servers.
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    # lifecycle
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.chiuso.set()
        self.server.shutdown()
        self.server.server_close()

    def spegni(self):
        """The listener closes at once (Config.spegni_dopo); the handlers in flight see `spento`."""
        self.spento.set()
        self.server.shutdown()
        self.server.server_close()

    # scheduling
    def occupati(self) -> int:
        return sum(s.busy for s in self.slots)

    def prendi_slot(self, parole: Optional[List[str]] = None) -> Slot:
        with self.cond:
            ticket = object()
            self.coda.append(ticket)
            while not (self.coda[0] is ticket and any(not s.busy for s in self.slots)):
                self.cond.wait()
            self.coda.popleft()
            # The free slot whose last prompt shares the longest prefix with this one, as llama.cpp picks.
            slot = max((s for s in self.slots if not s.busy), key=lambda s: comune(parole or [], s.parole or []))
            slot.busy = True
            self.n_task += 1
            slot.id_task, slot.n_prompt, slot.n_decoded = self.n_task, 0, 0
            self.picco_occupati = max(self.picco_occupati, self.occupati())
            self.cond.notify_all()
            return slot

    def kv_pieno(self) -> bool:
        """--kv-unified: the busy slots hold more tokens together than the shared buffer (-c)."""
        if not self.config.kv_unified:
            return False
        with self.cond:
            if sum(s.n_prompt + s.n_decoded for s in self.slots if s.busy) > self.config.n_ctx:
                self.kv_esaurito += 1
            return self.kv_esaurito > 0

    def lascia_slot(self, slot: Slot):
        with self.cond:
            slot.busy = False
            self.in_volo -= 1  # before the answer is written: the client may send the next one at once
            self.cond.notify_all()

    def completa(self, body: dict, al_token: Optional[Callable[[int], None]] = None,
                 all_avvio: Optional[Callable[[], None]] = None, chiusa: Callable[[], bool] = lambda: False):
        """(status, json) for a chat completion, after waiting for a slot like the real server.
        `all_avvio()` is called when a slot takes the request, `al_token(i)` after each token:
        the streaming handler sends its headers and chunks from there. When `chiusa()` says the
        client went away, generation stops and the slot is freed: (None, None)."""
        contenuto = " ".join(m.get("content", "") for m in body.get("messages", []))
        if self.config.tiene_le_richieste:
            self.prompts.append(contenuto)
        if self.registro:  # run as a process: what it was asked, for the test to read
            with open(self.registro, "a", encoding="utf-8") as f:
                f.write(json.dumps(contenuto) + "\n")
        n_prompt = conta_token(contenuto) + TEMPLATE_TOKENS
        if self.config.lunghezze is not None:
            self.config.lunghezze.append(n_prompt - TEMPLATE_TOKENS)
        max_tokens = body.get("max_tokens", body.get("n_predict", 16))
        finish = "length"
        if self.config.eos_dopo is not None and self.config.eos_dopo < max_tokens and not (
                body.get("ignore_eos") and self.config.rispetta_ignore_eos):
            max_tokens, finish = self.config.eos_dopo, "stop"
        with self.cond:
            self.in_volo += 1
            self.picco_in_volo = max(self.picco_in_volo, self.in_volo)
        parole = re.findall(r"\w+|[^\w\s]", contenuto)
        slot = self.prendi_slot(parole)
        try:
            if n_prompt >= self.config.n_ctx_slot:
                return 400, {"error": {
                    "code": 400, "type": "exceed_context_size_error",
                    "message": f"request ({n_prompt} tokens) exceeds the available context size "
                               f"({self.config.n_ctx_slot} tokens), try increasing it",
                    "n_prompt_tokens": n_prompt, "n_ctx": self.config.n_ctx_slot}}
            if all_avvio:
                all_avvio()
            # The prompt cache, as llama.cpp's: the common prefix with the slot's last prompt (the
            # template's opening at least), and all but the last token of the same prompt again.
            cache_n = 0
            if slot.parole is not None and (body.get("cache_prompt", True) or not self.config.rispetta_cache_prompt):
                comuni = comune(parole, slot.parole)
                cache_n = min(n_prompt - 1, APERTURA_TEMPLATE + comuni if comuni < len(parole) else n_prompt - 1)
            slot.parole = parole
            # An answer stops where the slot's context ends (finish_reason length), as llama.cpp's does.
            if n_prompt + max_tokens > self.config.n_ctx_slot:
                max_tokens, finish = self.config.n_ctx_slot - n_prompt, "length"
            slot.n_prompt, slot.n_cache, slot.n_remain = n_prompt, cache_n, max_tokens
            t0 = time.perf_counter()
            time.sleep((n_prompt - cache_n) * self.config.s_per_prompt_token)  # what the cache holds is not computed
            t1 = time.perf_counter()
            for i in range(max_tokens + 1):
                if self.kv_pieno():  # every request in flight fails, as this llama.cpp version does
                    return 500, {"error": {"code": 500, "message": "Context size has been exceeded.",
                                           "type": "server_error"}}
                if i == max_tokens:
                    break
                if self.spento.is_set():  # stopped: a killed server resets; one stopped with Ctrl+C never answers
                    if self.config.spegni_uccidendo:
                        return "reset", None
                    self.chiuso.wait()
                    return None, None
                if chiusa():
                    with self.cond:
                        self.abbandonate += 1
                    return None, None
                # One decode step costs more when more sequences share the cores.
                time.sleep(self.config.s_per_token * (1 - self.config.quota_per_slot + self.config.quota_per_slot * self.occupati()))
                slot.n_decoded += 1
                slot.n_remain -= 1
                if al_token:
                    al_token(i)
            t2 = time.perf_counter()
            with self.cond:
                self.tokens_predicted_total += max_tokens
                self.prompt_tokens_total += n_prompt
            prompt_ms, predicted_ms = (t1 - t0) * 1000, (t2 - t1) * 1000
            velocita = max_tokens / max(t2 - t1, 1e-9)
            if max_tokens == 1:  # as llama.cpp: the one token is sampled with the prompt, no step to time
                prompt_ms, predicted_ms, velocita = (t2 - t0) * 1000, 0.001, 0.0
            risposta = {
                "choices": [{"finish_reason": finish, "index": 0,
                             "message": {"role": "assistant", "content": " ".join(["parola"] * max_tokens)}}],
                "created": int(time.time()), "model": self.config.alias, "object": "chat.completion",
                "system_fingerprint": "b0-fake", "id": f"chatcmpl-{slot.id_task}",
                "usage": {"completion_tokens": max_tokens, "prompt_tokens": n_prompt,
                          "total_tokens": n_prompt + max_tokens, "prompt_tokens_details": {"cached_tokens": cache_n}},
                "timings": {"cache_n": cache_n, "prompt_n": n_prompt - cache_n, "prompt_ms": prompt_ms,
                            "prompt_per_token_ms": prompt_ms / n_prompt,
                            "prompt_per_second": n_prompt / max(t1 - t0, 1e-9),
                            "predicted_n": max_tokens, "predicted_ms": predicted_ms,
                            "predicted_per_token_ms": predicted_ms / max(max_tokens, 1),
                            "predicted_per_second": velocita},
            }
            if self.config.altro_server:
                del risposta["timings"]
                risposta["model"] = body.get("model", self.config.alias)
            return 200, risposta
        finally:
            self.lascia_slot(slot)
            with self.cond:
                if not any(s.busy for s in self.slots):
                    self.kv_esaurito = 0  # the buffer is free again

    def json_slots(self):
        with self.cond:
            out = []
            for s in self.slots:
                d = {"id": s.id, "n_ctx": self.config.n_ctx_slot, "speculative": False, "is_processing": s.busy}
                if s.id_task is not None:
                    # As this llama.cpp version: n_prompt_tokens of a busy slot counts the decoded tokens too.
                    d.update(id_task=s.id_task, n_prompt_tokens=s.n_prompt + s.n_decoded * s.busy,
                             n_prompt_tokens_processed=s.n_prompt - s.n_cache, n_prompt_tokens_cache=s.n_cache,
                             params={"n_predict": -1},
                             next_token=[{"has_next_token": s.busy, "has_new_line": False,
                                          "n_remain": s.n_remain, "n_decoded": s.n_decoded}])
                out.append(d)
            self.letture_slots.append(out)
            return out

    def id_pezzo(self, pezzo: str) -> int:
        """The stand-in tokenizer's id of a piece (as /tokenize gives it), remembered for /extras/detokenize."""
        i = 2 + sum(map(ord, pezzo)) % 262144  # 0 and 1 stay free: 1 is the BOS
        self.pezzi_per_id[i] = pezzo
        return i

    def json_props(self):
        return {"default_generation_settings": {"n_ctx": self.config.n_ctx_slot, "params": {}},
                "total_slots": self.config.n_slot, "model_alias": self.config.alias,
                "model_path": "/modelli/fake.gguf", "build_info": "b0-fake",
                "endpoint_slots": self.config.slots, "endpoint_metrics": self.config.metrics}

    def testo_metrics(self) -> str:
        with self.cond:
            valori = {"prompt_tokens_total": self.prompt_tokens_total,
                      "tokens_predicted_total": self.tokens_predicted_total,
                      "requests_processing": self.occupati(), "requests_deferred": len(self.coda)}
        righe = []
        for nome, valore in valori.items():
            righe += [f"# HELP llamacpp:{nome} fake", f"# TYPE llamacpp:{nome} gauge", f"llamacpp:{nome} {valore}"]
        return "\n".join(righe) + "\n"

    # HTTP
    def _handler_class(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def version_string(self):
                return "llama.cpp"  # its `Server` header

            def end_headers(self):
                # As llama.cpp (cpp-httplib) answers: `Connection: close` to a client that asked for it (carico
                # always does), and then the connection closes; else Keep-Alive.
                self.send_header("Access-Control-Allow-Origin", "")
                if (self.headers.get("Connection") or "").lower() == "close":
                    self.send_header("Connection", "close")  # BaseHTTPRequestHandler closes after the answer
                else:
                    self.send_header("Keep-Alive", "timeout=5, max=100")
                super().end_headers()

            def send_json(self, status, dati):
                corpo = json.dumps(dati).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(corpo)))
                self.end_headers()
                self.wfile.write(corpo)

            def scrivi_chunk(self, dati: bytes):
                """One piece of a chunked body (an empty one ends it)."""
                self.wfile.write(chunk(dati))
                self.wfile.flush()

            def evento(self, dati):
                self.scrivi_chunk(b"data: " + json.dumps(dati).encode() + b"\n\n")

            def chiusa(self) -> bool:
                """The client closed its side: the socket is readable and has nothing left to read."""
                try:
                    pronto, _, _ = select.select([self.connection], [], [], 0)
                    return bool(pronto) and self.connection.recv(1, socket.MSG_PEEK) == b""
                except OSError:
                    return True

            def stream(self, body):
                """Server-sent events in chunked encoding; headers only once a slot takes the request,
                as llama.cpp does."""
                avviato = []

                def avvio():
                    avviato.append(True)
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    self.evento({"choices": [{"index": 0, "finish_reason": None,
                                              "delta": {"role": "assistant", "content": None}}]})

                def token(i):
                    if fake.config.flusso_interrotto_dopo is not None and i >= fake.config.flusso_interrotto_dopo:
                        raise Interrotto
                    self.evento({"choices": [{"index": 0, "finish_reason": None, "delta": {"content": "parola "}}]})

                try:
                    status, dati = fake.completa(body, token, avvio, self.chiusa)
                except Interrotto:  # ended early: [DONE], and no chunk ever said why
                    self.scrivi_chunk(b"data: [DONE]\n\n")
                    return self.scrivi_chunk(b"")
                if status == "reset":
                    return chiudi_di_colpo(self)
                if status is None:
                    return
                if status != 200 and avviato:  # an error after the headers: inside the stream, no [DONE]
                    self.evento({"error": dati["error"]})
                    return self.scrivi_chunk(b"")
                if status != 200:
                    return self.send_json(status, dati)
                self.evento({"choices": [{"index": 0, "finish_reason": dati["choices"][0]["finish_reason"], "delta": {}}]})
                if fake.config.usage_nei_flussi and not fake.config.altro_server:  # another server: no usage in a stream
                    self.evento({"choices": [], "usage": dati["usage"], "timings": dati["timings"]})
                self.scrivi_chunk(b"data: [DONE]\n\n")
                self.scrivi_chunk(b"")

            def errore(self, status, tipo, messaggio):
                self.send_json(status, {"error": {"code": status, "message": messaggio, "type": tipo}})

            def rispondi(self):
                arrivo = time.perf_counter()
                percorso = self.path.split("?")[0]
                fake.richieste_ricevute.append((percorso, dict(self.headers)))
                lunghezza = int(self.headers.get("Content-Length") or 0)
                corpo = self.rfile.read(lunghezza) if lunghezza else b""
                if percorso in fake.override:
                    return fake.override[percorso](self, corpo)
                cfg = fake.config
                if cfg.altro_server and percorso in ("/health", "/v1/health", "/slots", "/props", "/metrics", "/tokenize"):
                    return self.send_json(404, {"detail": "Not Found"})
                if cfg.altro_server and percorso in ("/extras/tokenize", "/extras/detokenize") and self.command == "POST":
                    body = json.loads(corpo or b"{}")
                    if percorso == "/extras/tokenize":  # ids only, the BOS (1) first, as llama-cpp-python's
                        return self.send_json(200, {"tokens": [1] + [fake.id_pezzo(p) for p in pezzi_token(body["input"])]})
                    return self.send_json(200, {"text": "".join(fake.pezzi_per_id.get(i, "") for i in body["tokens"])})
                if time.monotonic() - fake.inizio < cfg.loading_s:
                    return self.errore(503, "unavailable_error", "Loading model")
                if percorso in ("/health", "/v1/health"):
                    return self.send_json(200, {"status": "ok"})
                if cfg.api_key is not None:
                    chiave = (self.headers.get("Authorization") or "").replace("Bearer ", "", 1)
                    if chiave != cfg.api_key:
                        return self.errore(401, "authentication_error", "Invalid API Key")
                if percorso == "/slots":
                    if not cfg.slots:
                        return self.errore(501, "not_supported_error",
                                           "This server does not support slots endpoint. Start it with `--slots`")
                    return self.send_json(200, fake.json_slots())
                if percorso == "/props":
                    return self.send_json(200, fake.json_props())
                if percorso == "/v1/models":  # llama.cpp's: the alias
                    return self.send_json(200, {"object": "list", "data": [{"id": cfg.alias, "object": "model"}]})
                if percorso == "/tokenize" and self.command == "POST":
                    body = json.loads(corpo or b"{}")
                    pezzi = pezzi_token(body.get("content", ""))
                    ids = [sum(map(ord, p.strip())) % 262144 for p in pezzi]
                    return self.send_json(200, {"tokens": [{"id": i, "piece": p} for i, p in zip(ids, pezzi)]
                                                if body.get("with_pieces") else ids})
                if percorso == "/metrics":
                    if not cfg.metrics:
                        return self.errore(501, "not_supported_error",
                                           "This server does not support metrics endpoint. Start it with `--metrics`")
                    testo = fake.testo_metrics().encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(testo)))
                    self.end_headers()
                    return self.wfile.write(testo)
                if percorso in ("/v1/chat/completions", "/chat/completions") and self.command == "POST":
                    fake.arrivi.append(arrivo)
                    if cfg.spegni_dopo is not None and len(fake.arrivi) >= cfg.spegni_dopo and not fake.spento.is_set():
                        fake.spegni()
                    try:
                        body = json.loads(corpo)
                    except ValueError:
                        return self.errore(400, "invalid_request_error", "invalid JSON")
                    if cfg.tiene_le_richieste:
                        fake.bodies.append(body)
                    time.sleep(cfg.ritardo_ingresso)
                    if body.get("stream"):
                        return self.stream(body)
                    status, dati = fake.completa(body, chiusa=self.chiusa)
                    if status == "reset":
                        return chiudi_di_colpo(self)
                    if status is not None:
                        self.send_json(status, dati)
                    return None
                return self.errore(404, "not_found_error", "File Not Found")

            do_GET = do_POST = rispondi

        return Handler


class Interrotto(Exception):
    """Raised from a stream's token callback: the fake ends that stream early (Config.flusso_interrotto_dopo)."""


def comune(a: List[str], b: List[str]) -> int:
    """How many words two prompts share from the start."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def righe_kv(config: Config, swa: bool = True) -> List[str]:
    """The KV cache lines llama.cpp prints at -lv 4, with gemma-3-270m's shapes: a global cache of 3
    layers that grows with the context, a sliding-window one of 15 that stops at 1024 cells a stream
    (without `swa`: one cache of 18 layers, all global, as a model without sliding windows)."""
    flussi = 1 if config.kv_unified else config.n_slot
    celle_globali = config.n_ctx_slot
    # llama.cpp's SWA cache per stream: the window (512 on gemma-3-270m) per sequence it holds, plus a batch (512)
    celle_swa = min(celle_globali, 512 * (config.n_slot if config.kv_unified else 1) + 512)
    cache = (("non-SWA", celle_globali, 3), ("    SWA", celle_swa, 15)) if swa else (("", celle_globali, 18),)
    righe = []
    for nome, celle, strati in cache:
        mib = celle * flussi * strati * KV_KIB_PER_CELLA_E_STRATO / 1024
        righe += [f"llama_kv_cache_iswa: creating {nome} KV cache, size = {celle} cells"] * swa + [
                  f"llama_kv_cache: size = {mib:7.2f} MiB ({celle:6d} cells, {strati:3d} layers, "
                  f"{config.n_slot:2d}/{flussi} seqs), K (f16): {mib / 2:7.2f} MiB, V (f16): {mib / 2:7.2f} MiB"]
    return righe


def chunk(dati: bytes) -> bytes:
    """One piece of a body in chunked transfer encoding (an empty one ends the body)."""
    return b"%x\r\n%s\r\n" % (len(dati), dati)


def chiudi_di_colpo(h: BaseHTTPRequestHandler) -> None:
    """Connection reset: RST instead of an answer, as the kernel does for a killed process."""
    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    h.connection.close()
    h.close_connection = True


def risposta_grezza(status: int, corpo: bytes, tipo: str = "text/html", lunghezza: Optional[int] = None):
    """A scripted handler that answers `corpo` with a declared Content-Length (which may lie)."""
    def handler(h: BaseHTTPRequestHandler, _richiesta: bytes):
        h.send_response(status)
        h.send_header("Content-Type", tipo)
        h.send_header("Content-Length", str(len(corpo) if lunghezza is None else lunghezza))
        h.end_headers()
        h.wfile.write(corpo)
        h.wfile.flush()
        h.close_connection = True
    return handler


def flusso_scritto(*eventi: bytes, finito: bool = False):
    """A scripted handler that streams `eventi` (each a whole `data: ...` event) in chunked encoding,
    then closes: with `finito` after the last chunk, else before it, as a server that died would."""
    def handler(h: BaseHTTPRequestHandler, _richiesta: bytes):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for evento in eventi + ((b"",) if finito else ()):
            h.wfile.write(chunk(evento))
        h.wfile.flush()
        h.close_connection = True
    return handler


def main(argv=None):
    """Run the fake as a process, with llama serve's flags: what --avvia starts in the tests."""
    import argparse
    import os

    parser = argparse.ArgumentParser()
    parser.add_argument("serve", nargs="?")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("-np", type=int, default=-1)  # auto, as llama.cpp: 4 slots and --kv-unified
    parser.add_argument("-lv", type=int, default=3)  # 4 or more: the KV cache lines too
    parser.add_argument("--senza-swa", action="store_true", help="a model without sliding-window layers")
    parser.add_argument("-c", type=int, default=2048)
    parser.add_argument("-t", "--threads", type=int, help="ignored: the fake's pace is --s-per-token")
    parser.add_argument("--kv-unified", action="store_true")
    parser.add_argument("--s-per-token", type=float, default=0.005)
    parser.add_argument("--loading-s", type=float, default=0.0)
    parser.add_argument("--fallisci", action="store_true", help="print an error and exit 1, like a bad -m")
    parser.add_argument("--muori-dopo", type=int, default=0, help="die (exit 3) at the N-th chat request")
    parser.add_argument("--registro", help="append each chat prompt to this file, one JSON string a line")
    parser.add_argument("--lento-a-fermarsi", type=float, default=0.0, help="seconds it takes to stop on SIGTERM")
    parser.add_argument("--spegni-dopo", type=int, help="stop as on Ctrl+C at the N-th chat request (Config.spegni_dopo)")
    parser.add_argument("--api-key", default=os.environ.get("LLAMA_API_KEY"), help="as llama serve's (or LLAMA_API_KEY)")
    parser.add_argument("--eco", action="store_true", help="log its own arguments and key first, as a server may")
    a = parser.parse_args(argv)
    if a.eco:
        print(f"main: argv: {' '.join(sys.argv)}; api key: {a.api_key}", flush=True)
    if a.fallisci:
        print("error: failed to load model 'manca.gguf'", flush=True)
        return 1
    n_slot = 4 if a.np == -1 else a.np
    config = Config(n_slot=n_slot, n_ctx=a.c, kv_unified=a.kv_unified or a.np == -1,
                    s_per_token=a.s_per_token, loading_s=a.loading_s, spegni_dopo=a.spegni_dopo, api_key=a.api_key)
    for riga in righe_kv(config, not a.senza_swa) if a.lv >= 4 else []:
        print(riga, flush=True)
    print(f"srv    load_model: initializing, n_slots = {n_slot}, n_ctx_slot = {config.n_ctx_slot}, "
          f"kv_unified = '{str(config.kv_unified).lower()}'", flush=True)
    override = {}
    if a.muori_dopo:
        def muori(h, corpo):
            if len(fake.bodies) + 1 >= a.muori_dopo:
                print("GGML_ASSERT failed: fake crash", flush=True)
                os._exit(3)
            fake.bodies.append(json.loads(corpo))
            h.send_json(*fake.completa(fake.bodies[-1]))
        override["/v1/chat/completions"] = muori
    fake = FakeLlama(config, override, indirizzo=(a.host, a.port))
    fake.registro = a.registro
    if a.lento_a_fermarsi:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(a.lento_a_fermarsi), os._exit(0)))
    try:
        fake.server.serve_forever()
    except KeyboardInterrupt:
        pass
    if fake.spento.is_set():  # as llama serve on Ctrl+C: its last line, then it exits once its connections end
        print("srv    operator(): cleaning up before exit...", flush=True)
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    sys.exit(main())
