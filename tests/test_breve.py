"""What carico prints says less and surer: a sweep shows each run in one line, --spiega fits a screen, and
the few words that read wrong are mended."""
import re

import pytest

import carico
from aiuti import VELOCE


def righe_a_80(testo):
    """The lines a terminal 80 columns wide shows: a long line takes as many as it wraps to."""
    return sum(max(1, -(-len(riga) // 80)) for riga in testo.splitlines())


def test_spiega_sulla_prova_del_lab_sta_in_dodici_righe(fake, carica, monkeypatch):
    """--spiega on the lab's run adds at most 12 lines of an 80-column terminal (it added 15 to 18, on a
    machine busy around the run, as the lab's often is: staged here)."""
    monkeypatch.setattr(carico, "osserva_macchina", lambda *durata: carico.Macchina(2, 1.0, 0.67))
    server = fake(n_slot=4, s_per_token=0.002)
    rc, lab, _ = carica(server.url, "--richieste", "4", "--parallele", "4", "--token", "32")
    assert rc == 0
    rc, spiegata, err = carica(server.url, "--richieste", "4", "--parallele", "4", "--token", "32", "--spiega")
    assert rc == 0, err
    aggiunte = spiegata.split("\nthroughput aggregato ", 1)[1].split("\n", 1)[1]
    assert lab.split("\nthroughput aggregato ", 1)[1].count("\n") == 1
    assert "4 slot" in aggiunte and "t/s" in aggiunte  # what the run proves is still said
    assert righe_a_80(aggiunte) <= 12, aggiunte


def test_una_griglia_mostra_ogni_prova_in_una_riga(fake, carica, tmp_path):
    """--parallele 1,2,4,8 --ripeti 3 --spiega printed twelve whole lab blocks, each with its explanation,
    before the table (~245 lines): each run is one line now, at most 80 in all; the blocks are in --json
    and with --blocchi."""
    server = fake(n_slot=4, s_per_token=0.001)
    flag = ("--richieste", "4", "--parallele", "1,2,4,8", "--ripeti", "3", "--token", "4", "--spiega", *VELOCE)
    rc, out, err = carica(server.url, *flag, "--json", str(tmp_path / "g.json"))
    assert rc == 0, err
    assert len(out.splitlines()) <= 80, out
    assert out.count("server: 4 slot") == 1 and "  req 0:" not in out and "richieste=4" not in out
    una = [r for r in out.splitlines() if r.startswith("prova ") and " di 3: " in r]
    assert len(una) == 12 and all(" richieste in " in r and "latenza media" in r and "token/s" in r for r in una), out
    assert "| parallele |" in out and "Curva" in out  # the table and the sweep's own explanation
    assert (tmp_path / "g.json").read_text().count('"indice": 3') >= 12  # each run whole in the file
    rc, blocchi, err = carica(server.url, *flag, "--blocchi")
    assert rc == 0, err
    assert blocchi.count("richieste=4 parallele=") == 12 and blocchi.count("server: 4 slot") == 12


def test_la_prova_del_lab_stampa_come_prima(fake, carica):
    """A plain lab run (one --url, no list) prints its block as always: no one-line form."""
    server = fake(n_slot=4, s_per_token=0.001)
    rc, out, err = carica(server.url, "--richieste", "4", "--parallele", "4", "--token", "4", *VELOCE)
    assert rc == 0, err
    righe = out.splitlines()
    assert righe[0] == "server: 4 slot, n_ctx per slot = 512" and len(righe) == 9
    assert [r[:8] for r in righe[1:5]] == ["  req 0:", "  req 1:", "  req 2:", "  req 3:"] and righe[5] == ""
    assert righe[6].startswith("richieste=4 parallele=4 slot=4") and righe[7].startswith("tempo totale ")
    assert righe[8].startswith("throughput aggregato ")


@pytest.mark.parametrize("valore,esempio", [("127.0.0.1:8080", "--url http://127.0.0.1:8080"),
                                            ("localhost:8080", "--url http://localhost:8080"),
                                            ("http://127.0.0.1:8080", "--url http://127.0.0.1:8080"),
                                            ("4", "--richieste 4")])
def test_un_valore_senza_opzione_ha_il_suo_esempio(capsys, valore, esempio):
    """A bare host:port is a --url without its flag (it got '--richieste 4' as its example)."""
    with pytest.raises(SystemExit):
        carico.main([valore])
    err = capsys.readouterr().err
    assert f"un valore va dopo la sua opzione: {esempio};" in err, err


def test_dopo_la_prova_la_cpu_non_e_gia_occupata():
    """The look after a run said 'CPU già occupata': 'già' is the look before's word."""
    assert carico.macchina_occupata(carico.Macchina(2, 0.0, 0.9)) == "CPU occupata al 90%"


def test_una_griglia_in_breve_tiene_le_tagliate_e_cosa_aiuta(fake, carica):
    """The tour: a sweep's run lines dropped the block's answers cut by the slot's context and what helps. FIRE:
    each run line counts them, what helps is said once after the table; SILENT: none cut, neither; --blocchi,
    each block's own line and no note."""
    server = fake(n_slot=2, s_per_token=0.001, n_ctx=128)
    flag = ("--richieste", "4", "--parallele", "1,2", "--token", "80", *VELOCE)
    rc, out, err = carica(server.url, *flag)
    assert rc == 0, err
    una = [r for r in out.splitlines() if r.startswith("4 richieste in ")]
    assert len(una) == 2 and all(r.endswith(" token/s (4 tagliate dal contesto)") and len(r) <= 160 for r in una), out
    assert out.count("\ntagliate dal contesto: risposte fermate dal contesto pieno dello slot (finish_reason length); "
                     "aiuta un -c più grande o, senza --kv-unified, meno slot (-np)\n") == 1, out
    rc, blocchi, err = carica(server.url, *flag, "--blocchi")
    assert rc == 0, err
    assert blocchi.count("\ntagliate dal contesto dello slot (64 token): 4 risposte su 4") == 2, blocchi
    assert "tagliate dal contesto: " not in blocchi
    rc, corte, err = carica(server.url, "--richieste", "4", "--parallele", "1,2", "--token", "4", *VELOCE)
    assert rc == 0, err
    assert "tagliat" not in corte and "aiuta" not in corte, corte


def test_una_griglia_a_ritmo_in_breve_dice_il_programma(fake, carica):
    """The tour: under --ritmo a sweep's run lines dropped `nel programma`, which tells Poisson's drawn schedule
    from the rate asked. FIRE: each line says it and what was sent; SILENT: a sweep of --parallele, no schedule."""
    server = fake(n_slot=2, s_per_token=0.001)
    rc, out, err = carica(server.url, "--ritmo", "4,8", "--durata", "1", "--token", "4", *VELOCE)
    assert rc == 0, err
    una = [r for r in out.splitlines() if re.match(r"\d+ richiest[ae] in ", r)]
    assert len(una) == 2 and all(re.search(r"; nel programma \d+\.\d\d req/s, inviate davvero \d+\.\d\d$", r)
                                 and len(r) <= 160 for r in una), out
    rc, out, err = carica(server.url, "--richieste", "4", "--parallele", "1,2", "--token", "4", *VELOCE)
    assert rc == 0 and "programma" not in out, out
