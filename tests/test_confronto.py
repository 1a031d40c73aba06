"""Traffic like the real thing, and results that compare: prompts of exact lengths (--prompt-token, on
the server's own tokenizer), the prefill-against-decode sweep, --percentili, --json under vLLM's `bench
serve` names, and --confronta A.json B.json (figure by figure, the ratio, Welch's t on the repeats)."""

import json
import re
import statistics
import subprocess
import sys

import pytest

import carico
from aiuti import CARICO, rifiutata
from fakeserver import TEMPLATE_TOKENS, conta_token, pezzi_token


def test_json_con_i_nomi_di_vllm(fake, carica, tmp_path):
    """One run: vLLM's names at the top of the file and in the run, computed from the requests the same
    file keeps (so a script written for vLLM reads the same figures carico prints)."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, _, err = carica(server.url, "--stream", "--token", "8", "--richieste", "6", "--json", str(tmp_path / "r.json"))
    assert rc == 0, err
    dati = json.loads((tmp_path / "r.json").read_text())
    prova = dati["prove"][0]
    richieste = prova["richieste"]
    latenze_ms = [r["latenza_s"] * 1000 for r in richieste]
    primi_ms = [r["primo_token_s"] * 1000 for r in richieste]
    assert dati["completed"] == prova["vllm"]["completed"] == 6 and dati["failed"] == 0
    assert dati["total_output_tokens"] == sum(r["token"] for r in richieste) == 48
    assert dati["total_input_tokens"] == sum(r["token_prompt"] for r in richieste)
    assert dati["duration"] == prova["riepilogo"]["tempo_totale"]
    assert dati["output_throughput"] == pytest.approx(48 / dati["duration"])
    assert dati["total_token_throughput"] == pytest.approx((48 + dati["total_input_tokens"]) / dati["duration"])
    assert dati["mean_e2el_ms"] == pytest.approx(statistics.fmean(latenze_ms))
    assert dati["median_e2el_ms"] == pytest.approx(statistics.median(latenze_ms))
    assert dati["std_e2el_ms"] == pytest.approx(statistics.pstdev(latenze_ms))
    assert dati["p99_e2el_ms"] == pytest.approx(statistics.quantiles(latenze_ms, n=100, method="inclusive")[98])
    assert dati["median_ttft_ms"] == pytest.approx(statistics.median(primi_ms))
    assert dati["mean_tpot_ms"] == pytest.approx(statistics.fmean(r["tpot_s"] * 1000 for r in richieste))
    assert all(dati[f"{s}_itl_ms"] > 0 for s in ("mean", "median", "std", "p99"))


def test_json_senza_stream_e_con_piu_prove(fake, carica, tmp_path):
    """Without --stream TTFT, TPOT and ITL are None (never guessed); with more runs the names are in each."""
    server = fake(n_slot=2, s_per_token=0.001)
    rc, _, _ = carica(server.url, "--token", "4", "--ripeti", "2", "--json", str(tmp_path / "r.json"))
    assert rc == 0
    dati = json.loads((tmp_path / "r.json").read_text())
    assert "completed" not in dati  # two runs: which one would the top be?
    for prova in dati["prove"]:
        assert prova["vllm"]["completed"] == 4 and prova["vllm"]["mean_ttft_ms"] is None
        assert prova["vllm"]["p99_itl_ms"] is None and prova["vllm"]["mean_e2el_ms"] > 0


def file_di_prove(percorso, throughput, latenze, np=1, parallele=4):
    """A --json file made of known numbers: one run per value."""
    prove = [{"np": str(np), "piano": {"parallele": parallele, "max_token": 32, "ritmo": None, "turni": None},
              "riepilogo": {"throughput": t, "latenza_media": l, "latenza_max": 2 * l},
              "latenza_p90_s": 1.5 * l, "dettagli": {"figure_s": {}}, "interrotta": False}
             for t, l in zip(throughput, latenze)]
    percorso.write_text(json.dumps({"carico": "1.4.0", "prove": prove}))
    return str(percorso)


def test_confronta_una_differenza_netta_e_una_nel_rumore(tmp_path, capsys):
    """Known numbers, known verdicts: throughput 10 against 20 (spread 0.2) is beyond the noise; latency
    1.0 against 1.1 (spread 0.2) is within it. Welch: t = 0.1 / sqrt(0.04/3 * 2) = 0.61 on 4 degrees."""
    a = file_di_prove(tmp_path / "a.json", [10.0, 10.2, 9.8], [1.0, 1.2, 0.8], np=1)
    b = file_di_prove(tmp_path / "b.json", [20.0, 20.2, 19.8], [1.1, 0.9, 1.3], np=4)
    assert carico.main(["--confronta", a, b]) == 0
    righe = capsys.readouterr().out.splitlines()
    assert righe[0] == f"confronto: A = {a} (np 1, parallele 4, token 32: 3 prove), B = {b} (np 4, parallele 4, token 32: 3 prove)"
    tp = next(r for r in righe if r.startswith("  throughput aggregato"))
    assert " ".join(tp.split()) == ("throughput aggregato (token/s) 10.000 20.000 ×2.00 oltre il rumore "
                                    "(Welch 95%: t 61.24, gl 4.00, soglia 2.78)")
    lat = next(r for r in righe if r.startswith("  latenza media"))
    assert "×1.10  entro il rumore (Welch 95%: t 0.61, gl 4.00, soglia 2.78)" in lat
    assert not any("primo token" in r for r in righe)  # no --stream in either file: not compared


def test_confronta_con_una_prova_sola_e_indicativa(tmp_path, capsys):
    a = file_di_prove(tmp_path / "a.json", [10.0], [1.0])
    b = file_di_prove(tmp_path / "b.json", [20.0, 20.2, 19.8], [1.1, 0.9, 1.3], np=4)
    assert carico.main(["--confronta", a, b]) == 0
    righe = [r for r in capsys.readouterr().out.splitlines() if r.startswith("  ") and not r.strip().startswith("cifra")]
    assert righe and all(r.endswith("indicativa: meno di due prove con questa cifra in un file (con --ripeti 3 si "
                                    "misura il rumore)") for r in righe)


def test_welch_su_numeri_noti():
    """Against a hand computation: means 10 and 20, variances 0.04 and 0.04, three runs each."""
    t, gl = carico.welch([10.0, 10.2, 9.8], [20.0, 20.2, 19.8])
    assert t == pytest.approx(10 / (0.08 / 3) ** 0.5) and gl == pytest.approx(4.0)
    assert carico.welch([1.0, 1.0], [1.0, 1.0]) == (0.0, float("inf"))  # no spread, no difference
    assert carico.oltre_il_rumore([1.0, 1.0], [2.0, 2.0]).startswith("oltre il rumore")


@pytest.mark.parametrize("contenuto,messaggio", [
    (None, "non riesco a leggere"),
    ("non json", "non riesco a leggere"),
    ('{"prove": 3}', "non è un file di risultati di carico.py (--json)"),
    ('{"prove": [{"riepilogo": {}, "dettagli": {}, "interrotta": true}]}', "non ha prove intere da confrontare"),
    ('{"prove": [{"riepilogo": {}, "dettagli": {}, "interrotta": true}]}', "ripeti la misura fino in fondo con --json"),
])
def test_confronta_file_sbagliati(tmp_path, capsys, contenuto, messaggio):
    buono = file_di_prove(tmp_path / "a.json", [10.0], [1.0])
    cattivo = tmp_path / "b.json"
    if contenuto is not None:
        cattivo.write_text(contenuto)
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--confronta", buono, str(cattivo)])
    assert uscita.value.code == 2
    assert messaggio in capsys.readouterr().err.splitlines()[-1]


def test_confronta_mai_carichi_diversi(tmp_path, capsys):
    """Two files of different loads get no verdict (exit 2: the files given must change, issue 23); a file
    of two servers (--avvia --np 1,4) is compared server by server against the other's, never pooled."""
    a = file_di_prove(tmp_path / "a.json", [10.0, 10.2], [1.0, 1.1], parallele=2)
    b = file_di_prove(tmp_path / "b.json", [20.0, 20.2], [1.0, 1.1], np=4, parallele=4)
    with pytest.raises(SystemExit) as uscita:
        carico.main(["--confronta", a, b])
    assert uscita.value.code == 2
    out, err = capsys.readouterr()
    assert err.splitlines()[-1].endswith(f"--confronta: {a} e {b} non si confrontano: differiscono --parallele (A 2, "
                                         "B 4). Rifai le prove con le stesse opzioni, cambiando solo il server o -np")
    assert "rumore" not in out + err
    due = json.loads((tmp_path / "b.json").read_text())
    uno = json.loads(open(file_di_prove(tmp_path / "c.json", [10.0, 10.4], [1.0, 1.1], np=1)).read())
    due["prove"] = uno["prove"] + due["prove"]  # np 1 and np 4 in one file
    (tmp_path / "d.json").write_text(json.dumps(due))
    assert carico.main(["--confronta", str(tmp_path / "c.json"), str(tmp_path / "d.json")]) == 0
    teste = [r for r in capsys.readouterr().out.splitlines() if r.startswith("confronto:")]
    assert [t.split("B = ")[1] for t in teste] == [f"{tmp_path / 'd.json'} (np 1, parallele 4, token 32: 2 prove)",
                                                    f"{tmp_path / 'd.json'} (np 4, parallele 4, token 32: 2 prove)"]


