/* netprobe: the local cluster's traffic probe, static, in an image of its own (no registry).
 *
 *   netprobe serve PORT      answer every TCP connection on PORT (IPv4) with the address the
 *                            connection came from, then close it: what the receiver sees of
 *                            the sender, so a test can tell a pod's own IP from a masquerade;
 *                            and echo back whatever comes on PORT+1, one process per
 *                            connection, for as long as the connection lasts
 *   netprobe get ADDR PORT   connect to ADDR:PORT (3 s limit), print what it answers; exit 1
 *                            naming the failed step otherwise
 *   netprobe hold ADDR PORT  keep one connection to an echoing PORT until standard input
 *                            closes, a line every 100 ms, each answered within 3 s; print
 *                            "connected", then how many were answered, or exit 1 at the first
 *                            one lost: one connection that must survive whatever happens
 *                            meanwhile
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int fail(const char *step) {
  fprintf(stderr, "netprobe: %s: %s\n", step, strerror(errno));
  return 1;
}

static int parse_port(const char *s) {
  char *end;
  long p = strtol(s, &end, 10);
  return (*end == '\0' && p > 0 && p < 65536) ? (int)p : -1;
}

static int listen_on(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return -1;
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 64) < 0) return -1;
  return s;
}

/* Echoes one connection until the peer closes it. */
static void echo(int c) {
  char buf[512];
  ssize_t n;
  while ((n = read(c, buf, sizeof buf)) > 0)
    if (write(c, buf, n) != n) break;
  close(c);
}

static int serve_echo(int port) {
  int s = listen_on(port);
  if (s < 0) return fail("listen (echo)");
  for (;;) {
    int c = accept(s, NULL, NULL);
    if (c < 0) continue;
    if (fork() == 0) {
      close(s);
      echo(c);
      _exit(0);
    }
    close(c);
  }
}

static int serve(int port) {
  /* Children reaped by the kernel: the echo listener and its connections. */
  signal(SIGCHLD, SIG_IGN);
  if (port < 65535 && fork() == 0) _exit(serve_echo(port + 1));
  int s = listen_on(port);
  if (s < 0) return fail("listen");
  for (;;) {
    struct sockaddr_in peer;
    socklen_t len = sizeof peer;
    int c = accept(s, (struct sockaddr *)&peer, &len);
    if (c < 0) continue;
    char line[INET_ADDRSTRLEN + 1];
    inet_ntop(AF_INET, &peer.sin_addr, line, INET_ADDRSTRLEN);
    strcat(line, "\n");
    /* One short line: a failed write only loses this answer. */
    if (write(c, line, strlen(line)) < 0) perror("netprobe: write");
    close(c);
  }
}

/* A connected non-blocking socket to ADDR:PORT within 3 s, or -1 (the reason printed). */
static int dial(const char *addr, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
    fprintf(stderr, "netprobe: not an IPv4 address: %s\n", addr);
    return -1;
  }
  int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (s < 0) return fail("socket"), -1;
  if (connect(s, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) return fail("connect"), -1;
  struct pollfd p = {.fd = s, .events = POLLOUT};
  if (poll(&p, 1, 3000) != 1) {
    errno = ETIMEDOUT;
    return fail("connect"), -1;
  }
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    errno = err;
    return fail("connect"), -1;
  }
  return s;
}

static int get(const char *addr, int port) {
  int s = dial(addr, port);
  if (s < 0) return 1;
  struct pollfd p = {.fd = s};
  char buf[256];
  size_t got = 0;
  for (;;) {
    p.events = POLLIN;
    if (poll(&p, 1, 3000) != 1) {
      errno = ETIMEDOUT;
      return fail("read");
    }
    ssize_t n = read(s, buf + got, sizeof buf - 1 - got);
    if (n < 0) return fail("read");
    if (n == 0 || got + n >= sizeof buf - 1) {
      got += n > 0 ? n : 0;
      break;
    }
    got += n;
  }
  buf[got] = '\0';
  fputs(buf, stdout);
  return got ? 0 : (fprintf(stderr, "netprobe: empty answer\n"), 1);
}

/* True once standard input is at its end (what is read from it is ignored). */
static int stdin_closed(void) {
  struct pollfd p = {.fd = 0, .events = POLLIN};
  char buf[64];
  while (poll(&p, 1, 0) == 1) {
    if (read(0, buf, sizeof buf) <= 0) return 1;
  }
  return 0;
}

static int hold(const char *addr, int port) {
  int s = dial(addr, port);
  if (s < 0) return 1;
  /* Whoever waits for the connection to be up reads this first. */
  printf("connected\n");
  fflush(stdout);
  long lines = 0;
  while (!stdin_closed()) {
    char line[32], back[32];
    int n = snprintf(line, sizeof line, "%ld\n", lines);
    if (write(s, line, n) != n) return fail("write");
    int got = 0;
    while (got < n) {
      struct pollfd p = {.fd = s, .events = POLLIN};
      if (poll(&p, 1, 3000) != 1) {
        errno = ETIMEDOUT;
        fprintf(stderr, "netprobe: line %ld lost after %ld answered\n", lines, lines);
        return fail("read");
      }
      ssize_t r = read(s, back + got, sizeof back - got);
      if (r <= 0) {
        fprintf(stderr, "netprobe: connection closed after %ld lines\n", lines);
        return r < 0 ? fail("read") : 1;
      }
      got += r;
    }
    lines++;
    usleep(100000);
  }
  printf("%ld\n", lines);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "serve") == 0 && parse_port(argv[2]) > 0) return serve(parse_port(argv[2]));
  if (argc == 4 && strcmp(argv[1], "get") == 0 && parse_port(argv[3]) > 0) return get(argv[2], parse_port(argv[3]));
  if (argc == 4 && strcmp(argv[1], "hold") == 0 && parse_port(argv[3]) > 0) return hold(argv[2], parse_port(argv[3]));
  fprintf(stderr, "usage: netprobe serve PORT | netprobe get ADDR PORT | netprobe hold ADDR PORT\n");
  return 2;
}
