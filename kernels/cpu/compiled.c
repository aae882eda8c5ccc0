/* The compiled CPU kernels (float32): loops that fuse what the numpy kernels run as many passes.
 *
 * Built at first use by modeldsl.kernels.cpu.compiled with the C compiler of the `ziglang` wheel
 * (clang, -O3 -march=native, no contraction into FMAs: each operation rounds as written, as numpy's
 * do; the sums of REDUCE blocks may be reassociated, so they vectorize), loaded through ctypes. Every function takes element counts and row
 * strides in elements (the last dimension is contiguous) and is called with the GIL released.
 * Loops marked assume_safety write each element after reading it, so an output may be its input's
 * buffer (the registry's in-place reuse) and still vectorize.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef int64_t i64;

#define SAFE _Pragma("clang loop vectorize(assume_safety)")
/* At the top of a block holding a sum: its terms may be added in any order (so it vectorizes).
 * Nowhere else: an expression rounds as written, so a fused kernel keeps its parts' bits. */
#define REDUCE _Pragma("clang fp reassociate(on)")

/* exp(x) = 2^k p(r), k = round(x log2 e), r = x - k ln 2 (Cody-Waite), p of degree 7, 2^k as two
 * powers of two from their bits: within 1 ulp of the rounded result; inf above 88.72, 0 below
 * -103.97, NaN kept. No branch and no call, so the loops around it vectorize. */
static inline float fast_exp(float x) {
    float c = fminf(fmaxf(x, -103.97208f), 88.72283f);
    float k = floorf(c * 1.44269504088896341f + 0.5f);
    float r = fmaf(k, 2.12194440e-4f, fmaf(-k, 0.693359375f, c));
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t ki = (int32_t)k, half = ki >> 1;
    int32_t bits1 = (half + 127) << 23, bits2 = (ki - half + 127) << 23;
    float two1, two2;
    memcpy(&two1, &bits1, 4);
    memcpy(&two2, &bits2, 4);
    float v = p * two1 * two2;
    v = x > 88.72283f ? INFINITY : v;
    v = x < -103.97208f ? 0.0f : v;
    return x != x ? x : v;
}

/* max(x[0:n]) as the maximum of integer keys ordered as the floats (-inf when empty): an integer
 * maximum vectorizes without fast-math. */
static inline float row_max(const float *x, i64 n) {
    int32_t key = INT32_MIN;
    for (i64 i = 0; i < n; i++) {
        int32_t bits;
        memcpy(&bits, &x[i], 4);
        int32_t ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF);
        key = ordered > key ? ordered : key;
    }
    int32_t bits = key ^ ((key >> 31) & 0x7FFFFFFF);
    float m;
    memcpy(&m, &bits, 4);
    return n > 0 ? m : -INFINITY;
}

/* out = fast_exp(x), for the tests of its accuracy. */
void exp_rows(i64 n, float *out, const float *x) {
    for (i64 i = 0; i < n; i++) out[i] = fast_exp(x[i]);
}

static inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

/* ---------------------------------------------------------------- the SiLU family, row by row */
void silu_rows(i64 rows, i64 width, float *out, i64 so, const float *g, i64 sg) {
    for (i64 r = 0; r < rows; r++) {
        float *o = out + r * so;
        const float *x = g + r * sg;
        SAFE for (i64 c = 0; c < width; c++) o[c] = x[c] * sigmoid(x[c]);
    }
}

void swiglu_rows(i64 rows, i64 width, float *out, i64 so, const float *g, i64 sg, const float *u, i64 su) {
    for (i64 r = 0; r < rows; r++) {
        float *o = out + r * so;
        const float *x = g + r * sg, *up = u + r * su;
        SAFE for (i64 c = 0; c < width; c++) o[c] = sigmoid(x[c]) * x[c] * up[c];
    }
}

void silu_backward_rows(i64 rows, i64 width, float *d_x, i64 sx, const float *d_out, i64 sd, const float *g, i64 sg) {
    for (i64 r = 0; r < rows; r++) {
        float *dx = d_x + r * sx;
        const float *dy = d_out + r * sd, *x = g + r * sg;
        SAFE for (i64 c = 0; c < width; c++) {
            float s = sigmoid(x[c]);
            dx[c] = dy[c] * (((1.0f - s) * x[c] + 1.0f) * s);
        }
    }
}

