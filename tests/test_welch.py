"""Welch's test at the degrees of freedom it really has, and what it may conclude from few runs.

The tour (`--parallele 1,2,4 --ripeti 2` on the real server): latency 0.45/0.49 s against 0.81/0.88 s, Welch t 9.3
at 1.6 degrees of freedom, was called "non è salita oltre il rumore" because the 95% t was read from the table's
row below (df 1: 12.706; at 1.6 it is 5.52). Now the quantile is computed at any df; and a change over 10% that
the test cannot confirm is "non accertato", never "non è salita" or "entro il rumore"."""
import math

import pytest

import carico
from test_certezza import punti
from test_confronto import file_di_prove


def t_di_riferimento(gl):
    """Two-sided 95% Student's t by a different road from carico's: Simpson on the density in t itself (4,000
    steps), bisection on t."""
    c = math.exp(math.lgamma((gl + 1) / 2) - math.lgamma(gl / 2)) / math.sqrt(gl * math.pi)

    def area(t, n=4000):
        f = [c * (1 + (t * i / n) ** 2 / gl) ** (-(gl + 1) / 2) for i in range(n + 1)]
        return t / n / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    basso, alto = 0.0, 50.0
    for _ in range(50):
        mezzo = (basso + alto) / 2
        basso, alto = (mezzo, alto) if area(mezzo) < 0.475 else (basso, mezzo)
    return basso


@pytest.mark.parametrize("gl", [1, 1.1, 1.3, 1.5, 1.6, 2, 2.5, 3.5, 7.3, 25.5, 200])
def test_t_critico_a_gradi_frazionari(gl):
    """Within 0.01% of the reference (measured: at most 0.0033%, at df 1.1). The table's row below gave 12.706 for
    5.517 at df 1.6; interpolation in 1/df between its rows errs by up to 18% under df 2 (df 1.5: 7.10 for 6.02)."""
    assert carico.t_critico(gl) == pytest.approx(t_di_riferimento(gl), rel=1e-4)


def test_t_critico_valori_noti():
    assert carico.t_critico(1.5) == pytest.approx(6.0167, abs=1e-3)
    assert carico.t_critico(1) == pytest.approx(math.tan(0.475 * math.pi), rel=1e-6)  # Cauchy, exactly
    assert carico.t_critico(2) == pytest.approx(2 * 0.95 / math.sqrt(2 * (1 - 0.95 ** 2)), rel=1e-6)
    assert carico.t_critico(float("inf")) == pytest.approx(1.95996, abs=1e-4)


def test_la_latenza_quasi_raddoppiata_del_giro_e_oltre_il_rumore():
    """FIRE: the tour's runs are beyond the noise (t 9.3 > 5.5), and the sweep names a saturation, not "non è
    salita oltre il rumore"."""
    assert carico.diversi([0.45, 0.49], [0.81, 0.88]) is True
    curva = punti("parallele", (2, [(30.0, 0.45), (31.0, 0.49)]), (4, [(31.0, 0.81), (30.5, 0.88)]))
    (frase, *_) = carico.spiegazione_griglia("parallele", [("", curva)])
    assert frase.startswith("Curva: saturazione a parallele=4: da parallele=2 carico ×2.0"), frase
    assert "non è salita" not in frase


def test_una_salita_non_confermata_e_non_accertata():
    """FIRE: with 2 runs a point, +67% that Welch cannot separate from the noise is "non accertato", with the
    runs it rests on; SILENT: +4% stays "non è salita oltre il rumore"."""
    rumorosa = punti("parallele", (2, [(30.0, 0.3), (31.0, 0.9)]), (4, [(31.0, 0.7), (30.5, 1.3)]))
    (frase,) = carico.spiegazione_griglia("parallele", [("", rumorosa)])
    assert frase.startswith("Curva: nessuna saturazione accertata fino a parallele=4."), frase
    assert frase.endswith("La latenza media (0.60 → 1.00 s) sale del 67% ma con 2 prove a punto non è accertato: "
                          "--ripeti 5 lo decide."), frase
    quieta = punti("parallele", (2, [(30.0, 0.3), (31.0, 0.9)]), (4, [(31.0, 0.32), (30.5, 0.93)]))
    (frase,) = carico.spiegazione_griglia("parallele", [("", quieta)])
    assert frase.endswith("La latenza media (0.60 → 0.62 s) non è salita oltre il rumore (Welch 95%): --ripeti 5 lo "
                          "decide."), frase


def test_confronta_non_chiama_rumore_una_differenza_non_accertata(tmp_path, capsys):
    """--confronta, two runs a file. FIRE: latency ×1.50 with wide runs: "non accertata", with the runs; SILENT:
    ×1.05 within the noise stays "entro il rumore"; beyond it, "oltre il rumore"."""
    a = file_di_prove(tmp_path / "a.json", [10.0, 10.4], [0.6, 1.4])
    b = file_di_prove(tmp_path / "b.json", [10.2, 10.6], [1.0, 2.0])
    assert carico.main(["--confronta", a, b]) == 0
    righe = capsys.readouterr().out.splitlines()
    lat = " ".join(next(r for r in righe if r.startswith("  latenza media")).split())
    assert lat == ("latenza media (s) 1.000 1.500 ×1.50 non accertata, con 2 e 2 prove (Welch 95%: t 0.78, gl 1.91, "
                          "soglia 4.51)"), lat
    tp = " ".join(next(r for r in righe if r.startswith("  throughput")).split())
    assert tp.startswith("throughput aggregato (token/s) 10.200 10.400 ×1.02 entro il rumore (Welch 95%"), tp
    assert carico.oltre_il_rumore([1.0, 1.1], [3.0, 3.1]).startswith("oltre il rumore")
