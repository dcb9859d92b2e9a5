/* bench/harness2's backend: a single-threaded epoll HTTP/1.1 server that
 * answers every POST as vLLM's OpenAI server would, written apart from
 * mock-vllm (another program, another I/O model) so that the second harness
 * shares no part with bench/compare:
 *   - a body with "stream":true gets the whole SSE reply in one send():
 *     EVENTS chat.completion.chunk events in vLLM's exact layout, each in
 *     its own HTTP chunk, then (when the body asks include_usage) the usage
 *     chunk, data: [DONE] and the terminal chunk;
 *   - any other body gets a chat.completion JSON body of TOKENS tokens.
 * Keep-alive; requests are read whole (head + content-length body).
 *
 *   backend PORT [EVENTS] [TOKENS]      (defaults 222 and 16)
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
#include <unistd.h>

enum { k_in_max = 1 << 16 };

struct conn {
  int fd;
  size_t len;
  char in[k_in_max];
};

static char *sse_reply, *sse_usage_reply, *json_reply;
static size_t sse_len, sse_usage_len, json_len;

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
  if (*len + n > *cap) {
    *cap = (*len + n) * 2;
    *buf = realloc(*buf, *cap);
    if (*buf == NULL) exit(1);
  }
  memcpy(*buf + *len, s, n);
  *len += n;
}

static void append_chunk(char **buf, size_t *len, size_t *cap, const char *payload) {
  char head[32];
  const size_t n = strlen(payload);
  append(buf, len, cap, head, (size_t)snprintf(head, sizeof head, "%zx\r\n", n));
  append(buf, len, cap, payload, n);
  append(buf, len, cap, "\r\n", 2);
}

static void build(int events, int tokens) {
  const char *head =
      "HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
      "content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n";
  const char *base = "{\"id\":\"chatcmpl-h2b0c4e1d2a3f4b5c6d7e8f9a0b1c2d3e4\",\"object\":\"chat.completion.chunk\","
                     "\"created\":1767225600,\"model\":\"mock-model\",\"choices\":[{\"index\":0,";
  char ev[512];
  for (int with_usage = 0; with_usage < 2; ++with_usage) {
    char *b = NULL;
    size_t len = 0, cap = 0;
    append(&b, &len, &cap, head, strlen(head));
    snprintf(ev, sizeof ev, "data: %s\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", base);
    append_chunk(&b, &len, &cap, ev);
    for (int i = 0; i < events - 2; ++i) {
      snprintf(ev, sizeof ev, "data: %s\"delta\":{\"content\":\" word%d\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n", base, i);
      append_chunk(&b, &len, &cap, ev);
    }
    snprintf(ev, sizeof ev, "data: %s\"delta\":{\"content\":\"\"},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}]}\n\n", base);
    append_chunk(&b, &len, &cap, ev);
    if (with_usage) {
      snprintf(ev, sizeof ev, "data: {\"id\":\"chatcmpl-h2b0c4e1d2a3f4b5c6d7e8f9a0b1c2d3e4\",\"object\":\"chat.completion.chunk\","
               "\"created\":1767225600,\"model\":\"mock-model\",\"choices\":[],\"usage\":{\"prompt_tokens\":41,"
               "\"total_tokens\":%d,\"completion_tokens\":%d}}\n\n", 41 + events - 2, events - 2);
      append_chunk(&b, &len, &cap, ev);
    }
    append_chunk(&b, &len, &cap, "data: [DONE]\n\n");
    append(&b, &len, &cap, "0\r\n\r\n", 5);
    if (with_usage) {
      sse_usage_reply = b;
      sse_usage_len = len;
    } else {
      sse_reply = b;
      sse_len = len;
    }
  }
  char body[8192];
  int n = snprintf(body, sizeof body,
                   "{\"id\":\"chatcmpl-h2b0c4e1d2a3f4b5c6d7e8f9a0b1c2d3e4\",\"object\":\"chat.completion\",\"created\":1767225600,"
                   "\"model\":\"mock-model\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"reasoning_content\":null,"
                   "\"content\":\"");
  for (int i = 0; i < tokens; ++i) n += snprintf(body + n, sizeof body - (size_t)n, "%sword%d", i ? " " : "", i);
  n += snprintf(body + n, sizeof body - (size_t)n,
                "\",\"tool_calls\":[]},\"logprobs\":null,\"finish_reason\":\"length\",\"stop_reason\":null}],"
                "\"usage\":{\"prompt_tokens\":41,\"total_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":null},"
                "\"prompt_logprobs\":null,\"kv_transfer_params\":null}",
                41 + tokens, tokens);
  json_reply = malloc((size_t)n + 256);
  json_len = (size_t)sprintf(json_reply,
                             "HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
                             "content-length: %d\r\ncontent-type: application/json\r\n\r\n%s",
                             n, body);
}

static int send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {  /* the client is slow: wait for room */
      fd_set set;
      FD_ZERO(&set);
      FD_SET(fd, &set);
      select(fd + 1, NULL, &set, NULL, NULL);
      continue;
    }
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Answers each whole request in c->in; returns -1 to close. */
static int serve(struct conn *c) {
  for (;;) {
    char *end = memmem(c->in, c->len, "\r\n\r\n", 4);
    if (end == NULL) return c->len == k_in_max ? -1 : 0;
    const size_t head = (size_t)(end - c->in) + 4;
    size_t body = 0;
    for (char *p = c->in; p < end; ++p) {
      if ((p == c->in || p[-1] == '\n') && strncasecmp(p, "content-length:", 15) == 0) body = strtoul(p + 15, NULL, 10);
    }
    if (head + body > k_in_max) return -1;
    if (c->len < head + body) return 0;
    const char *b = c->in + head;
    const int stream = memmem(b, body, "\"stream\":true", 13) != NULL || memmem(b, body, "\"stream\": true", 14) != NULL;
    const int usage = memmem(b, body, "\"include_usage\":true", 20) != NULL || memmem(b, body, "\"include_usage\": true", 21) != NULL;
    const int rc = stream ? send_all(c->fd, usage ? sse_usage_reply : sse_reply, usage ? sse_usage_len : sse_len)
                          : send_all(c->fd, json_reply, json_len);
    if (rc < 0) return -1;
    memmove(c->in, c->in + head + body, c->len - head - body);
    c->len -= head + body;
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s PORT [EVENTS] [TOKENS]\n", argv[0]);
    return 2;
  }
  build(argc > 2 ? atoi(argv[2]) : 222, argc > 3 ? atoi(argv[3]) : 16);
  const int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  const int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])), .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 1024) < 0) {
    perror("bind/listen");
    return 1;
  }
  const int ep = epoll_create1(0);
  struct epoll_event e = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &e);
  struct epoll_event evs[256];
  for (;;) {
    const int n = epoll_wait(ep, evs, 256, -1);
    for (int i = 0; i < n; ++i) {
      struct conn *c = evs[i].data.ptr;
      if (c == NULL) {
        for (int fd; (fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0;) {
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          struct conn *nc = calloc(1, sizeof *nc);
          nc->fd = fd;
          struct epoll_event ce = {.events = EPOLLIN, .data.ptr = nc};
          epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ce);
        }
        continue;
      }
      const ssize_t r = recv(c->fd, c->in + c->len, k_in_max - c->len, 0);
      if (r > 0) c->len += (size_t)r;
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || (r > 0 && serve(c) < 0)) {
        close(c->fd);
        free(c);
      }
    }
  }
}
