"""Every figure, exact to the token: --dettagli (percentiles, TTFT, TPOT, ITL), --slo and goodput,
--riscaldamento, --esatti, the prompt cache made visible, and the live line on a terminal."""

import json
import os
import re
import select
import statistics
import sys
import time

import pytest

import carico
from aiuti import RIGA_REQ, VELOCE, rifiutata
from fakeserver import flusso_scritto


def latenze_scritte(ritardi):
    """A chat handler that answers request i (known by its prompt) after ritardi[i] seconds, one token."""
    per_prompt = {carico.prompt_per(i): r for i, r in enumerate(ritardi)}

    def handler(h, corpo):
        prompt = json.loads(corpo)["messages"][0]["content"]
        ritardo = per_prompt[prompt]
        time.sleep(ritardo)
        h.send_json(200, {"choices": [{"finish_reason": "length", "index": 0, "message": {"content": "ok"}}],
                          "usage": {"completion_tokens": 1, "prompt_tokens": 10},
                          "timings": {"cache_n": 0, "prompt_n": 10, "prompt_ms": 0.0, "predicted_n": 1,
                                      "predicted_ms": ritardo * 1000, "predicted_per_second": 1 / max(ritardo, 1e-9)}})
    return {"/v1/chat/completions": handler}


def leggi_terminale(madre):
    """Everything written to a pseudo-terminal so far, read from its master side, which is then closed."""
    scritto = b""
    while select.select([madre], [], [], 0.2)[0]:
        try:
            pezzo = os.read(madre, 65536)
        except OSError:  # the other side is closed
            break
        if not pezzo:
            break
        scritto += pezzo
    os.close(madre)
    return scritto


def riga_figura(out, nome):
    """The six numbers of a --dettagli row."""
    riga = next(r for r in out.splitlines() if r.startswith(f"  {nome} "))
    return [float(v) for v in riga.split()[-6:]]


# --dettagli #################################################################################

def test_percentili_sulle_latenze_scritte(fake, carica, tmp_path):
    ritardi = [i / 1000 for i in range(1, 101)]  # 1 to 100 ms
    server = fake(override=latenze_scritte(ritardi))
    rc, out, err = carica(server.url, "--richieste", "100", "--parallele", "10", "--dettagli",
                          "--json", str(tmp_path / "p.json"))
    assert rc == 0, out + err
    prova = json.loads((tmp_path / "p.json").read_text())["prove"][0]
    misurate = {r["indice"]: r["latenza_s"] for r in prova["richieste"]}
    # Each latency holds its own request's wait (an exact lower bound: a loaded machine only adds) and, for most,
    # little else: the typical excess stays far below the ~0.25 s that counting from the run's start would add.
    eccessi = [lat - ritardi[i] for i, lat in misurate.items()]
    assert len(eccessi) == 100 and min(eccessi) >= 0 and statistics.median(eccessi) < 0.1, eccessi
    # The tool's percentiles are the method's own answer on the same list.
    q = statistics.quantiles(list(misurate.values()), n=100, method="inclusive")
    cifre = prova["dettagli"]["figure_s"]["latenza"]
    assert (cifre["p50"], cifre["p90"], cifre["p99"]) == (q[49], q[89], q[98])
    assert cifre["min"] == min(misurate.values()) and cifre["max"] == max(misurate.values())
    assert prova["dettagli"]["metodo_percentili"] == 'statistics.quantiles(method="inclusive")'
    assert 'dettagli (percentili: statistics.quantiles(method="inclusive"))' in out
    assert riga_figura(out, "latenza (s)") == [round(v, 2) for v in (cifre["min"], cifre["media"], q[49], q[89],
                                                                      q[98], cifre["max"])]
    cadenze = re.search(r"richieste/s ([\d.]+)  token di prompt/s ([\d.]+)  token generati/s ([\d.]+)", out)
    totale = prova["riepilogo"]["tempo_totale"]
    assert float(cadenze.group(1)) == round(100 / totale, 2)
    assert float(cadenze.group(2)) == round(1000 / totale, 1)


