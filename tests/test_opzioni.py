"""The command line read in one parse: the lab's four flags and the extras' from one table, the flags
that do not go together as data, the files read after the flags are checked. No server: each case is
the parse alone (carico.analizza_argomenti), its plans and options, or its Italian line and exit 2."""

import pytest

import carico


def rifiuto(capsys, argomenti):
    """The one error line a bad command line gets, after the usage line; exit 2."""
    with pytest.raises(SystemExit) as uscita:
        carico.analizza_argomenti(argomenti)
    assert uscita.value.code == 2
    uso, errore = capsys.readouterr().err.splitlines()
    assert uso.startswith("uso: carico.py [--url URL]")
    return errore


@pytest.mark.parametrize("argomenti", [
    [], ["--richieste", "8", "--parallele", "2", "--token", "16"],
    ["--rich", "3"],  # an abbreviation of a lab flag is the lab's flag
    ["--ripeti", "1"], ["--timeout", "300"], ["--attesa", "120"], ["--intervallo", "0.5"],  # an extra at its default
])
def test_il_lab_senza_extra(argomenti):
    """Only the lab's flags (or an extra given at its default, which asks nothing more): the lab's one
    plan, and no extras, so that the lab's path runs it."""
    piani, opzioni = carico.analizza_argomenti(argomenti)
    assert [p.oltre for p in piani] == [None]
    assert opzioni.oltre is None
    assert piani[0].timeout == carico.TIMEOUT_RICHIESTA and opzioni.attesa_pronto == carico.ATTESA_PRONTO
    attesi = {"--richieste": 8, "--rich": 3}
    assert piani[0].richieste == next((v for k, v in attesi.items() if k in argomenti), 4)


def test_un_extra_solo_e_le_sue_cifre(tmp_path):
    """An extra, and everything the parse derives for it once: the lab's defaults, the key, the waits,
    each option in its field (--json in file_json)."""
    piani, opzioni = carico.analizza_argomenti(["--ripeti", "3", "--api-key", "k", "--attesa", "5", "--timeout", "9",
                                                "--json", str(tmp_path / "p.json"), "--silenzioso"])
    assert [(p.richieste, p.parallele, p.max_token, p.timeout) for p in piani] == [(4, 4, 32, 9.0)]
    assert (opzioni.api_key, opzioni.attesa_pronto) == ("k", 5.0)
    assert opzioni.oltre == carico.OpzioniOltre(ripeti=3, file_json=str(tmp_path / "p.json"), silenzioso=True)


def test_la_chiave_dall_ambiente_anche_nel_lab(monkeypatch):
    monkeypatch.setenv("LLAMA_API_KEY", "segreta")
    assert carico.analizza_argomenti([])[1].api_key == "segreta"
    assert carico.analizza_argomenti(["--api-key", "mia", "--ripeti", "2"])[1].api_key == "mia"


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--dataset", "{d}", "--prompt-file", "{p}"], "--dataset e --prompt-file si escludono: le richieste vengono dal file"),
    (["--dataset", "{d}", "--prefisso", "0"], "--dataset e --prefisso si escludono: le richieste vengono dal file"),
    (["--prefisso", "0", "--prompt-file", "{p}"], "--prefisso e --prompt-file si escludono: il prefisso apre i prompt "
                                                  "che fa carico.py"),
    (["--prompt-token", "64", "--prompt-file", "{p}"], "--prompt-token e --prompt-file si escludono: i prompt li fa "
                                                       "l'una o l'altro"),
    (["--confronta", "{a}", "{a}", "--json", "{j}"], "--confronta legge due file di risultati e non manda richieste: "
                                                     "--json non serve"),
    (["--confronta", "{a}", "{a}", "--avvia", "llama serve"], "--confronta legge due file di risultati e non manda "
                                                              "richieste: --avvia non serve"),
    (["--turni", "2", "--prompt-file", "{p}"], "--turni e --prompt-file si escludono"),
    (["--durata", "5", "--richieste", "4"], "--durata e --richieste si escludono"),
    # the first of the excluded flags, in the table's order, whatever the order they were typed in
    (["--turni", "2", "--richieste", "3", "--ritmo", "1"], "--turni e --ritmo si escludono"),
    (["--capacita", "--slo", "latenza=5", "--durata", "5", "--turni", "2"], "--capacita sceglie da sé i ritmi da "
                                                                            "provare: --turni non serve"),
])
def test_opzioni_che_si_escludono(capsys, tmp_path, argomenti, messaggio):
    (tmp_path / "p.txt").write_text("Riassumi.")
    (tmp_path / "d.jsonl").write_text('{"prompt": "ciao"}\n')
    (tmp_path / "a.json").write_text('{"prove": [{"riepilogo": {}, "piano": {"parallele": 4}}]}')
    file = {"d": tmp_path / "d.jsonl", "p": tmp_path / "p.txt", "a": tmp_path / "a.json", "j": tmp_path / "o.json"}
    errore = rifiuto(capsys, [a.format(**file) for a in argomenti])
    assert errore.startswith(f"carico.py: errore: {messaggio}")


