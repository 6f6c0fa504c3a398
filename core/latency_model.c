/* Latency models: online regression of a request's latency (TTFT, TPOT) on a
 * few features, trained on every finished request and shared by every
 * runtime of a process (lupin.predictor, docs/latency-prediction.md).
 *
 * A model is ridge regression over exponentially weighted sums: A = Σ wᵢxᵢxᵢᵀ,
 * b = Σ wᵢyᵢxᵢ, each sample's weight halving every half_life seconds.  Each
 * sample decays the sums, adds itself and solves (A + ρ)w = b again by
 * Cholesky: at most 16 features, so the solve costs less than the lock
 * around it and predictions read ready weights.  Models live as long as
 * their lupin_shared (as shared dicts do), one mutex each, at most
 * LUPIN_LATENCY_MAX_MODELS: a plugin naming a model per request fills the
 * store, not the memory. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#define MAXD     LUPIN_LATENCY_MAX_FEATURES
#define BUCKETS  1024       /* hash buckets: at most 4 models a chain when full */
#define EW       (1.0 / 64) /* the error means' weight of a new sample */
#define HUGE_IN  1e100      /* inputs past it count as non-finite: no sum overflows */
#define RIDGE    1e-4       /* ρ relative to the (scaled) trace */
#define RIDGE_0  1e-6       /* ρ's floor */
#define Q_RATE   0.02       /* the quantile factor's step, relative to itself */
#define Q_MIN    0.2
#define Q_MAX    5.0
#define TINY_VAR 1e-200 /* a diagonal below it: a feature never seen */

typedef struct ape {
  uint64_t n;
  double sum, mean; /* sum and exponentially weighted mean */
} ape;

struct lupin_latency_model {
  lupin_latency_model *next;  /* the store's list: set once, before it is published */
  lupin_latency_model *chain; /* its bucket's, under the store's lock */
  uint64_t hash;
  const char *plugin, *target, *group; /* in names[], never change */
  pthread_mutex_t lock;
  /* the rest under lock */
  int d;
  int exported;
  double half_life, quantile;
  double a[MAXD][MAXD]; /* upper triangle (i <= j) */
  double b[MAXD], w[MAXD];
  double weight, last, factor;
  uint64_t trained;
  ape apriori, served;
  char names[];
};

/* --- the store ---------------------------------------------------------------- */

static uint64_t names_hash(const char *plugin, const char *target, const char *group) {
  /* chained, each with its NUL: "a"+"bc" is not "ab"+"c" */
  uint64_t h = XXH64(plugin, strlen(plugin) + 1, 0);
  h = XXH64(target, strlen(target) + 1, h);
  return XXH64(group, strlen(group) + 1, h);
}

static int name_ok(const char *s) {
  return s && strnlen(s, LUPIN_LATENCY_MAX_NAME) < LUPIN_LATENCY_MAX_NAME;
}

static int spec_ok(const lupin_latency_spec *sp) {
  return sp && name_ok(sp->plugin) && name_ok(sp->target) && name_ok(sp->group) &&
         sp->features >= 1 && sp->features <= MAXD && isfinite(sp->half_life) &&
         isfinite(sp->quantile) && sp->quantile >= 0 && sp->quantile < 1;
}

/* What was learnt, gone: the weights, the sums, the a-priori errors.  The
 * served errors stay: they count predictions a scheduler already used. */
static void forget(lupin_latency_model *m, int d) {
  m->d = d;
  memset(m->a, 0, sizeof m->a);
  memset(m->b, 0, sizeof m->b);
  memset(m->w, 0, sizeof m->w);
  m->weight = m->last = 0;
  m->factor = 1;
  m->trained = 0;
  m->apriori = (ape){0};
}

static lupin_latency_model *model_new(const lupin_latency_spec *sp, uint64_t hash) {
  size_t lp = strlen(sp->plugin) + 1, lt = strlen(sp->target) + 1, lg = strlen(sp->group) + 1;
  lupin_latency_model *m = calloc(1, sizeof *m + lp + lt + lg);
  if (!m) return NULL;
  char *p = m->names;
  memcpy(p, sp->plugin, lp);
  memcpy(p + lp, sp->target, lt);
  memcpy(p + lp + lt, sp->group, lg);
  m->plugin = p;
  m->target = p + lp;
  m->group = p + lp + lt;
  m->hash = hash;
  pthread_mutex_init(&m->lock, NULL);
  forget(m, sp->features);
  return m;
}

