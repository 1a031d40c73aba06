#!/usr/bin/env python3
"""What carico.py itself costs, and how exact its numbers are: a table of medians.

Run it with `bash bench/run` (installs what it needs, then runs this with the .deps interpreter).
Figures, not pass/fail: each row says the target beside the measure. Needs the real llama.cpp
server and model (scripts/install-real.sh) and, for the scale row, nginx and wrk from Debian.

  3. start-up: `python3 carico.py --help` wall time, against the bare interpreter (measured first)
  1. client CPU in the lab run (4 x 32 tokens, real server, -np 1 and -np 4), share of wall time
  2. CPU per request and requests/s at 1,000 x 64 against a zero-delay server (nginx), beside wrk
  4. accuracy: client latency minus the server's prompt_ms + predicted_ms, for requests that did not queue
  5. the sampler: its real period against 0.5 s, and the peak of busy slots right in N lab runs
  6. aggregate throughput against the server's llamacpp:tokens_predicted_total
  7. scale: 10,000 requests with 256 in flight against the fake server (zero delay): peak RSS, and
     the send lag against the schedule at --ritmo 200
  8. exact prompts (--prompt-token 128,512,1024): the /tokenize calls and the time to prepare them on
     the real server, and the time to cut one prompt as its request leaves
  9. streams at scale: C = 16, 64, 256, 1000 streams of 64 tokens (first after 50 ms, then one every 20 ms)
     from a fake in C (bench/flussi.c, built here with cc) on its own core, carico on the other; carico's
     figures against what the fake really wrote, and the fake's own lateness

     9b. (`--pavimento N`, on its own) the floor under any reader at 1,000 streams: a reader in C and a bare
     Python one (bench/pavimento.c, bench/pavimento.py) in turns with carico, against the same fake
     9c. (`--misti N`, on its own) long answers that end while others stream: 64 streams of 1,000-2,000 tokens
     10 ms apart; the chunks carico timed more than 5 ms off
     9d. (`--limiti N`, on its own) the bound carico states on its own error (docs/flussi.md) against the
     true error, at 256 and 1,000 streams, quiet and beside a busy loop on carico's core

`--solo-flussi` runs row 9 alone (no real server needed).
"""

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

QUI = os.path.dirname(os.path.abspath(__file__))
RADICE = os.path.dirname(QUI)
CARICO = os.environ.get("CARICO_FILE", os.path.join(RADICE, "carico.py"))  # another version, to compare
sys.path[:0] = [RADICE, os.path.join(RADICE, "tests")]

import carico  # noqa: E402
from realserver import ServerReale, porta_libera  # noqa: E402

RIGHE = []  # (measure, median, worst or spread, target)


