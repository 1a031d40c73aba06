"""A sweep's verdict never rests on a point the same output calls busy (`la macchina era occupata a ...: quelle
cifre e i rapporti non valgono`), and "nessuna saturazione" is as sure as its repeats: categorical only where
their intervals support it. Each rule where it must fire and where it must stay silent; and the sweep table's
footnote, true of the `t/s nel proprio slot` column."""

import pytest

import carico
from carico import Esecuzione, InfoServer, Macchina, Piano, PianoOltre, Prova, Punto, Risultato
from test_verdetti import curva, prova, servite_in_fila

OCCUPATA = Macchina(2, 1.9, 0.87)


def occupato(punto, k=0):
    """The point with its k-th run seen busy before it, as tests/test_verdetti_tour3.py stages a busy machine."""
    prove = list(punto.prove)
    prove[k] = prove[k]._replace(macchina=OCCUPATA)
    return Punto(prove)


def spiega(punti, asse="parallele"):
    return carico.spiegazione_griglia(asse, [("", punti)])


def brevi(frasi):
    return all(len(f) <= 160 for frase in frasi for f in frase.split(". "))


SALE = ((1, [(11.4, 1.0), (11.0, 1.0)]), (2, [(22.0, 1.0), (22.4, 1.0)]), (4, [(63.0, 1.0), (62.6, 1.0)]))


def test_nessuna_saturazione_non_conclude_da_un_punto_occupato():
    """The tour: `--parallele 1,2,4 --ripeti 2` busy at parallele=1, then "nessuna saturazione fino a parallele=4"
    from 11.4 token/s. FIRE: no verdict, naming the point; SILENT: the same sweep quiet keeps its verdict."""
    punti = curva("parallele", *SALE)
    assert spiega(punti) == ["Curva: nessuna saturazione fino a parallele=4. Il throughput è salito da 11.0 a 63.0 "
                             "token/s, a ogni passo di almeno un quarto del carico."]
    punti[0] = occupato(punti[0], 1)
    assert carico.riga_occupata(punti, ["parallele"])[0].startswith("la macchina era occupata a parallele=1 (")
    assert spiega(punti) == ["Curva: nessun verdetto sulla saturazione, la macchina era occupata a parallele=1."]


def test_saturazione_non_conclude_da_un_capo_occupato():
    """FIRE: either end of the step the verdict names busy: no verdict, no why, no mark on the curve. SILENT: a busy
    point outside the step leaves the verdict as it was."""
    passi = ((1, [(10, 1.0), (10.2, 1.0)]), (2, [(19, 1.0), (19.2, 1.0)]), (4, [(19.5, 2.0), (19.4, 2.02)]),
             (8, [(19.6, 4.0), (19.5, 4.1)]))
    quieta = curva("parallele", *passi)
    verdetto = carico.verdetto_saturazione(quieta, "parallele")
    assert verdetto.dubbio is None and verdetto.dopo is quieta[2]
    assert spiega(quieta)[0].startswith("Curva: saturazione a parallele=4: da parallele=2 carico ×2.0")
    for k in (1, 2):  # the step's start, then its end
        punti = list(quieta)
        punti[k] = occupato(punti[k])
        verdetto = carico.verdetto_saturazione(punti, "parallele")
        atteso = f"nessun verdetto sulla saturazione, la macchina era occupata a parallele={(1, 2, 4)[k]}"
        assert verdetto.dubbio == atteso and carico.frase_saturazione("parallele", verdetto) == atteso
        assert spiega(punti) == [f"Curva: {atteso}."]  # nor "Lì gli slot occupati...": it explains no verdict
        righe = carico.curva("parallele", [("", punti)], carico.MARCHE_UNICODE)
        assert righe[-1] == atteso and not any("◆" in r for r in righe), righe
    punti = list(quieta)
    punti[0] = occupato(punti[0])  # parallele=1: no end of the step 2 -> 4
    assert spiega(punti)[0] == spiega(quieta)[0]


