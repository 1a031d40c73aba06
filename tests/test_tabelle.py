"""The tables and the aggregates, folded (issue 26, family 4): one mean, one Markdown table, one aligned
table, the rates computed once, the warm-up on the lab's pool, one repeat loop, one GET/POST of a ready
server. What a user sees stays as it was; these tests pin what the fold made one."""

import json
import signal
import sys
import threading
import time

import carico
from aiuti import FAKE, VELOCE, porta_libera


# One mean ######################################################################################

def test_valori_tutti_uguali_restano_entro_il_rumore():
    """Two files whose runs all measured the same figure: no variance, and no difference either, even where
    the mean of three 0.1s rounds to 0.10000000000000002 (Welch once saw an infinite t there)."""
    assert carico.welch([0.1] * 2, [0.1] * 3) == (0.0, float("inf"))
    assert carico.oltre_il_rumore([0.1] * 2, [0.1] * 3).startswith("entro il rumore")
    assert carico.welch([0.1] * 2, [0.2] * 3) == (float("inf"), float("inf"))


def test_una_sola_media():
    """n/d stays n/d: no values, no mean; otherwise the plain mean."""
    assert carico.media([]) is None
    assert carico.media([1.0, 2.0, 4.5]) == 2.5
    assert carico.riassunto([])["media"] is None


# One Markdown table, one aligned table #########################################################

def test_una_tabella_markdown_e_una_allineata():
    assert carico.tabella_md(["np", "throughput"], [["1", "9.50 token/s"], ["4", "n/d"]]) == [
        "| np | throughput |", "|---|---|", "| 1 | 9.50 token/s |", "| 4 | n/d |"]
    assert carico.in_colonne(["latenza (s)", "0.25", "1.50"], [-12, 6, 6]) == "  latenza (s)   0.25  1.50"
    assert carico.in_colonne(["1", "4/4", "poi il resto"], [5, 8], "  ") == "      1       4/4  poi il resto"


# The rates, computed once ######################################################################

def test_ogni_richiesta_fallita_i_ritmi_restano_quelli_di_prima(fake, carica, tmp_path):
    """Every request failed: --dettagli's rates are n/d (no request answered), while vLLM's names say what
    vLLM says, 0 requests a second and 0 prompt tokens: the two places keep their own values."""
    server = fake(n_slot=2, override={"/v1/chat/completions": lambda h, _: h.errore(500, "server_error", "guasto")})
    rc, out, _ = carica(server.url, "--dettagli", "--json", str(tmp_path / "r.json"))
    assert rc == 1
    assert "  richieste/s n/d  token di prompt/s n/d  token generati/s n/d" in out.splitlines()
    dati = json.loads((tmp_path / "r.json").read_text())
    assert dati["prove"][0]["dettagli"]["al_secondo"] == {"richieste": None, "token_prompt": None,
                                                         "token_generati": None}
    assert dati["duration"] > 0 and dati["completed"] == 0 and dati["failed"] == 4
    assert (dati["request_throughput"], dati["total_input_tokens"]) == (0.0, 0)
    assert dati["output_throughput"] is None and dati["total_token_throughput"] is None


# One repeat loop ###############################################################################

def test_capacita_su_ogni_server_avviato_parte_dal_primo_prompt(tmp_path, capsys):
    """--capacita with --avvia --np 1,2: each new server starts from the lab's first prompt, as every other
    run of a session does (the search once went on counting the prompts of the server before)."""
    registro = tmp_path / "prompt.jsonl"
    url = f"http://127.0.0.1:{porta_libera()}"
    comando = f"{sys.executable} {FAKE} serve -c 2048 --s-per-token 0.001 --registro {registro}"
    rc = carico.main(["--url", url, "--avvia", comando, "--np", "1,2", "--capacita", "--slo", "latenza=0.001",
                      "--durata", "0.5", "--ritmo", "8", "--arrivi", "costanti", "--token", "2", "--silenzioso", *VELOCE])
    out, err = capsys.readouterr()
    assert rc == 0, out + err
    prompt = [json.loads(riga) for riga in registro.read_text().splitlines()]
    assert [r for r in out.splitlines() if r.startswith("capacità, punto")] == [
        "capacità, punto 1: ritmo=8 req/s", "capacità, punto 2: ritmo=4 req/s"] * 2
    # Each server was sent the lab's prompts from the first, in the registry one server after the other. How
    # many each got can differ: on a loaded machine a send planned 0.125 s before the end of --durata may
    # find it over and stay unsent (a promise kept), and the next run goes on from the prompt after.
    primi = [i for i, p in enumerate(prompt) if p == carico.prompt_per(0)]
    assert len(primi) == 2, prompt
    for server in (prompt[:primi[1]], prompt[primi[1]:]):
        assert sorted(map(carico.PROMPTS.index, server)) == list(range(len(server))), prompt
        assert len(server) >= 2, prompt  # each point's first request always leaves


# The warm-up on the lab's pool #################################################################

def test_ctrl_c_nel_riscaldamento(fake, carica):
    """Ctrl+C while a warm-up request is in the slot: the lab's pool closes it (the server sees it go),
    nothing is measured, exit 130."""
    prompt, premuto = [], threading.Lock()

    def chat(h, corpo):  # the server's own answer; Ctrl+C when the slot takes the first request
        body = json.loads(corpo)
        prompt.append(body["messages"][0]["content"])
        # To the main thread, as a terminal's Ctrl+C reaches the tool waiting for its requests. Once, whichever
        # request the slot takes first (on a loaded machine both may have arrived by then).
        ctrl_c = lambda: premuto.acquire(blocking=False) and signal.pthread_kill(  # noqa: E731
            threading.main_thread().ident, signal.SIGINT)
        status, dati = h.server.fake.completa(body, all_avvio=ctrl_c, chiusa=h.chiusa)
        if status is not None:
            h.send_json(status, dati)

    server = fake(n_slot=1, s_per_token=0.02, override={"/v1/chat/completions": chat})
    rc, out, err = carica(server.url, "--riscaldamento", "2", "--token", "200", *VELOCE)  # 4 s a request: Ctrl+C lands in it
    assert rc == 130, err
    assert "riscaldamento: 2 richieste prima della prova, escluse dalle cifre" in err
    assert err.splitlines()[-1] == "carico.py: interrotto"
    assert out == "" and all(p.startswith("(riscaldamento ") for p in prompt), (out, prompt)
    limite = time.monotonic() + 5
    while (server.abbandonate == 0 or server.occupati()) and time.monotonic() < limite:
        time.sleep(0.02)
    assert server.abbandonate >= 1 and server.occupati() == 0


# One GET or POST of a ready server #############################################################

def test_tokenize_che_chiede_la_chiave_lo_dice(fake, carica):
    """/tokenize refusing the key is said as every other 401 of a ready server is: pass the key."""
    server = fake(n_slot=2, override={"/tokenize": lambda h, _: h.errore(401, "authentication_error", "Invalid API Key")})
    rc, out, err = carica(server.url, "--prompt-token", "64")
    assert rc == 1
    assert err.strip().splitlines()[-1] == (
        f"carico.py: errore: il server su {server.url} richiede una chiave API (è stato avviato con --api-key). "
        "Passala con --api-key CHIAVE o con la variabile LLAMA_API_KEY")
