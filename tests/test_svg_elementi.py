"""The SVG's elements come from one helper (issue 26): what it writes is what the hand-written tags
wrote, attribute for attribute, so that the files stay the same bytes."""

import carico


def test_un_elemento_vuoto_si_chiude_e_i_numeri_con_la_virgola_hanno_un_decimale():
    assert carico.elemento("line", x1=70, y1=10.0, x2=123.456, y2=10, stroke="#333") == (
        '<line x1="70" y1="10.0" x2="123.5" y2="10" stroke="#333"/>')
    assert carico.elemento("polyline", fill="none", stroke_dasharray="4 3", points="1.0,2.0") == (
        '<polyline fill="none" stroke-dasharray="4 3" points="1.0,2.0"/>')


def test_testo_e_titolo_escapati_dentro_l_elemento():
    assert carico.scritta(4, 30.26, "a & <b>", titolo="x<y", text_anchor="end") == (
        '<text x="4" y="30.3" text-anchor="end">a &amp; &lt;b&gt;<title>x&lt;y</title></text>')
    assert carico.elemento("circle", titolo="p90 1.00 s", cx=1.0, cy=2.0, r=4) == (
        '<circle cx="1.0" cy="2.0" r="4"><title>p90 1.00 s</title></circle>')
