"""The tables and the aggregates, folded (issue 26, family 4): one mean, one Markdown table, one aligned
table, the rates computed once, the warm-up on the lab's pool, one repeat loop, one GET/POST of a ready
server. What a user sees stays as it was; these tests pin what the fold made one."""

import json
import signal
import subprocess
import sys
import time

import carico
from aiuti import CARICO, FAKE, VELOCE, porta_libera


# One mean ######################################################################################

def test_valori_tutti_uguali_restano_entro_il_rumore():
    """Two files whose runs all measured the same figure: no variance, and no difference either, even where
    the mean of three 0.1s rounds to 0.10000000000000002 (Welch once saw an infinite t there)."""
    assert carico.welch([0.1] * 2, [0.1] * 3) == (0.0, float("inf"))
    assert carico.oltre_il_rumore([0.1] * 2, [0.1] * 3).startswith("entro il rumore")
    assert carico.welch([0.1] * 2, [0.2] * 3) == (float("inf"), float("inf"))


def test_una_sola_media():
    """n/d stays n/d: no values, no mean; otherwise the plain mean."""
    assert carico.media([]) is None
    assert carico.media([1.0, 2.0, 4.5]) == 2.5
    assert carico.riassunto([])["media"] is None


# One Markdown table, one aligned table #########################################################

def test_una_tabella_markdown_e_una_allineata():
    assert carico.tabella_md(["np", "throughput"], [["1", "9.50 token/s"], ["4", "n/d"]]) == [
        "| np | throughput |", "|---|---|", "| 1 | 9.50 token/s |", "| 4 | n/d |"]
    assert carico.in_colonne(["latenza (s)", "0.25", "1.50"], [-12, 6, 6]) == "  latenza (s)   0.25  1.50"
    assert carico.in_colonne(["1", "4/4", "poi il resto"], [5, 8], "  ") == "      1       4/4  poi il resto"
