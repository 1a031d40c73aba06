"""The documentation, checked without a server: links that resolve, a README for someone about to run the lab,
no dated logs where users read.

The rules:
- Every relative link in README.md, docs/*.md, bench/README.md, CONTRIBUTING.md and CHANGELOG.md (`[text](path)`,
  `![alt](path)`, `[name]: path`; not inside code) names a file inside the repository. A link with `#anchor`
  into a Markdown file names one of its headings, slugged as GitHub does: the heading's text without its
  Markdown, lower-cased, every character that is not a letter, a digit, a space, `-` or `_` dropped, each space
  made a `-`; a repeated slug gets `-1`, `-2`... Links with a scheme (https:, mailto:) are not checked.
- README.md has at most 300 lines, and within its first 40 the lab's server command (the sheet's `-hf` form,
  then the `-m FILE` form) and then the lab's carico command.
- README.md and docs/ hold no ISO date (YYYY-MM-DD), no clock time (HH:MM:SS) and no "UTC", except on a line
  that starts a "measured on" statement: a line whose text, after any list, quote or table marker, begins with
  "Measured on" (any case). One such line heads each table of measured figures.
- CHANGELOG.md has a line for carico.py's version.
"""

import re
from pathlib import Path

import pytest

RADICE = Path(__file__).resolve().parent.parent
README = RADICE / "README.md"
DOCUMENTI = sorted([README, RADICE / "bench" / "README.md", RADICE / "CONTRIBUTING.md", RADICE / "CHANGELOG.md",
                    *(RADICE / "docs").glob("*.md")])
PAGINE = ["docs/guida.md", "docs/repliche.md", "docs/verdetti.md", "docs/guasti.md", "docs/altri-server.md",
          "docs/docenti.md", "docs/flussi.md", "bench/README.md", "CONTRIBUTING.md", "CHANGELOG.md"]

SERVER_HF = "llama serve -hf ggml-org/Qwen3.5-0.8B-GGUF --host 127.0.0.1 --port 8080 -c 2048 -np 1 -t 3 -a qwen-0.8b"
SERVER_M = re.compile(r"llama serve -m \S+ --host 127\.0\.0\.1 --port 8080 -c 2048 -np 1 -t 3 -a qwen-0\.8b")
CARICO = "python3 carico.py --url http://127.0.0.1:8080 --richieste 4 --parallele 4 --token 32"

RECINTO = re.compile(r"^ {0,3}(`{3,}|~{3,})")  # a fenced code block opens or closes
CODICE = re.compile(r"(`+)(.+?)\1")  # an inline code span
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
RIFERIMENTO = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
SCHEMA = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
TITOLO = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
DATATO = re.compile(r"\b\d{4}-\d{2}-\d{2}\b|\b\d{1,2}:\d{2}:\d{2}\b|\bUTC\b")
MISURATO = re.compile(r"^[\s>*|+-]*measured on\b", re.IGNORECASE)


def righe_di_testo(percorso: Path):
    """(line number, line) outside fenced code blocks."""
    dentro = None
    for numero, riga in enumerate(percorso.read_text(encoding="utf-8").splitlines(), 1):
        recinto = RECINTO.match(riga)
        if recinto:
            if dentro is None:
                dentro = recinto.group(1)[0]
            elif recinto.group(1)[0] == dentro:
                dentro = None
            continue
        if dentro is None:
            yield numero, riga


def collegamenti(percorso: Path):
    """(line number, target) of every link outside code."""
    for numero, riga in righe_di_testo(percorso):
        senza_codice = CODICE.sub("codice", riga)
        for trovato in LINK.finditer(senza_codice):
            yield numero, trovato.group(1)
        riferimento = RIFERIMENTO.match(senza_codice)
        if riferimento:
            yield numero, riferimento.group(1)