void swiglu_backward_rows(i64 rows, i64 width, float *d_gate, i64 sdg, float *d_up, i64 sdu, const float *d_out, i64 sd,
                          const float *g, i64 sg, const float *u, i64 su) {
    for (i64 r = 0; r < rows; r++) {
        float *dg = d_gate + r * sdg, *du = d_up + r * sdu;
        const float *dy = d_out + r * sd, *x = g + r * sg, *up = u + r * su;
        SAFE for (i64 c = 0; c < width; c++) {
            float xc = x[c], uc = up[c], dyc = dy[c];
            float s = sigmoid(xc);
            dg[c] = dyc * uc * (((1.0f - s) * xc + 1.0f) * s);
            du[c] = dyc * (s * xc);
        }
    }
}

/* ---------------------------------------------------------------- attention strips
 * A strip is [stacked rows, span]: its row r is query r % rows of the block, of the stack's head
 * r / rows; its column c is key j_lo + c; `shift` is the distance i - j at its first row and
 * column. A key is seen where 0 <= d (causal) and |d| < window (window > 0). ALiBi slopes (NULL:
 * none) of stacked head h at slopes[(h / heads) * group + h % heads]. A softcap c > 0 caps the
 * scaled scores s to c tanh(s / c) before ALiBi (Gemma 2; 0: none, and the loops of no cap run).
 * Packed rows (seg_k not NULL): seg_q[r % rows] is the example id of row r's query, seg_k[c] that of
 * column c's key; a key of another example scores -inf (it gets probability 0). */
static inline void seen(i64 d0, i64 span, int causal, i64 window, i64 *lo, i64 *hi) {
    i64 h = causal ? (d0 + 1 < span ? d0 + 1 : span) : (window > 0 ? (d0 + window < span ? d0 + window : span) : span);
    i64 l = window > 0 ? (d0 - window + 1 > 0 ? d0 - window + 1 : 0) : 0;
    *lo = l;
    *hi = h > l ? h : l;
}

static inline void scale_scores(float *x, i64 n, float scale, float softcap, float *factor, const float *slopes,
                                i64 head, i64 heads, i64 group, i64 d_first) {
    if (softcap > 0.0f) { /* c tanh(s / c), and (factor: not NULL) its derivative 1 - tanh^2 */
        for (i64 c = 0; c < n; c++) {
            float t = tanhf(x[c] * scale / softcap);
            x[c] = softcap * t;
            if (factor) factor[c] = 1.0f - t * t;
        }
        if (slopes) {
            float slope = slopes[(head / heads) * group + head % heads];
            for (i64 c = 0; c < n; c++) x[c] = x[c] - slope * fabsf((float)(d_first - c));
        }
    } else if (slopes) {
        float slope = slopes[(head / heads) * group + head % heads];
        for (i64 c = 0; c < n; c++) x[c] = x[c] * scale - slope * fabsf((float)(d_first - c));
    } else {
        for (i64 c = 0; c < n; c++) x[c] *= scale;
    }
}

static inline void zero_outside(float *row, i64 span, i64 lo, i64 hi) {
    memset(row, 0, lo * sizeof(float));
    memset(row + hi, 0, (span - hi) * sizeof(float));
}

/* Row r of a strip: its seen keys zeroed around, scaled (softcapped, ALiBi'd) in place; *x, *n the seen
 * part. `factors` (NULL: none; a strip like s): the softcap's derivatives 1 - tanh^2 at the seen keys,
 * 0 around them. */
static inline void seen_scores(float *s, float *factors, i64 r, i64 span, float scale, float softcap,
                               const float *slopes, i64 heads, i64 group, i64 rows, i64 shift, int causal, i64 window,
                               const int32_t *seg_q, const int32_t *seg_k, float **x, i64 *n) {
    i64 d0 = shift + r % rows, lo, hi;
    seen(d0, span, causal, window, &lo, &hi);
    float *row = s + r * span, *factor = factors ? factors + r * span : NULL;
    zero_outside(row, span, lo, hi);
    if (factor) zero_outside(factor, span, lo, hi);
    *x = row + lo;
    *n = hi - lo;
    scale_scores(*x, *n, scale, softcap, factor ? factor + lo : NULL, slopes, r / rows, heads, group, d0 - lo);
    if (seg_k) {
        const int32_t id = seg_q[r % rows], *ids = seg_k + lo;
        float *xs = *x;
        for (i64 c = 0; c < *n; c++) xs[c] = ids[c] == id ? xs[c] : -INFINITY;
    }
}