def test_il_disegno_non_dice_il_verdetto_che_il_testo_tace():
    """The tour: the SVG's grey "forse saturazione" beside "nessun verdetto ... la macchina era occupata". FIRE: one
    run a point, quiet, the grey label with its doubt; SILENT: the same step busy, no label nor ring."""
    passi = ((1, [(10, 1.0)]), (2, [(19, 1.0)]), (4, [(19.5, 2.0)]))
    quieta = curva("parallele", *passi)
    disegno = "".join(carico.svg_curva("parallele", [("", quieta)], 0)[0])
    assert ">forse saturazione<" in disegno and "una prova per punto" in disegno and "occupata<" not in disegno
    occupata = list(quieta)
    occupata[2] = occupato(occupata[2])
    assert spiega(occupata) == ["Curva: nessun verdetto sulla saturazione, la macchina era occupata a parallele=4."]
    disegno = "".join(carico.svg_curva("parallele", [("", occupata)], 0)[0])
    assert "saturazione<" not in disegno and 'r="9"' not in disegno, disegno
    assert disegno.count(">macchina occupata<") == 1  # the point the table's line names, and only it


def a_ritmo(ritmo, macchina=None):
    """Twenty requests sent `ritmo` a second to two slots, each 1 s in its slot."""
    risultati = servite_in_fila([i / ritmo for i in range(20)], 1.0, 2)
    return Prova(InfoServer(2, 1024, True), Esecuzione(risultati, [], 20), Piano(None, 256, 32, oltre=PianoOltre(
        ritmo=ritmo)), macchina=macchina)


def test_sovraccarico_a_un_ritmo_occupato_nessun_verdetto():
    """The tour: `--ritmo 1,4 --durata 5` busy at ritmo=1, then "Curva: saturazione entro ritmo=1". FIRE: busy where
    the queue grew, no verdict on the curve nor on the overload; SILENT: quiet, both verdicts as ever."""
    quieta = [Punto([a_ritmo(0.5)]), Punto([a_ritmo(2.5)])]
    assert spiega(quieta, "ritmo")[0].startswith("Curva: saturazione entro ritmo=2.5 (fra ritmo=0.5 e ritmo=2.5;")
    occupata = [quieta[0], Punto([a_ritmo(2.5, OCCUPATA)])]
    assert spiega(occupata, "ritmo") == ["Curva: nessun verdetto sulla saturazione, la macchina era occupata a ritmo=2.5.",
                                         "A ritmo=2.5 l'attesa in coda è cresciuta da 0.35 a 1.46 s, ma la macchina era "
                                         "occupata: nessun verdetto sul sovraccarico."]
    assert "Il server è più lento degli arrivi (sovraccarico)" in spiega(quieta, "ritmo")[1]


def test_nessuna_saturazione_certa_solo_dove_le_ripetute_la_sostengono():
    """FIRE ("forse"): one run a point; or repeats whose gain's interval reaches under a quarter of the load.
    SILENT: tight repeats, the plain verdict (test_nessuna_saturazione_non_conclude_da_un_punto_occupato)."""
    (frase,) = spiega(curva("parallele", (1, [(10, 1.0)]), (2, [(19, 1.0)])))
    assert frase == ("Curva: forse nessuna saturazione fino a parallele=2. Il throughput è salito da 10.0 a 19.0 token/s, a "
                     "ogni passo di almeno un quarto del carico. Indicativo: una prova per punto (--ripeti 3 misura il "
                     "rumore)."), frase
    (frase,) = spiega(curva("parallele", (1, [(44.2, 1.0), (44.2, 1.0)]), (2, [(20, 1.0), (110, 1.0)])))
    assert frase == ("Curva: forse nessuna saturazione fino a parallele=2, non accertata. Da parallele=1 a 2 il guadagno "
                     "di throughput (+21.0 ±571.8 token/s al 95%) può stare sotto un quarto del carico (11.0): --ripeti 5 lo decide."), frase
    assert brevi([frase])


