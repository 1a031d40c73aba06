"""The extras' sections folded (issue 26): what their shorter code must still do, where no other test
looks: --avvia's -c replaced in every spelling, ShareGPT's skipped conversations counted whatever the
file holds."""

import json

import pytest

import carico


@pytest.mark.parametrize("comando", [
    ["llama", "serve", "-m", "m.gguf", "-c", "2048", "-t", "2"],
    ["llama", "serve", "-m", "m.gguf", "--ctx-size", "2048", "-t", "2"],
    ["llama", "serve", "-m", "m.gguf", "-c=2048", "-t", "2"],
    ["llama", "serve", "-m", "m.gguf", "--ctx-size=2048", "-t", "2"],
    ["llama", "serve", "-m", "m.gguf", "-t", "2"],
])
def test_con_contesto_toglie_il_c_del_comando_e_mette_il_suo(comando):
    """The RAM question's servers: the command's own -c (with its value, in any spelling) gone, -c N at the end."""
    assert carico.con_contesto(comando, 16384) == ["llama", "serve", "-m", "m.gguf", "-t", "2", "-c", "16384"]


def test_con_contesto_tiene_le_altre_opzioni_e_i_loro_valori():
    """A value that happens to look like a context (-t 2048) stays: only -c's own value goes."""
    comando = ["llama", "serve", "-t", "2048", "-c", "512", "-np", "4", "--ctx-size", "1024", "-a", "c"]
    assert carico.con_contesto(comando, 4096) == ["llama", "serve", "-t", "2048", "-np", "4", "-a", "c", "-c", "4096"]


def test_sharegpt_conta_le_conversazioni_saltate_di_ogni_tipo(tmp_path):
    """Whatever an entry lacks (not an object, no list of turns, no human turn, an empty question), it is
    skipped and counted; the rest keep their order, their first human (or user) question."""
    percorso = tmp_path / "s.json"
    percorso.write_text(json.dumps([
        {"conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "Prima"}]},
        "non un oggetto",
        {"conversations": "non una lista"},
        {"conversations": [{"from": "human", "value": ""}]},
        {"conversations": [5, {"from": "user", "value": "Seconda"}, {"from": "human", "value": "Terza"}]},
        {"altro": []}]))

    def errore(messaggio):
        raise AssertionError(messaggio)
    richieste, nome = carico.leggi_dataset(str(percorso), errore)
    assert richieste == (("Prima", None, None), ("Seconda", None, None))
    assert nome == "ShareGPT; 4 conversazioni su 6 senza una domanda (from human), saltate"


def test_sharegpt_senza_conversazioni_saltate_solo_il_nome(tmp_path):
    percorso = tmp_path / "s.json"
    percorso.write_text(json.dumps([{"conversations": [{"from": "human", "value": "Una"}]}]))
    assert carico.leggi_dataset(str(percorso), print) == ((("Una", None, None),), "ShareGPT")