def test_confronta_file_con_cifre_strane_senza_traceback(tmp_path, capsys):
    """Figures that are missing, text, or null are left out, never a traceback; nothing left: said so."""
    a = file_di_prove(tmp_path / "a.json", [10.0], [1.0])
    dati = json.loads(open(a).read())
    dati["prove"][0]["riepilogo"] = {"throughput": "10", "latenza_media": None}
    dati["prove"][0]["dettagli"] = "niente"
    dati["prove"][0].pop("latenza_p90_s")
    (tmp_path / "b.json").write_text(json.dumps(dati))
    assert carico.main(["--confronta", a, str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "  latenza max (s)" not in out and "nessuna cifra che abbiano tutti e due" in out


# --prompt-token: exact lengths by the server's tokenizer ######################################

def test_prompt_di_esattamente_n_token(fake, carica):
    """Every prompt has exactly N tokens for the server's tokenizer (the fake's rule), each opens with a
    different first token, and the chat template's overhead is measured from the server's prompt_tokens."""
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--prompt-token", "200", "--richieste", "6", "--token", "4")
    assert rc == 0, err
    assert [conta_token(p) for p in server.prompts] == [200] * 6
    assert len({p.split()[0] for p in server.prompts}) == 6  # no shared prefix, from the first token
    assert ("prompt: 200 token, contati dal tokenizzatore del server; il template della chat ne aggiunge "
            f"{TEMPLATE_TOKENS} (prompt_tokens {200 + TEMPLATE_TOKENS})") in out
    assert all(b.get("cache_prompt") is False for b in server.bodies)


def test_prompt_a_caso_fra_min_e_max_col_seme(fake, carica):
    """MIN-MAX draws each length uniformly, by --seme: the same seed the same lengths, another seed others."""
    server = fake(n_slot=2, s_per_token=0.001)
    for seme in ("3", "3", "4"):
        rc, out, _ = carica(server.url, "--prompt-token", "50-150", "--seme", seme, "--richieste", "8", "--token", "2")
        assert rc == 0
        assert f"(a caso, seme {seme})" in out
    lunghezze = [conta_token(p) for p in server.prompts]
    primi, secondi, terzi = lunghezze[:8], lunghezze[8:16], lunghezze[16:]
    assert all(50 <= n <= 150 for n in lunghezze) and len(set(primi)) > 3
    assert sorted(primi) == sorted(secondi) and sorted(primi) != sorted(terzi)  # (they arrive in any order)


def test_griglia_di_lunghezze_prefill_contro_decode(fake, carica, tmp_path):
    """A sweep over --prompt-token: per point the server's prompt speed beside the speed in the slot, and
    with --stream the first token's percentiles, which grow with the prompt (the fake computes a prompt
    at 0.2 ms a token: 1024 tokens take 0.2 s, 32 take 0.01 s)."""
    server = fake(n_slot=2, n_ctx=4096, s_per_token=0.001)
    rc, out, err = carica(server.url, "--prompt-token", "32,1024", "--richieste", "2", "--token", "4", "--stream",
                          "--percentili", "50,95", "--grafico", "--svg", str(tmp_path / "g.svg"))
    assert rc == 0, err
    # The curve carries the first token's median too: a mark on the terminal's (where the mean does not
    # sit on it), a square in the SVG for each point.
    assert "▴ primo token p50" in out
    assert len(re.findall(r": primo token p50 [\d.]+ s</title>", (tmp_path / "g.svg").read_text())) == 2  # a square a point
    testa = next(r for r in out.splitlines() if r.startswith("| prompt |")).strip("| ").split(" | ")
    assert testa[5:7] == ["prompt t/s (server)", "t/s nel proprio slot"]
    assert testa[-6:] == ["TTFT p50", "TTFT p95", "TPOT p50", "TPOT p95", "ITL p50", "ITL p95"]
    righe = [r.strip("| ").split(" | ") for r in out.splitlines() if r.startswith(("| 32 ", "| 1024 "))]
    ttft = [float(r[testa.index("TTFT p50")].split()[0]) for r in righe]
    # 0.2 s against 0.01 on a quiet machine; a loaded one adds tens of ms to both (0.057 and 0.254 s seen beside
    # 4 busy loops): twice is what a first token that did not wait for its prompt could never show.
    assert ttft[1] > 2 * ttft[0], ttft
    assert all(float(r[testa.index("prompt t/s (server)")]) > 0 for r in righe)


def test_percentili_scelti_in_dettagli_e_nel_json(fake, carica, tmp_path):
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, _ = carica(server.url, "--stream", "--dettagli", "--percentili", "50,95", "--token", "4",
                        "--json", str(tmp_path / "r.json"))
    assert rc == 0
    testa = next(r for r in out.splitlines() if r.strip().startswith("min"))
    assert testa.split() == ["min", "media", "p50", "p95", "max"]
    dati = json.loads((tmp_path / "r.json").read_text())
    assert {"p50", "p90", "p95", "p99"} <= set(dati["prove"][0]["dettagli"]["figure_s"]["latenza"])
    assert "p95_ttft_ms" in dati and "p99_ttft_ms" in dati


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--prompt-token", "0"], "'0': le lunghezze sono token, almeno 1, e MIN non supera MAX"),
    (["--prompt-token", "50-10"], "'50-10': le lunghezze sono token, almeno 1, e MIN non supera MAX"),
    (["--prompt-token", "10-20,30"], "una lista di lunghezze fa una prova per valore: valori singoli, senza MIN-MAX"),
    (["--prompt-token", "64,64"], "un valore è ripetuto nella lista '64,64'"),
    (["--prompt-token", "molti"], "'molti' non è una lunghezza in token (per esempio 200, 100-300, 128,512)"),
    (["--prompt-token", "64", "--turni", "2"], "--prompt-token e --turni si escludono"),
    (["--prompt-token", "64", "--seme", "2"], "--arrivi e --seme vanno usati insieme a --ritmo (o --seme con "
                                              "--prompt-token o --token MIN-MAX)"),
    (["--percentili", "50,100"], "opzione --percentili: '50,100': percentili fra 0 e 100 (esclusi), al più con due "
                                      "decimali (99.99), ognuno una volta"),
    (["--percentili", "50,50"], "opzione --percentili: '50,50': percentili fra 0 e 100 (esclusi), al più con due "
                                      "decimali (99.99), ognuno una volta"),
    (["--prompt-token", "100-"], "'100-' non è una lunghezza in token"),
    (["--confronta", "a.json"], "opzione --confronta: richiede 2 valori"),
])
def test_opzioni_sbagliate_delle_lunghezze(fake, capsys, argomenti, messaggio):
    assert messaggio in rifiutata(fake(), capsys, argomenti)


