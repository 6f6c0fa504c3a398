/* One ext_proc stream: one HTTP request the data plane (Envoy) proxies,
 * as the endpoint picker protocol has the picker see it (docs/epp.md).
 *
 *   request headers          kept; with end_of_stream (no body): scheduled
 *   request body chunks      buffered (FULL_DUPLEX_STREAMED) until the last
 *   the last one             scheduled: the headers answer sets the picks in
 *                            x-gateway-destination-endpoint (and envoy.lb
 *                            metadata), then the body is replayed in pieces
 *   response headers, body   the plugins' response points; each piece goes
 *                            back unchanged; the last is response_complete
 *   the stream's end         the request's end, exactly once, whenever
 *
 * A refusal is an ImmediateResponse with lupin serve's status and OpenAI
 * error body.  The request runs as an exchange of the proxy room
 * (gw_exchange_begin), so the access log, the EPP's series, flow control
 * and /admin/requests see it as they see lupin serve's. */
#include "envoy/service/ext_proc/v3/external_processor.pb-c.h"
#include "epp/epp.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef Envoy__Service__ExtProc__V3__ProcessingRequest proc_request;
typedef Envoy__Service__ExtProc__V3__ProcessingResponse proc_response;
typedef Envoy__Service__ExtProc__V3__CommonResponse common_response;
typedef Envoy__Service__ExtProc__V3__HeaderMutation header_mutation;
typedef Envoy__Config__Core__V3__HeaderValueOption header_option;
typedef Envoy__Config__Core__V3__HeaderValue header_value;
typedef Envoy__Config__Core__V3__HeaderMap header_map;
typedef Google__Protobuf__Value pb_value;

/* The protocol's limit on one body piece sent back: Envoy's buffer for a
 * streamed body mutation (the EPP uses the same). */
#define BODY_PIECE 62000
/* Endpoints in x-gateway-destination-endpoint at most. */
#define MAX_TARGETS 16

#define SUBSET_NS  "envoy.lb.subset_hint"
#define SUBSET_KEY "x-gateway-destination-endpoint-subset"
#define SERVED_NS  "envoy.lb"
#define SERVED_KEY "x-gateway-destination-endpoint-served"
#define DEST_NS    "envoy.lb"
#define DEST_KEY   "x-gateway-destination-endpoint"

typedef struct stream {
  gw_rpc *rpc;
  lupin_gateway *gw;
  gw_http_request http;
  char *subset; /* the metadata's hint, joined */
  gw_exchange *x;
  int have_headers, body_done, begun, picked, answered, complete;
  int in_flight;       /* counted in the caps' totals */
  uint64_t body_bytes; /* counted too */
  int status;          /* the response's */
  char id[32];         /* request_id(), when the client gave none */
} stream;

static const gw_front epp_front;

/* --- messages out ---------------------------------------------------------- */

static void send_response(stream *s, const proc_response *m) {
  size_t n = envoy__service__ext_proc__v3__processing_response__get_packed_size(m);
  uint8_t small[512], *buf = n <= sizeof small ? small : malloc(n);
  if (buf) envoy__service__ext_proc__v3__processing_response__pack(m, buf);
  if (!buf || gw_rpc_send(s->rpc, buf, n))
    gw_rpc_finish(s->rpc, GRPC_STATUS_RESOURCE_EXHAUSTED, "lupin epp: out of memory");
  if (buf != small) free(buf);
}

/* set_headers from name/value pairs (raw_value, as Envoy sends them). */
typedef struct header_set {
  header_option opts[2 * LH_MAX_HEADERS + 8];
  header_value vals[2 * LH_MAX_HEADERS + 8];
  header_option *ptrs[2 * LH_MAX_HEADERS + 8];
  size_t n;
} header_set;

static void header_add(header_set *h, const char *name, const char *value) {
  if (h->n >= sizeof h->opts / sizeof *h->opts) return;
  header_value *v = &h->vals[h->n];
  header_option *o = &h->opts[h->n];
  *v = (header_value)ENVOY__CONFIG__CORE__V3__HEADER_VALUE__INIT;
  v->key = (char *)name;
  v->raw_value.data = (uint8_t *)value;
  v->raw_value.len = strlen(value);
  *o = (header_option)ENVOY__CONFIG__CORE__V3__HEADER_VALUE_OPTION__INIT;
  o->header = v;
  o->append_action =
      ENVOY__CONFIG__CORE__V3__HEADER_VALUE_OPTION__HEADER_APPEND_ACTION__OVERWRITE_IF_EXISTS_OR_ADD;
  h->ptrs[h->n++] = o;
}