/* The settings of a (re)open, under m's lock. */
static void configure(lupin_latency_model *m, const lupin_latency_spec *sp) {
  pthread_mutex_lock(&m->lock);
  if (m->d != sp->features) forget(m, sp->features);
  if (m->quantile != sp->quantile) m->factor = 1; /* learnt for another quantile */
  m->quantile = sp->quantile;
  m->half_life = sp->half_life;
  m->exported = sp->exported != 0;
  pthread_mutex_unlock(&m->lock);
}

static lupin_latency_model *find(lupin_shared_store *st, const lupin_latency_spec *sp,
                                 uint64_t hash) {
  lupin_latency_model *m = st->latency_buckets[hash & (BUCKETS - 1)];
  while (m && !(m->hash == hash && !strcmp(m->plugin, sp->plugin) &&
                !strcmp(m->target, sp->target) && !strcmp(m->group, sp->group)))
    m = m->chain;
  return m;
}

lupin_latency_model *lupin__latency_open(lupin_runtime *rt, const lupin_latency_spec *sp) {
  if (!rt || !rt->shared || !spec_ok(sp)) return NULL;
  lupin_shared_store *st = lupin__shared_store(rt->shared);
  uint64_t hash = names_hash(sp->plugin, sp->target, sp->group);
  lupin_latency_model *m = NULL;
  pthread_mutex_lock(&st->lock);
  if (!st->latency_buckets) st->latency_buckets = calloc(BUCKETS, sizeof *st->latency_buckets);
  if (st->latency_buckets && !(m = find(st, sp, hash)) &&
      st->n_latency < LUPIN_LATENCY_MAX_MODELS && (m = model_new(sp, hash))) {
    m->next = st->latency;
    st->latency = m;
    m->chain = st->latency_buckets[hash & (BUCKETS - 1)];
    st->latency_buckets[hash & (BUCKETS - 1)] = m;
    st->n_latency++;
  }
  pthread_mutex_unlock(&st->lock);
  if (m) configure(m, sp);
  return m;
}

void lupin__latency_free_all(lupin_shared_store *st) {
  while (st->latency) {
    lupin_latency_model *m = st->latency;
    st->latency = m->next;
    pthread_mutex_destroy(&m->lock);
    free(m);
  }
  free(st->latency_buckets);
  st->latency_buckets = NULL;
  st->n_latency = 0;
}

/* --- training ----------------------------------------------------------------- */

static void ape_add(ape *e, double v) {
  e->n++;
  e->sum += v;
  e->mean = e->n == 1 ? v : e->mean + (v - e->mean) * EW;
}

static double dot(const double *w, const double *x, int d) {
  double s = 0;
  for (int i = 0; i < d; i++)
    s += w[i] * x[i];
  return s;
}

static int usable(double v) { return fabs(v) <= HUGE_IN; } /* false for NaN and ±Inf too */

/* The weights from the sums: (A + ρI)w = b on A scaled to a unit diagonal
 * (Jacobi), so that ρ = 1e-6 + 1e-4·trace/d shrinks a feature counted in
 * tokens no more than one in fractions, and a bias no more than either.
 * Without the scaling, ρ grows with the largest feature's square and pulls
 * the small ones (the bias first) towards 0.  A Cholesky failure, which
 * ρ > 0 rules out but for rounding, keeps the weights as they were. */
static void solve(lupin_latency_model *m) {
  int d = m->d;
  double s[MAXD], l[MAXD][MAXD], z[MAXD], trace = 0;
  for (int i = 0; i < d; i++) {
    double v = m->a[i][i];
    s[i] = v > TINY_VAR ? 1 / sqrt(v) : 1;
    trace += v * s[i] * s[i];
  }
  double rho = RIDGE_0 + RIDGE * trace / d;
  for (int i = 0; i < d; i++) {
    for (int j = 0; j <= i; j++) {
      double sum = m->a[j][i] * s[i] * s[j] + (i == j ? rho : 0);
      for (int k = 0; k < j; k++)
        sum -= l[i][k] * l[j][k];
      if (i == j) {
        if (!(sum > 0)) return;
        l[i][i] = sqrt(sum);
      } else {
        l[i][j] = sum / l[j][j];
      }
    }
  }
  for (int i = 0; i < d; i++) { /* L z' = S b */
    double sum = m->b[i] * s[i];
    for (int k = 0; k < i; k++)
      sum -= l[i][k] * z[k];
    z[i] = sum / l[i][i];
  }
  for (int i = d - 1; i >= 0; i--) { /* Lᵀ z = z' */
    double sum = z[i];
    for (int k = i + 1; k < d; k++)
      sum -= l[k][i] * z[k];
    z[i] = sum / l[i][i];
  }
  for (int i = 0; i < d; i++)
    m->w[i] = z[i] * s[i];
}

