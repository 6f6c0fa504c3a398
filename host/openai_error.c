/* The OpenAI error body every host answers a refused request with, so that
 * a client sees the same JSON from lupin serve's 4xx/5xx and from another
 * host's immediate response: {"error":{"message","type","param","code"}},
 * the type named by the status as OpenAI's API names it. */
#include "lupin_host.h"

const char *lh_openai_error_type(int status) {
  if (status == 429) return "rate_limit_error";
  if (status == 401) return "authentication_error";
  return status < 500 ? "invalid_request_error" : "server_error";
}

int lh_openai_error(lh_buf *b, int status, const char *message, const char *param) {
  int rc = lh_buf_str(b, "{\"error\":{\"message\":");
  rc |= lh_buf_json(b, message ? message : "");
  rc |= lh_buf_printf(b, ",\"type\":\"%s\",\"param\":", lh_openai_error_type(status));
  rc |= param && *param ? lh_buf_json(b, param) : lh_buf_str(b, "null");
  rc |= lh_buf_str(b, ",\"code\":null}}\n");
  return rc ? -1 : 0;
}