/* The picks, primary first, the rest the data plane's fallbacks in order:
 * "ip:port,ip:port" (a picker's maxNumOfEndpoints sets how many). */
static void targets(stream *s, lh_buf *out) {
  gw_exchange *x = s->x;
  for (size_t i = 0; i < x->result.n_picks && i < MAX_TARGETS; i++) {
    const lupin_pick *p = &x->result.picks[i];
    gw_endpoint *ep = gw_endpoint_find(s->gw, p->name);
    const char *sep = i ? "," : "";
    if (ep)
      lh_buf_printf(out, "%s%s", sep, ep->hostport);
    else
      lh_buf_printf(out, strchr(p->address, ':') ? "%s[%s]:%d" : "%s%s:%d", sep, p->address,
                    p->port);
  }
}

/* A Struct of one field, built in f (the caller's). */
typedef struct one_field {
  Google__Protobuf__Struct st;
  Google__Protobuf__Struct__FieldsEntry entry, *entries[1];
} one_field;

static Google__Protobuf__Struct *struct_of(one_field *f, const char *key, pb_value *value) {
  f->entry = (Google__Protobuf__Struct__FieldsEntry)GOOGLE__PROTOBUF__STRUCT__FIELDS_ENTRY__INIT;
  f->entry.key = (char *)key;
  f->entry.value = value;
  f->entries[0] = &f->entry;
  f->st = (Google__Protobuf__Struct)GOOGLE__PROTOBUF__STRUCT__INIT;
  f->st.n_fields = 1;
  f->st.fields = f->entries;
  return &f->st;
}

static void send_pick(stream *s) {
  gw_exchange *x = s->x;
  lh_buf dest = {0};
  targets(s, &dest);
  header_set h;
  h.n = 0;
  header_add(&h, DEST_KEY, dest.data ? dest.data : "");
  header_add(&h, "x-request-id", lupin_request_id(x->req));
  char length[24];
  if (s->body_done) {
    snprintf(length, sizeof length, "%zu", s->http.body.len);
    header_add(&h, "content-length", length);
  }
  for (size_t i = 0; i < x->result.n_headers; i++)
    header_add(&h, x->result.headers[i].name, x->result.headers[i].value);

  /* a client's P/D routing headers the plugins did not set go, as serve drops them */
  char *removed[LH_MAX_HEADERS];
  size_t n_removed = 0;
  for (size_t i = 0; i < s->http.headers.n; i++) {
    const char *name = s->http.headers.v[i].name;
    int set = 0;
    for (size_t j = 0; j < x->result.n_headers && !set; j++)
      set = !strcasecmp(name, x->result.headers[j].name);
    if (!set && gw_routing_header(name)) removed[n_removed++] = (char *)name;
  }
  header_mutation mut = ENVOY__SERVICE__EXT_PROC__V3__HEADER_MUTATION__INIT;
  mut.n_set_headers = h.n;
  mut.set_headers = h.ptrs;
  mut.n_remove_headers = n_removed;
  mut.remove_headers = removed;
  common_response common = ENVOY__SERVICE__EXT_PROC__V3__COMMON_RESPONSE__INIT;
  common.header_mutation = &mut;
  common.clear_route_cache = 1;
  Envoy__Service__ExtProc__V3__HeadersResponse headers =
      ENVOY__SERVICE__EXT_PROC__V3__HEADERS_RESPONSE__INIT;
  headers.response = &common;

  /* {"envoy.lb": {"x-gateway-destination-endpoint": dest}} */
  pb_value dest_value = GOOGLE__PROTOBUF__VALUE__INIT;
  dest_value.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE;
  dest_value.string_value = dest.data ? dest.data : (char *)"";
  one_field lb, meta;
  pb_value lb_value = GOOGLE__PROTOBUF__VALUE__INIT;
  lb_value.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE;
  lb_value.struct_value = struct_of(&lb, DEST_KEY, &dest_value);

  proc_response m = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__INIT;
  m.response_case = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__RESPONSE_REQUEST_HEADERS;
  m.request_headers = &headers;
  m.dynamic_metadata = struct_of(&meta, DEST_NS, &lb_value);
  send_response(s, &m);
  lh_buf_free(&dest);
}