def test_prompt_token_senza_tokenize_esce_1(fake, capsys):
    """A server without a tokenizer cannot honour --prompt-token: its limit (exit 1), not a bad option (2)."""
    server = fake(override={"/tokenize": lambda h, _: h.errore(404, "not_found_error", "File Not Found")})
    rc = carico.main(["--url", server.url, "--prompt-token", "64"])
    assert rc == 1
    assert ("(HTTP 404 not_found_error: File Not Found; né con /extras/tokenize). --sistema, --prompt-token e "
            "--prefisso hanno bisogno del suo tokenizzatore") in capsys.readouterr().err
    assert server.bodies == []


@pytest.mark.lento
def test_diecimila_prompt_da_1024_token_sotto_i_100_mb(fake):
    """10,000 requests with --prompt-token 1024: each prompt is made as its request leaves, in the
    worker's thread, so carico.py's memory stays under 100 MB (its own peak RSS, measured in its process)."""
    lunghezze = []
    server = fake(n_slot=8, n_ctx=8 * 4096, s_per_token=0.0, s_per_prompt_token=0.0, tiene_le_richieste=False,
                  lunghezze=lunghezze)
    misura = ("import resource, runpy, sys\nsys.argv = sys.argv[1:]\ntry:\n    runpy.run_path(sys.argv[0], "
              "run_name='__main__')\nfinally:\n    print('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
              "file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", misura, CARICO, "--url", server.url, "--prompt-token", "1024",
                           "--richieste", "10000", "--parallele", "8", "--token", "1", "--silenzioso"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "richieste=10000 parallele=8" in proc.stdout
    assert len(lunghezze) == 10000 and set(lunghezze) == {1024}
    rss_mb = int(proc.stderr.split("RSS ")[-1].split()[0]) / 1024  # ru_maxrss is in KiB on Linux
    assert rss_mb < 100, rss_mb


def test_prompt_token_con_un_tokenizzatore_senza_inizi_di_parola(fake, capsys):
    pezzi = {"tokens": [{"id": i, "piece": p} for i, p in enumerate(["ab", "cd", "ef"] * 400)]}
    server = fake(override={"/tokenize": lambda h, _: h.send_json(200, pezzi)})
    assert carico.main(["--url", server.url, "--prompt-token", "64"]) == 1  # the server's limit, not a bad option
    assert "non dà pezzi che aprano parole diverse" in capsys.readouterr().err
    assert server.bodies == []


def test_ripetere_min_max_ridà_le_stesse_lunghezze_con_altri_testi(fake, carica):
    """--ripeti with MIN-MAX: each repeat is the same load (the same lengths, drawn by the run's index),
    with texts that start further on (never the same prompts twice)."""
    server = fake(n_slot=2, s_per_token=0.001)
    rc, _, _ = carica(server.url, "--prompt-token", "20-90", "--richieste", "5", "--ripeti", "2", "--token", "2")
    assert rc == 0
    corpi = [b["messages"][0]["content"] for b in server.bodies]
    assert sorted(map(conta_token, corpi[:5])) == sorted(map(conta_token, corpi[5:]))
    assert not set(corpi[:5]) & set(corpi[5:])


def test_nessuna_lettura_al_lavoro_non_fa_uno_zero(fake, carica):
    """Every reading fell while the slots were idle: no peak of 0 is printed, only that none saw them work."""
    idle = [{"id": 0, "n_ctx": 1024, "is_processing": False}, {"id": 1, "n_ctx": 1024, "is_processing": False}]
    server = fake(n_slot=2, s_per_token=0.002, override={"/slots": lambda h, _: h.send_json(200, idle)})
    rc, out, _ = carica(server.url, "--dettagli", "--token", "8", "--intervallo", "0.05")
    assert rc == 0
    assert "  contesto per slot: nessuna lettura di /slots (ogni 0.05 s) ha visto uno slot al lavoro" in out
    assert "di 1024 token (0%)" not in out
    assert "la richiesta più lunga, dalle risposte: req " in out


def test_vllm_senza_conteggi_dice_none():
    """An answer that did not say its tokens: the totals and the token rates are None, as in the summary."""
    r = carico.Risultato(0, 0.0, 1.0, None, None, 10.0, 900.0, token_prompt=20)
    prova = carico.Prova(carico.InfoServer(1, 2048, True), carico.Esecuzione([r], [], 1))
    dati = carico.riassunto_vllm(prova)
    assert dati["completed"] == 1 and dati["total_output_tokens"] is None
    assert dati["output_throughput"] is None and dati["total_token_throughput"] is None
    assert dati["request_throughput"] == 1.0 and dati["total_input_tokens"] == 20


# --prefisso: a shared prefix, the prompt cache at work ########################################

def test_prefisso_comune_e_la_cache_al_lavoro(fake, carica):
    """Every prompt opens with the same N tokens, then its own text; the cache is asked for (and the note
    that warns about cached prompts stays silent: here the cache is the experiment); the requests after
    the first on a slot take the prefix from it."""
    server = fake(n_slot=2, n_ctx=4096, s_per_token=0.001)
    rc, out, err = carica(server.url, "--prefisso", "100", "--prompt-token", "180", "--richieste", "6",
                          "--parallele", "2", "--token", "2")
    assert rc == 0, err
    pezzi = [pezzi_token(p) for p in server.prompts]  # as the fake's tokenizer cuts them
    assert all(len(p) == 180 for p in pezzi)
    assert len({"".join(p[:100]) for p in pezzi}) == 1 and len({p[100] for p in pezzi}) > 1
    assert all(b["cache_prompt"] is True for b in server.bodies)
    riga = next(r for r in out.splitlines() if r.startswith("prefisso comune di 100 token"))
    assert "(cache_prompt acceso): dalla cache " in riga
    assert "cache_prompt: false" not in err


def test_prefisso_zero_contro_prefisso_lungo(fake, carica):
    """The same load with and without a shared prefix (a sweep --prefisso 0,400): the first token comes
    sooner with it (the fake computes only what its cache lacks, 0.5 ms a token: 500 against about 100)."""
    server = fake(n_slot=2, n_ctx=4096, s_per_token=0.001, s_per_prompt_token=0.0005)
    rc, out, err = carica(server.url, "--prefisso", "0,400", "--blocchi", "--prompt-token", "500", "--richieste", "6",
                          "--parallele", "2", "--token", "4", "--stream")
    assert rc == 0, err
    assert "nessun prefisso comune, per confronto (cache_prompt acceso)" in out
    testa = next(r for r in out.splitlines() if r.startswith("| prefisso |")).strip("| ").split(" | ")
    righe = {r.strip("| ").split(" | ")[0]: r.strip("| ").split(" | ") for r in out.splitlines()
             if r.startswith(("| 0 ", "| 400 "))}
    ttft = {k: float(v[testa.index("TTFT p50")].split()[0]) for k, v in righe.items()}
    cache = {k: float(v[testa.index("dalla cache (media)")]) for k, v in righe.items()}
    assert ttft["400"] < ttft["0"] / 2, ttft
    assert cache["400"] > 100 > cache["0"], cache


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--prefisso", "0", "--turni", "2"], "--prefisso e --turni si escludono"),
    (["--prefisso", "100", "--prompt-token", "100"], "--prefisso 100 non lascia posto al testo di ogni richiesta"),
    (["--prefisso", "10", "--turni", "2"], "--prefisso e --turni si escludono"),
    (["--prefisso", "dieci"], "'dieci' non è un numero di token (0 o più)"),
])
def test_opzioni_sbagliate_del_prefisso(fake, capsys, argomenti, messaggio):
    assert messaggio in rifiutata(fake(), capsys, argomenti)


