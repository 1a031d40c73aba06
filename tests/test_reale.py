"""carico.py against the real `llama serve` and a real model (gemma-3-270m Q4_K_M), as a user runs it.

The lab's "Check the result", on this small model: n_ctx per slot 2048 / 1024 / 512 with -np 1/2/4,
the peak of busy slots, the staircase of latencies with one slot and near-equal ones with four, the
long prompt of step 4 refused with 4 slots and accepted with --kv-unified. Timing figures are
reported at the end of the run (conftest.CIFRE), not asserted tightly: the machine is small and noisy.
"""

import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

import pytest

import carico
from conftest import CIFRE, FILI_DEL_SERVER
from realserver import LUNGO
from aiuti import CARICO, RIGA_REQ, griglia_np_token, latenze, porta_libera, reale_non_disponibile, valore

pytestmark = pytest.mark.reale


def carico_cli(url, *flags, env=None, timeout=300):
    proc = subprocess.run([sys.executable, CARICO, "--url", url, *flags], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def comando_reale():
    """`llama serve -m gemma -c 2048 -t 1 -a gemma-270m`, for --avvia (which adds -np, host and port)."""
    from realserver import ALIAS, ServerNonDisponibile, trova_binario, trova_modello

    try:
        binario, modello = trova_binario(), trova_modello()
    except ServerNonDisponibile as exc:
        reale_non_disponibile(exc)
    return f"{binario} {'serve ' if binario.endswith('/llama') else ''}-m {modello} -c 2048 -t {FILI_DEL_SERVER} -a {ALIAS}"


def throughput(out):
    return float(re.search(r"throughput aggregato ([\d.]+) token/s", out).group(1))


def test_np_1_2_4_come_il_lab(llama):
    misure = {}
    for np, n_ctx in ((1, 2048), (2, 1024), (4, 512)):
        server = llama(np)
        assert f"n_slots = {np}, n_ctx_slot = {n_ctx}, kv_unified = 'false'" in server.riga_log("n_slots =")
        rc, out, err = carico_cli(server.url, "--richieste", "4", "--parallele", "4", "--token", "32")
        assert rc == 0, out + err
        righe = out.splitlines()
        assert righe[0] == f"server: {np} slot, n_ctx per slot = {n_ctx}"
        assert all(RIGA_REQ.match(r) for r in righe[1:5]), out
        assert righe[5] == ""
        assert righe[6] == f"richieste=4 parallele=4 slot={np}  picco slot occupati insieme={np}", out
        assert re.match(r"tempo totale [\d.]+ s  \|  latenza media [\d.]+ s, max [\d.]+ s$", righe[7])
        assert re.match(r"throughput aggregato [\d.]+ token/s  \(\d+ token generati\)$", righe[8])
        assert len(righe) == 9
        misure[np] = out
        server.ferma()

    # -np 1: served one at a time, so each request's latency covers the generation of every request
    # that finished before it, its own included (tokens / the slot's speed printed on its line, from
    # the server's timings). A structure, not a timing: it holds on a busy machine, and with four slots
    # at work together it fails (each latency would cover only its own generation).
    generato = 0.0
    for latenza, token, velocita in sorted((float(m[2]), int(m[3]), float(m[4]))
                                           for m in map(RIGA_REQ.match, misure[1].splitlines()) if m):
        generato += token / velocita
        assert latenza > 0.8 * generato, misure[1]
    # -np 4: the four start and end together.
    lat4 = latenze(misure[4])
    assert max(lat4) < 1.5 * min(lat4), misure[4]
    rapporto = throughput(misure[4]) / throughput(misure[1])
    CIFRE.append(("aggregate throughput np4/np1 (lab: x2 on 6 vCPU)", f"{rapporto:.2f}"))
    for np in (1, 2, 4):
        CIFRE.append((f"np {np}", misure[np].splitlines()[7] + "  |  " + misure[np].splitlines()[8]))


def test_un_slot_la_latenza_massima_e_la_somma_dei_servizi(llama):
    """Against the server's own timings: with one slot the last request's latency is the sum of
    the four service times (prompt_ms + predicted_ms), give or take the HTTP overhead."""
    server = llama(1)
    client = carico.Client(server.url)
    esecuzione = carico.esegui_carico(client, carico.Piano(4, 4, 32, 0.5, 300), carico.InfoServer(1, 2048, True))
    assert all(r.riuscita for r in esecuzione.risultati), [r.errore for r in esecuzione.risultati]
    servizi = [(r.prompt_ms + r.predicted_ms) / 1000 for r in esecuzione.risultati]
    massima = max(r.latenza for r in esecuzione.risultati)
    assert 0.9 * sum(servizi) < massima < 1.5 * sum(servizi) + 0.5
    # cache_prompt: false: the slot computed every prompt token, the chat template's opening included.
    slot = server.get_json("/slots")[0]
    assert slot["n_prompt_tokens_cache"] == 0 and all(r.token_cache == 0 for r in esecuzione.risultati), slot
    CIFRE.append(("np 1: max latency / sum of service times", f"{massima / sum(servizi):.3f}"))


def test_passo_4_e_5_contesto_e_kv_unified(llama, tmp_path):
    lungo = tmp_path / "lungo.txt"
    lungo.write_text(LUNGO + "\n")
    flags = ("--prompt-file", str(lungo), "--richieste", "1", "--parallele", "1", "--token", "20")

    server = llama(4)
    rc, out, _ = carico_cli(server.url, *flags)
    assert rc == 1
    riga = out.splitlines()[1]
    assert re.match(r"  req 0: +[\d.]+ s   errore: HTTP 400 exceed_context_size_error: request \((\d+) tokens\) "
                    r"exceeds the available context size \(512 tokens\), try increasing it$", riga), out
    assert "richieste fallite: 1 su 1" in out
    CIFRE.append(("step 4 at -np 4", riga.split("errore: ")[1]))
    server.ferma()

    server = llama(4, "--kv-unified")
    assert "n_slots = 4, n_ctx_slot = 2048, kv_unified = 'true'" in server.riga_log("n_slots =")
    rc, out, err = carico_cli(server.url, *flags)
    assert rc == 0, out + err
    assert out.splitlines()[0] == "server: 4 slot, n_ctx per slot = 2048"
    assert re.match(r"  req 0: +[\d.]+ s   20 token", out.splitlines()[1]), out
    # And the lab's load on the unified buffer: four slots busy together.
    rc, out, _ = carico_cli(server.url)
    assert rc == 0
    assert valore(out, "picco slot occupati insieme") == "4", out
    CIFRE.append(("np 4 --kv-unified", out.splitlines()[8]))


def test_np_auto(llama):
    server = llama(-1)
    rc, out, _ = carico_cli(server.url)
    assert rc == 0
    # Auto means 4 slots and --kv-unified: each of the 4 sees the whole -c 2048.
    assert out.splitlines()[0] == "server: 4 slot, n_ctx per slot = 2048"
    assert "kv_unified = 'true'" in server.riga_log("n_slots =")


def test_no_slots(llama):
    """--no-slots: nothing to read during the run, yet the server's own timings prove the four slots busy."""
    server = llama(4, "--no-slots")
    rc, out, err = carico_cli(server.url)
    assert rc == 0, err
    assert out.splitlines()[0] == "server: 4 slot, n_ctx per slot = 512"
    assert "slot=4  picco slot occupati insieme=4" in out
    assert "--no-slots" in err
    assert len(latenze(out)) == 4


def test_prove_brevi_picco_esatto_e_nessuna_cache_reale(llama, tmp_path):
    """-np 2, --token 8: runs of a few tenths of a second, shorter than two readings of /slots. The peak
    is 2 in every one of five runs, from the server's timings; and the reruns of the same prompts on the
    same server are never served from a prompt cache (cache_prompt: false): cache_n is 0 every time."""
    server = llama(2, "--metrics")
    durate, letti = [], []
    for k in range(5):
        dati = tmp_path / f"p{k}.json"
        rc, out, err = carico_cli(server.url, "--token", "8", "--json", str(dati))
        assert rc == 0, out + err
        assert valore(out, "picco slot occupati insieme") == "2", out
        assert re.search(r"^picco richieste in coda \(.*\)=2$", out, re.M), out
        assert "cache" not in err, err
        prova = json.loads(dati.read_text())["prove"][0]
        assert [r["token_cache"] for r in prova["richieste"]] == [0, 0, 0, 0], prova["richieste"]
        durate.append(prova["riepilogo"]["tempo_totale"])
        letti.append(prova["riepilogo"]["occupati_letti"])
    CIFRE.append(("-np 2 --token 8: total times (s), peak 2 in 5 of 5", ", ".join(f"{d:.2f}" for d in durate)))
    CIFRE.append(("-np 2 --token 8: what the /slots readings alone saw", ", ".join(map(str, letti))))


def test_api_key(llama):
    server = llama(2, "--api-key", "chiave-del-lab")
    ambiente = {k: v for k, v in os.environ.items() if k != "LLAMA_API_KEY"}
    rc, out, err = carico_cli(server.url, env=ambiente)
    assert rc == 1 and out == ""
    assert "richiede una chiave API" in err
    rc, out, err = carico_cli(server.url, "--api-key", "sbagliata", env=ambiente)
    assert rc == 1 and "ha rifiutato la chiave API" in err and "sbagliata" not in err
    rc, out, err = carico_cli(server.url, "--api-key", "chiave-del-lab", env=ambiente)
    assert rc == 0, err
    assert "picco slot occupati insieme=2" in out
    assert "chiave-del-lab" not in out + err
    rc, out, err = carico_cli(server.url, env=dict(ambiente, LLAMA_API_KEY="chiave-del-lab"))
    assert rc == 0, err


def test_metrics(llama):
    server = llama(4, "--metrics")
    rc, out, err = carico_cli(server.url)
    assert rc == 0, err
    assert "picco slot occupati insieme=4" in out
    assert len(latenze(out)) == 4


def test_server_ucciso_a_meta(llama):
    """The server dies mid-run: the request already answered is kept and printed, the others
    say what happened, exit 1, no traceback."""
    server = llama(1)
    proc = subprocess.Popen([sys.executable, CARICO, "--url", server.url, "--token", "64"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    compiti = set()  # tasks seen in the slot: a second one means the first request is done
    limite = time.monotonic() + 60
    while len(compiti) < 2 and time.monotonic() < limite:
        slot = server.get_json("/slots")[0]
        if slot["is_processing"]:
            compiti.add(slot["id_task"])
        time.sleep(0.05)
    server.proc.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, out + err
    assert "Traceback" not in err
    assert len(latenze(out)) >= 1, out
    falliti = int(re.search(r"richieste fallite: (\d+) su 4", out).group(1))  # reset: in one line (Sentinella)
    assert falliti and falliti + len(latenze(out)) == 4, out
    assert "il server ha smesso di rispondere (accertato a " in out


def test_avvia_tutto_il_lab_reale(tmp_path):
    """--avvia: carico.py starts llama serve for each -np, measures, stops it; then the table."""
    comando = comando_reale()
    url = f"http://127.0.0.1:{porta_libera()}"
    svg = tmp_path / "lab.svg"
    rc, out, err = carico_cli(url, "--avvia", comando, "--np", "1,2,4,4kv", "--svg", str(svg), timeout=600)
    assert rc == 0, out + err
    intestazioni = [r for r in out.splitlines() if r.startswith("server: ")]
    assert intestazioni == ["server: 1 slot, n_ctx per slot = 2048", "server: 2 slot, n_ctx per slot = 1024",
                            "server: 4 slot, n_ctx per slot = 512", "server: 4 slot, n_ctx per slot = 2048"]
    assert [valore(b, "picco slot occupati insieme") for b in out.split("server: ")[1:]] == ["1", "2", "4", "4"]
    tabella = out[out.index("|---|"):].splitlines()[1:5]
    assert [r.split(" | ")[:2] for r in tabella] == [["| 1", "2048"], ["| 2", "1024"], ["| 4", "512"], ["| 4 kv", "2048"]]
    assert "  (--kv-unified: 2048 token di contesto condivisi fra i 4 slot)" in out
    (rapporto,) = [r for r in out.splitlines() if r.startswith("throughput: np 2 / np 1")]
    CIFRE.append(("--avvia --np 1,2,4,4kv", rapporto))
    assert svg.read_text().count("<svg") == 1
    assert err.count("server pronto in") == 4
    with pytest.raises(carico.ErroreRete):  # every server was stopped
        carico.Client(url, timeout_info=1).chiama("GET", "/health")
    CIFRE.append(("--avvia sweep", " / ".join(r.split(" | ")[-1].rstrip(" |") for r in tabella)))


def test_stream_e_grafico_reale(llama):
    server = llama(1)
    rc, out, err = carico_cli(server.url, "--stream", "--grafico")
    assert rc == 0, err
    primi = sorted(float(m.group(1)) for m in map(re.compile(r".*primo token ([\d.]+) s$").match, out.splitlines()) if m)
    assert len(primi) == 4
    # One slot: the first token of the last request waited for the three before it.
    assert primi[3] > 2.5 * primi[0] and primi[3] > primi[2] > primi[1]
    righe_req = [r for r in out.splitlines() if r.startswith("req ")]
    inizi = sorted(r[8:].index("█") for r in righe_req)
    assert inizi[3] > inizi[2] > inizi[1] > inizi[0], out
    assert all(len(r) <= 80 for r in out.splitlines())
    CIFRE.append(("np 1 --stream: time to first token (s)", ", ".join(f"{p:.2f}" for p in primi)))


def test_griglia_parallele_reale(llama, tmp_path):
    """A sweep on one real server: --parallele 1,2,4 at -np 2. With 1 in flight one slot works; never
    more than the 2 slots; with 4 in flight two requests wait for a slot."""
    server = llama(2)
    dati = tmp_path / "griglia.json"
    rc, out, err = carico_cli(server.url, "--parallele", "1,2,4", "--token", "16", "--intervallo", "0.1",
                              "--grafico", "--json", str(dati))
    assert rc == 0, out + err
    righe = [[c.strip() for c in r.strip("|").split("|")] for r in out.splitlines() if r.startswith("| ")]
    testa, *punti = righe
    assert testa[0] == "parallele" and [p[0] for p in punti] == ["1", "2", "4"], out
    picchi = dict(zip(testa, zip(*punti)))["picco slot occupati"]
    assert picchi[0] == "1/2" and all(int(p.split("/")[0]) <= 2 for p in picchi), out
    assert "curva di capacità" in out
    prove = json.loads(dati.read_text())["prove"]
    # At 4 in flight the queue shows: latency minus the slot's own time, for the two that waited.
    servizi = sorted((r["prompt_ms"] + r["predicted_ms"]) / 1000 for r in prove[2]["richieste"])
    attese = sorted(r["attesa_slot_s"] for r in prove[2]["richieste"])
    assert attese[-1] > 0.5 * servizi[0], (attese, servizi)
    throughput = [p["riepilogo"]["throughput"] for p in prove]
    CIFRE.append(("sweep -np 2 --parallele 1,2,4: throughput (token/s)", " / ".join(f"{t:.1f}" for t in throughput)))
    CIFRE.append(("sweep -np 2: throughput at 2 parallel / at 1", f"{throughput[1] / throughput[0]:.2f}"))


def test_dettagli_in_streaming_reale(llama, tmp_path):
    """-np 1 --stream --dettagli: the last request's first token waited for the others; each request's
    mean gap between chunks, from its first to its last, is the slot's own time per token
    (predicted_ms / (n - 1)). A loaded client may read several chunks at once and collapse single
    gaps, never the mean over a request; the p50 of single gaps is printed, not asserted."""
    server = llama(1)
    dati = tmp_path / "d.json"
    rc, out, err = carico_cli(server.url, "--stream", "--dettagli", "--json", str(dati))
    assert rc == 0, out + err
    prova = json.loads(dati.read_text())["prove"][0]
    primi = sorted(r["primo_token_s"] for r in prova["richieste"])
    assert primi[-1] > primi[0]
    for r in prova["richieste"]:
        chunk, per_token = r["chunk_s"], r["predicted_ms"] / 1000 / (r["token"] - 1)
        assert len(chunk) == r["token"], r  # llama.cpp: one token a chunk
        media = (chunk[-1] - chunk[0]) / (len(chunk) - 1)
        assert 0.7 * per_token < media < 1.3 * per_token, (media, per_token)
    figure = prova["dettagli"]["figure_s"]
    for nome in ("latenza (s)", "attesa in coda (s)", "primo token (s)", "TPOT (ms)", "ITL (ms)"):
        assert re.match(rf"  {re.escape(nome)} +(\d+\.\d+ +){{5}}\d+\.\d+$",
                        next(r for r in out.splitlines() if r.startswith(f"  {nome}"))), out
    per_token = statistics.fmean(1 / r["t_s_nel_slot"] for r in prova["richieste"])
    CIFRE.append(("np 1 --stream: ITL p50 / 1000 / predicted_per_second", f"{figure['ITL']['p50'] / per_token:.2f}"))
    CIFRE.append(("np 1 --stream: TTFT p50, TPOT p50 (ms)",
                  f"{figure['primo token']['p50'] * 1000:.0f}, {figure['TPOT']['p50'] * 1000:.1f}"))


def test_griglia_np_token_reale(tmp_path):
    """--avvia with --np 1,2 and --token 8,24: every header names np and token, and for each answer length
    the np 2 / np 1 ratio of throughput, then whether the advantage grew with longer answers."""
    comando = comando_reale()
    url = f"http://127.0.0.1:{porta_libera()}"
    rc, out, err = carico_cli(url, "--avvia", comando, "--np", "1,2", "--token", "8,24", timeout=600)
    assert rc == 0, out + err
    _, esito = griglia_np_token(out, (1, 2), (8, 24))
    CIFRE.append(("--np 1,2 --token 8,24", esito))


def test_esatti_reale(llama):
    """--esatti sends ignore_eos: the server takes it (its slot says so) and every request generates
    exactly --token tokens."""
    server = llama(2)
    rc, out, err = carico_cli(server.url, "--esatti", "--token", "40", "--richieste", "2", "--parallele", "2")
    assert rc == 0, out + err
    assert [int(m.group(3)) for m in map(RIGA_REQ.match, out.splitlines()) if m] == [40, 40]
    assert "(80 token generati)" in out and "si sono fermate" not in err
    assert all(s["params"]["ignore_eos"] is True for s in server.get_json("/slots"))


def test_conversazioni_reali_np_4_e_kv_unified(tmp_path):
    """The sheet's sentence, seen: at -np 4 -c 2048 (512 a slot) a few turns with a long system prompt no
    longer fit (HTTP 400 exceed_context_size_error, below turn 4). With --kv-unified the four conversations
    share 2048 tokens: this llama.cpp does not queue them when the buffer fills, every request in flight
    fails (HTTP 500 "Context size has been exceeded."). Both are the context running out: exit 3."""
    url = f"http://127.0.0.1:{porta_libera()}"
    rc, out, err = carico_cli(url, "--avvia", comando_reale(), "--np", "4,4kv", "--turni", "4", "--sistema", "300",
                              "--token", "32", "--svg", str(tmp_path / "c.svg"), timeout=600)
    assert rc == 3, out + err
    np4, kv = out.split("punto 2 di 2")
    fermi = [r for r in np4.splitlines() if "fermo al turno" in r]
    assert fermi and all(int(r.split("fermo al turno ")[1][0]) < 4 for r in fermi), np4
    assert all("il contesto dello slot è finito: HTTP 400 exceed_context_size_error: request (" in r for r in fermi)
    assert "il server (-np 4) ha deciso, dal suo log: 4 slot, n_ctx per slot 512, kv_unified false, cache KV 36.00 MiB" in out
    assert "il server (-np 4 kv) ha deciso, dal suo log: 4 slot, n_ctx per slot 2048, kv_unified true" in out
    pieno = [r for r in kv.splitlines() if "il buffer KV condiviso fra gli slot (--kv-unified) è pieno: HTTP 500 "
             "server_error: Context size has been exceeded." in r]
    assert pieno, kv
    assert "| 4 | 512 | 36.00 | " in out and "| 4 kv | 2048 | 36.00 | " in out
    assert "<title>n_ctx 512</title>" in (tmp_path / "c.svg").read_text()
    CIFRE.append(("--turni 4 --sistema 300 at -np 4", fermi[0].split(": HTTP")[0].strip()))
    CIFRE.append(("--turni 4 --sistema 300 at -np 4 kv", pieno[0].split(": HTTP")[0].strip()))


def test_una_conversazione_con_2048_token_arriva_in_fondo(llama):
    """At -np 1 -c 2048 the same conversation goes through its four turns, reusing its history from the
    slot's cache; the system prompt has exactly 300 tokens for the server's tokenizer."""
    server = llama(1)
    client = carico.Client(server.url)
    assert len(carico.tokenizza(client, carico.testo_di_token(client, 300))) == 300
    rc, out, err = carico_cli(server.url, "--turni", "4", "--sistema", "300", "--token", "32", "--parallele", "1",
                              "--dettagli")
    assert rc == 0, out + err
    assert "arrivate all'ultimo turno: 1 su 1" in out, out
    tabella = out[out.index("  turno  riuscite"):].splitlines()[1:5]
    assert [r.split()[1] for r in tabella] == ["1/1"] * 4
    assert all(int(r.split()[3]) >= 300 for r in tabella[1:]), out  # the history, from the slot's cache
    assert re.search(r"    slot 0: \d+ di 2048 token", out), out
    CIFRE.append(("--turni 4 at -np 1, turn 4 prompt", tabella[3].split()[2] + " token"))


def test_np_auto_e_la_domanda_della_ram_reale():
    """--np auto: the server started without -np says what it decided; --spiega then starts the question's
    servers, -np 4 -c 16384 and -np 4 --kv-unified -c 16384, whatever --np the session ran, and reads the KV
    cache each allocated (gemma-3's sliding-window layers: not 8 times as much; one shared SWA cache is
    smaller than four of their own)."""
    url = f"http://127.0.0.1:{porta_libera()}"
    rc, out, err = carico_cli(url, "--avvia", comando_reale(), "--np", "auto", "--richieste", "2", "--token", "4",
                              "--spiega", timeout=600)
    assert rc == 0, out + err
    assert out.splitlines()[0] == ("il server (-np auto) ha deciso, dal suo log: 4 slot, n_ctx per slot 2048, "
                                   "kv_unified true, cache KV 36.00 MiB")
    assert ("  La cache KV, misurata: il server di questa sessione (-np auto, -c 2048) ha allocato 36.00 MiB; avviato "
            "con -c 16384:") in out, out
    (np4,) = re.findall(r"^    -np 4: ([\d.]+) MiB \(", out, re.M)
    (np4kv,) = re.findall(r"^    -np 4 --kv-unified: ([\d.]+) MiB \(", out, re.M)
    assert 36.0 < float(np4kv) < float(np4) < 8 * 36.0, out
    assert "  Non cresce come il contesto: con -np 4 la cache SWA (15 strati) si ferma a " in out, out
    CIFRE.append(("KV at -c 16384: -np 4, -np 4 --kv-unified", f"{np4} MiB, {np4kv} MiB"))


def test_prompt_di_esattamente_200_token_reale(llama):
    """--prompt-token 200: prompt_tokens is 200 plus the chat template's overhead, and the overhead is
    measured apart, from the server's own template and tokenizer (/apply-template, /tokenize)."""
    server = llama(2)

    def chiedi(percorso, corpo):
        richiesta = urllib.request.Request(server.url + percorso, json.dumps(corpo).encode(),
                                           {"Content-Type": "application/json"})
        with urllib.request.urlopen(richiesta, timeout=10) as r:
            return json.loads(r.read())
    con_template = chiedi("/apply-template", {"messages": [{"role": "user", "content": "ciao"}],
                                              "chat_template_kwargs": {"enable_thinking": False}})["prompt"]
    # The templated prompt as the server tokenizes a chat (special tokens included), less the message alone.
    sopra = (len(chiedi("/tokenize", {"content": con_template, "add_special": True})["tokens"])
             - len(chiedi("/tokenize", {"content": "ciao"})["tokens"]))
    rc, out, err = carico_cli(server.url, "--prompt-token", "200", "--richieste", "2", "--token", "4")
    assert rc == 0, out + err
    assert (f"prompt: 200 token, contati dal tokenizzatore del server; il template della chat ne aggiunge {sopra} "
            f"(prompt_tokens {200 + sopra})") in out, out
    CIFRE.append(("--prompt-token 200: the chat template adds", f"{sopra} tokens"))