/* A body piece, the request's (replayed) or the response's (passed on). */
static void send_body(stream *s, int request, const uint8_t *data, size_t len, int last) {
  Envoy__Service__ExtProc__V3__StreamedBodyResponse piece =
      ENVOY__SERVICE__EXT_PROC__V3__STREAMED_BODY_RESPONSE__INIT;
  piece.body.data = (uint8_t *)data;
  piece.body.len = len;
  piece.end_of_stream = last;
  Envoy__Service__ExtProc__V3__BodyMutation mut;
  envoy__service__ext_proc__v3__body_mutation__init(
      &mut); /* its INIT macro trips -Wmissing-braces */
  mut.mutation_case = ENVOY__SERVICE__EXT_PROC__V3__BODY_MUTATION__MUTATION_STREAMED_RESPONSE;
  mut.streamed_response = &piece;
  common_response common = ENVOY__SERVICE__EXT_PROC__V3__COMMON_RESPONSE__INIT;
  common.body_mutation = &mut;
  Envoy__Service__ExtProc__V3__BodyResponse body =
      ENVOY__SERVICE__EXT_PROC__V3__BODY_RESPONSE__INIT;
  body.response = &common;
  proc_response m = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__INIT;
  if (request) {
    m.response_case = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__RESPONSE_REQUEST_BODY;
    m.request_body = &body;
  } else {
    m.response_case = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__RESPONSE_RESPONSE_BODY;
    m.response_body = &body;
  }
  send_response(s, &m);
}

static void replay_body(stream *s) {
  const uint8_t *p = (const uint8_t *)s->http.body.data;
  size_t left = s->http.body.len;
  do {
    size_t n = left < BODY_PIECE ? left : BODY_PIECE;
    send_body(s, 1, p, n, n == left);
    p += n;
    left -= n;
  } while (left);
}

/* The response headers' answer: the plugins' headers for the client. */
static void send_response_headers(stream *s) {
  header_set h;
  h.n = 0;
  const lupin_header *extra = NULL;
  size_t n = s->x ? lupin_request_client_headers(s->x->req, &extra) : 0;
  for (size_t i = 0; i < n; i++)
    header_add(&h, extra[i].name, extra[i].value);
  header_mutation mut = ENVOY__SERVICE__EXT_PROC__V3__HEADER_MUTATION__INIT;
  mut.n_set_headers = h.n;
  mut.set_headers = h.ptrs;
  common_response common = ENVOY__SERVICE__EXT_PROC__V3__COMMON_RESPONSE__INIT;
  if (h.n) common.header_mutation = &mut;
  Envoy__Service__ExtProc__V3__HeadersResponse headers =
      ENVOY__SERVICE__EXT_PROC__V3__HEADERS_RESPONSE__INIT;
  headers.response = &common;
  proc_response m = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__INIT;
  m.response_case = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__RESPONSE_RESPONSE_HEADERS;
  m.response_headers = &headers;
  send_response(s, &m);
}

static void send_trailers(stream *s, int request) {
  Envoy__Service__ExtProc__V3__TrailersResponse t =
      ENVOY__SERVICE__EXT_PROC__V3__TRAILERS_RESPONSE__INIT;
  proc_response m = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__INIT;
  m.response_case =
      request ? ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__RESPONSE_REQUEST_TRAILERS
              : ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__RESPONSE_RESPONSE_TRAILERS;
  if (request)
    m.request_trailers = &t;
  else
    m.response_trailers = &t;
  send_response(s, &m);
}

