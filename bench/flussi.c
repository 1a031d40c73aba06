/* The bench's fast fake for the streams row: bench tooling, not the product (bench/run builds it).
 *
 * One thread, epoll, every streamed answer written on an absolute CLOCK_MONOTONIC schedule (the clock
 * of Python's time.perf_counter on Linux); while streams are open it never sleeps (it polls: a sleeping
 * thread on a virtual machine wakes up to 2 ms late, and the fake has its own core): the headers and the role chunk
 * in one write when the request has arrived, token k at arrival + FIRST_MS + k * GAP_MS, then finish_reason,
 * usage, [DONE] and the last chunk in one write right after the last token.
 * Its own lateness (each write's time minus its due time) and every write's time are logged, so that the
 * bench compares carico's figures with what really left the server.
 *
 *   flussi PORT N_STREAMS TOKENS LOGFILE [GAP_MS [MIXED]]    exits after N_STREAMS streams have ended,
 *   writing LOGFILE: one line per stream: the prompt's first bytes, the request's arrival (ns), for each
 *   token the clock just before and just after its write (ns): the bytes left somewhere in between; last,
 *   the clock just after the end's write (ns).
 *   GAP_MS: the gap between two tokens (20); MIXED 1: the streams end at different times, each with
 *   between TOKENS/2 and TOKENS tokens (for the bench's long answers that end while others stream).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define FIRST_MS 50
#define MAXC 4096
#define MAXTOK 4096

typedef struct {
    int fd, stato; /* 0 free, 1 reading the request, 2 streaming */
    char req[16384];
    int n;
    long long arrivo, prima[MAXTOK], scritti[MAXTOK], fine;
    int k, ntok; /* tokens written so far, and this stream's */
    char tag[48];
} Conn;

static Conn conns[MAXC];
static int maxfd;
static int tokens, gap_ms = 20, misti;

