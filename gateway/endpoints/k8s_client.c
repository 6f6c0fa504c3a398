/* One HTTPS GET to the Kubernetes API server on the loop: the name looked
 * up off the loop (uv_getaddrinfo), a uv_tcp connection, OpenSSL driven
 * through memory BIOs (the loop owns the socket, OpenSSL only the bytes),
 * the response parsed by http_parser and its body handed on as it comes
 * (a watch is one response that lasts minutes).  One request per
 * connection: lists and watches are few, and a watch holds its own. */
#include "endpoints/endpoints.h"

#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#define CONNECT_MS 10000 /* resolve, connect and handshake */

struct gw_k8s_client {
  uv_loop_t *loop;
  SSL_CTX *ctx;
  const gw_k8s_config *cfg;
  char read_buf[65536]; /* every call reads into it: reads never nest */
};

enum { RESOLVING, CONNECTING, HANDSHAKE, OPEN };

struct gw_k8s_call {
  gw_k8s_client *cl;
  uv_getaddrinfo_t gai;
  uv_tcp_t tcp;
  uv_timer_t timer;
  int state, tcp_open, over, cancelled, refs;
  uint64_t idle_ms;
  SSL *ssl;
  BIO *rbio, *wbio; /* what the socket read, what it is to write */
  http_parser parser;
  lh_buf request;
  gw_k8s_call_cb cb;
  void *ud;
};

/* --- the TLS context: the CA, the client certificate ------------------------- */

static int tls_error(char *err, size_t errlen, const char *what) {
  char e[256] = "unknown error";
  unsigned long code = ERR_get_error();
  if (code) ERR_error_string_n(code, e, sizeof e);
  ERR_clear_error();
  lh_errf(err, errlen, "%s: %s", what, e);
  return -1;
}

static int add_cas(SSL_CTX *ctx, const gw_k8s_config *cfg, char *err, size_t errlen) {
  if (!cfg->ca) return SSL_CTX_set_default_verify_paths(ctx) ? 0 : tls_error(err, errlen, "CAs");
  BIO *b = BIO_new_mem_buf(cfg->ca, (int)cfg->ca_len);
  X509_STORE *store = SSL_CTX_get_cert_store(ctx);
  X509 *x;
  int n = 0;
  while (b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
    n += X509_STORE_add_cert(store, x);
    X509_free(x);
  }
  BIO_free(b);
  ERR_clear_error(); /* the end of the PEM list reads as an error */
  if (n) return 0;
  lh_errf(err, errlen, "the certificate authority of %s holds no PEM certificate", cfg->from);
  return -1;
}

static int add_client_cert(SSL_CTX *ctx, const gw_k8s_config *cfg, char *err, size_t errlen) {
  if (!cfg->cert && !cfg->key) return 0;
  if (!cfg->cert || !cfg->key) {
    lh_errf(err, errlen, "%s: a client certificate needs its key and the key its certificate",
            cfg->from);
    return -1;
  }
  BIO *cb = BIO_new_mem_buf(cfg->cert, (int)cfg->cert_len);
  BIO *kb = BIO_new_mem_buf(cfg->key, (int)cfg->key_len);
  X509 *x = cb ? PEM_read_bio_X509(cb, NULL, NULL, NULL) : NULL;
  EVP_PKEY *k = kb ? PEM_read_bio_PrivateKey(kb, NULL, NULL, NULL) : NULL;
  int ok = x && k && SSL_CTX_use_certificate(ctx, x) == 1 && SSL_CTX_use_PrivateKey(ctx, k) == 1;
  X509_free(x);
  EVP_PKEY_free(k);
  BIO_free(cb);
  BIO_free(kb);
  return ok ? 0 : tls_error(err, errlen, "the client certificate or key");
}

