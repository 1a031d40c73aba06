"""--repliche's building blocks, without a real server: the flags' checks, one copy's command (-np, -c and -t
divided among the copies), the copies started and stopped (the fake as a process), and what they cost in RAM
(/proc/PID/smaps_rollup)."""

import json
import mmap
import subprocess
import time
import sys
import urllib.parse

import pytest

import carico
from aiuti import porta_libera, risponde
from test_oltre import comando_fake
from test_opzioni import rifiuto

C = carico.Configurazione
AVVIA = ["--avvia", "llama serve -m m.gguf -c 2048"]


# The flags ####################################################################################

def test_repliche_senza_np_ne_prende_il_massimo():
    _, opzioni = carico.analizza_argomenti(AVVIA + ["--repliche", "1,2,4"])
    assert opzioni.oltre.repliche == [1, 2, 4]
    assert opzioni.oltre.smista == "liberi"  # against one server's slots: a free slot anywhere
    assert carico.analizza_argomenti(AVVIA + ["--repliche", "2", "--smista", "turno"])[1].oltre.smista == "turno"
    assert carico.analizza_argomenti(["--url", "http://a:1,http://b:2"])[1].oltre.smista == "turno"
    assert opzioni.oltre.np == [C(4, repliche=1), C(4, repliche=2), C(4, repliche=4)]  # a point per layout
    assert opzioni.oltre.contesto_intero is False
    _, opzioni = carico.analizza_argomenti(AVVIA + ["--repliche", "2", "--np", "2,4kv", "--contesto-intero"])
    assert opzioni.oltre.repliche == [2] and opzioni.oltre.contesto_intero
    assert opzioni.oltre.np == [C(2, repliche=2), C(4, True, repliche=2)]
    # without -c: each copy its whole (default) context, so it is not needed; nor with copies of one
    _, opzioni = carico.analizza_argomenti(["--avvia", "llama serve", "--repliche", "2", "--contesto-intero"])
    assert opzioni.oltre.np == [C(2, repliche=2)]
    assert carico.analizza_argomenti(["--avvia", "llama serve", "--repliche", "1"])[1].oltre.np == [C(1)]
    # none of it: the fields' defaults
    oltre = carico.analizza_argomenti(AVVIA)[1].oltre
    assert (oltre.repliche, oltre.contesto_intero, oltre.np) == (None, False, [C(1), C(2), C(4)])


@pytest.mark.parametrize("argomenti,messaggio", [
    (["--repliche", "2"], "--repliche va usato insieme a --avvia: le copie del server le avvia carico.py"),
    (["--contesto-intero"], "--contesto-intero va usato insieme a --repliche: dice se ogni copia del server ha il "
                            "-c intero"),
    (AVVIA + ["--contesto-intero"], "--contesto-intero va usato insieme a --repliche"),
    (AVVIA + ["--repliche", "4", "--np", "2"], "--repliche 4 divide -np 2? no: 4 copie da -np 0.5 (ogni valore di "
                                               "--repliche deve dividere ogni --np)"),
    (AVVIA + ["--repliche", "1,2", "--np", "2,3"], "--repliche 2 divide -np 3? no: 2 copie da -np 1.5"),
    (AVVIA + ["--repliche", "2", "--np", "4,auto"], "--repliche divide -np fra le copie: con --np auto non c'è un "
                                                    "numero da dividere"),
    (["--avvia", "llama serve -m m.gguf", "--repliche", "1,2"],
     "--repliche divide -c fra le copie (a ogni slot lo stesso contesto): manca -c N nel comando di --avvia (o "
     "--contesto-intero)"),
    (["--avvia", "llama serve -c 0", "--repliche", "2"], "stesso contesto): -c 0 non è un numero da dividere (o --contesto-intero)"),
    (AVVIA + ["--repliche", "1,2,1"], "il valore 1 è ripetuto nella lista '1,2,1'"),
    (["--smista", "liberi"], "--smista sceglie fra più server: dagli più --url (A,B) o, con --avvia, --repliche"),
    (AVVIA + ["--smista", "turno"], "--smista sceglie fra più server"),
    (AVVIA + ["--repliche", "0"], "opzione --repliche: deve essere maggiore di 0, non 0"),
    (AVVIA + ["--repliche", "2,due"], "opzione --repliche: 'due' non è un numero intero"),
])
def test_repliche_opzioni_sbagliate(capsys, argomenti, messaggio):
    assert messaggio in rifiuto(capsys, argomenti)


