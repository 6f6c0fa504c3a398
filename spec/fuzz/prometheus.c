/* Fuzz target "prometheus": the text a model server's /metrics answers.
 *
 * First lh_prometheus_parse alone, with its promises checked (every sample
 * has a name of metric characters, at most 32 labels with names).  Then the
 * real gateway (spec/fuzz/scrape.json: the default plugins, a scrape every
 * millisecond; two model servers played by the harness) scrapes the text
 * from both model servers: the scrape's reading (gateway/endpoints/scrape.c) stores
 * what it understood in the runtime's endpoints; a request is scheduled on
 * them through the default scorers and GET /admin/endpoints shows them.  Its
 * answer must be JSON, whatever the numbers were. */
#include "fuzz.h"

#include <ctype.h>
#include <string.h>

static lupin_gateway *gw;

static void on_sample(void *ud, const char *name, const lupin_header *labels, size_t n,
                      double value) {
  (void)value;
  (*(size_t *)ud)++;
  if (!*name) fz_fail("a sample with an empty name");
  for (const char *p = name; *p; p++)
    if (!isalnum((unsigned char)*p) && *p != '_' && *p != ':')
      fz_fail("a sample name with %#x in it", (unsigned char)*p);
  if (n > 32) fz_fail("%zu labels on one sample", n);
  for (size_t i = 0; i < n; i++)
    if (!labels[i].name[0] || !labels[i].value) fz_fail("a label without a name or a value");
}

/* Scrapes each endpoint has finished (read or failed). */
static void scrapes(uint64_t *n) {
  size_t i = 0;
  for (gw_endpoint *ep = gw->endpoints; ep && i < 8; ep = ep->next)
    n[i++] = ep->scrapes + ep->scrape_errors;
}

/* Runs the loop until every endpoint has finished two scrapes after now: the
 * second began after the text was set, so it read it (a scrape runs every
 * millisecond; gives up after a second). */
static void scrape_twice(void) {
  uint64_t before[8] = {0}, now[8];
  scrapes(before);
  double until = lupin_now() + 1;
  for (int done = 0; !done && lupin_now() < until;) {
    uv_run(gw->loop, UV_RUN_ONCE);
    scrapes(now);
    done = 1;
    for (size_t i = 0; i < gw->n_endpoints && i < 8; i++)
      done &= now[i] >= before[i] + 2;
  }
}

static const char request[] =
    "POST /v1/completions HTTP/1.1\r\nhost: lupin\r\ncontent-length: 36\r\n\r\n"
    "{\"model\":\"m\",\"prompt\":\"hello world\"}";
static const char admin[] = "GET /admin/endpoints HTTP/1.1\r\nhost: lupin\r\n\r\n";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  gw = fz_gateway("spec/fuzz/scrape.json", 2);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t samples = 0;
  lh_prometheus_parse((const char *)data, size, on_sample, &samples);
  /* an empty answer reaches the parser as (NULL, 0): found here and fixed
   * (docs/bad-input.md); LUPIN_FUZZ_KNOWN=empty-metrics still steps over it */
  if (!size && fz_known("empty-metrics")) return 0;

  /* the text stays the answer until the admin's answer is read: the scrapes
   * in between read it again */
  fz_set_metrics((const char *)data, size);
  scrape_twice();

  fz_reply r;
  fz_exchange(gw, gw->server, request, sizeof request - 1, &r);
  fz_check(gw, &r);
  fz_exchange(gw, gw->admin, admin, sizeof admin - 1, &r);
  fz_set_metrics(NULL, 0);
  fz_check(gw, &r);
  return 0;
}