gw_k8s_client *gw_k8s_client_new(uv_loop_t *loop, const gw_k8s_config *cfg, char *err,
                                 size_t errlen) {
  gw_k8s_client *cl = calloc(1, sizeof *cl);
  if (!cl) {
    lh_errf(err, errlen, "out of memory");
    return NULL;
  }
  cl->loop = loop;
  cl->cfg = cfg;
  cl->ctx = SSL_CTX_new(TLS_client_method());
  if (!cl->ctx) {
    tls_error(err, errlen, "TLS");
    free(cl);
    return NULL;
  }
  SSL_CTX_set_min_proto_version(cl->ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(cl->ctx, cfg->insecure ? SSL_VERIFY_NONE : SSL_VERIFY_PEER, NULL);
  if ((!cfg->insecure && add_cas(cl->ctx, cfg, err, errlen)) ||
      add_client_cert(cl->ctx, cfg, err, errlen)) {
    gw_k8s_client_free(cl);
    return NULL;
  }
  return cl;
}

void gw_k8s_client_free(gw_k8s_client *cl) {
  if (!cl) return;
  SSL_CTX_free(cl->ctx);
  free(cl);
}

/* --- a call's end ------------------------------------------------------------ */

static void release(gw_k8s_call *c) {
  if (--c->refs) return;
  SSL_free(c->ssl); /* frees the BIOs too */
  lh_buf_free(&c->request);
  free(c);
}

static void on_closed(uv_handle_t *h) { release(h->data); }

/* Ends the call once: on_done (unless cancelled), then its handles close;
 * the call is freed by the last close callback, never from inside one of
 * its own callbacks. */
static void finish(gw_k8s_call *c, gw_k8s_error e, const char *detail) {
  if (c->over) return;
  c->over = 1;
  if (!c->cancelled && c->cb.on_done) c->cb.on_done(c->ud, e, detail);
  if (c->state == RESOLVING) uv_cancel((uv_req_t *)&c->gai); /* its callback releases */
  uv_close((uv_handle_t *)&c->timer, on_closed);
  if (c->tcp_open) uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void failf(gw_k8s_call *c, gw_k8s_error e, const char *fmt, const char *arg) {
  char d[512];
  snprintf(d, sizeof d, fmt, arg);
  finish(c, e, d);
}

void gw_k8s_cancel(gw_k8s_call *c) {
  if (!c || c->over) return;
  c->cancelled = 1;
  finish(c, GW_K8S_OK, NULL);
}

static void on_timeout(uv_timer_t *t) {
  gw_k8s_call *c = t->data;
  if (c->state == OPEN)
    failf(c, GW_K8S_TIMEOUT, "no byte from the API server in %s", "the idle timeout");
  else
    failf(c, GW_K8S_UNREACHABLE, "%s: timed out",
          c->state == HANDSHAKE ? "TLS handshake" : "connect");
}

/* --- bytes out: what OpenSSL wrote to its BIO, onto the socket ---------------- */

static int flush(gw_k8s_call *c) {
  char tmp[16384];
  int n;
  while ((n = BIO_read(c->wbio, tmp, sizeof tmp)) > 0) {
    uv_buf_t b = uv_buf_init(tmp, (unsigned)n);
    int rc = gw_write((uv_stream_t *)&c->tcp, &b, 1, NULL, NULL); /* copies what waits */
    if (rc) {
      failf(c, GW_K8S_UNREACHABLE, "write: %s", uv_strerror(rc));
      return -1;
    }
  }
  return 0;
}

/* --- the response ------------------------------------------------------------ */

static int on_headers_complete(http_parser *p) {
  gw_k8s_call *c = p->data;
  if (c->cb.on_status) c->cb.on_status(c->ud, (int)p->status_code);
  return c->over;
}

static int on_body(http_parser *p, const char *at, size_t len) {
  gw_k8s_call *c = p->data;
  if (c->cb.on_body) c->cb.on_body(c->ud, at, len);
  return c->over;
}

static int on_message_complete(http_parser *p) {
  finish(p->data, GW_K8S_OK, NULL);
  return 1;
}

static const http_parser_settings settings = {.on_headers_complete = on_headers_complete,
                                              .on_body = on_body,
                                              .on_message_complete = on_message_complete};

static void parse(gw_k8s_call *c, const char *data, size_t len) {
  size_t n = http_parser_execute(&c->parser, &settings, data, len);
  if (!c->over && n != len)
    failf(c, GW_K8S_BROKEN, "a malformed HTTP response: %s",
          http_errno_description(HTTP_PARSER_ERRNO(&c->parser)));
}

/* Why a handshake failed: a certificate that did not verify says which
 * check failed; anything else OpenSSL's first error. */
static void handshake_failed(gw_k8s_call *c) {
  long v = SSL_get_verify_result(c->ssl);
  char d[512];
  if (v != X509_V_OK)
    snprintf(d, sizeof d, "TLS: the API server's certificate did not verify: %s",
             X509_verify_cert_error_string(v));
  else
    tls_error(d, sizeof d, "TLS handshake");
  ERR_clear_error();
  finish(c, GW_K8S_TLS, d);
}

/* Handshake, then the request, then whatever plaintext the bytes read make. */
static void pump(gw_k8s_call *c) {
  if (c->state == HANDSHAKE) {
    int r = SSL_do_handshake(c->ssl);
    if (r != 1) {
      if (SSL_get_error(c->ssl, r) == SSL_ERROR_WANT_READ) {
        flush(c);
        return;
      }
      handshake_failed(c);
      return;
    }
    c->state = OPEN;
    uv_timer_start(&c->timer, on_timeout, c->idle_ms, 0);
    if (SSL_write(c->ssl, c->request.data, (int)c->request.len) <= 0) {
      handshake_failed(c);
      return;
    }
  }
  char buf[16384];
  int r = 0;
  while (!c->over && (r = SSL_read(c->ssl, buf, sizeof buf)) > 0)
    parse(c, buf, (size_t)r);
  if (c->over) return;
  int e = SSL_get_error(c->ssl, r);
  if (e == SSL_ERROR_ZERO_RETURN) { /* close_notify: the end of a response without a length */
    parse(c, NULL, 0);
    if (!c->over) finish(c, GW_K8S_BROKEN, "the API server closed the connection mid-response");
    return;
  }
  if (e != SSL_ERROR_WANT_READ) {
    char d[512];
    tls_error(d, sizeof d, "TLS read");
    finish(c, GW_K8S_BROKEN, d);
    return;
  }
  flush(c);
}

static void on_alloc(uv_handle_t *h, size_t size, uv_buf_t *buf) {
  (void)size;
  gw_k8s_call *c = h->data;
  *buf = uv_buf_init(c->cl->read_buf, sizeof c->cl->read_buf);
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  gw_k8s_call *c = s->data;
  if (n == UV_EOF) { /* closed without close_notify: http_parser decides */
    if (c->state == OPEN) parse(c, NULL, 0);
    if (!c->over) finish(c, GW_K8S_BROKEN, "the API server closed the connection mid-response");
    return;
  }
  if (n < 0) {
    failf(c, GW_K8S_UNREACHABLE, "read: %s", uv_strerror((int)n));
    return;
  }
  if (c->state == OPEN) uv_timer_start(&c->timer, on_timeout, c->idle_ms, 0);
  BIO_write(c->rbio, buf->base, (int)n);
  ERR_clear_error();
  pump(c);
}

/* --- connect -------------------------------------------------------------------- */

static int start_tls(gw_k8s_call *c) {
  const gw_k8s_config *cfg = c->cl->cfg;
  c->ssl = SSL_new(c->cl->ctx);
  c->rbio = BIO_new(BIO_s_mem());
  c->wbio = BIO_new(BIO_s_mem());
  if (!c->ssl || !c->rbio || !c->wbio) {
    BIO_free(c->rbio);
    BIO_free(c->wbio);
    c->rbio = c->wbio = NULL;
    return -1;
  }
  SSL_set_bio(c->ssl, c->rbio, c->wbio);
  SSL_set_connect_state(c->ssl);
  struct sockaddr_storage ss;
  int ip = gw_addr_literal(cfg->host, cfg->port, &ss) == 0;
  /* the name or the address the certificate must carry */
  if (ip)
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), cfg->host);
  else if (!SSL_set_tlsext_host_name(c->ssl, cfg->host) || !SSL_set1_host(c->ssl, cfg->host))
    return -1;
  return 0;
}

