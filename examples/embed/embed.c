/* A minimal host embedding lupin: load a config, add 16 endpoints, run 1,000
 * requests through the whole lifecycle and print where they went.
 *
 * Endpoint i starts with i waiting requests, and every pick adds one to the
 * chosen endpoint's queue (a host would learn that from the next scrape), so
 * a least-loaded policy fills the queues level: the program prints the picks
 * per endpoint and checks them against that expectation.
 *
 *   LUPIN_HOME=. ./build/embed examples/embed/config.json */
#include <lupin.h>

#include <stdio.h>
#include <string.h>

#define ENDPOINTS 16
#define REQUESTS  1000

static int run_one(lupin_runtime *rt, int n, double queue[], int picks[]) {
  static const char body[] = "{\"model\":\"llama\",\"prompt\":\"Say hello\",\"max_tokens\":8}";
  char err[512];
  lupin_request_desc desc = {.path = "/v1/completions", .body = body, .body_len = sizeof body - 1};
  lupin_request *req = lupin_request_begin(rt, &desc, err, sizeof err);
  if (!req) {
    fprintf(stderr, "request %d: %s\n", n, err);
    return -1;
  }
  lupin_result res;
  if (lupin_request_schedule(req, &res) != 200) {
    fprintf(stderr, "request %d: %d %s\n", n, res.status, res.message);
    lupin_request_end(req, LUPIN_NO_ENDPOINT);
    return -1;
  }
  int i;
  sscanf(res.picks[0].name, "ep%d", &i);
  picks[i - 1]++;
  queue[i - 1] += 1;
  lupin_endpoint_set_metrics(rt, res.picks[0].name,
                             &(lupin_metrics){.waiting_queue_size = queue[i - 1]});

  /* pretend the model server answered */
  lupin_header ct = {"content-type", "text/event-stream"};
  lupin_request_response_header(req, 200, &ct, 1);
  lupin_request_response_chunk(req, "data: {}\n\n", 10);
  lupin_request_response_complete(req);
  lupin_request_end(req, LUPIN_OK);
  return 0;
}

int main(int argc, char **argv) {
  const char *config = argc > 1 ? argv[1] : "examples/embed/config.json";
  char err[2048];
  lupin_runtime *rt = lupin_runtime_new(NULL, err, sizeof err);
  if (!rt || lupin_runtime_load(rt, config, err, sizeof err)) {
    fprintf(stderr, "embed: %s\n", err);
    lupin_runtime_free(rt);
    return 1;
  }

  double queue[ENDPOINTS];
  int picks[ENDPOINTS] = {0};
  for (int i = 0; i < ENDPOINTS; i++) {
    char name[16], addr[32];
    snprintf(name, sizeof name, "ep%d", i + 1);
    snprintf(addr, sizeof addr, "10.0.0.%d", i + 1);
    lupin_endpoint_desc d = {.name = name, .address = addr, .port = 8000};
    queue[i] = i;
    if (lupin_endpoint_upsert(rt, &d, err, sizeof err) ||
        lupin_endpoint_set_metrics(rt, name, &(lupin_metrics){.waiting_queue_size = i})) {
      fprintf(stderr, "embed: %s\n", err);
      return 1;
    }
  }

  int failed = 0;
  for (int n = 0; n < REQUESTS; n++)
    failed += run_one(rt, n, queue, picks) != 0;

  /* 1,000 picks on queues 0..15 level them at (1000 + 120) / 16 = 70. */
  int wrong = 0;
  for (int i = 0; i < ENDPOINTS; i++) {
    printf("ep%-3d %4d picks\n", i + 1, picks[i]);
    wrong += picks[i] != 70 - i;
  }
  lupin_stats s;
  lupin_runtime_stats(rt, &s);
  printf("%d requests, %d failed, %llu live, lua memory %llu bytes\n", REQUESTS, failed,
         (unsigned long long)s.live_requests, (unsigned long long)s.lua_memory);
  printf("picks %s the least-loaded expectation\n", wrong ? "DO NOT match" : "match");
  lupin_runtime_free(rt);
  return failed || wrong ? 1 : 0;
}