def test_ttft_tpot_itl_sul_fake(fake, carica, tmp_path):
    """One slot, 50 ms a token, 10 tokens. The fake's first chunk carries only the role and leaves when the
    slot takes the request: the first token is the first chunk with text, after the prompt and one decode
    step. The lower bounds are exact: a loaded machine only adds delays (or reads several chunks at once,
    which the means over a whole request do not see), and they are what tell a gap divided in two. The
    upper bounds only say that nothing is counted twice."""
    passo = 0.05
    server = fake(n_slot=1, s_per_token=passo)
    rc, out, err = carica(server.url, "--stream", "--dettagli", "--richieste", "2", "--parallele", "1",
                          "--token", "10", "--json", str(tmp_path / "s.json"))
    assert rc == 0, out + err
    prova = json.loads((tmp_path / "s.json").read_text())["prove"][0]
    figure = prova["dettagli"]["figure_s"]
    for r in prova["richieste"]:
        assert len(r["chunk_s"]) == 10
        # Not the role chunk (which comes before the prompt is even read): after the prompt and a step.
        assert r["primo_token_s"] >= r["prompt_ms"] / 1000 + 0.95 * passo, r
        # Nine more steps after it, each at least one sleep long: the first token is not a later one.
        assert r["latenza_s"] - r["primo_token_s"] >= 9 * 0.95 * passo, r
        # TPOT as vLLM defines it: (latency - first token) / (tokens - 1): the step, not half of it.
        assert 0.95 * passo <= r["tpot_s"] < 3 * passo, r
        gap = [b - a for a, b in zip(r["chunk_s"], r["chunk_s"][1:])]
        assert 0.95 * passo <= sum(gap) / len(gap) < 3 * passo, gap
    assert figure["ITL"]["n"] == 2 * 9  # one gap between each two chunks with text
    assert 0.95 * passo <= figure["ITL"]["media"] < 3 * passo
    assert riga_figura(out, "ITL (ms)")[1] == round(figure["ITL"]["media"] * 1000, 1)
    assert "token per chunk" not in out  # one token a chunk: nothing to say


def test_itl_non_divide_i_gap_fra_chunk():
    """A server that sends several tokens a chunk: ITL is the gap between chunks as it is (vLLM does not
    divide it), and --dettagli says how many tokens a chunk carried, per request."""
    r = carico.Risultato(0, 0.0, 1.0, token=7, oltre=carico.RisultatoOltre(chunk_s=(0.1, 0.4, 0.7)))
    uno = carico.Risultato(1, 0.0, 1.0, token=3, oltre=carico.RisultatoOltre(chunk_s=(0.1, 0.11, 0.12)))
    assert carico.itl(r) == pytest.approx([0.3, 0.3])
    assert carico.tpot(r) == pytest.approx(0.9 / 6)
    assert carico.token_per_chunk(r) == pytest.approx(7 / 3) and carico.token_per_chunk(uno) == 1
    prova = carico.Prova(carico.InfoServer(1, 512, True), carico.Esecuzione([r, uno], [], 2),
                         carico.Piano(2, 2, 7))
    (riga,) = [r for r in carico.righe_dettagli(prova) if "token per chunk" in r]
    assert riga == ("  token per chunk (per richiesta): min 1.0, media 1.7, max 2.3: un intervallo ITL copre più di "
                    "un token")
    itl = next(x for x in carico.righe_dettagli(prova) if x.startswith("  ITL (ms)"))
    assert itl.split()[-6:] == ["10.0", "155.0", "155.0", "300.0", "300.0", "300.0"]