/* A refusal: Envoy answers the client with it, and the stream ends. */
static void send_refusal(stream *s, int status, const char *message, const char *param,
                         const lupin_header *extra, size_t n_extra) {
  lh_buf body = {0};
  lh_openai_error(&body, status, message, param);
  header_set h;
  h.n = 0;
  header_add(&h, "content-type", "application/json");
  for (size_t i = 0; i < n_extra; i++)
    header_add(&h, extra[i].name, extra[i].value);
  header_mutation mut = ENVOY__SERVICE__EXT_PROC__V3__HEADER_MUTATION__INIT;
  mut.n_set_headers = h.n;
  mut.set_headers = h.ptrs;
  Envoy__Type__V3__HttpStatus code = ENVOY__TYPE__V3__HTTP_STATUS__INIT;
  code.code = (Envoy__Type__V3__StatusCode)status;
  Envoy__Service__ExtProc__V3__ImmediateResponse im =
      ENVOY__SERVICE__EXT_PROC__V3__IMMEDIATE_RESPONSE__INIT;
  im.status = &code;
  im.headers = &mut;
  im.body.data = (uint8_t *)body.data;
  im.body.len = body.len;
  im.details = (char *)"lupin_refused";
  proc_response m = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__INIT;
  m.response_case = ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_RESPONSE__RESPONSE_IMMEDIATE_RESPONSE;
  m.immediate_response = &im;
  send_response(s, &m);
  lh_buf_free(&body);
  s->answered = 1;
  gw_rpc_finish(s->rpc, GRPC_STATUS_OK, NULL);
}

/* --- the caps lupin serve's HTTP server applies ---------------------------- */

static void count_in_flight(stream *s, int on) {
  if (s->in_flight == on) return;
  s->in_flight = on;
  s->gw->in_flight += on ? 1 : (size_t)-1;
  __atomic_add_fetch(&s->gw->totals->in_flight, on ? 1 : (size_t)-1, __ATOMIC_RELAXED);
}

/* Body bytes held, n more (negative: given back). */
static void count_body(stream *s, int64_t n) {
  s->body_bytes += (uint64_t)n;
  s->gw->body_bytes += (uint64_t)n;
  __atomic_add_fetch(&s->gw->totals->body_bytes, (uint64_t)n, __ATOMIC_RELAXED);
}

/* The id of a request the runtime never saw: the client's, else the
 * stream's own. */
static const char *request_id(stream *s) {
  const char *given = lh_headers_get(&s->http.headers, "x-request-id");
  if (given) return given;
  if (!*s->id) snprintf(s->id, sizeof s->id, "epp-%016llx", (unsigned long long)uv_hrtime());
  return s->id;
}

/* A refusal before the runtime saw the request: counted and logged as
 * lupin serve counts and logs its bad requests. */
static void refuse_early(stream *s, int status, const char *message, const char *drop) {
  lupin_header h[2] = {{"x-request-id", request_id(s)}, {GW_DROP_HEADER, drop}};
  gw_proxy_answered(s->gw, s->http.url ? s->http.url : "/", h[0].value, status,
                    status < 500 ? "bad_request" : "error");
  send_refusal(s, status, message, NULL, h, drop ? 2 : 1);
}

/* --- the request --------------------------------------------------------------- */

static const char *route_of(lupin_gateway *gw, const char *url) {
  size_t len = strcspn(url, "?");
  for (size_t i = 0; i < gw->n_routes; i++)
    if (strlen(gw->routes[i]) == len && !strncmp(url, gw->routes[i], len)) return gw->routes[i];
  return NULL;
}

static void begin(stream *s) {
  lupin_gateway *gw = s->gw;
  if (gw->draining) {
    refuse_early(s, 503, "the gateway is shutting down: retry on another instance",
                 GW_DROP_SHUTTING_DOWN);
    return;
  }
  const char *route = s->http.url && s->http.method == HTTP_POST ? route_of(gw, s->http.url) : NULL;
  /* a request the API routes do not name (GET /v1/models, ...) still gets
   * an endpoint, scheduled with no body read, as the EPP picks for any */
  gw_exchange_desc d = {.http = &s->http,
                        .path = route ? route : (s->http.url ? s->http.url : "/"),
                        .no_body_check = !route,
                        .subset = s->subset,
                        .front = &epp_front,
                        .front_data = s};
  int status;
  const char *why;
  s->begun = 1;
  s->x = gw_exchange_begin(gw, &d, &status, &why);
  if (!s->x) {
    send_refusal(s, status, why, NULL, NULL, 0);
    return;
  }
  gw_exchange_schedule(s->x);
}

/* Envoy sends values in raw_value; value is the older field. */
static const char *value_of(const header_value *h, size_t *len) {
  if (h->raw_value.len || !h->value) {
    *len = h->raw_value.len;
    return (const char *)h->raw_value.data;
  }
  *len = strlen(h->value);
  return h->value;
}