static void on_connect(uv_connect_t *req, int status) {
  gw_k8s_call *c = req->data;
  free(req);
  if (c->over) return;
  if (status) {
    char d[512];
    snprintf(d, sizeof d, "connect to %s:%d: %s", c->cl->cfg->host, c->cl->cfg->port,
             uv_strerror(status));
    finish(c, GW_K8S_UNREACHABLE, d);
    return;
  }
  if (start_tls(c)) {
    handshake_failed(c);
    return;
  }
  c->state = HANDSHAKE;
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
  pump(c);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *ai) {
  gw_k8s_call *c = req->data;
  if (c->over) {
    uv_freeaddrinfo(ai);
    release(c);
    return;
  }
  c->state = CONNECTING;
  uv_connect_t *conn = malloc(sizeof *conn);
  int rc = status ? status : conn ? 0 : UV_ENOMEM;
  if (!rc) {
    uv_tcp_init(c->cl->loop, &c->tcp);
    c->tcp.data = c;
    c->tcp_open = 1;
    c->refs++;
    conn->data = c;
    rc = uv_tcp_connect(conn, &c->tcp, ai->ai_addr, on_connect);
  }
  uv_freeaddrinfo(ai);
  if (rc) {
    free(conn);
    char d[512];
    snprintf(d, sizeof d, "%s %s: %s", status ? "look up" : "connect to", c->cl->cfg->host,
             uv_strerror(rc));
    finish(c, GW_K8S_UNREACHABLE, d);
  }
  release(c); /* the lookup's reference; the timer's keeps c */
}

