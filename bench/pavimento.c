/* The floor under any stream reader on this machine: bench tooling, not the product (bench.py
 * --pavimento builds it with cc, as it builds flussi.c).
 *
 * What carico's stream reader does at its least, in C: N connections to the fake, the requests sent one
 * after the other, then one thread that waits on every socket at once (epoll) and reads each as its
 * bytes come (recvmsg, with the kernel's receive stamp asked for, SO_TIMESTAMPNS), keeping nothing.
 * The kernel's share of a read (the wake-up, the copy, and the ACK that a read sends back to the
 * server) is the same as carico's; the rest costs next to nothing. A read that brings two tokens of one
 * stream gives both the later one's stamp: the reader was later than a token's gap, and the earlier
 * token's time is lost (the kernel merges queued bytes and keeps the newest stamp).
 *
 *   pavimento PORT N_STREAMS    prints: reads, tokens, tokens that shared a read with a later one, and
 *                               the CPU it used (user, system), over its whole life
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static int conta(const char *b, ssize_t n, const char *cosa) {
    int c = 0, l = (int)strlen(cosa);
    for (ssize_t i = 0; i + l <= n; i++) c += !memcmp(b + i, cosa, l);
    return c;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "pavimento PORT N_STREAMS\n"); return 2; }
    int n = atoi(argv[2]), ep = epoll_create1(0), uno = 1, aperti = n;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int *fd = calloc(n, sizeof *fd);
    for (int i = 0; i < n; i++) {
        fd[i] = socket(AF_INET, SOCK_STREAM, 0);
        if (connect(fd[i], (struct sockaddr *)&a, sizeof a)) { perror("connect"); return 1; }
        setsockopt(fd[i], SOL_SOCKET, 35 /* SO_TIMESTAMPNS */, &uno, sizeof uno);
        setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &uno, sizeof uno);
    }
    for (int i = 0; i < n; i++) {
        char corpo[256], richiesta[512];
        int lc = snprintf(corpo, sizeof corpo, "{\"messages\":[{\"role\":\"user\",\"content\":\"pavimento %d\"}],"
                          "\"stream\":true,\"max_tokens\":64}", i);
        int lr = snprintf(richiesta, sizeof richiesta, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", lc, corpo);
        if (write(fd[i], richiesta, lr) != lr) { perror("write"); return 1; }
        struct epoll_event e = {.events = EPOLLIN, .data.fd = fd[i]};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd[i], &e);
    }
    static char buf[65536];
    char ausiliari[256];
    long letture = 0, token = 0, insieme = 0;
    struct epoll_event pronti[4096];
    while (aperti > 0) {
        int k = epoll_wait(ep, pronti, 4096, 10000);
        if (k <= 0) { fprintf(stderr, "pavimento: nothing to read for 10 s\n"); return 1; }
        for (int j = 0; j < k; j++) {
            struct iovec v = {buf, sizeof buf};
            struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1, .msg_control = ausiliari, .msg_controllen = sizeof ausiliari};
            ssize_t r = recvmsg(pronti[j].data.fd, &m, MSG_DONTWAIT);
            if (r < 0 && errno == EAGAIN) continue;
            letture++;
            int t = r > 0 ? conta(buf, r, "\"content\":\"") : 0;
            token += t;
            insieme += t > 1 ? t - 1 : 0;
            if (r <= 0 || (r >= 5 && !memcmp(buf + r - 5, "0\r\n\r\n", 5))) {
                epoll_ctl(ep, EPOLL_CTL_DEL, pronti[j].data.fd, NULL);
                close(pronti[j].data.fd);
                aperti--;
            }
        }
    }
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    printf("reads %ld tokens %ld shared %ld user %.3f sys %.3f\n", letture, token, insieme,
           u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6, u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6);
    return 0;
}
