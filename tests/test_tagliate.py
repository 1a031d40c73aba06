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
import subprocess
import sys

import pytest

import carico
from aiuti import CARICO, RIGA_REQ, VELOCE

TAGLIATA = re.compile(r"^  req +\d+: +[\d.]+ s +(\d+) token  \([\d.]+ t/s nel proprio slot\)"
                      r"  tagliata dal contesto: prompt (\d+) \+ (\d+) = (\d+) token$")
CONSIGLIO = re.compile(r"^tagliate dal contesto dello slot \((\d+) token\): (\d+) rispost[ae] su (\d+) "
                       r"\(finish_reason length\); (.*)$", re.M)
VELOCISSIMO = dict(n_slot=4, s_per_token=0.0005)  # 512 tokens a slot, ~500 tokens an answer in a quarter second


def frasi_nuove(testo):
    """The sentences of the lines this change prints (each at most 160 characters)."""
    return [f for riga in testo.splitlines() for f in re.split(r"(?<=\.) (?=[A-Z])", riga)]


def test_risposte_tagliate_segnate_e_una_riga_dice_cosa_aiuta(fake, carica):
    """Finding 1: -np 4 (512 a slot), --token 600: each answer stops at 512 - its prompt, finish_reason length.
    Each `req` line says so after the sheet's fields; the summary's three lines stay the lab's (the throughput
    counts the tokens generated); the next line counts the cut answers and says what helps, not --esatti."""
    server = fake(**VELOCISSIMO)
    rc, out, err = carica(server.url, "--token", "600", *VELOCE)
    assert rc == 0, out + err
    righe = out.splitlines()
    tagliate = [TAGLIATA.match(r) for r in righe[1:5]]
    assert all(tagliate), out
    for m in tagliate:
        token, prompt, generati, somma = map(int, m.groups())
        assert token == generati and prompt + generati == somma == 512, m.group(0)
    assert righe[5] == ""
    assert re.fullmatch(r"richieste=4 parallele=4 slot=4  picco slot occupati insieme=4", righe[6]), out
    assert re.fullmatch(r"tempo totale [\d.]+ s  \|  latenza media [\d.]+ s, max [\d.]+ s", righe[7]), out
    somma_token = sum(int(m.group(1)) for m in tagliate)
    assert re.fullmatch(rf"throughput aggregato [\d.]+ token/s  \({somma_token} token generati\)", righe[8]), out
    consiglio = CONSIGLIO.match(righe[9])
    assert consiglio and consiglio.group(1, 2, 3) == ("512", "4", "4"), out
    assert "-np" in consiglio.group(4) and "-c più grande" in consiglio.group(4), righe[9]
    assert len(righe[9]) <= 160 and len(righe) == 10, out
    assert "--esatti" not in out + err and "si è fermata" not in err and "si sono fermate" not in err, err


def test_solo_le_tagliate_e_nei_file(fake, carica, tmp_path):
    """Only the answers the context cut are marked: with --token 400-600 some ask few enough tokens to end whole
    (finish_reason length at their own max_tokens) and keep the sheet's line byte for byte. The CSV and the JSON
    say the same per request (tagliata_dal_contesto), and the deliverable's table beside the throughput."""
    server = fake(**VELOCISSIMO)
    file_csv, file_json = tmp_path / "r.csv", tmp_path / "r.json"
    rc, out, err = carica(server.url, "--richieste", "8", "--token", "400-600", "--seme", "3", "--csv", str(file_csv),
                          "--json", str(file_json), "--tabella", *VELOCE)
    assert rc == 0, out + err
    with open(file_csv, newline="") as f:
        righe_csv = {int(r["indice"]): r for r in csv.DictReader(f)}
    segnate = set()
    for riga in out.splitlines():
        m = re.match(r"^  req +(\d+):", riga)
        if m and TAGLIATA.match(riga):
            segnate.add(int(m.group(1)))
        elif m:
            assert RIGA_REQ.match(riga), riga  # a whole answer: the sheet's line, nothing after
    piene = {i for i, r in righe_csv.items() if int(r["token_prompt"]) + int(r["token"]) >= 511}
    assert segnate == piene and 0 < len(segnate) < 8, (segnate, piene, out)
    assert {i for i, r in righe_csv.items() if r["tagliata_dal_contesto"] == "True"} == segnate
    dati = json.loads(file_json.read_text())
    assert {r["indice"] for r in dati["prove"][0]["richieste"] if r["tagliata_dal_contesto"]} == segnate
    assert dati["prove"][0]["riepilogo"]["tagliate_dal_contesto"] == len(segnate)
    assert CONSIGLIO.search(out).group(2, 3) == (str(len(segnate)), "8"), out
    assert re.search(rf"^\| 4 \| 512 \| .* token/s \({len(segnate)} tagliate dal contesto\) \|$", out, re.M), out


def test_esatti_tagliate_dal_contesto_non_dal_server(fake, carica):
    """--esatti (ignore_eos) on answers the context cut: marked as cut, and nothing says the server ignored
    ignore_eos or suggests --esatti again."""
    server = fake(eos_dopo=100, **VELOCISSIMO)
    rc, out, err = carica(server.url, "--token", "600", "--esatti", *VELOCE)
    assert rc == 0, out + err
    assert sum(bool(TAGLIATA.match(r)) for r in out.splitlines()) == 4, out
    assert CONSIGLIO.search(out), out
    assert "ignore_eos" not in err and "--esatti" not in out + err, err