static int write_request(gw_k8s_call *c, const char *path, const char *token) {
  const gw_k8s_config *cfg = c->cl->cfg;
  lh_buf *b = &c->request;
  lh_buf_printf(b, "GET %s HTTP/1.1\r\n", path);
  lh_buf_printf(b, strchr(cfg->host, ':') ? "host: [%s]:%d\r\n" : "host: %s:%d\r\n", cfg->host,
                cfg->port);
  if (token) lh_buf_printf(b, "authorization: Bearer %s\r\n", token);
  lh_buf_printf(b,
                "accept: application/json\r\nuser-agent: lupin/%s\r\n"
                "connection: close\r\n\r\n",
                LUPIN_VERSION);
  return b->data ? 0 : -1;
}

gw_k8s_call *gw_k8s_get(gw_k8s_client *cl, const char *path, uint64_t idle_ms,
                        const gw_k8s_call_cb *cb, void *ud, char *err, size_t errlen) {
  char port[16];
  err[0] = 0;
  char *token = gw_k8s_config_token(cl->cfg, err, errlen);
  if (!token && err[0]) return NULL;
  gw_k8s_call *c = calloc(1, sizeof *c);
  if (c) c->cl = cl;
  if (!c || write_request(c, path, token)) {
    free(token);
    if (c) lh_buf_free(&c->request);
    free(c);
    lh_errf(err, errlen, "out of memory");
    return NULL;
  }
  free(token);
  c->cb = *cb;
  c->ud = ud;
  c->idle_ms = idle_ms;
  c->refs = 2; /* the timer and the lookup */
  http_parser_init(&c->parser, HTTP_RESPONSE);
  c->parser.data = c;
  uv_timer_init(cl->loop, &c->timer);
  c->timer.data = c;
  uv_timer_start(&c->timer, on_timeout, CONNECT_MS, 0);
  c->gai.data = c;
  snprintf(port, sizeof port, "%d", cl->cfg->port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
  int rc = uv_getaddrinfo(cl->loop, &c->gai, on_resolved, cl->cfg->host, port, &hints);
  if (rc) {
    c->refs--;
    c->state = CONNECTING; /* nothing to cancel */
    lh_errf(err, errlen, "look up %s: %s", cl->cfg->host, uv_strerror(rc));
    c->cancelled = 1;
    finish(c, GW_K8S_OK, NULL);
    return NULL;
  }
  return c;
}
