"""The floor under any stream reader in Python on this machine: bench tooling, not the product.

bench/pavimento.c in Python, with the standard library as carico uses it: N connections to the fake, the
requests sent one after the other, then one thread that waits on every socket at once (select.epoll)
and reads each as its bytes come (socket.recvmsg with the kernel's receive stamp), keeping each read and
its stamp and doing nothing else. What carico's reader costs beyond this is carico's; what this costs
is Python's, on this machine.

  python3 bench/pavimento.py PORT N_STREAMS    prints what pavimento.c prints
"""

import gc
import resource
import select
import socket
import sys

SO_TIMESTAMPNS = 35


def main():
    porta, n = int(sys.argv[1]), int(sys.argv[2])
    gc.disable()  # the floor: nothing but the reads
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", porta))
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        socks.append(s)
    attesa, per_fd = select.epoll(), {}
    for i, s in enumerate(socks):
        corpo = b'{"messages":[{"role":"user","content":"pavimento %d"}],"stream":true,"max_tokens":64}' % i
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(corpo), corpo))
        s.setblocking(False)
        per_fd[s.fileno()] = (s.recvmsg, [])
        attesa.register(s.fileno(), select.EPOLLIN)
    aperti, spazio = n, socket.CMSG_SPACE(16)
    while aperti:
        pronti = attesa.poll(10.0, 4096)
        if not pronti:
            sys.exit("pavimento.py: nothing to read for 10 s")
        for fd, _ in pronti:
            ricevi, letture = per_fd[fd]
            try:
                dati, ausiliari, _, _ = ricevi(65536, spazio)
            except BlockingIOError:
                continue
            letture += (ausiliari[0][2] if ausiliari else b"", dati)
            if not dati or dati.endswith(b"0\r\n\r\n"):
                attesa.unregister(fd)
                aperti -= 1
    token = [d.count(b'"content":"') for _, letture in per_fd.values() for d in letture[1::2]]
    uso = resource.getrusage(resource.RUSAGE_SELF)
    print(f"reads {len(token)} tokens {sum(token)} shared {sum(t - 1 for t in token if t > 1)} "
          f"user {uso.ru_utime:.3f} sys {uso.ru_stime:.3f}")


if __name__ == "__main__":
    main()
