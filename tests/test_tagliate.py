"""Answers cut by the slot's context, said as cut (issue 37, findings 1, 7 and 8).

The real server (llama-server-api.md, "An answer longer than its slot's context"): at -np 4 -c 2048 an answer
asked 600 tokens stops when prompt + answer reach the slot's 512, with finish_reason length, completion_tokens
479 and usage.total_tokens 512. The fake does the same. Such an answer is marked on its `req` line after the
sheet's fields, one line after the summary says how many and what helps (never --esatti); the lines of whole
answers stay the sheet's. By hand carico cannot tell a --kv-unified server from one that splits -c, and says
neither; a run whose every request was refused (the lab's step 4) generated 0 tokens, and its peak of 0 is exact.
"""

import csv
import json
import re

import pytest

import carico
from aiuti import RIGA_REQ, VELOCE

TAGLIATA = re.compile(r"^  req +\d+: +[\d.]+ s +(\d+) token  \([\d.]+ t/s nel proprio slot\)"
                      r"  tagliata dal contesto: prompt (\d+) \+ (\d+) = (\d+) token$")
CONSIGLIO = re.compile(r"^tagliate dal contesto dello slot \((\d+) token\): (\d+) rispost[ae] su (\d+) "
                       r"\(finish_reason length\); (.*)$", re.M)
VELOCISSIMO = dict(n_slot=4, s_per_token=0.0005)  # 512 tokens a slot, ~500 tokens an answer in a quarter second


# Finding 7: by hand carico cannot know whether the slots share -c ###############################

@pytest.mark.parametrize("kv_unified", [True, False])
def test_spiega_a_mano_non_dice_il_contesto_che_non_sa(fake, carica, tmp_path, kv_unified):
    """-np auto or --kv-unified by hand: /slots says 4 slots of 2048, as a server started with -c 8192 -np 4
    would. --spiega says neither "Ogni slot aveva" nor "condividevano"; the JSON's kv_unificata is null."""
    server = fake(n_slot=4, n_ctx=2048 if kv_unified else 8192, kv_unified=kv_unified, s_per_token=0.001)
    file_json = tmp_path / "r.json"
    rc, out, err = carica(server.url, "--spiega", "--json", str(file_json), *VELOCE)
    assert rc == 0, out + err
    assert "Ogni slot aveva" not in out and "condividevano" not in out, out
    frase = ("Ogni slot vedeva 2048 token di contesto (n_ctx del server): suoi, o condivisi fra i 4 con --kv-unified "
             "(anche -np auto), che da qui non si vede.")
    assert frase in out and len(frase) <= 160, out
    assert json.loads(file_json.read_text())["prove"][0]["server"]["kv_unificata"] is None


def test_spiega_a_mano_un_solo_slot_lo_sa(fake, carica):
    """One slot: shared or not, it has all of -c; said as before."""
    server = fake(n_slot=1, s_per_token=0.001)
    rc, out, err = carica(server.url, "--spiega", "--richieste", "1", *VELOCE)
    assert rc == 0, out + err
    assert "Ogni slot aveva 2048 token di contesto" in out, out


# Finding 8: the lab's step 4, every request refused ############################################

def test_passo_4_tutte_rifiutate_zero_token_e_picco_esatto(fake, carica, tmp_path):
    """Every request HTTP 400 exceed_context_size: none reached a slot's work. The peak of 0 is exact (no note
    that it may be underestimated), and 0 tokens were generated (not n/d), at 0.00 token/s."""
    lungo = tmp_path / "lungo.txt"
    lungo.write_text("Riassumi: " + "La banda passante della memoria limita la generazione. " * 120)
    server = fake(n_slot=4)
    rc, out, err = carica(server.url, "--prompt-file", str(lungo), "--token", "20")
    assert rc == 1, out + err
    righe = out.splitlines()
    assert all("errore: HTTP 400 exceed_context_size_error" in r for r in righe[1:5]), out
    assert righe[6:10] == ["richieste=4 parallele=4 slot=4  picco slot occupati insieme=0",
                           righe[7], "throughput aggregato 0.00 token/s  (0 token generati)",
                           "richieste fallite: 4 su 4 (nessuna riuscita: niente da riassumere)"], out
    assert "sottostimato" not in err and "letture di /slots" not in err, err


def test_zero_token_solo_dove_e_saputo():
    """0 only when every request was refused with an HTTP 4xx; a connection closed without an answer (the
    server may have generated for it) or a run cut short keeps n/d."""
    rifiutata = carico.Risultato(0, 0.0, 0.01, errore="HTTP 400 exceed_context_size_error: request (1217 tokens)")
    s = carico.riassumi(carico.Esecuzione([rifiutata, rifiutata._replace(indice=1)], [], 2), 4)
    assert (s.token, s.throughput, s.picco) == (0, 0.0, 0)
    chiusa = rifiutata._replace(indice=1, errore="connessione chiusa dal server prima della risposta")
    s = carico.riassumi(carico.Esecuzione([rifiutata, chiusa], [], 2), 4)
    assert (s.token, s.throughput, s.picco) == (None, None, None)
    s = carico.riassumi(carico.Esecuzione([rifiutata], [], 2, interruzione=130), 4)  # one never ended
    assert (s.token, s.picco) == (None, None)