def test_i_file_si_leggono_dopo_le_opzioni(capsys, tmp_path):
    """A flag that cannot go with --dataset is said before the file is opened: a missing file is not the
    first thing to fix when the file would not be used."""
    errore = rifiuto(capsys, ["--dataset", str(tmp_path / "manca.jsonl"), "--turni", "2"])
    assert errore == "carico.py: errore: --dataset e --turni si escludono: le richieste vengono dal file"
    errore = rifiuto(capsys, ["--dataset", str(tmp_path / "manca.jsonl")])
    assert errore.startswith(f"carico.py: errore: --dataset: non riesco a leggere '{tmp_path / 'manca.jsonl'}'")


@pytest.mark.parametrize("contenuto,messaggio", [
    ("", "è vuoto"), (b"\xff\xfe", "non riesco a leggere"),
])
def test_prompt_file_che_non_si_usa(capsys, tmp_path, contenuto, messaggio):
    percorso = tmp_path / "p.txt"
    percorso.write_bytes(contenuto.encode() if isinstance(contenuto, str) else contenuto)
    assert messaggio in rifiuto(capsys, ["--prompt-file", str(percorso)])


def test_prompt_file_letto():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("  Il passo 4 del lab.\n")
    piani, _ = carico.analizza_argomenti(["--prompt-file", f.name])
    assert piani[0].oltre.testo == "Il passo 4 del lab."


# One np label ################################################################################

@pytest.mark.parametrize("configurazione,n_slot,tabella,csv,json_", [
    (carico.Configurazione(4, True), 4, "4 kv", "4 kv", "4 kv"),  # --avvia: the -np it started the server with
    (carico.Configurazione(-1), 4, "auto", "auto", "auto"),
    (None, 2, "2", "2", None),  # the server at --url: the slots it said it has; the file keeps null
    (None, None, "n/d", "", None),  # nor those
])
def test_la_stessa_etichetta_di_np_in_tabella_csv_e_json(configurazione, n_slot, tabella, csv, json_):
    import json

    r = carico.Risultato(0, 0.0, 1.0, 8, 10.0, 50.0, 700.0)
    prova = carico.Prova(carico.InfoServer(n_slot, 1024, True), carico.Esecuzione([r], [], 1), carico.Piano(1, 1, 8),
                         configurazione)
    assert carico.riga_tabella(carico.Punto([prova]), "")[:2] == [tabella, "1024"]
    assert carico.testo_csv([prova]).splitlines()[1].startswith(f"1,{csv},1,8,")
    assert json.loads(carico.testo_json([prova], [prova.piano], "http://x"))["prove"][0]["np"] == json_


def test_extra_di_opzioni_senza_extra():
    assert carico.oltre(carico.Opzioni()) == carico.OpzioniOltre()
    assert carico.oltre(carico.Opzioni(oltre=carico.OpzioniOltre(ripeti=2))).ripeti == 2


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--richieste", "1000000000"], "opzione --richieste: al massimo 100000, non 1000000000 (le richieste sono "
                                    "preparate tutte in memoria prima della prova)"),
    (["--timeout", "1e10"], "opzione --timeout: al massimo 1000000, non 1e10 (oltre 11 giorni)"),
    (["--durata", "1e300"], "opzione --durata: al massimo 1000000, non 1e300 (oltre 11 giorni)"),
])
def test_un_numero_enorme_detto_prima_della_prova(capsys, argomenti, messaggio):
    """The tour: `--richieste 1000000000` filled 1.8 GB in 16 s making the requests, sending none and saying
    nothing; `--timeout 1e10` failed every request with "errore interno: OverflowError: timestamp out of
    range". Both said at the parse, with the bound."""
    assert rifiuto(capsys, argomenti) == f"carico.py: errore: {messaggio}"
    carico.analizza_argomenti(["--richieste", "100000", "--timeout", "1e6"])  # the bounds themselves are fine