# --dataset: requests from a file, a trace on its own clock ####################################

def scrivi(percorso, righe):
    percorso.write_text("\n".join(righe) + "\n")
    return str(percorso)


def test_traccia_rimandata_con_i_suoi_orari(fake, carica, tmp_path):
    """A JSONL trace with timestamps 10.0, 10.5, 11.0: sent at 0, 0.5 and 1.0 s (bounds a loaded machine
    cannot break: a send late by a tenth of a second would be lateness the report shows), each with its
    own prompt or messages and max_tokens; the files keep the dataset's name, not its prompts."""
    traccia = scrivi(tmp_path / "t.jsonl", [
        '{"prompt": "Ciao, come stai?", "max_tokens": 4, "timestamp": 10.0}',
        '{"messages": [{"role": "system", "content": "Breve."}, {"role": "user", "content": "Che ore sono?"}], '
        '"timestamp": 10.5}',
        '{"prompt": "Spiega la banda passante.", "max_tokens": 6, "timestamp": 11.0}'])
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--dataset", traccia, "--json", str(tmp_path / "t.json"))
    assert rc == 0, err
    arrivi = [a - server.arrivi[0] for a in server.arrivi]
    assert 0.4 < arrivi[1] < 0.6 and 0.9 < arrivi[2] < 1.1, arrivi
    assert [b.get("max_tokens") for b in server.bodies] == [4, 32, 6]
    assert server.bodies[1]["messages"] == [{"role": "system", "content": "Breve."},
                                            {"role": "user", "content": "Che ore sono?"}]
    assert f"traccia di {traccia} (JSONL): 3 invii in 1.00 s nel file (2.00 req/s), inviate davvero " in out
    dati = json.loads((tmp_path / "t.json").read_text())
    assert [r["previsto_s"] for r in dati["prove"][0]["richieste"]] == [0.0, 0.5, 1.0]
    assert dati["opzioni"]["nome_dataset"] == f"{traccia} (JSONL)" and dati["opzioni"]["dataset"] is None


