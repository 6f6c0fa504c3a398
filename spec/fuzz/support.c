/* The harnesses' shared parts (fuzz.h): the gateway under test, the model
 * servers the harness plays, the client, and the invariants checked after
 * each input. */
#include "fuzz.h"
#include "internal.h" /* the Lua state, for line coverage */

#include <arpa/inet.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef LUPIN_FUZZ_HOME
#define LUPIN_FUZZ_HOME "."
#endif

static int err_fd = 2;

void fz_fail(const char *fmt, ...) {
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg - 1, fmt, ap);
  va_end(ap);
  if (n < 0) n = 0;
  if ((size_t)n > sizeof msg - 2) n = sizeof msg - 2;
  msg[n++] = '\n';
  if (write(err_fd, "fuzz invariant broken: ", 23) < 0 || write(err_fd, msg, (size_t)n) < 0) {
    /* nothing left to tell it to */
  }
  abort();
}

/* Weak: only a sanitizer runtime defines them. */
void __sanitizer_set_report_fd(void *fd) __attribute__((weak));
void __lsan_disable(void) __attribute__((weak));
void __lsan_enable(void) __attribute__((weak));

FILE *fz_quiet(void) {
  fz_setup();
  static FILE *report;
  if (report) return report;
  report = fdopen(dup(1), "w");
  if (__sanitizer_set_report_fd) __sanitizer_set_report_fd((void *)(intptr_t)err_fd);
  int devnull = open("/dev/null", O_WRONLY);
  if (devnull >= 0) {
    dup2(devnull, 1);
    close(devnull);
  }
  return report ? report : stderr;
}

void fz_setup(void) {
  static int done;
  if (done) return;
  done = 1;
  setenv("LUPIN_HOME", LUPIN_FUZZ_HOME, 0);
  int fd = dup(2);
  if (fd >= 0) err_fd = fd;
}

/* --- Lua coverage ------------------------------------------------------- */

/* libFuzzer sees C edges only, and most of what checks a config or a body is
 * Lua.  With LUPIN_FUZZ_LUA_COVERAGE=1, a line hook counts each Lua line run
 * into libFuzzer's extra counters, so inputs that reach new Lua lines are kept
 * too.  Opt-in: a hook disables the JIT, and a runtime that sets its own
 * hooks (budgets) would lose them. */
#define LUA_COUNTERS 65536
__attribute__((section("__libfuzzer_extra_counters"),
               used)) static uint8_t lua_counters[LUA_COUNTERS];

static void on_line(lua_State *L, lua_Debug *ar) {
  if (!lua_getinfo(L, "S", ar)) return;
  uintptr_t h = (uintptr_t)ar->source * 31u + (uintptr_t)ar->currentline * 2654435761u;
  uint8_t *c = &lua_counters[(h ^ (h >> 16)) % LUA_COUNTERS];
  if (*c < 255) (*c)++;
}

void fz_lua_coverage(lupin_runtime *rt) {
  const char *on = getenv("LUPIN_FUZZ_LUA_COVERAGE");
  if (on && *on == '1') lua_sethook(rt->L, on_line, LUA_MASKLINE, 0);
}

/* --- the loop ----------------------------------------------------------- */

static lupin_gateway gw_;
static int opened;
static unsigned events; /* bumped by every harness callback: the loop moved */

/* Model-server writes not yet done, the client's connect and write. */
static int writes, client_pending;
static int flush_rest(void);

/* Scrapes are the gateway's own upstream exchanges, always running. */
static size_t scrapes_in_flight(lupin_gateway *gw) {
  size_t n = 0;
  for (gw_endpoint *ep = gw->endpoints; ep; ep = ep->next)
    n += ep->scrape != NULL;
  return n;
}

static int busy(lupin_gateway *gw) {
  return gw->n_exchanges || gw->n_upstreams > scrapes_in_flight(gw) || writes || client_pending;
}

