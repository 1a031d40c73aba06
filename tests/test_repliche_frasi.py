"""--repliche's sentences and several servers' figures, each where it must fire and where it must stay silent:
the context per slot said per layout when it differs, no verdict from a layout run on a busy machine, the RAM
table's legend from a layout really run, a group's queue and waits counted per server, and the requests a
Ctrl+C left unanswered on each server's line."""

import carico
from carico import (Configurazione, DelServer, Esecuzione, EsecuzioneOltre, InfoServer, Memoria, Prova, Punto,
                    Risultato, RisultatoOltre)
from test_verdetti import prova
from test_verdetti_busy import OCCUPATA


def disposizione(repliche, throughput, latenza, n_ctx=512, macchina=None, thread=None):
    """A run of one layout of 4 slots in all: copies of -np 4/repliche, each slot with n_ctx tokens; `thread` in all,
    as the copies' logs said."""
    p = prova(throughput, latenza, slot=4, n=4)
    deciso = carico.Decisioni(n_thread=thread) if thread else None
    return p._replace(info=p.info._replace(n_ctx_slot=n_ctx), macchina=macchina,
                      configurazione=Configurazione(4, repliche=repliche, deciso=deciso))


def test_copie_o_slot_i_thread_quando_cambiano_o_superano_i_core():
    """FIRE: the layouts ran different threads in all (-t 3: 3, then 2 copies of -t 1), or more than the cores (4 copies
    of -t 1 on 2): said before any verdict, naming the layouts over the cores. SILENT: the same threads, within the
    cores; or a log that did not say."""
    quieta = carico.Macchina(2, 0.1, 0.01)
    def righe(*thread):
        return carico.righe_repliche([disposizione(r, 60 - r, 2.0, macchina=quieta, thread=t)
                                      for r, t in zip((1, 2, 4), thread)], {})
    assert righe(3, 2)[1] == ("  Attenzione, thread diversi (dai log, su 2 core): 3 con un server -np 4 (più dei core), 2 "
                              "con 2 copie da -np 2. Le cifre misurano anche questo, non solo copie contro slot.")
    assert righe(2, 2, 4)[1].startswith("  Attenzione, thread diversi (dai log, su 2 core): 2 con un server -np 4, 2 "
                                        "con 2 copie da -np 2, 4 con 4 copie da -np 1 (più dei core).")
    assert not any("thread" in r for r in righe(2, 2) + righe(2, None))
    assert carico.leggi_decisioni("I cmn  common_param: system_info: n_threads = 3 (n_threads_batch = 3) / 2 | CPU :"
                                  "\nI cmn  init: llama threadpool init, n_threads = 3\n").n_thread == 3
    assert carico.leggi_decisioni("I srv  load_model: initializing").n_thread is None


def test_copie_o_slot_il_contesto_detto_per_disposizione():
    """SILENT: the same context a slot in each layout, said once. FIRE: --contesto-intero gives each copy the whole
    -c: the slots' contexts differ, said per layout, and that the comparison is not at the same context."""
    uguale = carico.righe_repliche([disposizione(1, 60, 2.0), disposizione(4, 50, 2.4)], {})
    assert uguale[0] == "Copie o slot? 4 slot in tutto, 512 token di contesto a slot in ogni disposizione."
    diverso = carico.righe_repliche([disposizione(1, 60, 2.0), disposizione(4, 50, 2.4, n_ctx=2048)], {})
    assert diverso[0] == ("Copie o slot? 4 slot in tutto, contesto a slot 512 con un server -np 4, 2048 con 4 copie da "
                          "-np 1: il confronto non è a parità di contesto.")


def ripetute(repliche, *coppie, macchina=None):
    return [disposizione(repliche, throughput, latenza, macchina=macchina) for throughput, latenza in coppie]


def test_copie_o_slot_un_vincitore_solo_oltre_il_rumore():
    """FIRE: with repeats, a layout ahead of every other beyond the noise: "più alto"/"più bassa". SILENT: one run a
    layout, or a difference within the noise, or ahead of one but not of another: the figures in order, no winner."""
    uno = ripetute(1, (60, 2.0), (60.5, 1.98), (59.5, 2.02))
    righe = carico.righe_repliche(uno + ripetute(4, (50, 2.4), (50.5, 2.38), (49.5, 2.42)), {})
    assert righe[1].startswith("  Throughput più alto: un server -np 4, 60.00 token/s; 50.00 con 4 copie da -np 1 "
                               "(×1.20, oltre il rumore).")
    assert righe[2].startswith("  Latenza media più bassa: un server -np 4, 2.00 s; 2.40 con 4 copie da -np 1")
    for altre in ([disposizione(4, 50, 2.4)], ripetute(4, (58, 2.1), (61, 1.9), (57, 2.05)),
                  ripetute(4, (50, 2.4), (50.5, 2.38), (49.5, 2.42)) + ripetute(2, (58, 2.1), (62, 1.9), (60.2, 2.0))):
        righe = carico.righe_repliche((uno[:1] if len(altre) == 1 else uno) + altre, {})
        assert righe[1].startswith("  Throughput, nessun vincitore accertato: un server -np 4, 60.00 token/s; "), righe
        assert righe[2].startswith("  Latenza media, nessun vincitore accertato: "), righe
        assert not any("più alto" in r or "più bassa" in r for r in righe)


