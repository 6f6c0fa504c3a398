/* http.h -- the client side HTTP/1.1 server of lupin serve (server.c). */
#ifndef LUPIN_GW_HTTP_H
#define LUPIN_GW_HTTP_H

#include "loop/loop.h"

#include <http_parser.h>

typedef struct gw_http_request {
  int method; /* enum http_method */
  char *url;
  lh_headers headers;
  lh_buf body;
  double started; /* lupin_now() at the first byte */
} gw_http_request;

typedef void (*gw_handler)(void *ud, gw_conn *c, gw_http_request *req);
/* Called when the client goes away while owner's response is in progress;
 * the connection must not be used after. */
typedef void (*gw_abort_fn)(void *owner);

/* share: another worker's server whose listening socket this one polls
 * too (hostport is then only for messages); NULL: bind hostport.  role
 * ("listen", "admin") names the listener in the error message. */
gw_server *gw_server_listen(lupin_gateway *gw, const char *hostport, const char *role,
                            const gw_server *share, gw_handler h, void *ud, char *err,
                            size_t errlen);
/* Stops accepting and closes idle connections; busy ones close when done. */
void gw_server_close(gw_server *s);
size_t gw_server_connections(const gw_server *s);
void gw_server_free(gw_server *s);

void gw_conn_on_abort(gw_conn *c, gw_abort_fn fn, void *owner);
/* The current request's id: the client's x-request-id, or one made for it
 * (answers that never reach the runtime: bad requests, unknown routes). */
const char *gw_conn_request_id(gw_conn *c);
/* Bytes written to the client and not yet sent. */
size_t gw_conn_backlog(const gw_conn *c);
/* Calls fn(owner) once, when the backlog has been sent (slow clients). */
void gw_conn_on_drain(gw_conn *c, gw_abort_fn fn, void *owner);
/* A full response.  Adds content-length, connection. */
void gw_conn_respond(gw_conn *c, int status, const lupin_header *h, size_t n, const char *body,
                     size_t len);
/* The OpenAI error shape: {"error":{"message","type","param","code"}}. */
void gw_conn_error(gw_conn *c, int status, const char *message, const char *param,
                   const lupin_header *h, size_t n);
/* A streamed response: headers now, then writes, then end.  content_length
 * < 0: chunked transfer encoding. */
void gw_conn_start(gw_conn *c, int status, const lupin_header *h, size_t n, int64_t content_length);
void gw_conn_write(gw_conn *c, const char *data, size_t len);
void gw_conn_end(gw_conn *c);
/* Gives up on a response already started: the client sees the connection
 * close before the response ends. */
void gw_conn_abort(gw_conn *c);
/* Corked, a connection gathers what is written to it until uncorked, then
 * writes it at once: a streamed response whose head, chunks and end come in
 * one read from upstream leaves in one system call instead of one each.
 * Ending, aborting or closing the connection uncorks it. */
void gw_conn_cork(gw_conn *c);
void gw_conn_uncork(gw_conn *c);
const char *gw_status_text(int status);
int gw_server_address(gw_server *s, char *out, size_t len);
/* host:port (or [v6]:port) to an address; -1 with err when it is not one. */
int gw_parse_hostport(const char *hp, struct sockaddr_storage *ss, char *err, size_t errlen);

#endif