/* Runs the loop until nothing moves for a few turns while nothing is in
 * flight: each turn polls without blocking, so an exchange over loopback
 * progresses every turn.  Gives up after many turns (a hang is the fuzzer's
 * timeout to find, not a reason to spin forever). */
static void settle(lupin_gateway *gw) {
  int still = 0; /* turns in a row without a harness callback */
  for (long turn = 0; turn < 200000; turn++) {
    unsigned before = events;
    uv_run(gw->loop, UV_RUN_NOWAIT);
    still = events == before ? still + 1 : 0;
    if (still >= 2 && flush_rest()) still = 0; /* the gateway has read a first piece */
    if (still >= 4 && !busy(gw)) return;
  }
}

/* --- the model servers --------------------------------------------------- */

static const char metrics_text[] =
    "# TYPE vllm:num_requests_waiting gauge\n"
    "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 2.0\n"
    "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n"
    "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\n";

static const char models_text[] =
    "{\"object\":\"list\",\"data\":[{\"id\":\"m\",\"object\":\"model\",\"created\":1,"
    "\"owned_by\":\"fuzz\"}]}";

static const char completion_text[] =
    "{\"id\":\"c\",\"object\":\"text_completion\",\"choices\":[{\"text\":\"ok\",\"index\":0,"
    "\"finish_reason\":\"length\"}],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1,"
    "\"total_tokens\":2}}";

static struct {
  const char *bytes;
  size_t len, split;
  int reset;
} answer;

static lh_buf metrics_answer; /* a whole HTTP response, or empty: canned */

void fz_set_metrics(const char *text, size_t len) {
  metrics_answer.len = 0;
  if (!text) return;
  char head[160];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\n"
                   "content-length: %zu\r\n\r\n",
                   len);
  lh_buf_append(&metrics_answer, head, (size_t)n);
  lh_buf_append(&metrics_answer, text, len);
}

void fz_set_answer(const char *bytes, size_t len, size_t split, int reset) {
  answer.bytes = bytes;
  answer.len = len;
  answer.split = split < len ? split : len;
  answer.reset = reset;
}

typedef struct peer {
  uv_tcp_t tcp;
  http_parser parser;
  lh_buf url;
  int closing;
  int rest; /* the second piece of a fuzzed answer is due */
  struct peer *prev, *next;
} peer;

typedef struct {
  uv_write_t w;
  peer *p;
  int last; /* close the connection once written */
  char data[];
} peer_write;

static uv_tcp_t servers[8];
static peer *peers;

static void peer_closed(uv_handle_t *h) {
  peer *p = h->data;
  events++;
  if (p->prev)
    p->prev->next = p->next;
  else
    peers = p->next;
  if (p->next) p->next->prev = p->prev;
  lh_buf_free(&p->url);
  free(p);
}

static void peer_close(peer *p) {
  if (p->closing) return;
  p->closing = 1;
  p->rest = 0;
  if (answer.reset && answer.bytes)
    uv_tcp_close_reset(&p->tcp, peer_closed);
  else
    uv_close((uv_handle_t *)&p->tcp, peer_closed);
}

static void peer_written(uv_write_t *w, int status) {
  peer_write *pw = (peer_write *)w;
  events++;
  writes--;
  if (pw->last || status < 0) peer_close(pw->p);
  free(pw);
}

static void peer_send(peer *p, const char *data, size_t len, int last) {
  peer_write *pw = malloc(sizeof *pw + len + 1);
  if (!pw) fz_fail("out of memory");
  pw->p = p;
  pw->last = last;
  memcpy(pw->data, data, len);
  uv_buf_t b = uv_buf_init(pw->data, (unsigned)len);
  if (uv_write(&pw->w, (uv_stream_t *)&p->tcp, &b, 1, peer_written)) {
    free(pw);
    peer_close(p);
    return;
  }
  writes++;
}