def test_flusso_senza_usage_ne_timings(fake, carica):
    """A stream that ends well but never says its tokens: one per chunk with text, marked as an estimate
    (~) on its line and in the summary, never n/d silently beside a throughput."""
    eventi = [b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'] + [
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'] * 5 + [
        b'data: {"choices":[{"delta":{},"finish_reason":"length"}]}\n\n', b"data: [DONE]\n\n"]
    server = fake(override={"/v1/chat/completions": flusso_scritto(*eventi, finito=True)})
    rc, out, err = carica(server.url, "--stream", "--dettagli", "--richieste", "1", "--parallele", "1")
    assert rc == 0, out + err
    assert re.match(r"  req 0: +[\d.]+ s +~5 token  \(n/d t/s nel proprio slot\)  primo token [\d.]+ s$",
                    out.splitlines()[1]), out
    itl = next(r for r in out.splitlines() if r.startswith("  ITL (ms)"))
    assert "n/d" not in itl  # the gaps between chunks need no token count
    assert "(~5 token generati: stima, un token per chunk con testo)" in out
    assert "token per chunk (per richiesta)" not in out  # one a chunk by construction: nothing measured


# --slo and goodput ############################################################################

def test_slo_goodput_contato_a_mano(fake, carica, tmp_path):
    ritardi = [0.02 * (i + 1) for i in range(20)]  # 20 to 400 ms
    server = fake(override=latenze_scritte(ritardi))
    rc, out, err = carica(server.url, "--richieste", "20", "--parallele", "20", "--slo", "latenza=0.21",
                          "--json", str(tmp_path / "g.json"))
    assert rc == 0, out + err
    prova = json.loads((tmp_path / "g.json").read_text())["prove"][0]
    buone = [r for r in prova["richieste"] if r["latenza_s"] <= 0.21]
    # 20 to 200 ms plus HTTP: at most 10, fewer on a loaded machine (the count is the test, not the speed)
    assert 1 <= len(buone) <= 10
    totale = prova["riepilogo"]["tempo_totale"]
    slo = prova["dettagli"]["slo"]
    assert slo["rispettate"] == len(buone) and slo["quota"] == len(buone) / 20
    assert slo["goodput_richieste_s"] == pytest.approx(len(buone) / totale)
    assert slo["goodput_token_s"] == pytest.approx(len(buone) / totale)  # one token each
    riga = next(r for r in out.splitlines() if r.startswith("SLO "))
    assert riga == (f"SLO (latenza <= 0.21 s): rispettati da {len(buone)} richieste su 20 ({len(buone) / 20:.0%}); "
                    f"goodput {len(buone) / totale:.2f} req/s, {len(buone) / totale:.1f} token/s")


def test_slo_in_streaming_con_tre_obiettivi(fake, carica):
    server = fake(n_slot=1, s_per_token=0.01)
    rc, out, err = carica(server.url, "--stream", "--slo", "latenza=100,ttft=100,tpot=0.001", "--token", "4")
    assert rc == 0, out + err
    assert "SLO (latenza <= 100 s, primo token <= 100 s, TPOT <= 0.001 s): rispettati da 0 richieste su 4 (0%)" in out


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--slo", "boh=1"], "opzione --slo: 'boh=1' non è un obiettivo: usa latenza=S, ttft=S o tpot=S (secondi), "
                         "per esempio latenza=5,ttft=1,tpot=0.1"),
    (["--slo", "latenza"], "opzione --slo: 'latenza' non è un obiettivo: usa latenza=S, ttft=S o tpot=S (secondi), "
                           "per esempio latenza=5,ttft=1,tpot=0.1"),
    (["--slo", "latenza=0"], "opzione --slo: deve essere maggiore di 0, non 0"),
    (["--slo", "latenza=due"], "opzione --slo: 'due' non è un numero di secondi"),
    (["--slo", "ttft=1"], "--slo: ttft e tpot si misurano solo in streaming: aggiungi --stream"),
    (["--riscaldamento", "0"], "opzione --riscaldamento: deve essere maggiore di 0, non 0"),
    (["--riscaldamento", "-2"], "opzione --riscaldamento: deve essere maggiore di 0, non -2"),
])
def test_opzioni_sbagliate_dei_dettagli(fake, capsys, argomenti, messaggio):
    assert rifiutata(fake(), capsys, argomenti) == f"carico.py: errore: {messaggio}"


# --riscaldamento ##############################################################################

