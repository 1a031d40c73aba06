"""--stream: a stream is whole only when the server says why it ended, and it is read as it arrived.

The fake plays the faults measured on other servers (a stream ended early with [DONE] and no
finish_reason; streams without usage), and scripted handlers cut the bytes of a stream where a reader
can go wrong (an event, a `data:` line or a UTF-8 character split across reads, one byte at a time).
"""

import json
import re
import statistics

import pytest

import carico
from aiuti import VELOCE

INTERROTTA = "errore: il server ha interrotto la risposta dopo 4 chunk (nessun finish_reason)"


# A stream the server cut is a failure #########################################################

def test_flusso_chiuso_con_done_senza_finish_reason_e_fallito(fake, carica, tmp_path):
    """As llama-cpp-python ends a stream when another request waits: role chunk, three tokens, [DONE].
    Every such request is a failure with its own reason, counted apart, in neither latency nor throughput."""
    server = fake(n_slot=2, s_per_token=0.002, flusso_interrotto_dopo=3)
    rc, out, err = carica(server.url, "--stream", "--dettagli", "--richieste", "4", "--token", "8",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 1, out + err
    righe = out.splitlines()
    assert [r.split(" s ", 1)[1].strip() for r in righe[1:5]] == [INTERROTTA] * 4, out
    assert "richieste fallite: 4 su 4 (nessuna riuscita: niente da riassumere)" in righe
    assert ("  di cui interrotte dal server a metà risposta: 4 (nessun chunk con finish_reason: fuori da latenze "
            "e throughput)") in righe
    assert "tempo totale" in out and "latenza media n/d, max n/d" in out
    assert "  fallite per tipo: 4 il server ha interrotto la risposta" in righe
    prova = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    assert (prova["vllm"]["completed"], prova["vllm"]["failed"]) == (0, 4)
    assert prova["riepilogo"]["interrotte"] == 4 and prova["riepilogo"]["token"] is None


def test_flussi_interrotti_fuori_dalle_latenze(fake, carica, tmp_path):
    """Every other request cut after 3 of 8 tokens (one at a time, so the fake's setting can flip between
    them): the summary's latencies are those of the whole answers only, the cut ones counted apart."""
    server = fake(n_slot=1, s_per_token=0.01)
    tagli = iter([None, 3] * 2)

    def a_volte_tronca(h, corpo):
        server.config.flusso_interrotto_dopo = next(tagli)
        h.stream(json.loads(corpo))

    server.override["/v1/chat/completions"] = a_volte_tronca
    rc, out, err = carica(server.url, "--stream", "--richieste", "4", "--parallele", "1", "--token", "8",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 1, out + err
    prova = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    intere = [r for r in prova["richieste"] if r["errore"] is None]
    assert [r["indice"] for r in intere] == [0, 2]
    assert [r["errore"] for r in prova["richieste"] if r["indice"] in (1, 3)] == [INTERROTTA[len("errore: "):]] * 2
    s = prova["riepilogo"]
    assert s["latenza_media"] == pytest.approx(statistics.mean(r["latenza_s"] for r in intere))
    assert s["token"] == 16 and s["interrotte"] == 2
    assert "richieste fallite: 2 su 4 (il riepilogo conta solo le 2 riuscite)" in out


def test_flusso_chiuso_senza_finish_reason_ne_done(fake, carica):
    """The connection closed after two chunks with text, before any finish_reason: the same failure."""
    from fakeserver import flusso_scritto

    eventi = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'] * 2
    server = fake(override={"/v1/chat/completions": flusso_scritto(*eventi, finito=True)})
    rc, out, _ = carica(server.url, "--stream", "--richieste", "1", *VELOCE)
    assert rc == 1
    assert out.splitlines()[1].endswith("errore: il server ha interrotto la risposta dopo 2 chunk (nessun finish_reason)")


# A stream without usage: tokens from its chunks, said as an estimate ###########################

def test_flusso_senza_usage_token_stimati(fake, carica, tmp_path):
    server = fake(n_slot=2, s_per_token=0.002, usage_nei_flussi=False)
    rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--token", "5",
                          "--json", str(tmp_path / "r.json"), *VELOCE)
    assert rc == 0, out + err
    for riga in out.splitlines()[1:3]:
        assert re.match(r"  req \d: +[\d.]+ s +~5 token  \(n/d t/s nel proprio slot\)  primo token [\d.]+ s$", riga), out
    (throughput,) = [r for r in out.splitlines() if r.startswith("throughput aggregato")]
    assert re.match(r"throughput aggregato ~[\d.]+ token/s  \(~10 token generati: stima, un token per chunk con "
                    r"testo\)$", throughput), throughput
    assert ("i loro token (segnati ~) sono i chunk con testo, uno per chunk, una stima") in err
    prova = json.loads((tmp_path / "r.json").read_text())["prove"][0]
    assert [(r["token"], r["token_stimati"]) for r in prova["richieste"]] == [(5, True)] * 2
    assert prova["riepilogo"]["token_stimati"] is True


def test_flusso_con_usage_non_e_una_stima(fake, carica):
    server = fake(n_slot=2, s_per_token=0.002)
    rc, out, err = carica(server.url, "--stream", "--richieste", "2", "--token", "5", *VELOCE)
    assert rc == 0, out + err
    assert "~" not in out and "stima" not in err
    assert "(10 token generati)" in out