static const Google__Protobuf__Struct *metadata_ns(const proc_request *m, const char *ns) {
  const Envoy__Config__Core__V3__Metadata *md = m->metadata_context;
  for (size_t i = 0; md && i < md->n_filter_metadata; i++)
    if (md->filter_metadata[i]->key && !strcmp(md->filter_metadata[i]->key, ns))
      return md->filter_metadata[i]->value;
  return NULL;
}

static const pb_value *field(const Google__Protobuf__Struct *st, const char *key) {
  for (size_t i = 0; st && i < st->n_fields; i++)
    if (st->fields[i]->key && !strcmp(st->fields[i]->key, key)) return st->fields[i]->value;
  return NULL;
}

/* The subset hint: a list of "ip:port", or one comma-separated string;
 * an empty list is a subset too (that matches none: 503). */
static void read_subset(stream *s, const proc_request *m) {
  const pb_value *v = field(metadata_ns(m, SUBSET_NS), SUBSET_KEY);
  if (!v) return;
  lh_buf b = {0};
  if (v->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE)
    lh_buf_str(&b, v->string_value);
  else if (v->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_LIST_VALUE)
    for (size_t i = 0; i < v->list_value->n_values; i++)
      if (v->list_value->values[i]->kind_case == GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE)
        lh_buf_printf(&b, "%s%s", b.len ? "," : "", v->list_value->values[i]->string_value);
  free(s->subset);
  s->subset = b.data ? b.data : strdup(""); /* NULL (no memory): no subset, the header's */
}

static void request_headers(stream *s, const proc_request *m) {
  const Envoy__Service__ExtProc__V3__HttpHeaders *hh = m->request_headers;
  if (s->have_headers) {
    gw_rpc_finish(s->rpc, GRPC_STATUS_FAILED_PRECONDITION, "request headers sent twice");
    return;
  }
  s->have_headers = 1;
  s->http.started = lupin_now();
  s->http.method = HTTP_POST;
  for (size_t i = 0; hh->headers && i < hh->headers->n_headers; i++) {
    const header_value *h = hh->headers->headers[i];
    size_t len;
    const char *v = value_of(h, &len);
    const char *name = h->key ? h->key : "";
    if (!strcmp(name, ":authority")) {
      lh_headers_add(&s->http.headers, "host", 4, v ? v : "", len);
    } else if (!strcmp(name, ":path")) {
      free(s->http.url);
      s->http.url = strndup(v ? v : "/", len);
    } else if (!strcmp(name, ":method")) {
      /* only a POST may name an API route; any other method is scheduled
       * with no body read */
      s->http.method = len == 4 && !strncmp(v, "POST", 4) ? HTTP_POST : HTTP_GET;
    } else if (*name != ':' && s->http.headers.n < LH_MAX_HEADERS) {
      lh_headers_add(&s->http.headers, name, strlen(name), v ? v : "", len);
    }
  }
  read_subset(s, m);
  size_t in_flight = __atomic_load_n(&s->gw->totals->in_flight, __ATOMIC_RELAXED);
  if (in_flight >= s->gw->set.max_requests_in_flight) {
    s->gw->refused_in_flight++;
    refuse_early(s, 503,
                 "the gateway is at its cap of requests in flight (gateway.maxRequestsInFlight): "
                 "retry later",
                 NULL);
    return;
  }
  count_in_flight(s, 1);
  if (hh->end_of_stream) {
    s->body_done = 0; /* no body: none replayed, no content-length set */
    begin(s);
  }
}

static void request_body(stream *s, const proc_request *m) {
  const Envoy__Service__ExtProc__V3__HttpBody *b = m->request_body;
  if (!s->have_headers || s->begun) {
    gw_rpc_finish(s->rpc, GRPC_STATUS_FAILED_PRECONDITION,
                  s->begun ? "request body after its end" : "request body before its headers");
    return;
  }
  size_t len = b->body.len;
  if (s->http.body.len + len > s->gw->set.max_body_bytes) {
    refuse_early(s, 413,
                 "the request body is larger than maxBodyBytes: send a smaller body or raise "
                 "gateway.maxBodyBytes in the config",
                 NULL);
    return;
  }
  if (len && __atomic_load_n(&s->gw->totals->body_bytes, __ATOMIC_RELAXED) + len >
                 s->gw->set.max_buffered_body_bytes) {
    s->gw->refused_body_bytes++;
    refuse_early(s, 503,
                 "the gateway holds too many bytes of request bodies to take this one "
                 "(gateway.maxBufferedBodyBytes): retry later",
                 NULL);
    return;
  }
  if (len && lh_buf_append(&s->http.body, (const char *)b->body.data, len)) {
    refuse_early(s, 503, "the gateway could not allocate memory for this request: retry later",
                 NULL);
    return;
  }
  count_body(s, (int64_t)len);
  if (b->end_of_stream) {
    s->body_done = 1;
    begin(s);
  }
}