def test_copie_o_slot_nessun_verdetto_da_una_macchina_occupata():
    """FIRE: a layout run on a busy machine: no ranking at all, the layout named. SILENT: quiet, the ranking."""
    quiete = [disposizione(1, 60, 2.0), disposizione(2, 55, 2.2)]
    righe = carico.righe_repliche(quiete, {})
    assert righe[1].startswith("  Throughput, nessun vincitore accertato: un server -np 4, 60.")
    righe = carico.righe_repliche([quiete[0], disposizione(2, 55, 2.2, macchina=OCCUPATA)], {})
    assert righe[1] == ("  Nessun verdetto su throughput e latenza: la macchina era occupata con 2 copie da -np 2.")
    assert not any("più alto" in r or "accertato" in r or "rumore)" in r for r in righe)
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
    assert righe[1].startswith("  http://s0: 2 richieste (1 riuscita, 1 non completata), picco 1/1 slot")
    assert righe[0] == "per server:"  # all three left: 2 + 1
    assert carico.righe_per_server(gruppo([fatta(0, 0.0, 1.0, 0)], (1, 1), n_richieste=4, inviate=(2, 1)))[0] == (
        "per server (l'altra non è partita):")
    assert righe[2] == "  http://s1: 1 richiesta (0 riuscite, 1 non completata)"
    intera = gruppo([fatta(0, 0.0, 1.0, 0), fatta(1, 0.0, 1.0, 1)], (1, 1), inviate=(1, 1))
    assert not any("non completate" in r for r in carico.righe_per_server(intera))


def test_json_il_throughput_di_ogni_server_e_la_sua_parte():
    """Each server's throughput in --json is its share of the run's (its tokens over the run's time): they add up."""
    import json

    p = gruppo([fatta(0, 0.0, 1.0, 0, token=30), fatta(1, 0.0, 2.0, 1, token=10)], (1, 1), inviate=(1, 1))
    dati = json.loads(carico.testo_json([p], [p.piano], "http://s0, http://s1"))["prove"][0]
    assert [s["throughput"] for s in dati["per_server"]] == [15.0, 5.0]
    coda = gruppo([fatta(0, 0.0, 1.0, 0), fatta(1, 0.0, 2.0, 0)._replace(predicted_ms=950.0), fatta(2, 0.0, 0.2, 1)],
                  (1, 1))  # the 1-slot server's second request waited, the other server free: as printed
    assert carico.riepilogo_oltre(coda).picco_coda == 1
    assert json.loads(carico.testo_json([coda], [coda.piano], ""))["prove"][0]["riepilogo"]["picco_coda"] == 1
    # copies of --kv-unified: each shares its own buffer, never one for all
    assert carico.info_del_gruppo([InfoServer(2, 512, True, True, kv_unificata=True)] * 2).kv_unificata is None
    assert sum(s["throughput"] for s in dati["per_server"]) == dati["riepilogo"]["throughput"] == 20.0


def test_una_disposizione_interrotta_non_entra_nei_confronti():
    """FIRE: the 4x1 layout cut by Ctrl+C (its throughput a lower bound): out of the ratio line and of "Copie o slot?".
    SILENT: whole, it is in both."""
    intere = [disposizione(1, 60, 2.0), disposizione(4, 50, 2.4)]
    punti = carico.punti_di(intere)
    assert carico.rapporti_np(punti, ["np"])[-1] == "throughput: np 4x1 / np 4 ×0.83"
    assert "4 copie da -np 1" in carico.righe_repliche(intere, {})[1]
    cut = intere[1]._replace(esecuzione=intere[1].esecuzione._replace(interruzione=130, interrotta_a=1.0))
    assert carico.rapporti_np(carico.punti_di([intere[0], cut]), ["np"]) == []
    assert carico.righe_repliche([intere[0], cut], {}) == [  # one layout left: nothing to compare, and why
        "Copie o slot? Nessun confronto: interrotta con 4 copie da -np 1, una cifra che è solo un limite inferiore."]
    tre = [disposizione(1, 60, 2.0), disposizione(2, 55, 2.2), cut]
    righe = carico.righe_repliche(tre, {})
    assert righe[1] == "  Fuori dal confronto: interrotta con 4 copie da -np 1, una cifra che è solo un limite inferiore."
    assert not any("50.00" in r for r in righe)


def test_lo_stesso_server_con_due_nomi(capsys):
    """localhost, 127.0.0.1, 0.0.0.0 (what a server on all addresses announces) on one port are one server: refused
    (exit 2) before anything is sent."""
    from test_opzioni import rifiuto

    assert rifiuto(capsys, ["--url", "http://127.0.0.1:18361,http://localhost:18361/"]).endswith(
        "--url http://127.0.0.1:18361 e http://localhost:18361 sono lo stesso server (127.0.0.1:18361): ogni server "
        "una volta")
    for altro in ("http://0.0.0.0:18361", "http://[::ffff:127.0.0.1]:18361", "http://127.1:18361"):  # a server on 0.0.0.0
        assert "sono lo stesso server (127.0.0.1:18361)" in rifiuto(capsys, ["--url", f"http://127.0.0.1:18361,{altro}"])
