/* netprobe: the local cluster's traffic probe, static, in an image of its own (no registry).
 *
 *   netprobe serve PORT      answer every TCP connection on PORT (IPv4) with the address the
 *                            connection came from, then close it: what the receiver sees of
 *                            the sender, so a test can tell a pod's own IP from a masquerade
 *   netprobe get ADDR PORT   connect to ADDR:PORT (3 s limit), print what it answers; exit 1
 *                            naming the failed step otherwise
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
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

static int serve(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return fail("socket");
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
  if (bind(s, (struct sockaddr *)&a, sizeof a) < 0) return fail("bind");
  if (listen(s, 64) < 0) return fail("listen");
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

static int get(const char *addr, int port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  if (inet_pton(AF_INET, addr, &a.sin_addr) != 1) {
    fprintf(stderr, "netprobe: not an IPv4 address: %s\n", addr);
    return 2;
  }
  int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (s < 0) return fail("socket");
  if (connect(s, (struct sockaddr *)&a, sizeof a) < 0 && errno != EINPROGRESS) return fail("connect");
  struct pollfd p = {.fd = s, .events = POLLOUT};
  if (poll(&p, 1, 3000) != 1) {
    errno = ETIMEDOUT;
    return fail("connect");
  }
  int err = 0;
  socklen_t len = sizeof err;
  getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len);
  if (err) {
    errno = err;
    return fail("connect");
  }
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

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "serve") == 0 && parse_port(argv[2]) > 0) return serve(parse_port(argv[2]));
  if (argc == 4 && strcmp(argv[1], "get") == 0 && parse_port(argv[3]) > 0) return get(argv[2], parse_port(argv[3]));
  fprintf(stderr, "usage: netprobe serve PORT | netprobe get ADDR PORT\n");
  return 2;
}