def mediana(valori):
    v = sorted(valori)
    n = len(v)
    return (v[n // 2] + v[(n - 1) // 2]) / 2


def riga(misura, valore, dettaglio, obiettivo):
    RIGHE.append((misura, valore, dettaglio, obiettivo))
    print(f"  {misura}: {valore}  ({dettaglio})  target {obiettivo}", flush=True)


def dal_prompt(client, piano, info, primo):
    """The lab's run in-process, its prompts from the `primo`-th on: no run reuses another's prompts."""
    return carico.esegui_carico(client, piano, info, lancio=carico.Lancio(client, piano, primo))


def esegui_carico_cli(*argomenti, memoria=False):
    """carico.py as a user runs it: (stdout, wall s, CPU s of that process), and its peak RSS in MB
    when `memoria`."""
    with tempfile.TemporaryFile() as uscita:
        inizio = time.perf_counter()
        proc = subprocess.Popen([sys.executable, CARICO, *argomenti], stdout=uscita, stderr=subprocess.DEVNULL)
        _, _, uso = os.wait4(proc.pid, 0)
        parete = time.perf_counter() - inizio
        uscita.seek(0)
        cifre = (uscita.read().decode(), parete, uso.ru_utime + uso.ru_stime)
        return cifre + (uso.ru_maxrss / 1024,) if memoria else cifre


def cpu_processo():
    uso = resource.getrusage(resource.RUSAGE_SELF)
    return uso.ru_utime + uso.ru_stime


# 1. The client's CPU in the lab run ###########################################################

def cpu_nel_lab(ripetizioni):
    print("1. client CPU in the lab run (real server, 4 requests x 32 tokens)", flush=True)
    for np in (1, 4):
        with ServerReale(np) as server:
            quote, cpu_ms, pareti, quote_carico = [], [], [], []
            for _ in range(ripetizioni):
                out, parete, cpu = esegui_carico_cli("--url", server.url)
                quote.append(cpu / parete)
                cpu_ms.append(cpu * 1000)
                pareti.append(parete)
                # The load alone, in-process: what the client takes while the server works.
                client = carico.Client(server.url)
                il_server = info(client)
                prima, inizio = cpu_processo(), time.perf_counter()
                dal_prompt(client, carico.Piano(4, 4, 32), il_server, 8)
                quote_carico.append((cpu_processo() - prima) / (time.perf_counter() - inizio))
        riga(f"client CPU share of wall, whole process, -np {np}", f"{mediana(quote):.2%}",
             f"{mediana(cpu_ms):.0f} ms CPU in a {mediana(pareti):.2f} s run, start-up included; worst {max(quote):.2%}", "< 1%")
        riga(f"client CPU share of wall, during the load, -np {np}", f"{mediana(quote_carico):.2%}",
             f"worst {max(quote_carico):.2%}", "< 1%")


# 2. At scale, against a zero-delay server #####################################################

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location = /health {{ default_type application/json; return 200 '{{"status":"ok"}}'; }}
    location = /slots {{ default_type application/json; return 200 '[{{"id":0,"n_ctx":512,"is_processing":false}}]'; }}
    location = /v1/chat/completions {{ default_type application/json; return 200 '{risposta}'; }}
    location / {{ return 404; }}
  }}
}}
"""
RISPOSTA = ('{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":"ok"}}],'
            '"usage":{"completion_tokens":1,"prompt_tokens":20,"total_tokens":21},'
            '"timings":{"prompt_n":20,"prompt_ms":0.1,"predicted_n":1,"predicted_ms":0.1,"predicted_per_second":10000}}')


def wrk(url, chiudi):
    argomenti = ["wrk", "-t1", "-c64", "-d3s"] + (["-H", "Connection: close"] if chiudi else []) + [url]
    out = subprocess.run(argomenti, capture_output=True, text=True, timeout=30).stdout
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))


def su_scala(ripetizioni):
    print("2. 1,000 requests at 64 parallel against a zero-delay server (nginx, one worker)", flush=True)
    if not (shutil.which("nginx") and shutil.which("wrk")):
        riga("CPU per request at scale", "n/d", "nginx or wrk missing: apt-get install nginx wrk", "<= 1 ms")
        return
    cartella = tempfile.mkdtemp(prefix="carico-nginx-")
    porta = porta_libera()
    with open(os.path.join(cartella, "nginx.conf"), "w") as f:
        f.write(NGINX_CONF.format(dir=cartella, port=porta, risposta=RISPOSTA))
    nginx = subprocess.Popen(["nginx", "-p", cartella, "-c", os.path.join(cartella, "nginx.conf")],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{porta}"
    try:
        time.sleep(0.5)
        al_secondo, cpu_intero, cpu_carico, al_secondo_carico = [], [], [], []
        for _ in range(ripetizioni):
            out, _, cpu = esegui_carico_cli("--url", url, "--richieste", "1000", "--parallele", "64", "--token", "1")
            assert "richieste=1000" in out and "fallite" not in out, out[-500:]
            al_secondo.append(1000 / float(re.search(r"tempo totale ([\d.]+) s", out).group(1)))
            cpu_intero.append(cpu / 1000 * 1000)
            client = carico.Client(url)
            il_server = info(client)
            prima, inizio = cpu_processo(), time.perf_counter()
            esecuzione = carico.esegui_carico(client, carico.Piano(1000, 64, 1, timeout=60), il_server)
            durata = time.perf_counter() - inizio
            assert all(r.riuscita for r in esecuzione.risultati)
            cpu_carico.append((cpu_processo() - prima) / 1000 * 1000)
            al_secondo_carico.append(1000 / durata)
        client = carico.Client(url)
        senza_slots = carico.InfoServer(None, None, False)  # nothing sampled: the requests alone
        giri = [r.latenza * 1000 for r in carico.esegui_carico(client, carico.Piano(200, 1, 1, timeout=60),
                                                                senza_slots).risultati]
        wrk_chiudi = mediana([wrk(url + "/v1/chat/completions", True) for _ in range(3)])
        wrk_vivo = mediana([wrk(url + "/v1/chat/completions", False) for _ in range(3)])
    finally:
        nginx.terminate()
        nginx.wait()
        shutil.rmtree(cartella, ignore_errors=True)
    riga("CPU per request at 1,000 x 64, during the load", f"{mediana(cpu_carico):.3f} ms",
         f"worst {max(cpu_carico):.3f} ms; whole process incl. start-up {mediana(cpu_intero):.3f} ms", "<= 1 ms")
    riga("requests/s sustained by carico.py", f"{mediana(al_secondo):.0f}",
         f"in-process {mediana(al_secondo_carico):.0f}; worst {min(al_secondo):.0f}", ">= 1500")
    riga("the client's own share of a latency: a whole round trip to the zero-delay server", f"{mediana(giri):.3f} ms",
         f"worst {max(giri):.3f} ms; connect, send, receive, parse", "(part of row 4)")
    riga("wrk -c64 against the same server, new connection per request", f"{wrk_chiudi:.0f} req/s",
         f"carico.py / wrk = {mediana(al_secondo) / wrk_chiudi:.2f}; wrk with keep-alive {wrk_vivo:.0f} req/s",
         "the physical limit")


# 7. Scale: 10,000 requests, 256 in flight ####################################################

def scala(ripetizioni):
    print("7. 10,000 requests with 256 in flight against the fake server (zero delay, 256 slots)", flush=True)
    porta = porta_libera()
    url = f"http://127.0.0.1:{porta}"
    fake = subprocess.Popen([sys.executable, os.path.join(RADICE, "tests", "fakeserver.py"), "serve", "--port",
                             str(porta), "-np", "256", "-c", "65536", "--kv-unified", "--s-per-token", "0"],
                            stdout=subprocess.DEVNULL)
    try:
        while True:
            try:
                carico.Client(url).chiama("GET", "/health")
                break
            except carico.ErroreRete:
                time.sleep(0.1)
        rss, al_secondo = [], []
        for _ in range(ripetizioni):
            out, parete, _, picco = esegui_carico_cli("--url", url, "--richieste", "10000", "--parallele", "256",
                                                      "--token", "1", memoria=True)
            assert "richieste=10000 parallele=256" in out and "fallite" not in out, out[-500:]
            rss.append(picco)
            al_secondo.append(10000 / float(re.search(r"tempo totale ([\d.]+) s", out).group(1)))
        p99, massimi, rss_ritmo = [], [], []
        for k in range(min(3, ripetizioni)):  # 50 s each
            out, _, _, picco = esegui_carico_cli("--url", url, "--ritmo", "200", "--seme", str(k), "--richieste",
                                                 "10000", "--parallele", "256", "--token", "1", memoria=True)
            ritardo = re.search(r"inviate davvero ([\d.]+) req/s; ritardo degli invii sul programma: p99 ([\d.]+) ms, "
                                r"max ([\d.]+) ms", out)
            assert ritardo and "fallite" not in out, out[-500:]
            p99.append(float(ritardo.group(2)))
            massimi.append(float(ritardo.group(3)))
            rss_ritmo.append(picco)
    finally:
        fake.terminate()
        fake.wait()
    riga("peak RSS of carico.py, 10,000 requests x 256 in flight", f"{mediana(rss):.0f} MB",
         f"worst {max(rss):.0f} MB; {mediana(al_secondo):.0f} requests/s", "< 100 MB")
    riga("send lag against the schedule, --ritmo 200, 10,000 requests, p99", f"{mediana(p99):.1f} ms",
         f"worst p99 {max(p99):.1f} ms; max {mediana(massimi):.1f} ms; peak RSS {mediana(rss_ritmo):.0f} MB",
         "< 10 ms")


# 3. Start-up ##################################################################################

def avvio(ripetizioni):
    print("3. start-up", flush=True)

    def tempo(interprete, *argomenti):
        valori = []
        for _ in range(ripetizioni):
            inizio = time.perf_counter()
            subprocess.run([interprete, *argomenti], stdout=subprocess.DEVNULL, check=True)
            valori.append((time.perf_counter() - inizio) * 1000)
        return mediana(valori), min(valori)

    # As a student types it (`python3` found on PATH, maybe through a version manager's shim), and
    # with the interpreter binary itself, where the ratio shows carico.py's own share.
    for interprete, come in ((shutil.which("python3"), "python3 on PATH"), (sys.executable, "the interpreter binary")):
        if interprete is None:
            continue
        nudo, _ = tempo(interprete, "-c", "pass")
        aiuto, migliore = tempo(interprete, CARICO, "--help")
        riga(f"carico.py --help, wall, {come}", f"{aiuto:.0f} ms = {aiuto / nudo:.1f}x `-c pass`",
             f"best {migliore:.0f} ms; `{interprete} -c pass` {nudo:.0f} ms", "<= 2.5x")


# 4-6. Accuracy, sampler, throughput ###########################################################

def scarti(esecuzione):
    return [(r.latenza - carico.servizio(r)) * 1000 for r in esecuzione.risultati]


def esattezza(ripetizioni, prove_picco):
    print("4. accuracy: client latency - (prompt_ms + predicted_ms), requests that did not queue", flush=True)
    soli, insieme = [], []
    with ServerReale(1) as server:
        client = carico.Client(server.url)
        for k in range(ripetizioni):  # one at a time: nothing queues, nothing competes
            soli += scarti(dal_prompt(client, carico.Piano(4, 1, 32), info(client), 4 * k))
    with ServerReale(4, ["--metrics"]) as server:
        client = carico.Client(server.url)
        thr_carico, thr_server = [], []
        for k in range(ripetizioni):
            prima = leggi_tokens(server.url)
            esecuzione = dal_prompt(client, carico.Piano(4, 4, 32), info(client), 4 * k)
            dopo = leggi_tokens(server.url)
            s = carico.riassumi(esecuzione, 4)
            insieme += scarti(esecuzione)
            thr_carico.append(s.throughput)
            thr_server.append((dopo - prima) / s.tempo_totale)
    riga("latency - server time, one request at a time (-np 1)", f"{mediana(soli):.2f} ms",
         f"worst {max(soli):.2f} ms", "< 5 ms median")
    riga("latency - server time, 4 together in 4 slots (-np 4)", f"{mediana(insieme):.2f} ms",
         f"worst {max(insieme):.2f} ms; the server's HTTP threads template and tokenize 4 prompts on 2 busy cores",
         "< 5 ms median")
    print("6. aggregate throughput against the server's own accounting (-np 4, --metrics)", flush=True)
    differenze = [abs(c - s) / s for c, s in zip(thr_carico, thr_server)]
    riga("carico.py throughput vs llamacpp:tokens_predicted_total / same window", f"{mediana(differenze):.2%}",
         f"worst {max(differenze):.2%}; carico {mediana(thr_carico):.1f} t/s, server {mediana(thr_server):.1f} t/s",
         "within 2%")

    print(f"5. the sampler: period, and the peak right in {prove_picco} lab runs at -np 1, 2, 4", flush=True)
    periodi, giusti, letti = [], {1: 0, 2: 0, 4: 0}, {1: 0, 2: 0, 4: 0}
    for np in (1, 2, 4):
        with ServerReale(np) as server:
            client = carico.Client(server.url)
            for k in range(prove_picco):
                esecuzione = dal_prompt(client, carico.Piano(4, 4, 32), info(client), 4 * k)
                tempi = [c.t for c in esecuzione.campioni]
                periodi += [b - a for a, b in zip(tempi, tempi[1:])]
                s = carico.riassumi(esecuzione, np)
                giusti[np] += s.picco == np
                letti[np] += s.occupati_letti == np
    riga("sampler period (asked 0.5 s)", f"{mediana(periodi):.3f} s", f"worst {max(periodi):.3f} s", "0.5 s")
    riga("peak of busy slots right", " / ".join(f"-np {np}: {n}/{prove_picco}" for np, n in giusti.items()),
         "the peak equals -np; the /slots readings alone: " + " / ".join(f"{n}/{prove_picco}" for n in letti.values()),
         "all")


def prompt_esatti(ripetizioni):
    print("8. exact prompts: --prompt-token 128,512,1024 prepared on the real server's tokenizer", flush=True)
    server = ServerReale(2, ctx=4096).avvia()
    try:
        client = carico.Client(server.url)
        chiamate, durate = [], []
        originale = carico.tokenizza

        def contata(*args):
            chiamate[-1] += 1
            return originale(*args)
        carico.tokenizza = contata
        try:
            for _ in range(ripetizioni):
                piani = [carico.Piano(4, 4, 32, oltre=carico.PianoOltre(prompt_token=(n, n))) for n in (128, 512, 1024)]
                chiamate.append(0)
                inizio = time.perf_counter()
                piani = carico.con_pezzi(client, piani)
                durate.append(time.perf_counter() - inizio)
        finally:
            carico.tokenizza = originale
        pezzi = carico.oltre(piani[-1]).pezzi
        inizio = time.perf_counter()
        for i in range(1000):
            carico.taglia(pezzi, i, 1024)
        taglio = (time.perf_counter() - inizio) / 1000
    finally:
        server.ferma()
    riga("exact prompts, 3 lengths: /tokenize calls to prepare them", f"{mediana(chiamate):.0f}",
         f"{mediana(durate) * 1000:.0f} ms in all (worst {max(durate) * 1000:.0f} ms); none per request", "a few")
    riga("exact prompts: cutting one of 1,024 tokens as its request leaves", f"{taglio * 1e6:.1f} µs",
         "in the worker's thread, never all alive at once", "<< 1 ms")


# 9. Streams at scale #########################################################################

FLUSSI = tuple(int(c) for c in os.environ.get("CARICO_FLUSSI", "16,64,256,1000").split(","))
TOKEN_FLUSSI, PRIMO_MS, PASSO_MS = 64, 50, 20  # as bench/flussi.c writes them


def percentile_di(valori, p):
    v = sorted(valori)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else float("nan")


def una_prova_di_flussi(eseguibile, c, cartella, token=TOKEN_FLUSSI, passo_ms=PASSO_MS, misti=False, occupato=False):
    """One run at C streams: carico's figures from its --json, and the fake's true times from its log
    (`misti`: each stream with between token/2 and `token` tokens, see flussi.c; `occupato`: a busy loop on
    carico's core all along)."""
    porta = porta_libera()
    anello = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"]) if occupato else None
    registro, risultati = os.path.join(cartella, f"fake-{c}.log"), os.path.join(cartella, f"carico-{c}.json")
    fake = subprocess.Popen(["taskset", "-c", "0", eseguibile, str(porta), str(c), str(token), registro, str(passo_ms),
                             str(int(misti))], stdout=subprocess.PIPE)
    try:
        fake.stdout.readline()  # "pronto"
        cpu_nel_tempo = []  # (perf_counter, CPU s of carico's process): its share of a core while the fake writes
        err = []
        out, parete, cpu, rss = esegui_carico_cli_su(
            ["taskset", "-c", "1"], "--url", f"http://127.0.0.1:{porta}", "--stream", "--richieste", str(c),
            "--parallele", str(c), "--token", str(token), "--dettagli", "--json", risultati,
            "--intervallo", "60", campioni=cpu_nel_tempo, err=err)
        fake.wait(timeout=60)
    finally:
        if anello is not None:
            anello.kill()
            anello.wait()
        if fake.poll() is None:
            fake.kill()
            fake.wait()
    prova = json.load(open(risultati))["prove"][0]
    richieste = prova["richieste"]
    veri, fini = {}, {}
    for riga_log in open(registro):
        etichetta, arrivo, *scritti, fine = riga_log.rstrip("\n").split("\t")  # (the end's write last)
        veri[etichetta], fini[etichetta] = (int(arrivo), scritti), int(fine)
    # The truth of a chunk is an interval: the fake's clock just before and just after its write (a fake
    # preempted in between logs a later time than the bytes left). carico's error is its distance from it.
    def fuori(valore, da, a):
        return valore - da if valore < da else (valore - a if valore > a else 0.0)

    errori_ttft, errori_itl, errori_chunk, ritardi = [], [], [], []
    veri_fig = {f: ([], []) for f in ("primo token", "TPOT", "ITL")}  # the true figures, by the writes' starts and ends
    for r in richieste:
        if r["errore"] is not None:
            continue
        etichetta = json.dumps(carico.prompt_per(r["indice"]))[1:41]
        arrivo, scritti = veri[etichetta]
        scritti, fine = [tuple((int(x) - arrivo) / 1e9 for x in w.split(",")) for w in scritti], (fini[etichetta] - arrivo) / 1e9
        errori_chunk += [fuori(t, da, a) * 1000 for t, (da, a) in zip(r["chunk_s"], scritti)]
        errori_ttft.append(errori_chunk[-len(scritti)])
        errori_itl += [fuori(b - a, y0 - x1, y1 - x0) * 1000 for a, b, (x0, x1), (y0, y1)
                       in zip(r["chunk_s"], r["chunk_s"][1:], scritti, scritti[1:])]
        ritardi += [da * 1000 - (PRIMO_MS + passo_ms * k) for k, (da, _) in enumerate(scritti)]
        for lato in (0, 1):
            t = [w[lato] for w in scritti]
            veri_fig["primo token"][lato].append(t[0])
            veri_fig["TPOT"][lato].append(((fine if lato else t[-1]) - t[0]) / (len(t) - 1))  # to the end, as carico
            veri_fig["ITL"][lato].extend(b - a for a, b in zip(t, t[1:]))
    # CPU while the streams flowed: from the first request's arrival to the last write, on the fake's
    # clock (CLOCK_MONOTONIC, perf_counter's): carico's share of its one core, 1.00 when it saturates it
    da = min(a for a, _ in veri.values()) / 1e9
    a = max(int(s[-1].split(",")[1]) for _, s in veri.values()) / 1e9
    prima = max((c for t, c in cpu_nel_tempo if t <= da), default=0.0)
    dopo = min((c for t, c in cpu_nel_tempo if t >= a), default=float("nan"))
    figure, d = prova["dettagli"]["figure_s"], prova["dettagli"]
    # The stated bound against the true error of each percentile: carico's figure against the same
    # percentile of what the fake wrote (an interval: by the writes' starts, by their ends)
    limiti = {}
    for f, (inizio, fine) in veri_fig.items():
        for p in (50, 90, 99):
            vero = sorted((carico.percentile(inizio, p), carico.percentile(fine, p)))
            detto = figure[f][f"p{p}"]
            limiti[f"{f} p{p}"] = (detto * 1000, sum(vero) / 2 * 1000, abs(fuori(detto, *vero)) * 1000,
                                   d["spostamento_ms"][f"{f} p{p}"])
    chunk = sum(len(r["chunk_s"] or ()) for r in richieste if r["errore"] is None)
    inizi = [r["inizio_s"] for r in richieste]
    return {"falliti": sum(r["errore"] is not None for r in richieste), "chunk": chunk,
            "chunk_s": chunk / prova["riepilogo"]["tempo_totale"],
            "ttft50": figure["primo token"]["p50"] * 1000, "ttft99": figure["primo token"]["p99"] * 1000,
            "itl50": figure["ITL"]["p50"] * 1000, "itl99": figure["ITL"]["p99"] * 1000, "itlmax": figure["ITL"]["max"] * 1000,
            "cpu": cpu, "core": (dopo - prima) / (a - da), "us_chunk": cpu / chunk * 1e6, "rss": rss, "inviate_in": (max(inizi) - min(inizi)) * 1000,
            "arrivate_in": (max(a for a, _ in veri.values()) - min(a for a, _ in veri.values())) / 1e6,
            "err_ttft99": percentile_di([abs(e) for e in errori_ttft], 99),
            "err_itl99": percentile_di([abs(e) for e in errori_itl], 99),
            "err_chunk99": percentile_di([abs(e) for e in errori_chunk], 99),
            "fuori_5ms": sum(abs(e) > 5 for e in errori_chunk),  # mostly a token read with a later one (its stamp)
            "ritardo_fake99": percentile_di(ritardi, 99), "ritardo_fake_max": max(ritardi),
            "limiti": limiti, "nota": "carico non ha letto i flussi in tempo" in err[0],
            "lettore": tuple(d[f"ritardo_lettore_{k}_ms"] for k in ("p50", "p99", "max")),
            "insieme": d["chunk_letti_insieme"]}


def esegui_carico_cli_su(prefisso, *argomenti, campioni=None, err=None):
    """carico.py under a prefix (taskset): (stdout, wall s, CPU s, peak RSS MB); with `campioni`, a list that
    gets (perf_counter, the process's CPU s so far) every 10 ms while it runs; with `err`, one that gets its
    stderr."""
    with tempfile.TemporaryFile() as uscita, tempfile.TemporaryFile() as errori:
        inizio = time.perf_counter()
        proc = subprocess.Popen([*prefisso, sys.executable, CARICO, *argomenti], stdout=uscita, stderr=errori)
        if campioni is not None:
            import threading
            threading.Thread(target=campiona_cpu, args=(proc.pid, campioni), daemon=True).start()
        _, _, uso = os.wait4(proc.pid, 0)
        parete = time.perf_counter() - inizio
        uscita.seek(0)
        errori.seek(0)
        if err is not None:
            err.append(errori.read().decode())
        return uscita.read().decode(), parete, uso.ru_utime + uso.ru_stime, uso.ru_maxrss / 1024


def campiona_cpu(pid, campioni):
    """A process's user + system CPU seconds, from /proc, every 10 ms until it ends (its ticks are 10 ms)."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            while True:
                f.seek(0)
                campi = f.read().rsplit(b")", 1)[1].split()
                campioni.append((time.perf_counter(), (int(campi[11]) + int(campi[12])) / tick))
                time.sleep(0.01)
    except (OSError, IndexError, ValueError):  # it ended
        return


def flussi(ripetizioni):
    print(f"9. streams at scale: {TOKEN_FLUSSI} tokens, first after {PRIMO_MS} ms, then one every {PASSO_MS} ms; "
          "fake in C on core 0, carico on core 1", flush=True)
    if not (shutil.which("cc") and shutil.which("taskset")) or (os.cpu_count() or 1) < 2:
        riga("streams at scale", "n/d", "needs cc, taskset and 2 cores", "")
        return
    cartella = tempfile.mkdtemp(prefix="carico-flussi-")
    eseguibile = os.path.join(cartella, "flussi")
    subprocess.run(["cc", "-O2", "-o", eseguibile, os.path.join(QUI, "flussi.c")], check=True)
    print(f"carico: {CARICO}")
    print("| C | chunks/s | TTFT p50/p99 ms (true 50) | ITL p50/p99/max ms (true 20) | CPU s | cores while the streams flow "
          "| µs/chunk | RSS MB | all sent within ms: carico / fake | error p99 ms: TTFT / ITL / chunk | fake late p99/max ms | failed "
          "| load before / after | at |", flush=True)
    try:
        for c in FLUSSI:
            carico_prima = os.getloadavg()[0]
            prove = [una_prova_di_flussi(eseguibile, c, cartella) for _ in range(ripetizioni)]
            m = {k: mediana([p[k] for p in prove]) for k, v in prove[0].items() if isinstance(v, (int, float))}
            testo = (f"| {c} | {m['chunk_s']:,.0f} | {m['ttft50']:.1f} / {m['ttft99']:.1f} | {m['itl50']:.2f} / "
                     f"{m['itl99']:.2f} / {m['itlmax']:.1f} | {m['cpu']:.2f} | {m['core']:.2f} | {m['us_chunk']:.0f} | "
                     f"{m['rss']:.0f} | {m['inviate_in']:.0f} / {m['arrivate_in']:.0f} | {m['err_ttft99']:.2f} / {m['err_itl99']:.2f} / "
                     f"{m['err_chunk99']:.2f} | {m['ritardo_fake99']:.2f} / {m['ritardo_fake_max']:.2f} | "
                     f"{m['falliti']:.0f} | {carico_prima:.2f} / {os.getloadavg()[0]:.2f} | "
                     f"{time.strftime('%H:%M:%S', time.gmtime())} UTC |")
            for p in prove:  # each run, so that a median hides nothing
                print("    run: " + ", ".join(f"{k} {v:.2f}" for k, v in p.items() if k in m), flush=True)
            print(testo, flush=True)
            riga(f"streams at C = {c}: ITL p99 / TTFT p99 error against the fake's writes", f"{m['err_itl99']:.2f} / "
                 f"{m['err_ttft99']:.2f} ms", testo, "ITL within 1 ms, TTFT within 5 ms")
    finally:
        shutil.rmtree(cartella, ignore_errors=True)


def pavimento(giri, c=1000):
    """9b. The floor under any reader at C streams: in turns, bench/pavimento.c (C), bench/pavimento.py (bare
    Python) and carico, each against a fresh fake on core 0, itself on core 1. The tokens that came in one read
    with a later one (the floors) and carico's chunks off by more than 5 ms (the same tokens: they get the later
    one's stamp) say whether the reader kept up: each such token spoils two intervals (one too long, one too short),
    so ITL p99 holds only under some 315 of them (1% of 63,000 intervals)."""
    cartella = tempfile.mkdtemp(prefix="carico-pavimento-")
    fake, pav_c = os.path.join(cartella, "flussi"), os.path.join(cartella, "pavimento")
    subprocess.run(["cc", "-O2", "-o", fake, os.path.join(QUI, "flussi.c")], check=True)
    subprocess.run(["cc", "-O2", "-o", pav_c, os.path.join(QUI, "pavimento.c")], check=True)

    def vicini_nel_fake(registro="fake.log"):  # the fake's own: two tokens of a stream written under 5 ms apart
        vicini = 0
        for riga_log in open(os.path.join(cartella, registro)):
            scritti = [tuple(map(int, w.split(","))) for w in riga_log.rstrip("\n").split("\t")[2:-1]]
            vicini += sum(b[0] - a[1] < 5e6 for a, b in zip(scritti, scritti[1:]))
        return vicini

    def un_pavimento(comando):
        porta = porta_libera()
        f = subprocess.Popen(["taskset", "-c", "0", fake, str(porta), str(c), str(TOKEN_FLUSSI),
                              os.path.join(cartella, "fake.log")], stdout=subprocess.PIPE)
        try:
            f.stdout.readline()  # "pronto"
            out = subprocess.run(["taskset", "-c", "1", *comando, str(porta), str(c)], capture_output=True,
                                 text=True, timeout=60, check=True).stdout.split()
            f.wait(timeout=60)
        finally:
            if f.poll() is None:
                f.kill()
                f.wait()
        v = dict(zip(out[::2], map(float, out[1::2])))
        return f"{v['shared']:.0f} ({vicini_nel_fake()}) / {v['user'] + v['sys']:.2f}"

    print(f"carico: {CARICO}\n(in brackets: the tokens the fake itself wrote under 5 ms after the one before)\n"
          "| at | C reader: tokens sharing a read / CPU s | bare Python: the same | carico: chunks off > 5 ms / ITL error "
          "p99 ms / cores while streaming |\n|---|---|---|---|", flush=True)
    try:
        for _ in range(giri):
            a = time.strftime('%H:%M:%S', time.gmtime())
            in_c = un_pavimento([pav_c])
            in_python = un_pavimento([sys.executable, os.path.join(QUI, "pavimento.py")])
            p = una_prova_di_flussi(fake, c, cartella)
            vicini = vicini_nel_fake(f"fake-{c}.log")
            print(f"| {a} UTC | {in_c} | {in_python} | {p['fuori_5ms']:.0f} ({vicini}) / {p['err_itl99']:.2f} / "
                  f"{p['core']:.2f} |", flush=True)
    finally:
        shutil.rmtree(cartella, ignore_errors=True)


def misti(giri, c=64, token=2000, passo_ms=10):
    """9c. (--misti N) Long answers that end while others stream: C streams of token/2 to `token` tokens, one
    every `passo_ms`, so that they end one after the other. The chunks carico timed more than 5 ms off what the
    fake wrote: a stream's end work that held the reader would put the others' chunks two to a read."""
    cartella = tempfile.mkdtemp(prefix="carico-misti-")
    fake = os.path.join(cartella, "flussi")
    subprocess.run(["cc", "-O2", "-o", fake, os.path.join(QUI, "flussi.c")], check=True)
    print(f"carico: {CARICO}\n| at | chunks | off > 5 ms | ITL error p99 ms | fake late p99 ms |\n|---|---|---|---|---|")
    try:
        for _ in range(giri):
            a = time.strftime('%H:%M:%S', time.gmtime())
            p = una_prova_di_flussi(fake, c, cartella, token, passo_ms, misti=True)
            print(f"| {a} UTC | {p['chunk']:,.0f} | {p['fuori_5ms']:.0f} ({p['fuori_5ms'] / p['chunk']:.2%}) | {p['err_itl99']:.2f} | "
                  f"{p['ritardo_fake99']:.2f} |", flush=True)
    finally:
        shutil.rmtree(cartella, ignore_errors=True)


PUNTI_LIMITI = tuple((int(c.rstrip("o")), c.endswith("o")) for c in os.environ.get(
    "CARICO_LIMITI", "256,1000,256o,1000o").split(","))  # C, and "o": beside a busy loop on carico's core


TARDI = "ritardo_fake99"


def limiti(giri):
    """9d. (--limiti N) The client's own error as carico states it, against the truth: at each point (C streams,
    quiet or beside a busy loop on carico's core), N runs; in each, for TTFT, TPOT and ITL at p50, p90 and p99,
    carico's figure against the same percentile of the fake's writes, and the bound carico stated for it. The
    bound holds when the true error is within it; the note must fire where a bound passes carico.SOGLIA."""
    cartella = tempfile.mkdtemp(prefix="carico-limiti-")
    fake = os.path.join(cartella, "flussi")
    subprocess.run(["cc", "-O2", "-o", fake, os.path.join(QUI, "flussi.c")], check=True)
    print(f"carico: {CARICO}\n| C | beside | runs | reader late p50 / p99 / max ms | chunks read with an earlier one "
          "| ITL p99 ms: carico / true / error / bound | TTFT p99 ms: the same | TPOT p99 ms: the same "
          "| bound held (checks) | note (runs) | worst error / bound, ms | fake late p99 ms |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|",
          flush=True)
    try:
        for c, occupato in PUNTI_LIMITI:
            prove = []
            for _ in range(giri):
                prove.append(una_prova_di_flussi(fake, c, cartella, occupato=occupato))
                p = prove[-1]
                print("    run: " + "; ".join(f"{k} {v[0]:.2f}/{v[1]:.2f}/{v[2]:.2f}/{v[3]:.2f}" for k, v in
                                           p["limiti"].items()) + f"; late {p['lettore']}, together {p['insieme']}, "
                      f"note {p['nota']}, failed {p['falliti']}", flush=True)
            tenuti = [v[2] <= v[3] + 0.01 for p in prove for v in p["limiti"].values()]  # (0.01 ms: rounding)
            peggiore = max((v for p in prove for v in p["limiti"].values()), key=lambda v: v[2] - v[3])

            def cella(f):
                return " ; ".join(f"{v[0]:.2f} / {v[1]:.2f} / {v[2]:.2f} / {v[3]:.2f}" for v in
                                  (p["limiti"][f] for p in prove))

            def ms(x):
                return "n/d" if x is None else f"{x:.2f}"

            print(f"| {c:,} | {'busy loop' if occupato else 'quiet'} | {giri} | "
                  + " ; ".join("/".join(ms(x) for x in p["lettore"]) for p in prove)
                  + f" | {' ; '.join(str(p['insieme']) for p in prove)} | {cella('ITL p99')} | {cella('primo token p99')} "
                  f"| {cella('TPOT p99')} | {sum(tenuti)} of {len(tenuti)} | {sum(p['nota'] for p in prove)} of {giri} "
                  f"| {peggiore[2]:.2f} / {peggiore[3]:.2f} | {' ; '.join(f'{p[TARDI]:.1f}' for p in prove)} |", flush=True)
    finally:
        shutil.rmtree(cartella, ignore_errors=True)


def aspetta_la_quiete(limite=20.0):
    """Up to `limite` seconds for the CPU to settle (the install step just ran pip), as the lab asks."""
    fine = time.monotonic() + limite
    while time.monotonic() < fine:
        macchina = carico.osserva_macchina(1.0)
        if not carico.macchina_occupata(macchina) and (macchina.cpu_occupata or 0) < 0.15:
            break
    print(f"machine before the start-up row: {carico.descrivi_macchina(macchina)}", flush=True)


def info(client):
    """What the server says about itself, as carico.py asks it before a run."""
    return carico.interroga_server(client, 60, sys.stderr)


def leggi_tokens(url):
    risposta = carico.Client(url).chiama("GET", "/metrics")
    return carico.leggi_metrica(risposta.corpo.decode(), "tokens_predicted_total")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ripetizioni", type=int, default=5, help="runs per figure (median)")
    parser.add_argument("--prove-picco", type=int, default=10, help="lab runs per -np for the peak check")
    parser.add_argument("--solo-flussi", action="store_true", help="only row 9, the streams at scale")
    parser.add_argument("--pavimento", type=int, metavar="N", help="only row 9b: N turns of the floors and carico at 1,000 streams")
    parser.add_argument("--misti", type=int, metavar="N", help="only row 9c: N runs of long answers ending one after the other")
    parser.add_argument("--limiti", type=int, metavar="N", help="only row 9d: N runs a point of the stated bound against "
                        "the true error (CARICO_LIMITI: the points)")
    a = parser.parse_args()
    if a.pavimento:
        pavimento(a.pavimento)
        return 0
    if a.misti:
        misti(a.misti)
        return 0
    if a.limiti:
        limiti(a.limiti)
        return 0
    if a.solo_flussi:
        print(f"carico.py {carico.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        flussi(a.ripetizioni)
        return 0
    print(f"carico.py {carico.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}, "
          f"{sys.executable}", flush=True)
    aspetta_la_quiete()
    avvio(max(30, a.ripetizioni))  # first: the machine is at its quietest before any server ran
    cpu_nel_lab(a.ripetizioni)
    su_scala(a.ripetizioni)
    esattezza(a.ripetizioni, a.prove_picco)
    scala(a.ripetizioni)
    prompt_esatti(a.ripetizioni)
    flussi(min(3, a.ripetizioni))
    print("\n| measure | median | detail | target |\n|---|---|---|---|")
    for misura, valore, dettaglio, obiettivo in RIGHE:
        print(f"| {misura} | {valore} | {dettaglio} | {obiettivo} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
