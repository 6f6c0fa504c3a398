/* Fuzz target "upstream": what a model server answers.
 *
 * The real gateway (examples/configs/default.json, three model servers played
 * by the harness) gets a good request from a client; every model server
 * answers it with the input's bytes (after two header bytes), in two pieces
 * read apart, then closes or resets the connection.  The response parser
 * (http_parser, as gateway/endpoints/upstream.c drives it), the relay to the client and
 * the runtime's response hooks all see them.  After each input the client's
 * bytes must be well-formed HTTP/1.1 responses and nothing may be left.
 *
 * Input: byte 0 picks the request (bits 0-1: completion, streamed chat,
 * GET /v1/models, completion with "expect: 100-continue") and a reset
 * instead of a close (bit 2); byte 1 where the answer is cut in two (a
 * fraction of 255); the rest is the answer. */
#include "fuzz.h"

#include <stdio.h>
#include <string.h>

static lupin_gateway *gw;

static const char *const heads[4] = {
    "POST /v1/completions HTTP/1.1\r\nhost: lupin\r\ncontent-type: application/json\r\n",
    "POST /v1/chat/completions HTTP/1.1\r\nhost: lupin\r\n",
    "GET /v1/models HTTP/1.1\r\nhost: lupin\r\n",
    ("POST /v1/completions HTTP/1.1\r\nhost: lupin\r\nexpect: 100-continue\r\n"
     "connection: close\r\n"),
};
static const char *const bodies[4] = {
    "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":4}",
    "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
    NULL,
    "{\"model\":\"m\",\"prompt\":\"again\"}",
};
static char requests[4][512];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  for (int i = 0; i < 4; i++)
    if (bodies[i])
      snprintf(requests[i], sizeof requests[i], "%scontent-length: %zu\r\n\r\n%s", heads[i],
               strlen(bodies[i]), bodies[i]);
    else
      snprintf(requests[i], sizeof requests[i], "%s\r\n", heads[i]);
  gw = fz_gateway("examples/configs/default.json", 3);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  const char *answer = (const char *)data + 2;
  size_t len = size - 2;
  fz_set_answer(answer, len, len * data[1] / 255, data[0] & 4);
  const char *req = requests[data[0] & 3];
  fz_reply r;
  fz_exchange(gw, gw->server, req, strlen(req), &r);
  fz_set_answer(NULL, 0, 0, 0);
  fz_check(gw, &r);
  return 0;
}
