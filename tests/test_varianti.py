"""The sheet's own variants, as students will try them (issue 23): each fixed with a test that
reproduced it first, on the fake where it can stage it faithfully, on the real server where only
the real one shows it."""

import re

import pytest

import carico
from aiuti import VELOCE


# Item 1: a 1-token answer has no speed ######################################################
# llama.cpp samples the only token with the prompt and sends predicted_ms 0.001, predicted_per_second
# 0.0; the fake does the same. 0.0 is no speed: the lab's line says n/d, and no ratio divides by it.

@pytest.mark.parametrize("token", [["1"], ["1,8"]])
def test_un_token_con_spiega_non_crolla_e_dice_nd(fake, carica, token):
    server = fake(n_slot=4, s_per_token=0.002)
    rc, out, err = carica(server.url, "--token", *token, "--spiega", *VELOCE)
    assert rc == 0, out + err
    assert "Traceback" not in err and "Error" not in err, err
    righe_un_token = [r for r in out.splitlines() if re.match(r"^  req \d+: .* 1 token ", r)]
    assert len(righe_un_token) == 4, out
    assert all(r.endswith("1 token  (n/d t/s nel proprio slot)") for r in righe_un_token), out
    assert not re.search(r"\b0\.0 t/s|\| 0\.0 \|", out), out
