import itertools
import os
import sys

import pytest

# Each xdist worker imports every test module, whose asserts pytest rewrites: 2-3 s of CPU a worker, every run, where
# PYTHONDONTWRITEBYTECODE forbids their cache. The suite keeps it anyway (in __pycache__ folders, git-ignored).
sys.dont_write_bytecode = False

QUI = os.path.dirname(os.path.abspath(__file__))
for percorso in (os.path.dirname(QUI), QUI):
    if percorso not in sys.path:
        sys.path.insert(0, percorso)

import carico  # noqa: E402
from aiuti import reale_non_disponibile  # noqa: E402
from fakeserver import Config, FakeLlama  # noqa: E402


@pytest.fixture(autouse=True)
def sguardo_breve(monkeypatch):
    """In-process runs look at the CPU for 10 ms instead of 250 before each run, and see a quiet machine: the
    suite's own workers keep the cores busy, and a look would add its lines by chance. The look itself is tested
    on its own (test_oltre.py, with a duration), and a busy machine is staged by the tests that need one."""
    monkeypatch.setattr(carico, "SGUARDO_MACCHINA", 0.01)
    vera = carico.osserva_macchina
    monkeypatch.setattr(carico, "osserva_macchina", lambda *durata: vera(*durata) if durata else carico.Macchina(
        os.cpu_count() or 1, 0.0, 0.0))


@pytest.fixture
def fake():
    """fake(n_slot=..., ...) starts a fake llama.cpp server; all are stopped after the test."""
    avviati = []

    def avvia(override=None, **config):
        server = FakeLlama(Config(**config), override).__enter__()
        avviati.append(server)
        return server

    yield avvia
    for server in avviati:
        server.close()


@pytest.fixture
def carica(capsys):
    """carica(url, *flags) runs carico.main in-process: (exit code, stdout, stderr)."""
    def run(url, *flags):
        rc = carico.main(["--url", url, *flags])
        out, err = capsys.readouterr()
        return rc, out, err
    return run


# Real llama.cpp server #######################################################################

CIFRE = []  # (label, figure) lines the real-server tests report at the end of the run

# The tests' server decodes on one thread (-t 1), leaving the other core to carico.py, pytest and
# whatever else shares a CI machine. With -t 2 on 2 cores, one busy core made llama.cpp's threads
# wait for each other ~50x longer (49 -> 1.04 token/s at -np 1): the real suite took hours and its
# timeouts fired. With -t 1 it passed in 108 s beside a busy loop (112 s on a quiet machine). The
# tests assert structure (who waited for whom, per the server's own timings), not speed; the demo
# and the benchmark keep -t 2, the lab's "half the cores" on a quiet machine.
FILI_DEL_SERVER = 1


@pytest.fixture
def llama():
    """llama(np, *extra) starts the real `llama serve` on gemma-270m; all are stopped after the test.
    Not installed: a skip on a developer's machine, a failure in CI (CI=true)."""
    from realserver import ServerNonDisponibile, ServerReale

    avviati = []

    def avvia(np, *extra, **kw):
        try:
            server = ServerReale(np, extra, threads=FILI_DEL_SERVER, **kw)
        except ServerNonDisponibile as exc:
            reale_non_disponibile(exc)
        avviati.append(server)
        return server.avvia()

    yield avvia
    for server in avviati:
        server.__exit__(None, None, None)


def pytest_terminal_summary(terminalreporter, config):
    lunghe = getattr(config, "_carico_frasi_lunghe", [])  # see FRASE_MAX
    if lunghe:
        terminalreporter.section(f"carico: {len(lunghe)} sentences longer than {FRASE_MAX} characters (FAILED)")
        for lunghezza, frase, test in lunghe[:40]:
            terminalreporter.write_line(f"{lunghezza}: {frase}  [{test}]")
    if CIFRE:
        terminalreporter.section("carico: figures measured on the real server")
        for etichetta, cifra in CIFRE:
            terminalreporter.write_line(f"{etichetta}: {cifra}")


# The fast suite runs eight at a time with work stealing: xdist hands each worker one block of consecutive tests
# and the others steal from the tail of the longest queue. The longest tests head the blocks, so that each starts
# at once: placed together they would run one after the other on the first worker and outlast the rest of the
# suite. Each lane below heads its own block and runs in order. The tests that time the client's sends (the two
# of --ritmo, 2 s at 20 a second, and --capacita) share one lane, one after the other, so as not to take the
# cores from each other; the 1000-request test, which keeps a core busy, runs beside --capacita, which mostly
# waits; the --avvia sweeps, which mostly wait for servers to start and stop, head the fifth. Measured with
# --durations.
CORSIE = (("test_capacita_trova_il_ritmo_che_il_fake_regge", "test_ritmo_poisson_seminato_segue_il_programma",
           "test_ritmo_costante_sul_tempo_del_server"),
          ("test_grande_carico_memoria_limitata_e_campionamento_regolare", "test_picco_esatto_su_prove_brevi"),
          ("test_sovraccarico_tace_con_slot_liberi", "test_sovraccarico_quando_gli_arrivi_superano_il_server"),
          ("test_griglia_parallele_tabella_curva_e_spiega", "test_ctrl_c_mentre_il_server_si_ferma"),
          ("test_avvia_tutto_il_lab", "test_capacita_su_ogni_server_avviato_parte_dal_primo_prompt"))