def test_riscaldamento_escluso_dalle_cifre(fake, carica, tmp_path):
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--riscaldamento", "3", "--json", str(tmp_path / "r.json"))
    assert rc == 0, out + err
    assert "riscaldamento: 3 richieste prima della prova, escluse dalle cifre" in err
    assert len(server.prompts) == 3 + 4
    assert sorted(server.prompts[:3]) == [f"(riscaldamento {i + 1}) {carico.prompt_per(i)}" for i in range(3)]
    assert sorted(server.prompts[3:]) == sorted(carico.prompt_per(i) for i in range(4))  # the lab's, unchanged
    assert len([r for r in out.splitlines() if RIGA_REQ.match(r)]) == 4
    assert "(128 token generati)" in out
    assert len(json.loads((tmp_path / "r.json").read_text())["prove"][0]["richieste"]) == 4


# --esatti, and requests that stopped before --token ###########################################

def test_fermate_prima_di_token_e_esatti(fake, carica, tmp_path):
    server = fake(n_slot=4, s_per_token=0.001, eos_dopo=5)
    rc, out, err = carica(server.url, "--spiega")
    assert rc == 0, out + err
    nota = ("carico.py: nota: 4 richieste su 4 si sono fermate prima di --token 32 (finish_reason stop, 5 token). "
            "Il throughput conta solo i token generati: non confrontarlo con prove che arrivano a --token. "
            "--esatti li fa generare tutti")
    assert nota in err.splitlines()
    assert "4 richieste su 4 si sono fermate prima di --token 32" in out  # --spiega says it too
    assert "(20 token generati)" in out
    assert not any("ignore_eos" in b for b in server.bodies)

    rc, out, err = carica(server.url, "--esatti", "--dettagli")
    assert rc == 0, out + err
    assert all(b["ignore_eos"] is True for b in server.bodies[4:])
    assert "(128 token generati)" in out and "si sono fermate" not in out + err


def test_esatti_con_un_server_che_ignora_ignore_eos(fake, carica):
    server = fake(n_slot=4, s_per_token=0.001, eos_dopo=5, rispetta_ignore_eos=False)
    rc, out, err = carica(server.url, "--esatti", "--dettagli")
    assert rc == 0, out + err
    assert ("carico.py: nota: 4 richieste su 4 si sono fermate prima di --token 32 (finish_reason stop, 5 token): "
            "il server non rispetta ignore_eos (--esatti)") in err.splitlines()
    assert "  4 richieste su 4 si sono fermate prima di --token 32" in out  # in the --dettagli block


# The prompt cache ##############################################################################

def test_prove_ripetute_senza_cache(fake, carica, tmp_path):
    """Every request asks for no prompt cache (cache_prompt: false), so that a rerun of the lab's prompts is
    computed again: three reruns on one server see no cached token and no note. The same prompt for every
    request (--prompt-file) is not flattered either."""
    server = fake(n_slot=1, s_per_token=0.001)
    stesso = tmp_path / "stesso.txt"
    stesso.write_text("Spiega la stessa cosa quattro volte, parola per parola, senza cambiare nulla.\n")
    for flags in ([], [], [], ["--prompt-file", str(stesso)]):
        rc, out, err = carica(server.url, "--csv", str(tmp_path / "a.csv"), *flags)
        assert rc == 0 and "cache" not in err, err
        assert [r.split(",")[7] for r in (tmp_path / "a.csv").read_text().splitlines()[1:]] == ["0"] * 4
    assert all(b["cache_prompt"] is False for b in server.bodies)


def test_server_che_usa_la_cache_lo_stesso(fake, carica, tmp_path):
    """A server that reuses its cache although asked not to: the note says by how much, and what to do."""
    server = fake(n_slot=1, s_per_token=0.001, rispetta_cache_prompt=False)
    stesso = tmp_path / "stesso.txt"
    stesso.write_text("Spiega la stessa cosa quattro volte, parola per parola, senza cambiare nulla.\n")
    rc, out, err = carica(server.url, "--prompt-file", str(stesso), "--json", str(tmp_path / "b.json"))
    assert rc == 0, err
    richieste = json.loads((tmp_path / "b.json").read_text())["prove"][0]["richieste"]
    riusati = [r["token_cache"] for r in richieste if r["token_cache"]]
    assert len(riusati) == 3  # the first found the slot empty
    assert (f"carico.py: nota: il server ha preso dalla cache {sum(riusati)} token di prompt in 3 richieste, anche "
            "se carico.py chiede cache_prompt: false. Quei token non sono stati calcolati: la prova ne esce "
            "avvantaggiata. Riavvia il server prima di ripeterla") in err.splitlines()