def test_sharegpt_la_prima_domanda_e_richieste_che_ripartono(fake, carica, tmp_path):
    (tmp_path / "s.json").write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "Prima domanda"}, {"from": "gpt", "value": "x"}]},
        {"conversations": [{"from": "gpt", "value": "solo una risposta"}]},
        {"conversations": [{"from": "human", "value": "Seconda domanda"}]}]))
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, _ = carica(server.url, "--dataset", str(tmp_path / "s.json"), "--richieste", "4", "--token", "2")
    assert rc == 0
    assert sorted(server.prompts) == ["Prima domanda", "Prima domanda", "Seconda domanda", "Seconda domanda"]
    assert (f"richieste da {tmp_path / 's.json'} (ShareGPT; 1 conversazione su 3 senza una domanda (from human), "
            "saltata): 2 richieste nel file, 4 inviate") in out


@pytest.mark.parametrize("righe,messaggio", [
    (['{"prompt": "a"}', 'non json'], "riga 2: non è JSON"),
    (['{"prompt": ""}'], "riga 1: serve prompt (un testo) o messages (una lista di {role, content})"),
    (['{"messages": [{"role": "user"}]}'], "riga 1: serve prompt (un testo) o messages"),
    (['{"prompt": "a", "max_tokens": 1.5}'], "riga 1: max_tokens deve essere un intero positivo, non 1.5"),
    (['{"prompt": "a", "timestamp": -1}'], "riga 1: timestamp deve essere un numero di secondi, non -1"),
    (['{"prompt": "a", "timestamp": 1}', '{"prompt": "b"}'], "il timestamp c'è su alcune righe e non su altre"),
    (['{"prompt": "a", "timestamp": 2}', '{"prompt": "b", "timestamp": 1}'], "i timestamp devono crescere"),
    ([''], "è vuoto: nessuna richiesta"),
    (['[{"conversations": []}]'], "non ha conversazioni con una domanda (il formato di ShareGPT)"),
    (['[{"conversations": 5}]'], "non ha conversazioni con una domanda (il formato di ShareGPT)"),
    (['{"prompt": "a", "timestamp": Infinity}'], "riga 1: timestamp deve essere un numero di secondi, non Infinity"),
    (['{"prompt": "a", "timestamp": NaN}'], "riga 1: timestamp deve essere un numero di secondi, non NaN"),
    (['{"prompt": "a", "timestamp": 0}', '{"prompt": "b", "timestamp": 1e12}'], "la traccia dura più di un giorno"),
])
def test_dataset_sbagliati_prima_del_carico(fake, capsys, tmp_path, righe, messaggio):
    assert messaggio in rifiutata(fake(), capsys, ["--dataset", scrivi(tmp_path / "d.jsonl", righe)])