static void peer_canned(peer *p, const char *type, const char *body) {
  char head[256];
  int n = snprintf(head, sizeof head,
                   "HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %zu\r\n\r\n", type,
                   strlen(body));
  lh_buf b = {0};
  lh_buf_append(&b, head, (size_t)n);
  lh_buf_append(&b, body, strlen(body));
  peer_send(p, b.data, b.len, 0);
  lh_buf_free(&b);
}

/* The fuzzed answer: the first piece now; the rest once the gateway has
 * read it alone (settle calls flush_rest), then the close. */
static void peer_fuzzed(peer *p) {
  if (!answer.split) {
    peer_send(p, answer.bytes, answer.len, 1);
    return;
  }
  peer_send(p, answer.bytes, answer.split, answer.split == answer.len);
  p->rest = answer.split < answer.len;
}

static int flush_rest(void) {
  int n = 0;
  for (peer *p = peers; p; p = p->next)
    if (p->rest && !p->closing) {
      p->rest = 0;
      peer_send(p, answer.bytes + answer.split, answer.len - answer.split, 1);
      n++;
    }
  return n;
}

static int peer_url(http_parser *hp, const char *at, size_t len) {
  return lh_buf_append(&((peer *)hp->data)->url, at, len);
}

static int peer_message(http_parser *hp) {
  peer *p = hp->data;
  const char *url = p->url.data ? p->url.data : "";
  if (!strcmp(url, "/metrics") && metrics_answer.len)
    peer_send(p, metrics_answer.data, metrics_answer.len, 0);
  else if (!strcmp(url, "/metrics"))
    peer_canned(p, "text/plain; version=0.0.4", metrics_text);
  else if (answer.bytes)
    peer_fuzzed(p);
  else if (!strcmp(url, "/v1/models"))
    peer_canned(p, "application/json", models_text);
  else
    peer_canned(p, "application/json", completion_text);
  p->url.len = 0;
  return 0;
}

static const http_parser_settings peer_settings = {.on_url = peer_url,
                                                   .on_message_complete = peer_message};

static void peer_alloc(uv_handle_t *h, size_t size, uv_buf_t *b) {
  (void)h;
  static char buf[65536];
  (void)size;
  *b = uv_buf_init(buf, sizeof buf);
}

static void peer_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  peer *p = s->data;
  events++;
  if (n < 0) {
    peer_close(p);
    return;
  }
  if (p->closing) return;
  size_t used = http_parser_execute(&p->parser, &peer_settings, b->base, (size_t)n);
  if (HTTP_PARSER_ERRNO(&p->parser) != HPE_OK || used != (size_t)n) {
    if (fz_known("forwarded-framing")) { /* reported: answer as a strict server would */
      peer_close(p);
      return;
    }
    fz_fail("the gateway sent a model server a malformed request: %s",
            http_errno_description(HTTP_PARSER_ERRNO(&p->parser)));
  }
}

static void peer_accept(uv_stream_t *server, int status) {
  events++;
  if (status < 0) return;
  peer *p = calloc(1, sizeof *p);
  if (!p) fz_fail("out of memory");
  uv_tcp_init(server->loop, &p->tcp);
  p->tcp.data = p;
  if (uv_accept(server, (uv_stream_t *)&p->tcp)) fz_fail("cannot accept the gateway's connection");
  p->next = peers;
  if (peers) peers->prev = p;
  peers = p;
  http_parser_init(&p->parser, HTTP_REQUEST);
  p->parser.data = p;
  uv_read_start((uv_stream_t *)&p->tcp, peer_alloc, peer_read);
}

/* --- the gateway --------------------------------------------------------- */

static char tmp_dir[64];

static void close_peer_server(uv_handle_t *h) { (void)h; }

/* At exit: everything closed and freed as `lupin serve` does on SIGTERM, so
 * LeakSanitizer's exit check sees only real leaks. */
