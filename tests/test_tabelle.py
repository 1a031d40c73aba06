"""The tables and the aggregates, folded (issue 26, family 4): one mean, one Markdown table, one aligned
table, the rates computed once, the warm-up on the lab's pool, one repeat loop, one GET/POST of a ready
server. What a user sees stays as it was; these tests pin what the fold made one."""

import json
import signal
import subprocess
import sys
import time

import carico
from aiuti import CARICO, FAKE, VELOCE, porta_libera


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


# One GET or POST of a ready server #############################################################

def test_tokenize_che_chiede_la_chiave_lo_dice(fake, carica):
    """/tokenize refusing the key is said as every other 401 of a ready server is: pass the key."""
    server = fake(n_slot=2, override={"/tokenize": lambda h, _: h.errore(401, "authentication_error", "Invalid API Key")})
    rc, out, err = carica(server.url, "--prompt-token", "64")
    assert rc == 1
    assert err.strip().splitlines()[-1] == (
        f"carico.py: errore: il server su {server.url} richiede una chiave API (è stato avviato con --api-key): "
        "passala con --api-key CHIAVE o con la variabile LLAMA_API_KEY")