def test_fermate_prima_senza_esatti_se_token_non_sta_nel_contesto(fake, carica):
    """Answers the model ended early (finish_reason stop, 100 tokens) under --token 600 with 512 a slot: the note
    says they stopped, but not that --esatti makes them generate 600, which the slot's context cannot hold."""
    server = fake(eos_dopo=100, **VELOCISSIMO)
    rc, out, err = carica(server.url, "--token", "600", *VELOCE)
    assert rc == 0, out + err
    assert "4 richieste su 4 si sono fermate prima di --token 600 (finish_reason stop, 100 token)" in err, err
    assert "--esatti" not in err and "Il prompt più --token 600 non sta nei 512 token dello slot" in err, err
    assert not any(TAGLIATA.match(r) for r in out.splitlines()) and not CONSIGLIO.search(out), out


def test_spiega_non_dice_rifiutata_una_risposta_lunga(fake, carica):
    """--spiega on cut answers: no "una richiesta più lunga del contesto dello slot viene rifiutata (HTTP 400)",
    which is the prompt's case; it says the answer is cut; how many were, once (the block's line says it)."""
    server = fake(**VELOCISSIMO)
    rc, out, err = carica(server.url, "--token", "600", "--spiega", *VELOCE)
    assert rc == 0, out + err
    spiegazione = out[out.index("Sono partite"):]
    assert "viene rifiutata (HTTP 400)" not in spiegazione, spiegazione
    # one request's own prompt and answer, adding up to the slot's context (the maxima of two may not)
    assert re.search(r"La richiesta più lunga: (\d+) \+ (\d+) = (\d+) token di 512\. Un prompt che non ci sta è "
                     r"rifiutato \(HTTP 400\), una risposta tagliata\.", spiegazione), spiegazione
    assert out.lower().count("tagliate dal contesto") == 1 and CONSIGLIO.search(out), out
    assert "--esatti" not in out + err
    nuove = [f for f in frasi_nuove(spiegazione) if "tagliat" in f or "Ogni slot" in f]
    assert nuove and all(len(f) <= 160 for f in nuove), nuove


def test_tagliata_solo_con_le_sue_prove():
    """The test, on its own: length before --token and prompt + answer at the slot's n_ctx (or one less)."""
    prova = carico.Prova(carico.InfoServer(4, 512, True), carico.Esecuzione([], [], 0), carico.Piano(max_token=600))
    def r(token, prompt=30, finish="length", **kw):
        return carico.Risultato(0, 0.0, 1.0, token=token, token_prompt=prompt, finish_reason=finish, **kw)
    assert carico.tagliata_dal_contesto(r(482), prova) and carico.tagliata_dal_contesto(r(481), prova)
    assert not carico.tagliata_dal_contesto(r(480), prova)  # room left: it ended at its own max_tokens
    assert not carico.tagliata_dal_contesto(r(482, finish="stop"), prova)  # the model's EOS
    assert not carico.tagliata_dal_contesto(r(482, prompt=None), prova)  # no evidence, no mark
    assert not carico.tagliata_dal_contesto(r(600, prompt=0), carico.Prova(prova.info, prova.esecuzione,
                                                                          carico.Piano(max_token=600)))
    senza_ctx = prova._replace(info=carico.InfoServer(4, None, True))
    assert not carico.tagliata_dal_contesto(r(482), senza_ctx)
    assert carico.segno_tagliata(r(482), [r(482)]) == "  tagliata dal contesto: prompt 30 + 482 = 512 token"
    assert carico.segno_tagliata(r(480), [r(482)]) == ""


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
    frase = "Ogni slot: 2048 token di contesto, suoi o condivisi da tutti con --kv-unified (da qui non si vede)."
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


# The real server ##############################################################################

@pytest.mark.reale
def test_tagliate_dal_contesto_reale(llama, tmp_path):
    """-np 4 (512 tokens a slot), --token 600. Two prompts of 378 tokens whose answers the slot's context ends
    (the server's log: truncated = 1) and two short ones asking 16 tokens, whole at their own finish_reason
    length: only the first two are marked, by their usage, and one line says what helps, without --esatti."""
    server = llama(4)
    assert "n_ctx_slot = 512" in server.riga_log("n_slots ="), server.riga_log("n_slots =")
    lungo = ("Ripeti parola per parola questo testo, tutto, senza fermarti: "
             + "La banda passante della memoria limita la generazione. " * 34)
    dataset, file_csv = tmp_path / "d.jsonl", tmp_path / "r.csv"
    dataset.write_text("".join(json.dumps(r) + "\n" for r in [{"prompt": lungo}, {"prompt": "Ciao!", "max_tokens": 16}] * 2))
    proc = subprocess.run([sys.executable, CARICO, "--url", server.url, "--dataset", str(dataset), "--token", "600",
                           "--csv", str(file_csv)], capture_output=True, text=True, timeout=600)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0 and "Traceback" not in err, out + err
    with open(file_csv, newline="") as f:
        righe = {int(r["indice"]): r for r in csv.DictReader(f)}
    piene = {i for i, r in righe.items() if r["finish_reason"] == "length" and int(r["token"]) < 600
             and int(r["token_prompt"]) + int(r["token"]) >= 511}
    segnate = {int(re.match(r"  req (\d+):", r).group(1)) for r in out.splitlines() if TAGLIATA.match(r)}
    troncate_nel_log = len(re.findall(r"stop processing: n_tokens = \d+, truncated = 1", open(server.log.name).read()))
    assert segnate == piene and len(segnate) == troncate_nel_log and segnate <= {0, 2} and segnate, (out, righe)
    assert all(RIGA_REQ.match(r) for r in out.splitlines() if r.startswith("  req ") and not TAGLIATA.match(r)), out
    consiglio = CONSIGLIO.search(out)
    assert consiglio and consiglio.group(1, 2, 3) == ("512", str(len(segnate)), "4"), out
    assert "--esatti" not in out + err, out + err