# The live line ##################################################################################

def test_riga_dal_vivo_su_un_terminale(fake, capsys, monkeypatch):
    server = fake(n_slot=2, s_per_token=0.005)  # 4 rounds of 0.15 s: a dozen live lines at --intervallo 0.05
    # A quiet machine, after the run as before: on a busy one a note on it follows the cleared line.
    monkeypatch.setattr(carico, "osserva_macchina", lambda: carico.Macchina(2, 0.1, 0.01))
    madre, figlia = os.openpty()
    with open(figlia, "w", encoding="utf-8", closefd=True) as terminale:
        monkeypatch.setattr(sys, "stderr", terminale)
        rc = carico.main(["--url", server.url, "--richieste", "8", "--parallele", "4", "--token", "20", *VELOCE])
    monkeypatch.undo()
    out = capsys.readouterr().out
    scritto = leggi_terminale(madre)
    assert rc == 0
    testo = scritto.decode()
    righe = re.findall(r"\r(\[[^\r\x1b]*)\x1b\[K", testo)
    assert len(righe) >= 3, testo
    for riga in righe:
        assert re.fullmatch(r"\[[0-8]/8\] slot occupati [0-2]/2  in coda [0-4]  generati \d+ token  [\d.]+ t/s  "
                            r"[\d.]+ s", riga), riga
    # 4 in flight (--parallele), 2 in the slots: 2 wait at the server; the 4 not yet sent are not its queue.
    assert any(" slot occupati 2/2  in coda 2 " in r for r in righe), righe
    generati = [int(re.search(r"generati (\d+)", r).group(1)) for r in righe]
    assert generati == sorted(generati) and generati[-1] > 0
    assert testo.endswith("\r\x1b[K")  # cleared at the end
    assert "\r" not in out and "slot occupati 2/2 " not in out  # stdout: the lab's lines only
    assert out.splitlines()[0] == "server: 2 slot, n_ctx per slot = 1024"


def test_riga_dal_vivo_mai_in_una_pipe_ne_con_silenzioso(fake, carica, capsys, monkeypatch):
    """In-process: the live line asks only sys.stderr.isatty(), which a pipe and capsys answer alike."""
    server = fake(n_slot=2, s_per_token=0.002)
    rc, _, err = carica(server.url, *VELOCE)
    assert rc == 0 and "\r" not in err and "slot occupati" not in err
    madre, figlia = os.openpty()
    with open(figlia, "w", encoding="utf-8", closefd=True) as terminale:
        monkeypatch.setattr(sys, "stderr", terminale)
        rc = carico.main(["--url", server.url, "--silenzioso", *VELOCE])
    monkeypatch.undo()
    capsys.readouterr()
    scritto = leggi_terminale(madre)
    assert rc == 0 and b"slot occupati" not in scritto and b"\r" not in scritto.replace(b"\r\n", b"")


def test_fallite_contate_per_tipo(fake, carica):
    """A slot of 28 tokens: the longer lab prompts are refused (HTTP 400), the shorter ones answered."""
    server = fake(n_slot=1, n_ctx=28, s_per_token=0.001)
    rc, out, err = carica(server.url, "--dettagli", "--token", "4")
    assert rc == 1, out + err
    fallite = [r for r in out.splitlines() if "errore: HTTP 400 exceed_context_size_error" in r]
    assert 0 < len(fallite) < 4, out
    assert f"  fallite per tipo: {len(fallite)} HTTP 400 exceed_context_size_error" in out.splitlines()
