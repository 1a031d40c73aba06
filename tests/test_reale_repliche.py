"""Several servers (--url A,B) and copies of one server (--repliche) against the real `llama serve` on gemma-270m.

Each figure carico prints is set against the servers' own evidence: the tokens and prompt tokens each server
counted in its /metrics across the run, its /slots, the copies' memory as /proc/PID/smaps_rollup says it while
they serve, and the copies' processes themselves, gone once carico.py is (Ctrl+C, or killed outright).
"""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from aiuti import CARICO, RIGA_REQ, porta_libera, reale_non_disponibile
from conftest import CIFRE
from test_piu_server import righe_server

pytestmark = pytest.mark.reale


def carico_cli(url, *flags, timeout=300):
    proc = subprocess.run([sys.executable, CARICO, "--url", url, *flags], capture_output=True, text=True,
                          timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout, proc.stderr


def metrica(server, nome):
    """A counter of the server's /metrics (started with --metrics)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        testo = r.read().decode()
    (valore,) = re.findall(rf"^llamacpp:{nome} ([\d.e+]+)$", testo, re.M)
    return int(float(valore))


def test_due_server_veri_ognuno_conta_i_suoi_token(llama, tmp_path):
    """--url A,B on two real servers of different sizes: the lab's total and each server's line are what each
    server counted itself (its /metrics before and after the run, its /slots)."""
    a, b = llama(1, "--metrics"), llama(2, "--metrics")
    contatori = ("tokens_predicted_total", "prompt_tokens_total")
    prima = [{c: metrica(s, c) for c in contatori} for s in (a, b)]
    dati = tmp_path / "due.json"
    # Five in turn: three to A, two to B; each its own answer length (8 to 16 tokens), so that the servers' counts
    # differ and a request counted on the wrong server shows.
    rc, out, err = carico_cli(f"{a.url},{b.url}", "--richieste", "5", "--parallele", "3", "--token", "8-16",
                              "--json", str(dati))
    assert rc == 0, out + err
    generati, letti = ([metrica(s, c) - p[c] for s, p in zip((a, b), prima)] for c in contatori)

    assert out.startswith(f"server: 3 slot, n_ctx per slot = n/d\n  {a.url}: 1 slot, n_ctx per slot = 2048\n"
                          f"  {b.url}: 2 slot, n_ctx per slot = 1024\n  richieste a turno (--smista turno)\n"), out
    (totale,) = re.findall(r"^throughput aggregato [\d.]+ token/s  \((\d+) token generati\)$", out, re.M)
    assert int(totale) == sum(generati) > 0, (out, generati)
    assert sum(int(m[3]) for m in map(RIGA_REQ.match, out.splitlines()) if m) == sum(generati), out

    prova = json.loads(dati.read_text())["prove"][0]
    richieste = prova["richieste"]
    tempo = prova["riepilogo"]["tempo_totale"]
    linee = righe_server(out)
    for k, (server, n, suoi, prompt) in enumerate(zip((a, b), (3, 2), generati, letti)):
        sue = [r for r in richieste if r["server"] == k]
        assert len(sue) == n, richieste  # in turn, whatever their size
        # Each server generated the tokens of the requests carico says it sent there, and read their prompts:
        # nothing else reached it (cache_prompt: false, so every prompt token was computed).
        assert sum(r["token"] for r in sue) == suoi, (k, sue, suoi)
        assert sum(r["token_prompt"] for r in sue) == prompt, (k, sue, prompt)
        slot = len(server.get_json("/slots"))
        m = re.fullmatch(rf"{n} richieste \({n} riuscite\), picco (\d+)/(\d+) slot, coda \d+, latenza media [\d.]+ s, "
                         r"max [\d.]+ s, quota del throughput ([\d.]+) token/s", linee[server.url])
        assert m, linee
        assert int(m[2]) == slot and 1 <= int(m[1]) <= slot, linee[server.url]
        assert abs(float(m[3]) - suoi / tempo) <= 0.006, (linee[server.url], suoi, tempo)  # printed to 0.01
        assert prova["per_server"][k]["token"] == suoi and prova["per_server"][k]["n_slot"] == slot
    CIFRE.append(("--url A,B (-np 1, -np 2): tokens per server, from /metrics", " + ".join(map(str, generati))))


# --repliche: the copies carico.py starts ########################################################

def comando_avvia():
    """`llama serve -m gemma -c 2048 -t 2 -a gemma-270m`: with --repliche 2, each copy -c 1024 -t 1."""
    from realserver import ALIAS, ServerNonDisponibile, trova_binario, trova_modello

    try:
        binario, modello = trova_binario(), trova_modello()
    except ServerNonDisponibile as exc:
        reale_non_disponibile(exc)
    return f"{binario} {'serve ' if binario.endswith('/llama') else ''}-m {modello} -c 2048 -t 2 -a {ALIAS}", modello


def processi(modello, padre=None):
    """{pid: command line} of the live processes that hold `modello` in their command line (and are `padre`'s
    children, if given). A zombie has no command line: it holds nothing."""
    trovati = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argomenti = f.read().decode(errors="replace").split("\0")
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if modello in argomenti and (padre is None or ppid == padre):
            trovati[int(pid)] = argomenti
    return trovati


def porta_di(argomenti):
    dopo = argomenti[argomenti.index("--port") + 1:] if "--port" in argomenti else []
    return int(dopo[0]) if dopo and dopo[0].isdigit() else None


def rss_e_privata(pid):
    """The process's resident pages and those only it maps, MiB, read by hand from /proc."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        kib = {r.split(":")[0]: int(r.split()[1]) for r in f if r.rstrip().endswith(" kB")}
    return kib["Rss"] / 1024, (kib["Private_Clean"] + kib["Private_Dirty"]) / 1024


def ram_delle_copie(letti):
    """The copies together: each one's private pages, plus the pages they share (the weights) once."""
    return sum(p for _, p in letti) + max(r - p for r, p in letti)


class Avviato:
    """carico.py in a process of its own, its stdout and stderr read line by line as they come, each line with
    the time it arrived (PYTHONUNBUFFERED: printed is sent)."""

    def __init__(self, *argomenti):
        self.proc = subprocess.Popen([sys.executable, CARICO, *argomenti], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.out, self.err = [], []
        self.lettori = [threading.Thread(target=self._leggi, args=(flusso, righe), daemon=True)
                        for flusso, righe in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for lettore in self.lettori:
            lettore.start()

    @staticmethod
    def _leggi(flusso, righe):
        for riga in flusso:
            righe.append((time.monotonic(), riga.rstrip("\n")))

    def fine(self, timeout):
        self.proc.wait(timeout)
        for lettore in self.lettori:
            lettore.join(10)
        return self.proc.returncode, "\n".join(r for _, r in self.out) + "\n", "\n".join(r for _, r in self.err)

    def quando(self, condizione, righe=None):
        """When the first line of stdout meeting `condizione` arrived (None: not yet)."""
        return next((t for t, r in (self.out if righe is None else righe) if condizione(r)), None)

    def ferma(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.fine(30)


def test_repliche_1_2_vere_tabella_ram_e_nessuna_copia_rimasta(tmp_path):
    """--np 2 --repliche 1,2: one server -np 2 -c 2048 -t 2, then two copies -np 1 -c 1024 -t 1. Both run; the
    table's RAM column is the copies' private pages plus their shared ones once, as the test reads them from
    /proc while they serve; --spiega says
    copies or slots; and no process holding the model is left."""
    comando, modello = comando_avvia()
    url = f"http://127.0.0.1:{porta_libera()}"
    carico = Avviato("--url", url, "--avvia", comando, "--np", "2", "--repliche", "1,2", "--richieste", "4",
                     "--token", "16", "--spiega")
    letture, visti = [], {}  # (time, {pid: (Rss, private) MiB}) of carico's children holding the model; all seen
    try:
        scadenza = time.monotonic() + 240
        while carico.proc.poll() is None and time.monotonic() < scadenza:
            figli = processi(modello, padre=carico.proc.pid)
            visti.update(figli)
            pss = {}
            for pid in figli:
                try:
                    pss[pid] = rss_e_privata(pid)
                except (OSError, ValueError):  # gone meanwhile, or exiting: no reading
                    pss = None
                    break
            if pss:
                letture.append((time.monotonic(), pss))
            time.sleep(0.05)
        rc, out, err = carico.fine(60)
    finally:
        carico.ferma()
        rimasti = {pid: a for pid, a in processi(modello).items() if pid in visti}
        senza_resti(modello, visti)
    assert rc == 0, out + err
    assert "Traceback" not in err

    # Nothing left holding the model: no copy, and no server for the lab's RAM question (the RAM is measured here).
    porte = [int(p) for p in re.findall(r"^avvio: .* --port (\d+)$", err, re.M)]
    assert len(porte) == 3, err  # -np 2; two copies
    assert [porta_di(a) for a in visti.values()] and {porta_di(a) for a in visti.values()} == set(porte), (visti, err)
    assert rimasti == {}, rimasti
    assert not [a for a in processi(modello).values() if porta_di(a) in porte], err

    # Both points ran, four requests each; the second over the two copies, two requests each.
    assert re.findall(r"^punto \d di 2: .*$", out, re.M) == ["punto 1 di 2: np=2", "punto 2 di 2: np=2x1"], out
    assert len([r for r in out.splitlines() if RIGA_REQ.match(r)]) == 8, out
    copie = re.findall(r"^il server \(-np 1\) ha deciso, dal suo log: 1 slot, n_ctx per slot 1024, .* \(copia (\d) "
                       r"di 2, (http://127\.0\.0\.1:(\d+))\)$", out, re.M)
    assert [c[0] for c in copie] == ["1", "2"] and copie[0][1] == url, out
    linee = righe_server(out)
    for _, base, _ in copie:
        assert re.match(r"2 richieste \(2 riuscite\), picco 1/1 slot", linee[base]), linee
    # The copies ran as the test's /proc saw them: -np 1, -c 1024 and -t 1 each, on the ports carico printed.
    coppie = {frozenset(pss) for _, pss in letture if len(pss) == 2}
    assert len(coppie) == 1, coppie
    (coppia,) = coppie
    assert sorted(porta_di(visti[pid]) for pid in coppia) == sorted(int(c[2]) for c in copie)
    for pid in coppia:
        argomenti = " ".join(visti[pid])
        assert " -c 1024 -t 1 -np 1 " in argomenti, argomenti

    # The table, with the RAM column.
    testa = next(r for r in out.splitlines() if r.startswith("| np |"))
    colonne = [c.strip() for c in testa.strip("|").split("|")]
    assert colonne[:4] == ["np", "n_ctx_slot", "KV MiB", "RAM MiB"], testa
    righe = {r[0]: r for r in ([c.strip() for c in riga.strip("|").split("|")] for riga in out.splitlines()
                                if re.match(r"\| (2|2x1) \|", riga))}
    assert sorted(righe) == ["2", "2x1"] and all(r[1] == "1024" for r in righe.values()), out
    ram = {np: int(r[3]) for np, r in righe.items()}

    # Each point's RAM against what the test read while that point's run went on: from its header to its
    # last line (carico reads its own right after that line, the copies still up).
    inizi = [carico.quando(lambda r, k=k: r.startswith(f"punto {k} di 2")) for k in (1, 2)]
    fini = [t for t, r in carico.out if r.startswith("throughput aggregato ")]
    assert len(fini) == 2 and None not in inizi, out
    ultime = {}
    for np, repliche, da, a in (("2", 1, inizi[0], fini[0]), ("2x1", 2, inizi[1], fini[1])):
        durante = [ram_delle_copie(pss.values()) for t, pss in letture if da <= t <= a and len(pss) == repliche]
        assert durante, (np, letture)
        ultime[np] = durante[-1]
        assert abs(ram[np] - durante[-1]) <= 0.15 * durante[-1], (np, ram[np], durante)

    # --spiega: copies or slots, each layout named with its figures, the RAM the table's.
    assert "\nCopie o slot?" in out, out
    blocco = out.split("\nCopie o slot?", 1)[1].split("\n\n", 1)[0].splitlines()
    assert len(blocco) >= 2 and all(r.startswith("  ") for r in blocco[1:]), blocco
    testo = "\n".join(blocco)
    assert "un server -np 2" in testo and "2 copie da -np 1" in testo, testo
    (riga_ram,) = [r for r in blocco if r.lstrip().startswith("RAM")]
    assert f"{ram['2']} MiB" in riga_ram and f"{ram['2x1']} MiB" in riga_ram, riga_ram
    CIFRE.append(("--repliche 1,2 (-np 2): RAM MiB, carico's / the test's last reading during the run",
                  ", ".join(f"np {np}: {ram[np]} / {ultime[np]:.0f}" for np in ("2", "2x1"))))


def avviato_con_due_copie(tmp_path):
    """carico.py --repliche 2 (-np 1, -c 1024, -t 1 a copy) with long answers, once both copies are generating:
    (carico, the model's path, the copies {pid: command line})."""
    comando, modello = comando_avvia()
    carico = Avviato("--url", f"http://127.0.0.1:{porta_libera()}", "--avvia", comando, "--np", "2", "--repliche",
                     "2", "--richieste", "4", "--token", "256", "--esatti")
    try:
        scadenza = time.monotonic() + 120
        urls = []
        while len(urls) < 2 and carico.proc.poll() is None and time.monotonic() < scadenza:
            urls = [m[1] for _, r in carico.out for m in [re.search(r"\(copia \d di 2, (http://\S+)\)$", r)] if m]
            time.sleep(0.05)
        assert len(urls) == 2, carico.fine(30)
        occupati = set()
        while len(occupati) < 2 and carico.proc.poll() is None and time.monotonic() < scadenza:
            for url in urls:
                with urllib.request.urlopen(url + "/slots", timeout=10) as r:
                    if any(s["is_processing"] for s in json.loads(r.read())):
                        occupati.add(url)
            time.sleep(0.05)
        assert len(occupati) == 2 and carico.proc.poll() is None, carico.fine(30)
        copie = processi(modello, padre=carico.proc.pid)
        assert sorted(porta_di(a) for a in copie.values()) == sorted(int(u.rsplit(":", 1)[1]) for u in urls), copie
    except BaseException:
        carico.ferma()
        raise
    return carico, modello, copie


def senza_resti(modello, copie):
    """Kills what is left of the copies (a failed test must not leave servers behind)."""
    for pid in processi(modello):
        if pid in copie:
            os.kill(pid, signal.SIGKILL)


def spente(modello, copie, secondi):
    """The copies still holding the model after up to `secondi`."""
    scadenza = time.monotonic() + secondi
    while True:
        vive = [pid for pid in processi(modello) if pid in copie]
        if not vive or time.monotonic() > scadenza:
            return vive
        time.sleep(0.1)


def test_ctrl_c_ferma_le_copie_vere(tmp_path):
    carico, modello, copie = avviato_con_due_copie(tmp_path)
    try:
        inviato = time.monotonic()
        carico.proc.send_signal(signal.SIGINT)
        rc, out, err = carico.fine(60)
        uscito = time.monotonic() - inviato
        assert spente(modello, copie, 5) == []
        fermate = time.monotonic() - inviato
    finally:
        carico.ferma()
        senza_resti(modello, copie)
    assert rc == 130, out + err
    assert "Traceback" not in err, err
    assert fermate < 10, (uscito, fermate)  # a few seconds: the copies stop together, none waits for the other
    CIFRE.append(("--repliche 2, Ctrl+C mid-run: carico.py gone in, its copies in", f"{uscito:.1f} s, {fermate:.1f} s"))


def test_carico_ucciso_le_copie_vere_muoiono_con_lui(tmp_path):
    carico, modello, copie = avviato_con_due_copie(tmp_path)
    log = {os.readlink(f"/proc/{pid}/fd/1") for pid in copie}  # carico.py, killed, cannot remove them
    try:
        ucciso = time.monotonic()
        carico.proc.kill()
        carico.fine(30)
        assert spente(modello, copie, 10) == []  # PR_SET_PDEATHSIG: each copy got SIGTERM
        CIFRE.append(("--repliche 2, carico.py killed mid-run: its copies gone in",
                      f"{time.monotonic() - ucciso:.1f} s"))
    finally:
        carico.ferma()
        senza_resti(modello, copie)
        for percorso in log:
            if os.path.basename(percorso).startswith("carico-server-"):
                os.unlink(percorso)