static void teardown(void) {
  if (!opened) return;
  opened = 0;
  for (int i = 0; i < 8; i++)
    if (servers[i].loop) uv_close((uv_handle_t *)&servers[i], close_peer_server);
  for (peer *p = peers; p; p = p->next)
    peer_close(p);
  uv_stop(gw_.loop);
  gw_run(&gw_);
  free((char *)gw_.opts.endpoints_file);
  char file[96];
  snprintf(file, sizeof file, "%s/endpoints.json", tmp_dir);
  unlink(file);
  rmdir(tmp_dir);
}

/* A listening socket on 127.0.0.1, port picked by the system. */
static int listen_socket(int *port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t n = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) ||
      getsockname(fd, (struct sockaddr *)&a, &n))
    fz_fail("cannot open a model server's socket");
  *port = ntohs(a.sin_port);
  return fd;
}

lupin_gateway *fz_gateway(const char *config, int n_endpoints) {
  if (opened) return &gw_;
  fz_setup();
  static char dir[] = "/tmp/lupin-fuzz-XXXXXX";
  if (!mkdtemp(dir)) fz_fail("mkdtemp: cannot create a temporary directory");
  char endpoints[sizeof dir + 32], cfg[4096];
  snprintf(endpoints, sizeof endpoints, "%s/endpoints.json", dir);
  snprintf(cfg, sizeof cfg, "%s/%s", LUPIN_FUZZ_HOME, config);
  if (n_endpoints > 8) n_endpoints = 8;
  FILE *f = fopen(endpoints, "w");
  if (!f) fz_fail("cannot write %s", endpoints);
  int fds[8];
  fputs("[", f);
  for (int i = 0; i < n_endpoints; i++) {
    int port;
    fds[i] = listen_socket(&port);
    fprintf(f, "%s{\"name\":\"m%d\",\"address\":\"127.0.0.1\",\"port\":%d}", i ? "," : "", i, port);
  }
  fputs("]\n", f);
  fclose(f);

  /* every log line and the access log at full detail, so their code runs
   * on fuzzed values too: fz_quiet or -close_fd_mask=3 sends them away */
  const char *level = getenv("LUPIN_FUZZ_LOG");
  gw_options o = {.config = cfg,
                  .listen = "127.0.0.1:0",
                  .admin = "127.0.0.1:0",
                  .endpoints_file = strdup(endpoints),
                  .log_level = level ? atoi(level) : LUPIN_LOG_DEBUG,
                  .no_watch = 1,
                  .workers = "1"}; /* the harness runs the leader's loop alone */
  char err[2048];
  /* what the start leaves for good (lua-cjson's buffers, held from the Lua
   * heap LeakSanitizer does not scan) is no input's leak */
  if (__lsan_disable) __lsan_disable();
  if (gw_open(&gw_, &o, err, sizeof err)) fz_fail("the gateway did not open: %s", err);
  for (int i = 0; i < n_endpoints; i++) {
    uv_tcp_init(gw_.loop, &servers[i]);
    if (uv_tcp_open(&servers[i], fds[i]) || uv_listen((uv_stream_t *)&servers[i], 128, peer_accept))
      fz_fail("cannot listen for a model server");
  }
  opened = 1;
  fz_lua_coverage(gw_.rt);
  settle(&gw_); /* the first scrapes */
  if (__lsan_enable) __lsan_enable();
  snprintf(tmp_dir, sizeof tmp_dir, "%s", dir);
  atexit(teardown);
  return &gw_;
}

/* --- the client ---------------------------------------------------------- */

typedef struct {
  uv_tcp_t tcp;
  uv_connect_t connect;
  uv_write_t w;
  lh_buf in;
  uv_buf_t out;
  int closed;
} client;

static void client_closed(uv_handle_t *h) {
  client *c = h->data;
  events++;
  c->closed = 1;
}

static void client_alloc(uv_handle_t *h, size_t size, uv_buf_t *b) {
  (void)h;
  (void)size;
  static char buf[65536];
  *b = uv_buf_init(buf, sizeof buf);
}

static void client_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  client *c = s->data;
  events++;
  if (n > 0) lh_buf_append(&c->in, b->base, (size_t)n);
  if (n < 0) uv_read_stop(s);
}