def slug(titolo: str) -> str:
    """GitHub's anchor for a heading's text (see the module's docstring)."""
    testo = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", titolo)  # a link or an image: its text
    testo = CODICE.sub(lambda m: m.group(2), testo)  # code: its content
    testo = re.sub(r"<[^>]+>", "", testo)  # inline HTML
    testo = re.sub(r"(\*\*|__|\*|~~)", "", testo)  # emphasis
    testo = re.sub(r"(?<!\w)_|_(?!\w)", "", testo)
    testo = testo.strip().lower()
    return re.sub(r"[^\w\- ]", "", testo).replace(" ", "-")


def ancore(percorso: Path) -> set:
    visti = {}
    risultato = set()
    for _, riga in righe_di_testo(percorso):
        titolo = TITOLO.match(riga)
        if not titolo:
            continue
        base = slug(titolo.group(2))
        n = visti.get(base, 0)
        visti[base] = n + 1
        risultato.add(base if n == 0 else f"{base}-{n}")
    return risultato


def test_lo_slug_e_quello_di_github():
    assert slug("The demo and the tests") == "the-demo-and-the-tests"
    assert slug("Repeat and average: `--ripeti`, `--tabella`") == "repeat-and-average---ripeti---tabella"
    assert slug("Where this llama.cpp differs from the sheet") == "where-this-llamacpp-differs-from-the-sheet"
    assert slug("Results others can read: vLLM's names") == "results-others-can-read-vllms-names"
    assert slug("\"latenza max\" with --ripeti") == "latenza-max-with---ripeti"
    assert slug("Perché **così** [qui](x.md)") == "perché-così-qui"


def test_ci_sono_le_pagine():
    mancanti = [p for p in PAGINE if not (RADICE / p).is_file()]
    assert not mancanti, mancanti


@pytest.mark.parametrize("percorso", DOCUMENTI, ids=lambda p: str(p.relative_to(RADICE)))
def test_ogni_collegamento_relativo_porta_dentro_il_repository(percorso):
    rotti = []
    for numero, destinazione in collegamenti(percorso):
        if SCHEMA.match(destinazione):
            continue  # https:, mailto: ...: not this repository's
        file, _, ancora = destinazione.partition("#")
        bersaglio = (percorso.parent / file).resolve() if file else percorso
        dove = f"{percorso.relative_to(RADICE)}:{numero}: {destinazione}"
        if RADICE != bersaglio and RADICE not in bersaglio.parents:
            rotti.append(f"{dove} (outside the repository)")
        elif not bersaglio.exists():
            rotti.append(f"{dove} (no such file)")
        elif ancora and bersaglio.suffix == ".md" and ancora not in ancore(bersaglio):
            rotti.append(f"{dove} (no heading with that anchor)")
    assert not rotti, "\n".join(rotti)


def test_il_readme_e_per_chi_sta_per_usarlo():
    righe = README.read_text(encoding="utf-8").splitlines()
    assert len(righe) <= 300, f"README.md has {len(righe)} lines, at most 300"

    def prima(cerca) -> int:
        return next((i for i, r in enumerate(righe, 1) if cerca(r)), len(righe) + 1)

    hf, m = prima(lambda r: SERVER_HF in r), prima(lambda r: SERVER_M.search(r) is not None)
    comando = prima(lambda r: CARICO in r)
    assert hf < comando <= 40 and m < comando, (hf, m, comando)


@pytest.mark.parametrize("percorso", [README, *sorted((RADICE / "docs").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(RADICE)))
def test_niente_registri_datati_dove_leggono_gli_utenti(percorso):
    datate = [f"{percorso.relative_to(RADICE)}:{n}: {riga.strip()}"
              for n, riga in enumerate(percorso.read_text(encoding="utf-8").splitlines(), 1)
              if DATATO.search(riga) and not MISURATO.match(riga)]
    assert not datate, "\n".join(datate)


def test_il_changelog_ha_la_versione_di_carico():
    versione = re.search(r'^__version__ = "([^"]+)"', (RADICE / "carico.py").read_text(encoding="utf-8"), re.M)
    assert versione, "carico.py has no __version__"
    voci = re.findall(r"^- \*\*([^*]+)\*\*", (RADICE / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
    assert versione.group(1) in voci, (versione.group(1), voci)