/* The weight left to what was learnt before now: 2^(-elapsed/half_life). */
static double decay(const lupin_latency_model *m, double now) {
  if (m->half_life <= 0 || m->trained == 0 || now <= m->last) return 1;
  return exp2(-(now - m->last) / m->half_life);
}

/* The quantile factor f follows the quantile of y/p: up when fewer than q
 * of the samples fall at or below f·p, down when more. */
static void track_quantile(lupin_latency_model *m, double p, double y) {
  double f = m->factor, below = y / p <= f;
  f += Q_RATE * f * (m->quantile - below);
  m->factor = f < Q_MIN ? Q_MIN : f > Q_MAX ? Q_MAX : f;
}

int lupin__latency_train(lupin_latency_model *m, const double *x, double y, double now) {
  if (!m || !x || !usable(y) || !isfinite(now)) return -1;
  pthread_mutex_lock(&m->lock);
  int d = m->d;
  for (int i = 0; i < d; i++)
    if (!usable(x[i])) {
      pthread_mutex_unlock(&m->lock);
      return -1;
    }
  double p = fmax(0, dot(m->w, x, d));
  /* fewer samples than features: the fit is not determined yet, its misses
   * say nothing of the model */
  if (m->trained >= (uint64_t)d && y > 0) ape_add(&m->apriori, fabs(p - y) / y);
  if (m->quantile > 0 && p > 0 && y > 0) track_quantile(m, p, y);
  double g = decay(m, now);
  for (int i = 0; i < d; i++) {
    for (int j = i; j < d; j++)
      m->a[i][j] = g * m->a[i][j] + x[i] * x[j];
    m->b[i] = g * m->b[i] + y * x[i];
  }
  m->weight = g * m->weight + 1;
  if (now > m->last) m->last = now;
  m->trained++;
  solve(m);
  pthread_mutex_unlock(&m->lock);
  return 0;
}

/* --- predictions and errors ---------------------------------------------------- */

void lupin__latency_predict(lupin_latency_model *const *models, size_t n, const double *x,
                            size_t stride, double *out, uint64_t *trained) {
  for (size_t i = 0; i < n; i++) {
    lupin_latency_model *m = models[i];
    double v = NAN;
    uint64_t t = 0;
    if (m) {
      pthread_mutex_lock(&m->lock);
      if ((size_t)m->d <= stride) {
        double p = dot(m->w, x + i * stride, m->d);
        v = isnan(p) ? p : p > 0 ? p * m->factor : 0;
        t = m->trained;
      }
      pthread_mutex_unlock(&m->lock);
    }
    out[i] = v;
    if (trained) trained[i] = t;
  }
}

void lupin__latency_observe(lupin_latency_model *m, double predicted, double actual) {
  if (!m || !isfinite(predicted) || !isfinite(actual) || actual <= 0 || predicted < 0) return;
  pthread_mutex_lock(&m->lock);
  ape_add(&m->served, fabs(predicted - actual) / actual);
  pthread_mutex_unlock(&m->lock);
}

/* Under m's lock. */
static void stats_of(const lupin_latency_model *m, lupin_latency_stats *out) {
  *out = (lupin_latency_stats){
      .trained = m->trained,
      .weight = m->weight,
      .apriori_n = m->apriori.n,
      .apriori_mape = m->apriori.mean,
      .served_n = m->served.n,
      .served_ape_sum = m->served.sum,
      .served_mape = m->served.mean,
      .factor = m->factor,
      .features = m->d,
  };
  memcpy(out->w, m->w, (size_t)m->d * sizeof *m->w);
}

void lupin__latency_stats(lupin_latency_model *m, lupin_latency_stats *out) {
  pthread_mutex_lock(&m->lock);
  stats_of(m, out);
  pthread_mutex_unlock(&m->lock);
}

void lupin_shared_latency_each(lupin_shared *s,
                               void (*fn)(const lupin_latency_model_info *m, void *ud), void *ud) {
  if (!s || !fn) return;
  lupin_shared_store *st = lupin__shared_store(s);
  /* models are only ever added at the head and freed with s: the list from
   * the head taken under the lock stays whole without it */
  pthread_mutex_lock(&st->lock);
  lupin_latency_model *m = st->latency;
  pthread_mutex_unlock(&st->lock);
  for (; m; m = m->next) {
    lupin_latency_model_info info = {m->plugin, m->target, m->group, {0}};
    pthread_mutex_lock(&m->lock);
    int exported = m->exported;
    if (exported) stats_of(m, &info.stats);
    pthread_mutex_unlock(&m->lock);
    if (exported) fn(&info, ud);
  }
}