/* The endpoint the data plane reports as the one that served. */
static void served(stream *s, const proc_request *m) {
  const pb_value *v = field(metadata_ns(m, SERVED_NS), SERVED_KEY);
  if (!v || v->kind_case != GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE || !s->x) return;
  for (gw_endpoint *ep = s->gw->endpoints; ep; ep = ep->next)
    if (!strcmp(ep->hostport, v->string_value)) {
      if (s->x->ep) gw_endpoint_unref(s->x->ep);
      gw_endpoint_ref(ep);
      s->x->ep = ep;
      return;
    }
}

static void complete(stream *s) {
  if (s->complete || !s->x) return;
  s->complete = 1;
  gw_exchange *x = s->x;
  lupin_request_response_complete(x->req);
  gw_exchange_end(x, LUPIN_OK, s->status ? s->status : 200);
}

/* ":status" from its bytes (raw_value is not terminated); 0: not one. */
static int status_of(const char *v, size_t len) {
  int n = 0;
  for (size_t i = 0; v && i < len && i < 3; i++) {
    if (v[i] < '0' || v[i] > '9') return 0;
    n = n * 10 + (v[i] - '0');
  }
  return len == 3 ? n : 0;
}

static void response_headers(stream *s, const proc_request *m) {
  const Envoy__Service__ExtProc__V3__HttpHeaders *hh = m->response_headers;
  if (!s->picked || !s->x) {
    send_response_headers(s);
    return;
  }
  served(s, m);
  s->status = 200;
  lh_headers seen = {0}; /* raw_value is not terminated: the values are copied */
  for (size_t i = 0; hh->headers && i < hh->headers->n_headers; i++) {
    const header_value *h = hh->headers->headers[i];
    size_t len;
    const char *v = value_of(h, &len);
    if (!h->key) continue;
    if (!strcmp(h->key, ":status") && status_of(v, len)) s->status = status_of(v, len);
    if (*h->key != ':' && strcasecmp(h->key, SERVED_KEY) && seen.n < LH_MAX_HEADERS)
      lh_headers_add(&seen, h->key, strlen(h->key), v ? v : "", len);
  }
  if (s->x->ep)
    lh_headers_add(&seen, SERVED_KEY, strlen(SERVED_KEY), s->x->ep->hostport,
                   strlen(s->x->ep->hostport));
  s->x->status = s->status;
  /* the endpoint's answer counts toward its health, as a proxied one does */
  if (s->x->ep) gw_health_request(s->x->ep, GW_UP_OK, s->status, 0, NULL);
  lupin_request_response_header(s->x->req, s->status, seen.v, seen.n);
  lh_headers_free(&seen);
  send_response_headers(s);
  if (hh->end_of_stream) complete(s);
}

static void response_body(stream *s, const proc_request *m) {
  const Envoy__Service__ExtProc__V3__HttpBody *b = m->response_body;
  if (s->x && !s->complete) {
    s->x->response_bytes += b->body.len;
    if (b->body.len)
      lupin_request_response_chunk(s->x->req, (const char *)b->body.data, b->body.len);
  }
  send_body(s, 0, b->body.data, b->body.len, b->end_of_stream);
  if (b->end_of_stream) complete(s);
}

