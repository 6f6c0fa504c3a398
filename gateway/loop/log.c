/* The gateway's diagnostics: a line at the worker's log level, as text or
 * JSON (--log-format), written by host/log.c. */
#include "loop/loop.h"

#include <stdio.h>

void gw_log(lupin_gateway *gw, int level, const char *fmt, ...) {
  if (level > gw->opts.log_level) return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  lh_log_line(gw->opts.log_json, level, msg);
}