CORSIA_DI = {nome: (corsia, posto) for corsia, nomi in enumerate(CORSIE) for posto, nome in enumerate(nomi)}


@pytest.hookimpl(trylast=True)  # after -m has deselected: the blocks are cut from what runs
def pytest_collection_modifyitems(items):
    lavoratori = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    lunghi = sorted((item for item in items if item.originalname in CORSIA_DI),
                    key=lambda item: CORSIA_DI[item.originalname])
    resto = iter([item for item in items if item.originalname not in CORSIA_DI])  # in their order
    ordine, rimasti = [], len(items)
    for blocco in range(lavoratori):  # as xdist cuts them: what is left, shared among the workers left
        misura = rimasti // (lavoratori - blocco)
        in_testa = [item for item in lunghi if CORSIA_DI[item.originalname][0] % lavoratori == blocco]
        ordine += in_testa + list(itertools.islice(resto, max(0, misura - len(in_testa))))
        rimasti -= misura
    items[:] = ordine + list(resto)


# What carico prints says little and sure: every sentence at most FRASE_MAX characters ##########
# Each output a test reads through capsys or capfd (the fixture `carica` included) is kept, and at the end of
# the session its sentences are measured; one longer than FRASE_MAX fails the session, the longest named.
# A sentence: a stretch of one printed line up to '. ' (': ' and '; ' do not end one). Not sentences, so not
# measured: the lab's own lines (the sheet's, pinned byte for byte by the golden tests), indented lines and
# lines with a '|' or a run of three spaces (the rows of a table or of a figure: columns, not prose), the
# picture's and the files' lines sent to stdout (SVG, markdown, JSON, CSV: lines opening with '<', '#', '{',
# '[', '"' or holding two commas with no space after them), and lines that quote a server's log or --help's
# argparse text ('usage:', 'srv ', 'main:'), which carico does not word. A path (the suite's are long temporary
# ones) counts as one character: its length is the user's, not carico's wording.
FRASE_MAX = 160
USCITE = []  # (test, text) of every output read in this process
LAB = ("server: ", "richieste=", "tempo totale ", "throughput aggregato ")


def frasi_misurate(testo):
    import re

    for riga in testo.splitlines():
        if (not riga.strip() or riga[:1].isspace() or riga.startswith(LAB) or "|" in riga or "   " in riga
                or riga.lstrip("\x1b[0123456789;m")[:1] in "<#{[\"" or re.search(r",[^ ].*,[^ ]", riga)
                or riga.startswith(("usage:", "srv ", "main:"))):
            continue
        for frase in re.sub(r"/[^\s'\"():,;]+/[^\s'\"():,;]+(/[^\s'\"():,;]*)+", "F", riga).split(". "):
            yield frase


@pytest.fixture(autouse=True)
def uscite_lette(request, monkeypatch):
    from _pytest.capture import CaptureFixture

    vera = CaptureFixture.readouterr

    def legge(self):
        letto = vera(self)
        USCITE.append((request.node.nodeid, f"{letto.out}\n{letto.err}"))
        return letto
    monkeypatch.setattr(CaptureFixture, "readouterr", legge)


def frasi_lunghe(uscite):
    """(length, sentence, test) of each sentence longer than FRASE_MAX, the longest first, each once."""
    viste = {}
    for test, testo in uscite:
        for frase in frasi_misurate(testo):
            if len(frase) > FRASE_MAX:
                viste.setdefault(frase, test)
    return sorted(((len(f), f, t) for f, t in viste.items()), reverse=True)


def pytest_sessionfinish(session):
    lunghe = frasi_lunghe(USCITE)
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller judges
        session.config.workeroutput["frasi_lunghe"] = lunghe
        return
    for nodo in getattr(session.config, "_carico_lavoratori", []):
        lunghe += [tuple(x) for x in nodo]
    if lunghe:
        session.config._carico_frasi_lunghe = sorted(set(lunghe), reverse=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    lista = node.config.__dict__.setdefault("_carico_lavoratori", [])
    lista.append(getattr(node, "workeroutput", {}).get("frasi_lunghe", []))

