/* `lupin explain`: one request scheduled offline, and why it goes where it
 * goes (docs/explain.md).  The runtime, the config and the plugins are the
 * ones lupin serve would run; the endpoints and their metrics come from a
 * file instead of the network.  Nothing is forwarded; pre_request does not
 * run (LUPIN_REQUEST_DRY_RUN). */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char gw_explain_usage[] =
    "usage: lupin explain --config FILE [--endpoints FILE] [--format text|json] REQUEST\n"
    "\n"
    "Schedules one request offline with the config's plugins and prints why it goes\n"
    "where it goes: each profile the handler ran, each filter's kept set, each\n"
    "scorer's raw and weighted scores, the totals, the picks and fallbacks, the time\n"
    "of every plugin call and the plugin errors with their tracebacks.  REQUEST is\n"
    "a file holding an OpenAI body (\"-\": standard input); one with \"messages\" is\n"
    "a chat completion.  The endpoints are those of --endpoints (a JSON or YAML list\n"
    "of {name, address, port, labels, metrics}; metrics: waiting_queue_size,\n"
    "running_requests, kv_cache_usage, max_lora, running_lora_adapters, ...) or\n"
    "the config's.  Nothing is sent and pre_request does not run.  --format json\n"
    "prints the record as the runtime gives it (docs/explain.md).\n"
    "Exit 0 with the record, whatever scheduling decided; 1 when the config, a\n"
    "plugin or the endpoints are rejected; 2 on a usage error or a bad request.\n";

typedef struct explain_run {
  lupin_runtime *rt;
  int failed;
  char err[2048];
} explain_run;

static void on_log(void *ud, int level, const char *msg) {
  (void)ud;
  lh_log_line(0, level, msg);
}

static void add_endpoint(void *ud, const lupin_endpoint_desc *d) {
  explain_run *r = ud;
  if (!r->failed && lupin_endpoint_upsert(r->rt, d, r->err, sizeof r->err)) r->failed = 1;
}

static void set_metrics(void *ud, const char *name, const lupin_metrics *m) {
  lupin_endpoint_set_metrics(((explain_run *)ud)->rt, name, m);
}

/* The whole of a file, or of stdin for "-"; NULL with err. */
static char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
  FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
  if (!f) {
    snprintf(err, errlen, "cannot read the request %s: %s", path, strerror(errno));
    return NULL;
  }
  lh_buf b = {0};
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
    lh_buf_append(&b, chunk, n);
  int bad = ferror(f);
  if (f != stdin) fclose(f);
  if (bad) {
    snprintf(err, errlen, "cannot read the request %s: %s", path, strerror(errno));
    lh_buf_free(&b);
    return NULL;
  }
  lh_buf_append(&b, "", 0); /* an empty file is an empty text, not NULL */
  *len = b.len;
  return b.data;
}

/* Schedules the body; prints the record.  Returns the exit code. */
static int explain_body(explain_run *r, const char *file, const char *body, size_t len, int json) {
  lupin_request_desc d = {.body = body, /* path NULL: the body's */
                          .body_len = len,
                          .check_body = 1,
                          .flags = LUPIN_REQUEST_EXPLAIN | LUPIN_REQUEST_DRY_RUN};
  lupin_request *req = lupin_request_begin(r->rt, &d, r->err, sizeof r->err);
  if (!req) {
    fprintf(stderr, "lupin explain: %s\n", r->err);
    return GW_EXIT_CONFIG;
  }
  lupin_result res;
  int rc = GW_EXIT_OK;
  if (lupin_request_schedule(req, &res) == 400 && res.outcome == LUPIN_INVALID_REQUEST) {
    if (res.param && *res.param)
      fprintf(stderr, "lupin explain: %s: %s (parameter %s)\n", file, res.message, res.param);
    else
      fprintf(stderr, "lupin explain: %s: %s\n", file, res.message);
    rc = GW_EXIT_USAGE;
  } else {
    size_t n;
    const char *record =
        lupin_request_explain(req, json ? LUPIN_EXPLAIN_JSON : LUPIN_EXPLAIN_TEXT, &n);
    if (!record) {
      fprintf(stderr, "lupin explain: the record could not be made (see the log above)\n");
      rc = GW_EXIT_CONFIG;
    } else {
      fwrite(record, 1, n, stdout);
      if (json) fputc('\n', stdout);
    }
  }
  lupin_request_end(req, LUPIN_OK);
  return rc;
}

static int usage_error(const char *fmt, const char *arg) {
  fputs("lupin explain: ", stderr);
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n\n%s", gw_explain_usage);
  return GW_EXIT_USAGE;
}

int gw_explain_main(int argc, char **argv) {
  const char *config = NULL, *endpoints = NULL, *format = "text", *request = NULL;
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      fputs(gw_explain_usage, stdout);
      return GW_EXIT_OK;
    }
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    const char **dst = !strcmp(a, "--config")      ? &config
                       : !strcmp(a, "--endpoints") ? &endpoints
                       : !strcmp(a, "--format")    ? &format
                                                   : NULL;
    if (dst && v) {
      *dst = v;
      i++;
    } else if (dst || (a[0] == '-' && a[1])) {
      return usage_error(dst ? "%s needs a value" : "bad argument %s", a);
    } else if (request) {
      return usage_error("one request file only, got another: %s", a);
    } else {
      request = a;
    }
  }
  if (!config) return usage_error("%s", "--config FILE is required");
  if (!request) return usage_error("%s", "a request file is required (\"-\": standard input)");
  if (strcmp(format, "text") && strcmp(format, "json"))
    return usage_error("--format is text or json, got %s", format);

  explain_run r = {0};
  size_t len = 0;
  char *body = slurp(request, &len, r.err, sizeof r.err);
  if (!body) {
    fprintf(stderr, "lupin explain: %s\n", r.err);
    return GW_EXIT_USAGE;
  }
  lupin_options ro = {.log = on_log, .log_level = LUPIN_LOG_WARN};
  int rc = GW_EXIT_CONFIG;
  r.rt = lupin_runtime_new(&ro, r.err, sizeof r.err);
  /* the gateway section too: a config lupin serve runs explains as it is */
  if (!r.rt || gw_settings_declare(r.rt, r.err, sizeof r.err) ||
      lupin_runtime_load(r.rt, config, r.err, sizeof r.err) ||
      lupin_runtime_read_endpoints(r.rt, endpoints, add_endpoint, &r, r.err, sizeof r.err) ||
      r.failed ||
      lupin_runtime_read_endpoint_metrics(r.rt, endpoints, set_metrics, &r, r.err, sizeof r.err))
    fprintf(stderr, "lupin explain: %s\n", r.err);
  else
    rc = explain_body(&r, request, body, len, !strcmp(format, "json"));
  if (r.rt) lupin_runtime_free(r.rt);
  free(body);
  return rc;
}
