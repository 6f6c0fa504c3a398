/* Log lines every host writes the same way: diagnostics (text or JSON) and
 * the access log's JSON objects; and the admin token's comparison. */
#include "lupin_host.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};

static double wall_time(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void lh_log_line(int json, int level, const char *msg) {
  if (!json) {
    fprintf(stderr, "lupin [%s] %s\n", level_names[level & 3], msg);
    return;
  }
  lh_buf b = {0};
  lh_buf_printf(&b, "{\"ts\":%.3f,\"level\":\"%s\",\"msg\":", wall_time(), level_names[level & 3]);
  lh_buf_json(&b, msg);
  lh_buf_append(&b, "}\n", 2);
  if (b.data) fwrite(b.data, 1, b.len, stderr);
  lh_buf_free(&b);
}

int lh_access_line(lh_buf *b, const lh_access *a) {
  int bad = 0;
  bad |= lh_buf_str(b, "{\"ts\":");
  bad |= lh_buf_fixed(b, a->ts, 3);
  bad |= lh_buf_str(b, ",\"id\":");
  bad |= lh_buf_json(b, a->id);
  bad |= lh_buf_str(b, ",\"path\":");
  bad |= lh_buf_json(b, a->path);
  bad |= lh_buf_str(b, ",\"model\":");
  bad |= lh_buf_json(b, a->model ? a->model : "");
  bad |= lh_buf_str(b, ",\"endpoint\":");
  bad |= lh_buf_json(b, a->endpoint ? a->endpoint : "");
  bad |= lh_buf_str(b, ",\"status\":");
  bad |= lh_buf_fixed(b, a->status, 0);
  bad |= lh_buf_str(b, ",\"scheduling_us\":");
  bad |= lh_buf_fixed(b, a->scheduling_us, 1);
  bad |= lh_buf_str(b, ",\"total_ms\":");
  bad |= lh_buf_fixed(b, a->total_ms, 3);
  bad |= lh_buf_str(b, ",\"outcome\":\"");
  bad |= lh_buf_str(b, a->outcome);
  bad |= lh_buf_str(b, "\"");
  if (a->attempts && a->attempts_len) {
    bad |= lh_buf_str(b, ",\"attempts\":[");
    bad |= lh_buf_append(b, a->attempts, a->attempts_len);
    bad |= lh_buf_str(b, "]");
  }
  bad |= lh_buf_str(b, "}\n");
  return bad ? -1 : 0;
}

/* Compares in a time that depends on the length of what the client sent,
 * never on how much of the token it got right (strcmp stops at the first
 * difference, which lets a client find the token byte by byte). */
int lh_same_secret(const char *given, const char *token) {
  size_t n = strlen(given), t = strlen(token);
  volatile unsigned char diff = n != t;
  for (size_t i = 0; i < n; i++)
    diff |= (unsigned char)given[i] ^ (unsigned char)token[i % t];
  return diff == 0;
}