@pytest.mark.parametrize("altri,messaggio", [
    (["--prompt-token", "64"], "--dataset e --prompt-token si escludono: le richieste vengono dal file"),
    (["--token", "8-32"], "--dataset e --token MIN-MAX si escludono"),
    (["--turni", "2"], "--dataset e --turni si escludono"),
    (["--ritmo", "2"], "ha i timestamp: è una traccia; --ritmo non serve"),
    (["--richieste", "9"], "--richieste 9: la traccia"),
])
def test_dataset_con_opzioni_che_non_vanno(fake, capsys, tmp_path, altri, messaggio):
    traccia = scrivi(tmp_path / "t.jsonl", ['{"prompt": "a", "timestamp": 0}', '{"prompt": "b", "timestamp": 1}'])
    assert messaggio in rifiutata(fake(), capsys, ["--dataset", traccia, *altri])


# --capacita: the highest rate within the objective ############################################

def test_capacita_trova_il_ritmo_che_il_fake_regge(fake, carica):
    """The fake's capacity is known by construction: one slot, 2 tokens at 25 ms each and a short
    prompt, about 0.056 s a request, 18 requests a second. With steady arrivals and a latency objective
    of 0.25 s, the search lands within one step of it (the last rate that held and the first that did not
    are within 20%). The search starts at 16 req/s, which holds: from 1 it would spend four more points
    doubling through rates that hold by far. Points of 1 s, about 16 requests each. Two sleeps a request, not
    ten of 5 ms: on a loaded machine each sleep ends late by its own few ms, and ten of them made the fake
    hold half its rate."""
    server = fake(n_slot=1, s_per_token=0.025)
    rc, out, err = carica(server.url, "--capacita", "--slo", "latenza=0.25", "--durata", "1", "--ritmo", "16",
                          "--token", "2", "--silenzioso")
    assert rc == 0, err
    riga = next(r for r in out.splitlines() if r.startswith("capacità sotto lo SLO (latenza <= 0.25 s, per il 95%"))
    tiene, cade = map(float, re.search(r"\. Fra ([\d.]+), che lo rispetta, e ([\d.]+), che no\. Provati ", riga).groups())
    capacita = 1 / (2 * 0.025 + 0.006)
    assert cade / tiene <= 1.2 + 1e-9
    assert capacita / 1.45 <= tiene <= capacita * 1.2, (tiene, capacita)
    esiti = [r.split(" | ")[-1] for r in out.splitlines() if r.startswith("| ") and r.endswith((" regge |", " no |"))]
    assert "regge |" in esiti and "no |" in esiti