def test_configurazione_delle_copie():
    """One copy's arguments; the label as today with one copy, else copies x slots of each."""
    assert [(c.etichetta, c.argomenti(), c.descrizione) for c in (C(4), C(4, True), C(-1))] == [
        ("4", ["-np", "4"], "un server -np 4"), ("4 kv", ["-np", "4", "--kv-unified"], "un server -np 4 --kv-unified"),
        ("auto", [], "un server -np auto")]
    assert [(c.etichetta, c.argomenti(), c.descrizione) for c in
            (C(4, repliche=2), C(4, repliche=4), C(4, True, repliche=2))] == [
        ("2x2", ["-np", "2"], "2 copie da -np 2"), ("4x1", ["-np", "1"], "4 copie da -np 1"),
        ("2x2 kv", ["-np", "2", "--kv-unified"], "2 copie da -np 2 --kv-unified")]
    assert C(4, False, None) == C(4)  # positional uses unchanged
    assert sorted([C(4, repliche=4), C(4, repliche=2), C(4), C(2)], key=lambda c: c.ordine) == [
        C(2), C(4), C(4, repliche=2), C(4, repliche=4)]


# One copy's command ##############################################################################

@pytest.mark.parametrize("comando,atteso", [
    ("llama serve -m m.gguf -c 2048 -t 2", "llama serve -m m.gguf -c 1024 -t 1"),
    ("llama serve -t=4 --ctx-size 2048", "llama serve -c 1024 -t 2"),
    ("llama serve --threads 6 --ctx-size=4096", "llama serve -c 2048 -t 3"),
    ("llama serve --threads=2 -c=2048 -a q", "llama serve -a q -c 1024 -t 1"),
])
def test_copia_divide_contesto_e_thread(comando, atteso):
    assert carico.copia_del_comando(comando.split(), C(4, repliche=2)) == (atteso.split(), [])


def test_copia_le_note():
    r2, r4 = C(4, repliche=2), C(4, repliche=4)
    assert carico.copia_del_comando("s -c 2048 -t 3".split(), r2) == (
        "s -c 1024 -t 1".split(), ["-t 3 non si divide fra 2 copie: ogni copia -t 1, 2 thread in tutto su 3 chiesti"])
    assert carico.copia_del_comando("s -c 2048 -t 2".split(), r4) == (  # at least one thread each: more in all
        "s -c 512 -t 1".split(), ["-t 2 non si divide fra 4 copie: ogni copia -t 1, 4 thread in tutto su 2 chiesti: "
                                  "si contendono i core"])
    assert carico.copia_del_comando("s -c 2050 -t 4".split(), r4) == (
        "s -c 512 -t 1".split(), ["-c 2050 non si divide fra 4 copie: ogni copia -c 512"])
    comando, note = carico.copia_del_comando("s -c 2048".split(), r2)
    assert comando == "s -c 1024".split()
    assert note == ["senza -t nel comando ognuna delle 2 copie usa i thread predefiniti del server: si contendono i "
                    "core (-t N li divide fra le copie)"]
    assert carico.copia_del_comando("s -c 2048 -t -1".split(), r2)[1][0].startswith("con -t -1 ognuna delle 2 copie")
    # the whole context to each copy: -c as given, -t still divided
    assert carico.copia_del_comando("s -c 2048 -t 4".split(), r2, intero=True) == ("s -c 2048 -t 2".split(), [])
    # one copy: the command as given, whatever it holds
    assert carico.copia_del_comando("s -c 2047 -t 3".split(), C(4)) == ("s -c 2047 -t 3".split(), [])
    assert carico.copia_del_comando(["s"], C(4, repliche=1)) == (["s"], [])


# The copies started and stopped (the fake as a process) ##########################################

def slot_di(url):
    return json.loads(carico.Client(url).chiama("GET", "/slots").corpo)


def test_copie_avviate_e_fermate(capsys):
    url = f"http://127.0.0.1:{porta_libera()}"
    with carico.copie_avviate(comando_fake("-t", "2").split(), C(2, repliche=2), url, 20, sys.stderr) as copie:
        assert len(copie) == 2 and copie[0].url == url
        porte = [urllib.parse.urlsplit(s.url).port for s in copie]
        assert porte[0] != porte[1] and all(risponde(s.url) for s in copie)
        for server in copie:  # -np 1 each, and the context divided: 2048 / 2
            assert [s["n_ctx"] for s in slot_di(server.url)] == [1024]
            assert (server.decisioni().n_slot, server.decisioni().n_ctx_slot) == (1, 1024)
        processi = [s.proc for s in copie]
    assert all(p.poll() is not None for p in processi) and not any(risponde(s.url) for s in copie)
    err = capsys.readouterr().err
    assert err.count("avvio: ") == 2 and err.count("-np 1 -lv 4 --host 127.0.0.1") == 2
    assert "-c 1024 -t 1 -np 1" in err
    assert "carico.py: nota" not in err  # -t 2 divides


def test_copie_fermate_anche_dopo_un_errore(capsys):
    url = f"http://127.0.0.1:{porta_libera()}"
    with pytest.raises(RuntimeError):
        with carico.copie_avviate(comando_fake().split(), C(2, repliche=2), url, 20, sys.stderr) as copie:
            processi = [s.proc for s in copie]
            raise RuntimeError("a metà")
    assert len(processi) == 2 and all(p.poll() is not None for p in processi)
    assert not any(risponde(s.url) for s in copie)
    err = capsys.readouterr().err
    # without -t, said once
    assert err.count("carico.py: nota: senza -t nel comando ognuna delle 2 copie") == 1