/* s = softmax(cap(scale s) - slope |d|) over the keys each row sees (the others 0), lse its log-sum-exp. */
void softmax_strip(i64 total, i64 span, float *s, float *lse, float scale, float softcap, const float *slopes,
                   i64 heads, i64 group, i64 rows, i64 shift, int causal, i64 window, const int32_t *seg_q,
                   const int32_t *seg_k) {
    for (i64 r = 0; r < total; r++) {
        float *x;
        i64 n;
        seen_scores(s, NULL, r, span, scale, softcap, slopes, heads, group, rows, shift, causal, window, seg_q, seg_k,
                    &x, &n);
        float m = row_max(x, n), sum = 0.0f;
        {
            REDUCE for (i64 c = 0; c < n; c++) {
                float e = fast_exp(x[c] - m);
                x[c] = e;
                sum += e;
            }
        }
        float inverse = 1.0f / sum;
        for (i64 c = 0; c < n; c++) x[c] *= inverse;
        lse[r] = m + logf(sum);
    }
}

/* s = exp(cap(scale s) - slope |d| - lse) over the keys each row sees (the others 0); with a softcap,
 * factors (a strip like s) = its derivatives 1 - tanh^2 there (0 elsewhere). */
void probabilities_strip(i64 total, i64 span, float *s, const float *lse, float scale, float softcap, float *factors,
                         const float *slopes, i64 heads, i64 group, i64 rows, i64 shift, int causal, i64 window,
                         const int32_t *seg_q, const int32_t *seg_k) {
    for (i64 r = 0; r < total; r++) {
        float *x;
        i64 n;
        seen_scores(s, softcap > 0.0f ? factors : NULL, r, span, scale, softcap, slopes, heads, group, rows, shift,
                    causal, window, seg_q, seg_k, &x, &n);
        float offset = lse[r];
        for (i64 c = 0; c < n; c++) x[c] = fast_exp(x[c] - offset);
    }
}

/* d_s = scale p (d_s - sum(d_out out)) row by row (times the softcap's factors 1 - tanh^2 where not NULL:
 * probabilities_strip's); d_out, out: [heads, rows, Dv] by strides. */
void score_grads_strip(i64 total, i64 span, float *d_s, const float *p, const float *factors, const float *d_out,
                       i64 dh, i64 dr, const float *out, i64 oh, i64 orow, i64 depth, i64 rows, float scale) {
    for (i64 r = 0; r < total; r++) {
        const float *dy = d_out + (r / rows) * dh + (r % rows) * dr, *o = out + (r / rows) * oh + (r % rows) * orow;
        float delta = 0.0f;
        {
            REDUCE for (i64 e = 0; e < depth; e++) delta += dy[e] * o[e];
        }
        float *grad = d_s + r * span;
        const float *prob = p + r * span;
        if (factors) {
            const float *factor = factors + r * span;
            for (i64 c = 0; c < span; c++) grad[c] = prob[c] * (grad[c] - delta) * factor[c] * scale;
        } else {
            for (i64 c = 0; c < span; c++) grad[c] = prob[c] * (grad[c] - delta) * scale;
        }
    }
}

/* ---------------------------------------------------------------- cross-entropy rows
 * Rows first + r of a cross-entropy, for each row r of logits [n, vocab]: with `losses` their
 * lse = log(sum exp(l - m)) + m (m the row max, 0 when not finite) and loss lse - l[label] (0 where
 * not valid); with `grads` the row overwritten by (exp(l - lse) - onehot) scale. */
void cross_entropy_rows(i64 n, i64 vocab, float *logits, i64 stride, i64 first, const i64 *column, const uint8_t *valid,
                        const float *scale, float *lse, float *per_row, int losses, int grads) {
    for (i64 r = 0; r < n; r++) {
        float *row = logits + r * stride;
        i64 at = first + r;
        if (losses) {
            float m = row_max(row, vocab), sum = 0.0f;
            m = isfinite(m) ? m : 0.0f;
            {
                REDUCE for (i64 c = 0; c < vocab; c++) sum += fast_exp(row[c] - m);
            }
            lse[at] = logf(sum) + m;
            per_row[at] = valid[at] ? lse[at] - row[column[at]] : 0.0f;
        }
        if (grads) {
            float offset = lse[at], factor = scale[at], label = row[column[at]];
            for (i64 c = 0; c < vocab; c++) row[c] = fast_exp(row[c] - offset) * factor;
            if (valid[at]) row[column[at]] = (fast_exp(label - offset) - 1.0f) * factor;
        }
    }
}