def punto_finto(latenze, slo_ok_fino=None):
    risultati = [carico.Risultato(i, 0.0, l, 8, 30.0, 10.0, 200.0) for i, l in enumerate(latenze)]
    return [carico.Prova(carico.InfoServer(1, 2048, True), carico.Esecuzione(risultati, [], len(risultati)),
                         carico.Piano(None, 4, 8))]


@pytest.mark.parametrize("latenze,incerta", [
    ([0.1] * 10, "solo 10 richieste (meno di 20): allunga --durata"),
    ([0.1] * 96 + [9.0] * 4, "una differenza dentro il rumore di 100 richieste"),
    ([0.1] * 100, None),
])
def test_capacita_dice_quando_la_risposta_e_incerta(latenze, incerta):
    """Too few requests at the point that held, or a share within two standard errors of the objective:
    said; a clear margin on enough requests: silent."""
    cerca = carico.Capacita.__new__(carico.Capacita)
    cerca.oltre = carico.OpzioniOltre(slo={"latenza": 5.0}, capacita=95.0)
    cerca.punti = [(2.0, punto_finto(latenze), True)]
    righe = cerca.incertezza(2.0)
    assert (righe == []) if incerta is None else (len(righe) == 1 and incerta in righe[0]), righe


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--capacita", "--slo", "latenza=5"], "--capacita cerca il ritmo più alto entro un obiettivo: servono --slo"),
    (["--capacita", "--durata", "5"], "servono --slo (per esempio latenza=5) e --durata S"),
    (["--capacita", "150", "--slo", "latenza=5", "--durata", "5"], "--capacita 150: è una percentuale"),
    (["--capacita", "--slo", "latenza=5", "--durata", "5", "--ritmo", "1,2"], "--capacita sceglie da sé i ritmi"),
    (["--capacita", "--slo", "latenza=5", "--durata", "5", "--prefisso", "0,64"], "--capacita cerca un ritmo per un "
                                                                                  "carico solo"),
])
def test_opzioni_sbagliate_della_capacita(fake, capsys, argomenti, messaggio):
    assert messaggio in rifiutata(fake(), capsys, argomenti)