@pytest.mark.parametrize("intoppo,errore", [("porta occupata", carico.ErroreUtente), ("Ctrl+C", KeyboardInterrupt)])
def test_copie_fermate_se_la_seconda_non_parte(monkeypatch, capsys, intoppo, errore):
    """The second copy finds its port taken, or Ctrl+C comes before it starts: the first copy is stopped too."""
    url = f"http://127.0.0.1:{porta_libera()}"

    def porta(_):
        assert risponde(url)  # the first copy is up
        if intoppo == "Ctrl+C":
            raise KeyboardInterrupt
        return url  # where the first copy answers
    monkeypatch.setattr(carico, "url_libero", porta)
    with pytest.raises(errore):
        with carico.copie_avviate(comando_fake().split(), C(2, repliche=2), url, 20, sys.stderr):
            pytest.fail("the block runs only with every copy started")
    assert not risponde(url)
    assert capsys.readouterr().err.count("avvio: ") == 1  # the second: refused before it starts, or never tried


# Memory ###########################################################################################

ROLLUP = """55d0c6a6b000-7ffd4c1fb000 ---p 00000000 00:00 0                          [rollup]
Rss:              {rss} kB
Pss:              {pss} kB
Pss_Anon:            10 kB
Shared_Clean:      2048 kB
Private_Clean:    {pc} kB
Private_Dirty:    {pd} kB
Swap:                 0 kB
"""


def scrivi_rollup(radice, pid, **kib):
    (radice / str(pid)).mkdir()
    (radice / str(pid) / "smaps_rollup").write_text(ROLLUP.format(**kib))


def test_memoria_da_file(tmp_path):
    # Two copies each with 1 GiB of weights mapped by both (512 MiB of Pss each: not read), and their own pages.
    scrivi_rollup(tmp_path, 11, rss=1048576 + 102400, pss=524288 + 102400, pc=1024, pd=101376)
    scrivi_rollup(tmp_path, 12, rss=1048576 + 51200, pss=524288 + 51200, pc=0, pd=51200)
    m = carico.memoria([11, 12], str(tmp_path))
    assert m == carico.Memoria(privata=(100.0, 50.0), rss=(1124.0, 1074.0), condivisa=1024.0, totale=1174.0)
    # alone: what it maps with anyone, in full (Pss would give it half, the other copy's process holding the rest)
    assert carico.memoria([11], str(tmp_path)) == carico.Memoria((100.0,), (1124.0,), 1024.0, 1124.0)
    assert carico.memoria([11, 13], str(tmp_path)) is None  # a process gone
    (tmp_path / "14").mkdir()
    (tmp_path / "14" / "smaps_rollup").write_text("Rss: 1 kB\n")  # a kernel without Pss in the rollup
    assert carico.memoria([14], str(tmp_path)) is None
    assert carico.memoria([], str(tmp_path)) is None


MAPPA = """
import mmap, sys, time
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
sum(m[i] for i in range(0, len(m), mmap.PAGESIZE))  # every page resident
print("pronto", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/smaps_rollup is Linux's")
def test_memoria_di_due_processi_veri(tmp_path):
    """Two processes map the same 8 MiB file: those pages are shared, counted once in the total; in full, though a
    third process (another server on the same model) maps it too."""
    dati = tmp_path / "pesi.bin"
    dati.write_bytes(bytes(range(256)) * (8 * 4096))
    processi = [subprocess.Popen([sys.executable, "-c", MAPPA, str(dati)], stdout=subprocess.PIPE, text=True)
                for _ in range(3)]
    try:
        assert [p.stdout.readline() for p in processi] == ["pronto\n"] * 3
        m = carico.memoria([p.pid for p in processi[:2]])
        assert m is not None and len(m.privata) == len(m.rss) == 2
        assert m.condivisa >= 8 - 0.5  # the file, once (and the interpreter's own shared pages)
        assert m.totale < sum(m.rss) - 4  # summing RSS counts the file twice
        assert abs(m.totale - (sum(m.privata) + m.condivisa)) < 1e-9
        assert all(0 < p < r for p, r in zip(m.privata, m.rss))
    finally:
        for p in processi:
            p.kill()
            p.wait()
            p.stdout.close()
    assert carico.memoria([p.pid for p in processi[:2]]) is None  # gone


def test_copie_lente_a_fermarsi_aspettate_insieme(monkeypatch, capsys):
    """Copies that ignore SIGTERM: one deadline for all, then all killed; never one deadline after the other."""
    monkeypatch.setattr(carico, "FERMATA", 2.0)
    url = f"http://127.0.0.1:{porta_libera()}"
    with carico.copie_avviate(comando_fake("--lento-a-fermarsi", "60").split(), C(3, repliche=3), url, 20,
                              sys.stderr) as copie:
        processi = [s.proc for s in copie]
        inizio = time.monotonic()
    durata = time.monotonic() - inizio
    assert all(p.poll() is not None for p in processi)
    assert 2.0 <= durata < 5.0, durata  # one after the other: 6 s
