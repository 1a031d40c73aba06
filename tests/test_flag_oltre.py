"""The extras' flags folded without a change a user can see: each case pins the line (or the options) that
1.6.0 gives, so that a fold of the checks in leggi_opzioni_oltre cannot move a message or rename a flag.
No server: the parse alone (carico.analizza_argomenti)."""

import pytest

import carico
from test_opzioni import rifiuto  # the one error line a bad command line gets, after the usage line; exit 2

CAPACITA = ["--capacita", "--slo", "latenza=5", "--durata", "5"]


@pytest.mark.parametrize("altre,superflua", [
    (["--ritmo", "1,2"], "--ritmo"), (["--parallele", "1,2"], "--parallele"), (["--token", "8,16"], "--token"),
    (["--turni", "2"], "--turni"), (["--dataset", "d.jsonl"], "--dataset"),
    # more than one: the first in this order (ritmo, parallele, token, turni, dataset), whatever the typed one
    (["--dataset", "d.jsonl", "--token", "8,16"], "--token"), (["--turni", "2", "--parallele", "1,2"], "--parallele"),
    (["--dataset", "d.jsonl", "--turni", "2"], "--turni"),
])
def test_capacita_nomina_la_prima_opzione_che_non_serve(capsys, altre, superflua):
    assert rifiuto(capsys, CAPACITA + altre) == (f"carico.py: errore: --capacita sceglie da sé i ritmi da provare: "
                                                 f"{superflua} non serve (--ritmo R, un valore solo, è il primo)")


@pytest.mark.parametrize("altre", [[], ["--ritmo", "3"], ["--parallele", "2"], ["--token", "8"]])
def test_capacita_con_un_valore_solo(altre):
    """One value of --ritmo, --parallele or --token is not a list: the search runs, from --ritmo R (or 1)."""
    piani, opzioni = carico.analizza_argomenti(CAPACITA + altre)
    assert len(piani) == 1 and opzioni.oltre.capacita == 95.0
    assert piani[0].oltre.ritmo == (3.0 if "--ritmo" in altre else 1.0)


def test_la_chiave_vuota_nell_ambiente_non_e_una_chiave(monkeypatch):
    monkeypatch.setenv("LLAMA_API_KEY", "")
    assert carico.analizza_argomenti([])[1].api_key is None
    assert carico.analizza_argomenti(["--ripeti", "2"])[1].api_key is None


def test_la_chiave_sbagliata_nell_ambiente(capsys, monkeypatch):
    monkeypatch.setenv("LLAMA_API_KEY", "con spazi")
    assert rifiuto(capsys, []) == ("carico.py: errore: LLAMA_API_KEY: la chiave API deve essere fatta di caratteri "
                                   "ASCII stampabili, senza spazi")