@pytest.mark.parametrize("prima, dopo, forse", [
    ([(44.2, 10), (44.0, 12), (44.4, 11)], [(30, 10.5), (70, 12.5), (42, 11.5)], True),  # ±75: may have followed
    ([(100, 10), (101, 12), (99, 11)], [(105, 10.5), (104, 12.5), (106, 11.5)], False)])  # tight: it did not
def test_non_ha_seguito_il_carico_solo_oltre_il_rumore(prima, dopo, forse):
    """The tour: "Da parallele=1 a 2 il throughput non ha seguito il carico (44.2 → 47.4 token/s)" beside a ±72.59
    that reaches twice 44.2. FIRE: "forse", with the gain's interval; SILENT: tight repeats, said plainly."""
    (frase,) = spiega(curva("parallele", (1, prima), (2, dopo)))
    assert frase.startswith("Curva: nessuna saturazione accertata fino a parallele=2. Da parallele=1 a 2 il throughput "
                            + ("forse " if forse else "") + "non ha seguito il carico ("), frase
    assert ("±" in frase.split(". ")[1]) == forse and brevi([frase]), frase


def test_la_nota_delle_medie_dice_cos_e_la_velocita_nello_slot():
    """The tour: `| 1 (media di 2) | ... | 3.3 |` under "(media di N): le medie delle N prove" while the runs said
    1.7 and 25.3 t/s. The column is every request's tokens over its time in a slot, the two runs together: the
    footnote says so, and the figure is that."""
    def una(tps, secondi):
        risultati = [Risultato(0, 0.0, secondi + 0.1, round(tps * secondi), tps, 5.0, secondi * 1000)]
        return Prova(InfoServer(1, 1024, True), Esecuzione(risultati, [], 1), Piano(1, 1, 32))
    punto = Punto([una(1.7, 20.0), una(25.3, 1.0)])
    righe = carico.tabella_griglia([punto], ["parallele"])
    assert righe[2].split(" | ")[-3] == f"{(1.7 * 20 + 25.3) / 21:.1f}" == "2.8", righe[2]  # not (1.7 + 25.3) / 2
    (nota,) = [r for r in righe if r.startswith("(media di N)")]
    assert "t/s nel proprio slot: token generati sul tempo nello slot" in nota and "richieste delle N prove insieme" in nota
    assert brevi([nota]), nota


def test_una_prova_esclusa_e_occupata_rende_occupato_il_punto():
    """The tour: the busy run was the one left out of the mean (under half its siblings' median), and the table's
    busy line and the verdict forgot the machine. FIRE: the point is busy, no verdict; SILENT: the same exclusion
    on a quiet machine keeps the point out of the busy line."""
    passi = ((1, [(30.0, 0.5), (31.0, 0.5), (6.0, 2.5)]), (2, [(60.0, 0.5), (61.0, 0.5), (62.0, 0.5)]),
             (4, [(120.0, 0.5), (121.0, 0.5), (119.0, 0.5)]))
    quieta = curva("parallele", *passi)
    assert len(quieta[0].intere) == 2 and carico.riga_occupata(quieta, ["parallele"]) == []
    punti = [occupato(quieta[0], 2)] + quieta[1:]
    assert carico.riga_occupata(punti, ["parallele"])[0].startswith("la macchina era occupata a parallele=1 (")
    assert spiega(punti) == ["Curva: nessun verdetto sulla saturazione, la macchina era occupata a parallele=1."]


def test_ripeti_da_solo_dice_la_macchina_occupata():
    """The re-tour: `--ripeti 3` alone (no --tabella) averaged a slowed run beside a busy machine and said it only
    on stderr. FIRE: the line after the repeats' summary, without the sweep's ratios; SILENT: quiet repeats."""
    quieta = curva("parallele", (1, [(30.0, 0.5), (31.0, 0.5), (29.0, 0.5)]))[0]
    assert carico.riga_occupata([quieta], []) == []
    assert carico.riga_occupata([occupato(quieta, 2)], []) == [
        "la macchina era occupata (CPU occupata al 87%): quelle cifre non valgono, ripeti a macchina tranquilla"]