static long long ora(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* CLOCK_REALTIME - CLOCK_MONOTONIC: a kernel receive stamp is wall-clock time */
static long long scarto(void) {
    struct timespec a, r, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    clock_gettime(CLOCK_REALTIME, &r);
    clock_gettime(CLOCK_MONOTONIC, &b);
    return r.tv_sec * 1000000000LL + r.tv_nsec - (a.tv_sec * 1000000000LL + a.tv_nsec + b.tv_sec * 1000000000LL + b.tv_nsec) / 2;
}

static long long dovuto(Conn *c) { return c->arrivo + (FIRST_MS + (long long)gap_ms * c->k) * 1000000LL; }

/* The streams by their next write's due time: a binary heap of fds (a scan of every stream at every
   wake-up would not keep 50,000 writes a second on time). */
static int heap[MAXC], nheap;

static long long chiave(int i) { return dovuto(&conns[heap[i]]); }

static void scambia(int i, int j) { int t = heap[i]; heap[i] = heap[j]; heap[j] = t; }

static void su(int i) {
    while (i > 0 && chiave((i - 1) / 2) > chiave(i)) { scambia(i, (i - 1) / 2); i = (i - 1) / 2; }
}

static void giu(int i) {
    for (;;) {
        int m = i, l = 2 * i + 1, r = l + 1;
        if (l < nheap && chiave(l) < chiave(m)) m = l;
        if (r < nheap && chiave(r) < chiave(m)) m = r;
        if (m == i) return;
        scambia(i, m);
        i = m;
    }
}

static void scrivi(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EAGAIN) continue; /* never seen at these sizes: the send buffer is large */
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

/* one SSE event as one HTTP chunk, into buf: its length */
static int evento_in(char *buf, size_t spazio, const char *dati) {
    return snprintf(buf, spazio, "%zx\r\ndata: %s\n\n\r\n", strlen(dati) + 8, dati);
}

static void evento(int fd, const char *dati) {
    char buf[1024];
    scrivi(fd, buf, (size_t)evento_in(buf, sizeof buf, dati));
}

/* A stream that has ended is closed, and logged, when nothing is due: closing costs the loop more
   than a write, and a thousand streams end within a few milliseconds of each other. */
static int da_chiudere[MAXC], nchiudere;
static FILE *log;

static void chiudi(int fd) {
    Conn *c = &conns[fd];
    close(fd);
    c->stato = 0;
    fprintf(log, "%s\t%lld", c->tag, c->arrivo);
    for (int k = 0; k < c->ntok; k++) fprintf(log, "\t%lld,%lld", c->prima[k], c->scritti[k]);
    fprintf(log, "\t%lld\n", c->fine);
}

/* Every write that is due: called between any two other things the loop does (a request read, a
   connection accepted), so that a burst of arrivals never holds a due token back. */
static int finiti;

static void dovuti(void) {
    long long adesso = ora();
    while (nheap > 0 && chiave(0) <= adesso) {
        int fd = heap[0];
        Conn *c = &conns[fd];
        c->prima[c->k] = ora();
        evento(fd, "{\"choices\":[{\"index\":0,\"finish_reason\":null,\"delta\":{\"content\":\"parola \"}}]}");
        c->scritti[c->k++] = adesso = ora();
        if (c->k == c->ntok) {
            /* the end in one write: finish_reason, usage, [DONE] and the last chunk */
            char usage[256], fine[1024];
            snprintf(usage, sizeof usage, "{\"choices\":[],\"usage\":{\"completion_tokens\":%d,\"prompt_tokens\":20,"
                     "\"total_tokens\":%d}}", c->ntok, c->ntok + 20);
            int n = evento_in(fine, sizeof fine, "{\"choices\":[{\"index\":0,\"finish_reason\":\"length\",\"delta\":{}}]}");
            n += evento_in(fine + n, sizeof fine - n, usage);
            n += evento_in(fine + n, sizeof fine - n, "[DONE]");
            n += snprintf(fine + n, sizeof fine - n, "0\r\n\r\n");
            scrivi(fd, fine, (size_t)n);
            c->fine = ora();
            da_chiudere[nchiudere++] = fd;
            finiti++;
            heap[0] = heap[--nheap];
        }
        giu(0);
    }
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    int porta = atoi(argv[1]), attesi = atoi(argv[2]);
    tokens = atoi(argv[3]);
    if (tokens > MAXTOK) tokens = MAXTOK;
    if (argc > 5) gap_ms = atoi(argv[5]);
    if (argc > 6) misti = atoi(argv[6]);
    log = fopen(argv[4], "w");
    int ascolto = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), uno = 1;
    setsockopt(ascolto, SOL_SOCKET, SO_REUSEADDR, &uno, sizeof uno);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(porta), .sin_addr.s_addr = htonl(0x7f000001)};
    if (bind(ascolto, (struct sockaddr *)&a, sizeof a) || listen(ascolto, 4096)) { perror("bind"); return 1; }
    /* Linux turns receive stamping on for the whole machine a moment after the first socket asks: ask now */
    setsockopt(ascolto, SOL_SOCKET, SO_TIMESTAMPNS, &uno, sizeof uno);
    usleep(100000);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = -1};
    epoll_ctl(ep, EPOLL_CTL_ADD, ascolto, &ev);
    printf("pronto\n");
    fflush(stdout);
    struct epoll_event eventi[256];
    while (finiti < attesi) {
        int n = epoll_wait(ep, eventi, 256, nheap > 0 ? 0 : 1000);
        for (int i = 0; i < n; i++) {
            dovuti();
            int fd = eventi[i].data.fd;
            if (fd == -1) {
                int c;
                while ((c = accept4(ascolto, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    dovuti();
                    if (c >= MAXC) { close(c); continue; }
                    if (c > maxfd) maxfd = c;
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &uno, sizeof uno);
                    setsockopt(c, SOL_SOCKET, SO_TIMESTAMPNS, &uno, sizeof uno);
                    memset(&conns[c], 0, sizeof(Conn));
                    conns[c].fd = c;
                    conns[c].stato = 1;
                    struct epoll_event e = {.events = EPOLLIN, .data.fd = c};
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
                }
            } else if (fd >= 0 && conns[fd].stato == 1) {
                Conn *c = &conns[fd];
                /* the request's arrival is when its first bytes reached the machine (the kernel's stamp),
                   however late this loop reads them: the schedule, and its lateness, start there */
                char ausiliari[256];
                struct iovec iov = {.iov_base = c->req + c->n, .iov_len = sizeof c->req - 1 - c->n};
                struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ausiliari,
                                   .msg_controllen = sizeof ausiliari};
                ssize_t r = recvmsg(fd, &m, 0);
                if (r <= 0) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); close(fd); c->stato = 0; continue; }
                if (c->n == 0) {
                    c->arrivo = ora();
                    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
                        if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SO_TIMESTAMPNS) {
                            struct timespec t;
                            memcpy(&t, CMSG_DATA(h), sizeof t);
                            long long k = t.tv_sec * 1000000000LL + t.tv_nsec - scarto();
                            if (k <= c->arrivo) c->arrivo = k;
                        }
                }
                c->n += r;
                c->req[c->n] = 0;
                char *fine = strstr(c->req, "\r\n\r\n");
                if (!fine) continue;
                char *cl = strcasestr(c->req, "content-length:");
                int lunghezza = cl && cl < fine ? atoi(cl + 15) : 0;
                if (c->n < (fine + 4 - c->req) + lunghezza) continue;
                if (strncmp(c->req, "POST /v1/chat/completions ", 26) != 0) { /* only the chat streams count: /tokenize and others 404 */
                    const char *r200 = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
                                       "Connection: close\r\n\r\n{\"status\":\"ok\"}";
                    const char *r404 = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
                    const char *r = strncmp(c->req, "GET /health ", 12) == 0 ? r200 : r404;
                    scrivi(fd, r, strlen(r));
                    epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
                    close(fd);
                    c->stato = 0;
                    continue;
                }
                char *p = strstr(fine, "\"content\": \"");
                if (p) { strncpy(c->tag, p + 12, 40); c->tag[40] = 0; char *q = strchr(c->tag, '"'); if (q) *q = 0; }
                const char *testa = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
                                    "Connection: close\r\n\r\n";
                char primo[1024];
                int n = snprintf(primo, sizeof primo, "%s", testa);
                n += evento_in(primo + n, sizeof primo - n, "{\"choices\":[{\"index\":0,\"finish_reason\":null,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}");
                scrivi(fd, primo, (size_t)n); /* one write: the headers and the role chunk */
                c->stato = 2;
                c->k = 0;
                c->ntok = misti ? tokens / 2 + (fd * 37) % (tokens / 2 + 1) : tokens;
                heap[nheap++] = fd;
                su(nheap - 1);
                epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); /* nothing more to read from it */
            }
        }
        if (nchiudere > 0 && (nheap == 0 || chiave(0) > ora())) chiudi(da_chiudere[--nchiudere]);
        dovuti();
    }
    while (nchiudere > 0) chiudi(da_chiudere[--nchiudere]);
    fclose(log);
    return 0;
}
