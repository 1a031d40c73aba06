"""--repliche's sentences and several servers' figures, each where it must fire and where it must stay silent:
the context per slot said per layout when it differs, no verdict from a layout run on a busy machine, the RAM
table's legend from a layout really run, a group's queue and waits counted per server, and the requests a
Ctrl+C left unanswered on each server's line."""

import carico
from carico import (Configurazione, DelServer, Esecuzione, EsecuzioneOltre, InfoServer, Memoria, Prova, Punto,
                    Risultato, RisultatoOltre)
from test_verdetti import prova
from test_verdetti_busy import OCCUPATA


def disposizione(repliche, throughput, latenza, n_ctx=512, macchina=None):
    """A run of one layout of 4 slots in all: copies of -np 4/repliche, each slot with n_ctx tokens."""
    p = prova(throughput, latenza, slot=4, n=4)
    return p._replace(info=p.info._replace(n_ctx_slot=n_ctx), configurazione=Configurazione(4, repliche=repliche),
                      macchina=macchina)


def test_copie_o_slot_il_contesto_detto_per_disposizione():
    """SILENT: the same context a slot in each layout, said once. FIRE: --contesto-intero gives each copy the whole
    -c: the slots' contexts differ, said per layout, and that the comparison is not at the same context."""
    uguale = carico.righe_repliche([disposizione(1, 60, 2.0), disposizione(4, 50, 2.4)], {})
    assert uguale[0] == "Copie o slot? 4 slot in tutto, 512 token di contesto a slot in ogni disposizione."
    diverso = carico.righe_repliche([disposizione(1, 60, 2.0), disposizione(4, 50, 2.4, n_ctx=2048)], {})
    assert diverso[0] == ("Copie o slot? 4 slot in tutto, contesto a slot 512 con un server -np 4, 2048 con 4 copie da "
                          "-np 1: il confronto non è a parità di contesto.")


def test_copie_o_slot_nessun_verdetto_da_una_macchina_occupata():
    """FIRE: a layout run on a busy machine: no "più alto"/"più bassa", the layout named. SILENT: quiet, the verdicts."""
    quiete = [disposizione(1, 60, 2.0), disposizione(2, 55, 2.2)]
    righe = carico.righe_repliche(quiete, {})
    assert righe[1].startswith("  Throughput più alto: un server -np 4, 60.") and "Latenza media più bassa" in righe[2]
    righe = carico.righe_repliche([quiete[0], disposizione(2, 55, 2.2, macchina=OCCUPATA)], {})
    assert righe[1] == ("  Nessun verdetto su throughput e latenza: la macchina era occupata con 2 copie da -np 2.")
    assert not any("più alto" in r or "più bassa" in r or "rumore)" in r for r in righe)
    assert righe[2].startswith("  Nel proprio slot (dai tempi del server): ")  # the evidence stays


def test_la_legenda_della_tabella_da_una_disposizione_vera():
    """FIRE: the legend's example is a layout of the table (4x1, not a 2x2 nobody ran). SILENT: copies of one only,
    just the RAM's meaning."""
    prove = [disposizione(1, 60, 2.0), disposizione(4, 50, 2.4)]
    memorie = {p.configurazione: Memoria((300.0,), (300.0,), 0.0, 300.0) for p in prove}
    legenda = carico.tabella_consegnato(prove, memorie)[-1]
    assert legenda.startswith("np 4x1: 4 copie da -np 1 (--repliche); RAM: le copie insieme") and "2x2" not in legenda
    legenda = carico.tabella_consegnato(prove[:1], {prove[0].configurazione: memorie[prove[0].configurazione]})[-1]
    assert legenda.startswith("RAM: le copie insieme, la più alta letta a fine prova (/proc/PID/smaps_rollup)")
    assert carico.tabella_consegnato(prove)[-1].startswith("|")  # no RAM measured: no legend


def fatta(indice, inizio, fine, server, token=8):
    return Risultato(indice, inizio, fine, token=token, prompt_ms=50.0, predicted_ms=(fine - inizio) * 1000 - 50,
                     oltre=RisultatoOltre(server=server))


def gruppo(risultati, slot, n_richieste=None, inviate=(0, 0)):
    info = [InfoServer(n, 1024, True, True) for n in slot]
    server = tuple(DelServer(f"http://s{k}", i, [], inviate=n) for k, (i, n) in enumerate(zip(info, inviate)))
    return Prova(carico.info_del_gruppo(info), Esecuzione(risultati, [], n_richieste or len(risultati),
                                                         oltre=EsecuzioneOltre(server=server)))


def test_spiega_con_piu_server_conta_l_attesa_nel_suo_server():
    """Two 1-slot servers: two requests in a row on one, a short one on the other. FIRE: the second waited 1 s for
    ITS server's slot, though over the two slots together one was free from 0.2 s (0.2 s counted that way); said so,
    in the dettagli's wait too. SILENT: one request a server, nothing waited."""
    in_fila = [fatta(0, 0.0, 1.0, 0), fatta(1, 0.0, 2.0, 0)._replace(predicted_ms=950.0), fatta(2, 0.0, 0.2, 1)]
    p = gruppo(in_fila, (1, 1))
    attese = carico.attese_in_coda(p)  # less the trip, as for one server
    assert list(attese) == [1] and 0.9 < attese[1] <= 1.0
    assert carico.attese_a_slot_pieni(in_fila, 2)[1] <= 0.2  # the slots together: the old figure
    frasi = " ".join(carico.spiegazione(p))
    assert f"1 richiesta su 3 ha aspettato in coda uno slot libero. La più sfortunata, la req 1: {attese[1]:.2f} s" in frasi
    assert carico.valori_figure(p)["attesa in coda"] == [attese[1]]
    soli = gruppo([fatta(0, 0.0, 1.0, 0), fatta(1, 0.0, 1.0, 1)], (1, 1))
    assert not any(carico.attese_in_coda(soli).values())
    assert "aspettato in coda" not in " ".join(carico.spiegazione(soli))


def test_dopo_ctrl_c_ogni_server_dice_le_sue_non_completate():
    """FIRE: Ctrl+C with a request of each server unanswered: each line counts it (not "0 richieste"). SILENT: all
    answered, no such words."""
    p = gruppo([fatta(0, 0.0, 1.0, 0)], (1, 1), n_richieste=3, inviate=(2, 1))
    righe = carico.righe_per_server(p)
    assert righe[1].startswith("  http://s0: 2 richieste (1 riuscite, 1 non completate), picco 1/1 slot")
    assert righe[2] == "  http://s1: 1 richiesta (0 riuscite, 1 non completate)"
    intera = gruppo([fatta(0, 0.0, 1.0, 0), fatta(1, 0.0, 1.0, 1)], (1, 1), inviate=(1, 1))
    assert not any("non completate" in r for r in carico.righe_per_server(intera))


def test_json_il_throughput_di_ogni_server_e_la_sua_parte():
    """Each server's throughput in --json is its share of the run's (its tokens over the run's time): they add up."""
    import json

    p = gruppo([fatta(0, 0.0, 1.0, 0, token=30), fatta(1, 0.0, 2.0, 1, token=10)], (1, 1), inviate=(1, 1))
    dati = json.loads(carico.testo_json([p], [p.piano], "http://s0, http://s1"))["prove"][0]
    assert [s["throughput"] for s in dati["per_server"]] == [15.0, 5.0]
    assert sum(s["throughput"] for s in dati["per_server"]) == dati["riepilogo"]["throughput"] == 20.0