static void message(gw_rpc *r, const uint8_t *data, size_t len) {
  stream *s = gw_rpc_data(r);
  proc_request *m = envoy__service__ext_proc__v3__processing_request__unpack(NULL, len, data);
  if (!m) {
    gw_rpc_finish(r, GRPC_STATUS_INVALID_ARGUMENT,
                  "not an envoy.service.ext_proc.v3.ProcessingRequest");
    return;
  }
  if (s->answered &&
      m->request_case !=
          ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_RESPONSE_HEADERS &&
      m->request_case != ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_RESPONSE_BODY)
    goto done; /* refused: nothing more is read */
  switch (m->request_case) {
  case ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_REQUEST_HEADERS:
    request_headers(s, m);
    break;
  case ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_REQUEST_BODY:
    request_body(s, m);
    break;
  case ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_REQUEST_TRAILERS:
    if (!s->begun && s->have_headers) { /* trailers end the body */
      s->body_done = 1;
      begin(s);
    }
    if (s->picked) send_trailers(s, 1);
    break;
  case ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_RESPONSE_HEADERS:
    response_headers(s, m);
    break;
  case ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_RESPONSE_BODY:
    response_body(s, m);
    break;
  case ENVOY__SERVICE__EXT_PROC__V3__PROCESSING_REQUEST__REQUEST_RESPONSE_TRAILERS:
    send_trailers(s, 0);
    complete(s);
    break;
  default:
    gw_rpc_finish(r, GRPC_STATUS_INVALID_ARGUMENT, "a ProcessingRequest with no request set");
  }
done:
  envoy__service__ext_proc__v3__processing_request__free_unpacked(m, NULL);
}

/* --- the exchange's turns (gw_front) ---------------------------------------- */

static void picked(gw_exchange *x) {
  stream *s = x->front_data;
  s->picked = 1;
  /* where the request goes, until the data plane says where it went */
  gw_endpoint *ep = x->result.n_picks ? gw_endpoint_find(s->gw, x->result.picks[0].name) : NULL;
  if (ep) {
    gw_endpoint_ref(ep);
    x->ep = ep;
  }
  send_pick(s);
  if (s->body_done) replay_body(s);
}

static void refused(gw_exchange *x, int status, const char *message, const char *param,
                    const lupin_header *h, size_t n) {
  stream *s = x->front_data;
  if (!s->answered) send_refusal(s, status, message, param, h, n);
}

/* The stream ended before the request did: it ends as cancelled, once;
 * one the runtime never saw (no body yet) is logged as such. */
static void end_early(stream *s) {
  if (s->x) {
    gw_exchange_end(s->x, LUPIN_CANCELLED, 499);
  } else if (s->have_headers && !s->begun && !s->answered) {
    s->answered = 1;
    gw_proxy_answered(s->gw, s->http.url ? s->http.url : "/", request_id(s), 499, "cancelled");
  }
}

static void cancel(gw_exchange *x) {
  stream *s = x->front_data;
  gw_rpc_finish(s->rpc, GRPC_STATUS_UNAVAILABLE, "lupin epp is shutting down");
  gw_exchange_end(x, LUPIN_CANCELLED, 503);
}

static void ended(gw_exchange *x) {
  stream *s = x->front_data;
  s->x = NULL;
  count_body(s, -(int64_t)s->body_bytes);
  count_in_flight(s, 0);
}

static const gw_front epp_front = {picked, refused, cancel, ended};

/* --- the stream ----------------------------------------------------------------- */

static void open_stream(gw_rpc *r) {
  stream *s = calloc(1, sizeof *s);
  if (!s) {
    gw_rpc_finish(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "lupin epp: out of memory");
    return;
  }
  s->rpc = r;
  s->gw = gw_rpc_gateway(r);
  gw_rpc_set_data(r, s);
}

/* The data plane has nothing more to send before the response ended: the
 * request ended early (its client went away).  The protocol has the data
 * plane stream the response through the picker, so a complete request has
 * had its last response piece by now. */
static void half_closed(gw_rpc *r) {
  stream *s = gw_rpc_data(r);
  if (s) end_early(s);
  gw_rpc_finish(r, GRPC_STATUS_OK, NULL);
}

/* The call is over; a request still open ends as cancelled (a reset). */
static void gone(gw_rpc *r, int cancelled) {
  stream *s = gw_rpc_data(r);
  (void)cancelled;
  if (!s) return;
  end_early(s);
  count_body(s, -(int64_t)s->body_bytes);
  count_in_flight(s, 0);
  lh_headers_free(&s->http.headers);
  lh_buf_free(&s->http.body);
  free(s->http.url);
  free(s->subset);
  free(s);
  gw_rpc_set_data(r, NULL);
}

const gw_rpc_service gw_ext_proc_service = {open_stream, message, half_closed, gone};