static void client_written(uv_write_t *w, int status) {
  (void)w;
  (void)status; /* the gateway may refuse and close before reading it all */
  events++;
  client_pending = 0;
}

static void client_connected(uv_connect_t *r, int status) {
  client *c = r->data;
  events++;
  if (status < 0) fz_fail("cannot connect to the gateway: %s", uv_strerror(status));
  if (c->closed) return;
  uv_read_start((uv_stream_t *)&c->tcp, client_alloc, client_read);
  if (!c->out.len || uv_write(&c->w, (uv_stream_t *)&c->tcp, &c->out, 1, client_written))
    client_pending = 0;
}

void fz_exchange(lupin_gateway *gw, gw_server *to, const char *bytes, size_t len, fz_reply *out) {
  static client c;
  struct sockaddr_storage addr;
  char hp[96];
  gw_server_address(to, hp, sizeof hp);
  char *colon = strrchr(hp, ':');
  *colon = 0;
  uv_ip4_addr(hp, atoi(colon + 1), (struct sockaddr_in *)&addr);
  lh_buf_free(&c.in);
  c = (client){0};
  c.tcp.data = c.connect.data = &c;
  c.out = uv_buf_init((char *)bytes, (unsigned)len);
  uv_tcp_init(gw->loop, &c.tcp);
  c.tcp.data = &c;
  client_pending = 1;
  if (uv_tcp_connect(&c.connect, &c.tcp, (struct sockaddr *)&addr, client_connected))
    fz_fail("cannot connect to the gateway");
  settle(gw);
  uv_close((uv_handle_t *)&c.tcp, client_closed);
  for (long turn = 0; turn < 200000 && (!c.closed || gw_server_connections(to)); turn++)
    uv_run(gw->loop, UV_RUN_NOWAIT);
  if (gw_server_connections(to))
    fz_fail("the gateway kept a connection open after its client closed it");
  settle(gw);
  out->data = c.in.data ? c.in.data : "";
  out->len = c.in.len;
}

/* --- the invariants ------------------------------------------------------ */

int fz_known(const char *cls) {
  const char *list = getenv("LUPIN_FUZZ_KNOWN");
  size_t n = strlen(cls);
  for (const char *p = list; p && *p; p += strcspn(p, ","), p += *p == ',')
    if (!strncmp(p, cls, n) && (p[n] == ',' || !p[n])) return 1;
  return 0;
}

/* The offset of the first byte that is not UTF-8 (RFC 3629: no overlong
 * forms, no surrogates, nothing past U+10FFFF), or -1. */
static long bad_utf8(const unsigned char *s, size_t len) {
  for (size_t i = 0; i < len;) {
    unsigned c = s[i];
    size_t n = c < 0x80                 ? 1
               : c >= 0xc2 && c <= 0xdf ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    if (!n || i + n > len) return (long)i;
    for (size_t k = 1; k < n; k++)
      if ((s[i + k] & 0xc0) != 0x80) return (long)i;
    if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] > 0x9f) ||
        (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] > 0x8f))
      return (long)i;
    i += n;
  }
  return -1;
}

typedef struct {
  int status, relayed, json, text, done;
  lh_buf body, field;
  int last_was_value;
  size_t responses;
} reading;

static int r_field(http_parser *p, const char *at, size_t len) {
  reading *r = p->data;
  if (r->last_was_value) r->field.len = 0;
  r->last_was_value = 0;
  return lh_buf_append(&r->field, at, len);
}

static int r_value(http_parser *p, const char *at, size_t len) {
  reading *r = p->data;
  if (!r->last_was_value && r->field.data) {
    if (!strcasecmp(r->field.data, "x-gateway-destination-endpoint")) r->relayed = 1;
    if (!strcasecmp(r->field.data, "content-type") && len >= 16 &&
        !strncmp(at, "application/json", 16))
      r->json = 1;
    if (!strcasecmp(r->field.data, "content-type") && len >= 10 && !strncmp(at, "text/plain", 10))
      r->text = 1;
  }
  r->last_was_value = 1;
  return 0;
}

