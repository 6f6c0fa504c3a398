/* /metrics over several workers: each worker writes its own exposition (on
 * its own thread, from its own counters), and the leader merges them into
 * one.  A sample is its line up to the value ("name{labels}"); the same
 * sample in several texts is summed when its family is a counter, a
 * histogram, a summary or a gauge each worker holds a share of
 * (LH_SUM_GAUGE), the largest is kept for a flag any worker may raise
 * (LH_MAX_GAUGE), else the leader's value stands (what every worker sees
 * alike: endpoint metrics, the generation).  Families and samples keep the
 * order they first appear in, the leader's text first. */
#include "admin/admin.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef struct sample {
  const char *key; /* into one of the texts, not terminated */
  size_t len;
  double value;
  int family;
  int next; /* the family's next sample, -1: none */
} sample;

typedef struct family {
  const char *head; /* its # HELP and # TYPE lines */
  size_t head_len, name_len;
  int sum;         /* LEADER, SUM or MAX */
  int first, last; /* samples */
} family;

typedef struct merge {
  family *f;
  size_t n_f, cap_f;
  sample *s;
  size_t n_s, cap_s;
  int *slots; /* sample index + 1 by key hash, 0 empty */
  size_t mask;
} merge;

static int grow(void **p, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return 0;
  size_t cap2 = *cap ? *cap * 2 : 64;
  while (cap2 < need)
    cap2 *= 2;
  void *q = realloc(*p, cap2 * size);
  if (!q) return -1;
  *p = q;
  *cap = cap2;
  return 0;
}

enum { LEADER, SUM, MAX }; /* how a family's samples merge */

static int named(const char *s, const char *name, size_t len) {
  return s && strlen(s) == len && !memcmp(s, name, len);
}

/* A deprecated twin merges as the family it repeats: running requests and
 * queues are shares, saturation a flag, whichever name they go by. */
static int merged_by(const char *name, size_t len, const char *type) {
  for (size_t i = 0; i < LH_FAMILIES; i++)
    if (named(lh_families[i].name, name, len) || named(lh_families[i].deprecated, name, len)) {
      lh_metric_type t = lh_families[i].type;
      return t == LH_GAUGE ? LEADER : t == LH_MAX_GAUGE ? MAX : SUM;
    }
  return strncmp(type, "gauge", 5) ? SUM : LEADER; /* a family not in the table: by its type */
}

static int find_family(merge *m, const char *name, size_t len) {
  for (size_t i = 0; i < m->n_f; i++)
    if (m->f[i].name_len == len && !memcmp(m->f[i].head + 7, name, len)) return (int)i;
  return -1;
}

/* The index of the sample with this key, or where it would go. */
static size_t slot_of(const merge *m, const char *key, size_t len) {
  size_t i = (size_t)XXH64(key, len, 0) & m->mask;
  while (m->slots[i]) {
    const sample *s = &m->s[m->slots[i] - 1];
    if (s->len == len && !memcmp(s->key, key, len)) break;
    i = (i + 1) & m->mask;
  }
  return i;
}

static int add_sample(merge *m, int fam, const char *key, size_t len, double v) {
  size_t i = slot_of(m, key, len);
  if (m->slots[i]) {
    sample *s = &m->s[m->slots[i] - 1];
    if (m->f[s->family].sum == SUM) s->value += v;
    if (m->f[s->family].sum == MAX && v > s->value) s->value = v;
    return 0;
  }
  if (m->n_s * 2 >= m->mask + 1 || grow((void **)&m->s, &m->cap_s, m->n_s + 1, sizeof *m->s))
    return -1;
  m->s[m->n_s] = (sample){key, len, v, fam, -1};
  family *f = &m->f[fam];
  if (f->last >= 0)
    m->s[f->last].next = (int)m->n_s;
  else
    f->first = (int)m->n_s;
  f->last = (int)m->n_s;
  m->slots[i] = (int)++m->n_s;
  return 0;
}

/* "# HELP name text\n# TYPE name type\n" starts a family. */
static int read_text(merge *m, const lh_buf *t) {
  const char *p = t->data, *end = p ? p + t->len : p;
  int fam = -1;
  while (p && p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) nl = end;
    if (!strncmp(p, "# HELP ", 7)) {
      const char *name = p + 7, *sp = memchr(name, ' ', (size_t)(nl - name));
      size_t len = sp ? (size_t)(sp - name) : (size_t)(nl - name);
      const char *type_line = nl + 1 < end ? nl + 1 : nl;
      const char *type_end = memchr(type_line, '\n', (size_t)(end - type_line));
      if (!type_end) type_end = end;
      fam = find_family(m, name, len);
      if (fam < 0) {
        if (grow((void **)&m->f, &m->cap_f, m->n_f + 1, sizeof *m->f)) return -1;
        const char *type = type_line + 8 + len; /* "# TYPE name " */
        m->f[m->n_f] = (family){p,   (size_t)(type_end + 1 - p),
                                len, merged_by(name, len, type < type_end ? type + 1 : ""),
                                -1,  -1};
        fam = (int)m->n_f++;
      }
      p = type_end + 1;
      continue;
    }
    const char *sp = nl;
    while (sp > p && sp[-1] != ' ')
      sp--;
    if (fam >= 0 && sp > p && *p != '#' &&
        add_sample(m, fam, p, (size_t)(sp - 1 - p), strtod(sp, NULL)))
      return -1;
    p = nl + 1;
  }
  return 0;
}

static void write_value(lh_buf *b, double v) {
  char s[40];
  lh_metric_number(s, sizeof s, v);
  lh_buf_printf(b, " %s\n", s);
}

void gw_metrics_merge(lh_buf *out, const lh_buf *texts, size_t n) {
  merge m = {0};
  size_t lines = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < texts[i].len; k++)
      lines += texts[i].data[k] == '\n';
  size_t cap = 64;
  while (cap < lines * 2 + 2)
    cap *= 2;
  m.slots = calloc(cap, sizeof *m.slots);
  m.mask = cap - 1;
  int failed = !m.slots;
  for (size_t i = 0; i < n && !failed; i++)
    failed = read_text(&m, &texts[i]);
  if (failed) { /* out of memory: the leader's own numbers, unmerged */
    lh_buf_append(out, texts[0].data, texts[0].len);
  } else {
    for (size_t i = 0; i < m.n_f; i++) {
      lh_buf_append(out, m.f[i].head, m.f[i].head_len);
      for (int k = m.f[i].first; k >= 0; k = m.s[k].next) {
        lh_buf_append(out, m.s[k].key, m.s[k].len);
        write_value(out, m.s[k].value);
      }
    }
  }
  free(m.slots);
  free(m.f);
  free(m.s);
}