/* ---------------------------------------------------------------- RoPE
 * Tokens start .. stop - 1 (flattened b * T + t) of out = rope(x) (inverse: by -angle) for every head;
 * x, out C-contiguous in their layout (bthd: [B, T, H, D], else [B, H, T, D]); freqs [T, D / 2, 2]
 * (table_rows = T: one table for every row) or [B, T, D / 2, 2] (table_rows = B T: each row's own). */
void rope_rows(i64 start, i64 stop, const float *x, float *out, const float *freqs, i64 tokens, i64 heads, i64 depth,
               int bthd, int interleaved, int inverse, i64 table_rows) {
    i64 half = depth / 2;
    float sign = inverse ? -1.0f : 1.0f;
    for (i64 item = start; item < stop; item++) {
        i64 b = item / tokens, t = item % tokens;
        const float *angles = freqs + (item % table_rows) * depth;
        for (i64 h = 0; h < heads; h++) {
            i64 offset = bthd ? ((b * tokens + t) * heads + h) * depth : ((b * heads + h) * tokens + t) * depth;
            const float *xs = x + offset;
            float *o = out + offset;
            if (interleaved) {
                SAFE for (i64 i = 0; i < half; i++) {
                    float cos = angles[2 * i], sin = sign * angles[2 * i + 1], a = xs[2 * i], c = xs[2 * i + 1];
                    o[2 * i] = a * cos - c * sin;
                    o[2 * i + 1] = c * cos + a * sin;
                }
            } else {
                SAFE for (i64 i = 0; i < half; i++) {
                    float cos = angles[2 * i], sin = sign * angles[2 * i + 1], a = xs[i], c = xs[i + half];
                    o[i] = a * cos - c * sin;
                    o[i + half] = c * cos + a * sin;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- RMSNorm
 * Rows start .. stop - 1 of y = x rstd w, rstd = 1 / sqrt(mean(x^2) + eps); `fused`: x first
 * written as residual + value. */
void rmsnorm_rows(i64 start, i64 stop, i64 width, float *y, float *rstd, float *x, const float *weight, float eps,
                  const float *residual, const float *value, int fused) {
    for (i64 r = start; r < stop; r++) {
        float *xs = x + r * width, *ys = y + r * width;
        if (fused) {
            const float *a = residual + r * width, *b = value + r * width;
            SAFE for (i64 c = 0; c < width; c++) xs[c] = a[c] + b[c];
        }
        float sum = 0.0f;
        {
            REDUCE for (i64 c = 0; c < width; c++) sum += xs[c] * xs[c];
        }
        float scale = 1.0f / sqrtf(sum / (float)width + eps);
        rstd[r] = scale;
        SAFE for (i64 c = 0; c < width; c++) ys[c] = xs[c] * scale * weight[c];
    }
}

/* Rows start .. stop - 1 of d_x = r g - x r^3 mean(g x) (g = d_y w; plus d_next where `fused`), and
 * their d_y x r added into column_sums (the weight's gradient). */
void rmsnorm_backward_rows(i64 start, i64 stop, i64 width, float *d_x, const float *d_y, const float *x,
                           const float *weight, const float *rstd, const float *d_next, int fused, float *column_sums) {
    for (i64 r = start; r < stop; r++) {
        const float *dy = d_y + r * width, *xs = x + r * width;
        float scale = rstd[r], mean = 0.0f;
        {
            REDUCE for (i64 c = 0; c < width; c++) {
                column_sums[c] += dy[c] * xs[c] * scale;
                mean += dy[c] * weight[c] * xs[c];
            }
        }
        float cube = scale * scale * scale * (mean / (float)width);
        float *dx = d_x + r * width;
        if (fused) {
            const float *next = d_next + r * width;
            SAFE for (i64 c = 0; c < width; c++) dx[c] = next[c] + (scale * (dy[c] * weight[c]) - xs[c] * cube);
        } else {
            SAFE for (i64 c = 0; c < width; c++) dx[c] = scale * (dy[c] * weight[c]) - xs[c] * cube;
        }
    }
}

/* ---------------------------------------------------------------- GEMMs on spinning threads
 * The products of one GEMM, cut into blocks, run on this library's own threads: the caller runs
 * the first share and waits, the workers theirs, each calling BLAS's cblas_sgemm (one-threaded:
 * the executor holds BLAS at one thread) without the GIL. A worker spins a while after its last
 * share before it sleeps, so GEMMs that follow each other hand over in a microsecond, not in the
 * tens of microseconds of waking a sleeping thread (the Python pool's queues); gemm_rest, called
 * when the Python pool's threads start a kernel, puts them to sleep at once, so they never take a
 * core from those. */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

typedef struct {
    i64 trans_a, trans_b, m, n, k;
    const float *a;
    i64 lda;
    const float *b;
    i64 ldb;
    float *c;
    i64 ldc;
    float alpha, beta;
} gemm_job;

typedef void (*sgemm_fn)(int, int, int, i64, i64, i64, float, const float *, i64, const float *, i64, float, float *,
                         i64);

enum { MAX_WORKERS = 63, ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
static const i64 SPIN_NS = 300000;

static sgemm_fn sgemm;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static int workers;
static _Atomic long generation;
static _Atomic int pending;
static _Atomic int resting; /* set by gemm_rest: the workers sleep now instead of spinning */
static const gemm_job *jobs;
static i64 job_count, shares;

static i64 now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (i64)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void run_jobs(const gemm_job *list, i64 first, i64 last) {
    for (i64 j = first; j < last; j++) {
        const gemm_job *g = &list[j];
        sgemm(ROW_MAJOR, g->trans_a ? TRANS : NO_TRANS, g->trans_b ? TRANS : NO_TRANS, g->m, g->n, g->k, g->alpha, g->a,
              g->lda, g->b, g->ldb, g->beta, g->c, g->ldc);
    }
}

static void run_share(i64 share) { run_jobs(jobs, job_count * share / shares, job_count * (share + 1) / shares); }

static _Atomic int busy; /* a run_gemms is under way (another thread's call then runs alone) */

/* In a forked child the workers are gone: its calls run on the caller alone. */
static void forked(void) {
    workers = 0;
    atomic_store(&busy, 0);
    pthread_mutex_init(&lock, NULL);
    pthread_cond_init(&wake, NULL);
}

static long born[MAX_WORKERS + 1]; /* the generation when each worker was made: it waits for the next */

static void *worker(void *arg) {
    i64 index = (i64)(intptr_t)arg;
    long seen = born[index];
    for (;;) {
        i64 start = now_ns();
        while (atomic_load_explicit(&generation, memory_order_acquire) == seen) {
            __builtin_ia32_pause();
            if (atomic_load_explicit(&resting, memory_order_relaxed) || now_ns() - start > SPIN_NS) {
                pthread_mutex_lock(&lock);
                while (atomic_load(&generation) == seen) pthread_cond_wait(&wake, &lock);
                pthread_mutex_unlock(&lock);
            }
        }
        seen = atomic_load_explicit(&generation, memory_order_acquire);
        if (index < shares) {
            run_share(index);
            atomic_fetch_sub_explicit(&pending, 1, memory_order_release);
        }
    }
    return NULL;
}

/* The BLAS to call (numpy's cblas_sgemm) and the workers to have: returns how many there are. */
int gemm_threads(void *blas, int wanted) {
    static int registered;
    pthread_mutex_lock(&lock);
    if (!registered) registered = pthread_atfork(NULL, NULL, forked) == 0;
    sgemm = (sgemm_fn)blas;
    while (workers < wanted && workers < MAX_WORKERS) {
        pthread_t thread;
        born[workers + 1] = atomic_load(&generation);
        if (pthread_create(&thread, NULL, worker, (void *)(intptr_t)(workers + 1)) != 0) break;
        pthread_detach(thread);
        workers++;
    }
    int have = workers;
    pthread_mutex_unlock(&lock);
    return have;
}

/* Run `count` products in `parts` shares (the caller's and parts - 1 workers'); a call made while
 * another runs (another Python thread's executor) runs its products alone on its caller. */
void run_gemms(const gemm_job *list, i64 count, i64 parts) {
    if (parts > workers + 1) parts = workers + 1;
    if (parts <= 1 || atomic_exchange(&busy, 1)) {
        run_jobs(list, 0, count);
        return;
    }
    jobs = list;
    job_count = count;
    shares = parts;
    atomic_store_explicit(&pending, (int)(parts - 1), memory_order_relaxed);
    atomic_store_explicit(&resting, 0, memory_order_relaxed);
    pthread_mutex_lock(&lock);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    run_share(0);
    while (atomic_load_explicit(&pending, memory_order_acquire) > 0) __builtin_ia32_pause();
    atomic_store_explicit(&busy, 0, memory_order_release);
}

/* The workers stop spinning (the caller's other threads are about to need the cores). */
void gemm_rest(void) { atomic_store_explicit(&resting, 1, memory_order_relaxed); }