def test_token_min_max_a_caso_col_seme(fake, carica):
    """--token MIN-MAX: each request's max_tokens drawn between the two by --seme (the same seed, the same
    counts); with --esatti each one generates exactly what it asked."""
    server = fake(n_slot=2, s_per_token=0.001)
    for seme in ("2", "2", "5"):
        rc, out, _ = carica(server.url, "--token", "5-15", "--seme", seme, "--richieste", "8", "--esatti")
        assert rc == 0
        assert f"token chiesti a caso fra 5 e 15 (seme {seme}): generati " in out
    chiesti = [b["max_tokens"] for b in server.bodies]
    assert all(5 <= n <= 15 for n in chiesti) and len(set(chiesti[:8])) > 2
    assert sorted(chiesti[:8]) == sorted(chiesti[8:16]) != sorted(chiesti[16:])
    assert sum(map(int, re.findall(r"^  req +\d+: +[\d.]+ s +(\d+) token", out, re.M))) == sum(chiesti[16:])


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--token", "15-5"], "'15-5': MIN-MAX vuole MIN almeno 1 e non più di MAX (per esempio 5-15)"),
    (["--token", "5-x"], "'5-x' non è un intervallo di token"),
    (["--token", "5-8,10"], "--token MIN-MAX vale da solo: non in una lista, non con --turni"),
    (["--token", "5-8,5-8"], "il valore (5, 8) è ripetuto nella lista '5-8,5-8'"),
])
def test_opzioni_sbagliate_dei_token(fake, capsys, argomenti, messaggio):
    assert messaggio in rifiutata(fake(), capsys, argomenti)


def test_una_traccia_non_ha_il_tetto_di_quattro(fake, carica, tmp_path):
    """A trace is an open loop, like --ritmo: a burst of ten at the same instant is sent at once, not four at
    a time (the cap is only there against a runaway)."""
    traccia = scrivi(tmp_path / "t.jsonl", ['{"prompt": "Ciao numero %d", "timestamp": 0}' % i for i in range(10)])
    server = fake(n_slot=10, n_ctx=20480, s_per_token=0.01)
    rc, out, err = carica(server.url, "--dataset", traccia, "--token", "10")
    assert rc == 0, err
    assert "richieste=10 parallele=10 (tetto predefinito)" in out
    assert "trovato già" not in err
    assert server.picco_in_volo == 10


def test_capacita_con_tutte_le_richieste_fallite_si_ferma_e_lo_dice(fake, carica, tmp_path):
    """A server that fails every request: the search halves until a point would hold fewer than two
    requests, says why there is no answer, and saves its points in --json."""
    server = fake(n_slot=1, override={"/v1/chat/completions": lambda h, _: h.errore(500, "server_error", "guasto")})
    rc, out, _ = carica(server.url, "--capacita", "--slo", "latenza=1", "--durata", "1", "--silenzioso",
                        "--json", str(tmp_path / "c.json"))
    assert rc == 1
    riga = next(r for r in out.splitlines() if r.startswith("capacità sotto lo SLO"))
    assert "n/d: tutte le richieste sono fallite" in riga
    punti = json.loads((tmp_path / "c.json").read_text())["capacita"][0]["punti"]
    assert [p["ritmo"] for p in punti] == [1.0, 0.5, 0.25][:len(punti)] and len(punti) <= 3
    assert not any(p["regge"] for p in punti)


def test_prefisso_su_uno_slot_gia_caldo_non_dice_che_la_prima_non_trova_nulla(fake, carica):
    server = fake(n_slot=1, n_ctx=4096, s_per_token=0.001)
    righe = []
    for _ in range(2):  # the first run's first request finds an empty slot; the second run finds the prefix
        rc, out, _ = carica(server.url, "--prefisso", "100", "--prompt-token", "150", "--richieste", "3", "--token", "2")
        assert rc == 0
        righe.append(next(r for r in out.splitlines() if r.startswith("prefisso comune di 100 token")))
    assert righe[0].endswith(". 1 su 3 ne hanno presi meno della metà del prefisso: il suo slot l'ha presa prima che "
                             "un altro avesse calcolato il prefisso")
    assert "meno della metà" not in righe[1]