static int r_begin(http_parser *p) {
  reading *r = p->data;
  r->relayed = r->json = r->text = r->done = r->last_was_value = 0;
  r->body.len = r->field.len = 0;
  return 0;
}

static int r_body(http_parser *p, const char *at, size_t len) {
  return lh_buf_append(&((reading *)p->data)->body, at, len);
}

/* A response the gateway wrote itself (not relayed from a model server):
 * JSON, and for an error the OpenAI shape with a message; the admin
 * listener's /metrics, /healthz and /readyz are plain text. */
static int r_complete(http_parser *p) {
  reading *r = p->data;
  int status = (int)p->status_code;
  r->responses++;
  r->done = 1;
  if (r->relayed || status < 200 || (r->text && status != 400 && status != 404)) return 0;
  if (!r->json) fz_fail("the gateway answered %d without content-type application/json", status);
  long at = bad_utf8((const unsigned char *)r->body.data, r->body.len);
  if (at >= 0) {
    if (!fz_known("utf8"))
      fz_fail("the gateway's %d answer is not UTF-8 (byte %ld), so not JSON: %.200s", status, at,
              r->body.data);
    for (size_t i = (size_t)at; i < r->body.len; i++) /* check the rest of it */
      if ((unsigned char)r->body.data[i] >= 0x80) r->body.data[i] = '?';
  }
  json_error_t e;
  json_t *j = json_loadb(r->body.data ? r->body.data : "", r->body.len, 0, &e);
  if (!j && fz_known("nonfinite") &&
      (strstr(r->body.data, "nan") || strstr(r->body.data, "inf"))) /* NaN, Inf printed */
    return 0;
  if (!j) fz_fail("the gateway's %d answer is not JSON (%s): %.200s", status, e.text, r->body.data);
  if (status >= 400) {
    json_t *msg = json_object_get(json_object_get(j, "error"), "message");
    if (!json_is_string(msg) || !json_string_length(msg))
      fz_fail("the gateway's %d answer has no error.message: %.200s", status, r->body.data);
  }
  json_decref(j);
  return 0;
}

static const http_parser_settings reply_settings = {.on_message_begin = r_begin,
                                                    .on_header_field = r_field,
                                                    .on_header_value = r_value,
                                                    .on_body = r_body,
                                                    .on_message_complete = r_complete};

void fz_check(lupin_gateway *gw, const fz_reply *rep) {
  const char *verbose = getenv("LUPIN_FUZZ_VERBOSE");
  if (verbose && *verbose == '1')
    dprintf(err_fd, "-- the client read %zu bytes:\n%.*s\n", rep->len,
            (int)(rep->len < 600 ? rep->len : 600), rep->data);
  reading r = {0};
  http_parser p;
  http_parser_init(&p, HTTP_RESPONSE);
  p.data = &r;
  size_t used = http_parser_execute(&p, &reply_settings, rep->data, rep->len);
  enum http_errno e = HTTP_PARSER_ERRNO(&p);
  if (e == HPE_UNEXPECTED_CONTENT_LENGTH && fz_known("forwarded-framing")) /* reported */
    e = HPE_OK, used = rep->len;
  if (e != HPE_OK || used != rep->len)
    fz_fail("the client read a malformed response (%s) at byte %zu of %zu: %.300s",
            http_errno_description(e), used, rep->len, rep->data);
  lh_buf_free(&r.body);
  lh_buf_free(&r.field);
  if (gw->n_exchanges)
    fz_fail("%zu requests still in flight after the client left", gw->n_exchanges);
  lupin_stats s;
  lupin_runtime_stats(gw->rt, &s);
  if (s.live_requests)
    fz_fail("%llu runtime requests not ended", (unsigned long long)s.live_requests);
}
