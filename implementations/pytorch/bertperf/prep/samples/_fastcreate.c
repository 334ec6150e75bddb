/* C fast path of bertperf.prep.instances.create_instances (same algorithm, same output).
 *
 * The random stream is CPython's: MT19937 whose state is copied from random.Random(seed).getstate(),
 * with random(), getrandbits()-based _randbelow(), randint() and shuffle() written as in
 * Modules/_randommodule.c and Lib/random.py (unchanged from Python 3.7 to 3.13 for these calls).
 * instances.py is the readable statement of the algorithm; tests check both give identical output.
 *
 * Inputs are buffers (int32 tokens, int64 offsets, 625 uint32 of RNG state); outputs are bytes
 * objects that numpy wraps without copying. No numpy headers are needed to build this.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- CPython's MT19937 ------------------------------------------------------------------------ */
#define MT_N 624
#define MT_M 397

typedef struct {
    uint32_t mt[MT_N];
    int index;
} Rng;

static uint32_t genrand_uint32(Rng *r) {
    static const uint32_t mag01[2] = {0x0U, 0x9908b0dfU};
    uint32_t y;
    uint32_t *mt = r->mt;
    if (r->index >= MT_N) {
        int kk;
        for (kk = 0; kk < MT_N - MT_M; kk++) {
            y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
            mt[kk] = mt[kk + MT_M] ^ (y >> 1) ^ mag01[y & 0x1U];
        }
        for (; kk < MT_N - 1; kk++) {
            y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
            mt[kk] = mt[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 0x1U];
        }
        y = (mt[MT_N - 1] & 0x80000000U) | (mt[0] & 0x7fffffffU);
        mt[MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 0x1U];
        r->index = 0;
    }
    y = mt[r->index++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680U;
    y ^= (y << 15) & 0xefc60000U;
    y ^= (y >> 18);
    return y;
}

/* random.random(): 53-bit double from two draws */
static double rng_random(Rng *r) {
    uint32_t a = genrand_uint32(r) >> 5, b = genrand_uint32(r) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

/* random._randbelow_with_getrandbits(n), n >= 1 and n < 2**32 */
static uint32_t rng_below(Rng *r, uint32_t n) {
    int shift = __builtin_clz(n);  /* 32 - n.bit_length() */
    uint32_t x;
    do { x = genrand_uint32(r) >> shift; } while (x >= n);
    return x;
}

/* random.randint(a, b), a <= b */
static int64_t rng_randint(Rng *r, int64_t a, int64_t b) { return a + rng_below(r, (uint32_t)(b - a + 1)); }

/* random.shuffle(x) on an int64 array */
static void rng_shuffle64(Rng *r, int64_t *x, int64_t n) {
    for (int64_t i = n - 1; i >= 1; i--) {
        int64_t j = rng_below(r, (uint32_t)(i + 1));
        int64_t t = x[i]; x[i] = x[j]; x[j] = t;
    }
}

static void rng_shuffle32(Rng *r, int32_t *x, int64_t n) {
    for (int64_t i = n - 1; i >= 1; i--) {
        int64_t j = rng_below(r, (uint32_t)(i + 1));
        int32_t t = x[i]; x[i] = x[j]; x[j] = t;
    }
}

/* ---- growable output arrays ------------------------------------------------------------------- */
typedef struct {
    char *data;
    size_t len, cap, item;
} Vec;

static int vec_reserve(Vec *v, size_t extra) {
    if (v->len + extra <= v->cap) return 0;
    size_t cap = v->cap ? v->cap : 1024;
    while (cap < v->len + extra) cap *= 2;
    char *p = realloc(v->data, cap * v->item);
    if (!p) return -1;
    v->data = p;
    v->cap = cap;
    return 0;
}

#define VEC_PUSH(v, T, value)                                  \
    do {                                                       \
        if (vec_reserve(&(v), 1)) goto nomem;                  \
        ((T *)(v).data)[(v).len++] = (T)(value);               \
    } while (0)

/* ---- the algorithm ---------------------------------------------------------------------------- */
typedef struct {
    const int32_t *tokens;
    const int64_t *sent_off;  /* n_sent + 1 */
    const int64_t *doc_off;   /* n_docs + 1, in sentences */
    int64_t *doc_order;       /* shuffled document list: position -> original document */
    int64_t n_docs;
    int max_seq_length, max_pred, dupe_factor;
    double masked_lm_prob, short_seq_prob;
    int32_t cls, sep, mask, vocab_size;
    Rng rng;
    /* scratch */
    int32_t *a, *b, *inst, *cand;
    int64_t *picked;
    /* outputs */
    Vec tok, off, alen, nsp, mpos, mlab, moff;
} Ctx;

static int64_t doc_first(Ctx *c, int64_t d) { return c->doc_off[c->doc_order[d]]; }
static int64_t doc_nsent(Ctx *c, int64_t d) {
    int64_t o = c->doc_order[d];
    return c->doc_off[o + 1] - c->doc_off[o];
}
static int64_t sent_len(Ctx *c, int64_t s) { return c->sent_off[s + 1] - c->sent_off[s]; }

static int cmp_i64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

/* Masks c->inst[0..n) in place and appends the instance to the outputs. */
static int emit(Ctx *c, int64_t n, int64_t a_len, int is_random_next) {
    int64_t nc = 0;
    for (int64_t k = 1; k < n - 1; k++)
        if (k != a_len + 1) c->cand[nc++] = (int32_t)k;
    rng_shuffle32(&c->rng, c->cand, nc);
    int64_t want = (int64_t)nearbyint((double)n * c->masked_lm_prob);  /* half to even, as round() */
    if (want < 1) want = 1;
    if (want > c->max_pred) want = c->max_pred;
    if (want > nc) want = nc;
    for (int64_t m = 0; m < want; m++) {
        int32_t idx = c->cand[m];
        int32_t original = c->inst[idx];
        if (rng_random(&c->rng) < 0.8) {
            c->inst[idx] = c->mask;
        } else if (rng_random(&c->rng) < 0.5) {
            /* keep */
        } else {
            c->inst[idx] = (int32_t)rng_randint(&c->rng, 0, c->vocab_size - 1);
        }
        c->picked[m] = ((int64_t)idx << 32) | (uint32_t)original;  /* sort by position */
    }
    qsort(c->picked, (size_t)want, sizeof(int64_t), cmp_i64);
    if (vec_reserve(&c->tok, (size_t)n)) goto nomem;
    memcpy((int32_t *)c->tok.data + c->tok.len, c->inst, (size_t)n * sizeof(int32_t));
    c->tok.len += (size_t)n;
    VEC_PUSH(c->off, int64_t, c->tok.len);
    VEC_PUSH(c->alen, int32_t, a_len);
    VEC_PUSH(c->nsp, int8_t, is_random_next);
    for (int64_t m = 0; m < want; m++) {
        VEC_PUSH(c->mpos, int32_t, c->picked[m] >> 32);
        VEC_PUSH(c->mlab, int32_t, (int32_t)(uint32_t)(c->picked[m] & 0xffffffffU));
    }
    VEC_PUSH(c->moff, int64_t, c->mpos.len);
    return 0;
nomem:
    return -1;
}

static int64_t append_sents(Ctx *c, int32_t *dst, int64_t len, int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; s++) {
        int64_t l = sent_len(c, s);
        memcpy(dst + len, c->tokens + c->sent_off[s], (size_t)l * sizeof(int32_t));
        len += l;
    }
    return len;
}

static int from_document(Ctx *c, int64_t di) {
    int64_t nsent = doc_nsent(c, di), first = doc_first(c, di);
    int64_t max_num_tokens = c->max_seq_length - 3;
    int64_t target = max_num_tokens;
    if (rng_random(&c->rng) < c->short_seq_prob) target = rng_randint(&c->rng, 2, max_num_tokens);

    int64_t chunk_begin = 0, chunk_n = 0, current_length = 0;
    for (int64_t i = 0; i < nsent; i++) {
        chunk_n++;
        current_length += sent_len(c, first + i);
        if (!(i == nsent - 1 || current_length >= target)) continue;
        int64_t a_end = chunk_n >= 2 ? rng_randint(&c->rng, 1, chunk_n - 1) : 1;
        /* A and B are built in scratch buffers large enough for any sentence span: the caller sized
           them to the longest document/whole corpus span we can copy (see create_instances). */
        int64_t la = append_sents(c, c->a, 0, first + chunk_begin, first + chunk_begin + a_end);
        int64_t lb = 0;
        int is_random_next = chunk_n == 1 || rng_random(&c->rng) < 0.5;
        if (is_random_next) {
            int64_t target_b = target - la;
            int64_t rdi = 0;
            for (int t = 0; t < 10; t++) {
                rdi = rng_randint(&c->rng, 0, c->n_docs - 1);
                if (rdi != di) break;
            }
            int64_t rn = doc_nsent(c, rdi), rfirst = doc_first(c, rdi);
            int64_t rstart = rng_randint(&c->rng, 0, rn - 1);
            for (int64_t j = rstart; j < rn; j++) {
                lb = append_sents(c, c->b, lb, rfirst + j, rfirst + j + 1);
                if (lb >= target_b) break;
            }
            i -= chunk_n - a_end;
        } else {
            lb = append_sents(c, c->b, 0, first + chunk_begin + a_end, first + chunk_begin + chunk_n);
        }
        /* truncate_seq_pair: windows [alo, ahi) and [blo, bhi) */
        int64_t alo = 0, ahi = la, blo = 0, bhi = lb;
        while ((ahi - alo) + (bhi - blo) > max_num_tokens) {
            int trunc_a = (ahi - alo) > (bhi - blo);
            if (rng_random(&c->rng) < 0.5) {
                if (trunc_a) alo++; else blo++;
            } else {
                if (trunc_a) ahi--; else bhi--;
            }
        }
        int64_t n = 0, na = ahi - alo, nb = bhi - blo;
        c->inst[n++] = c->cls;
        memcpy(c->inst + n, c->a + alo, (size_t)na * sizeof(int32_t));
        n += na;
        c->inst[n++] = c->sep;
        memcpy(c->inst + n, c->b + blo, (size_t)nb * sizeof(int32_t));
        n += nb;
        c->inst[n++] = c->sep;
        if (emit(c, n, na, is_random_next)) return -1;
        chunk_begin = i + 1;
        chunk_n = 0;
        current_length = 0;
    }
    return 0;
}

static PyObject *vec_bytes(Vec *v) {
    return PyBytes_FromStringAndSize(v->data ? v->data : "", (Py_ssize_t)(v->len * v->item));
}

static PyObject *create_instances(PyObject *self, PyObject *args) {
    Py_buffer tok = {0}, soff = {0}, doff = {0}, state = {0};
    int max_seq_length, max_pred, dupe_factor, cls, sep, mask, vocab_size;
    double masked_lm_prob, short_seq_prob;
    PyObject *result = NULL;
    Ctx c;
    memset(&c, 0, sizeof(c));
    if (!PyArg_ParseTuple(args, "y*y*y*y*iididiiii", &tok, &soff, &doff, &state, &max_seq_length,
                          &max_pred, &masked_lm_prob, &dupe_factor, &short_seq_prob, &cls, &sep,
                          &mask, &vocab_size))
        return NULL;
    if (state.len != (MT_N + 1) * 4 || doff.len < 16 || max_seq_length < 5 || vocab_size < 1) {
        PyErr_SetString(PyExc_ValueError, "bad arguments to _fastcreate.create_instances");
        goto done;
    }
    c.tokens = tok.buf;
    c.sent_off = soff.buf;
    c.doc_off = doff.buf;
    c.n_docs = doff.len / 8 - 1;
    c.max_seq_length = max_seq_length;
    c.max_pred = max_pred;
    c.dupe_factor = dupe_factor;
    c.masked_lm_prob = masked_lm_prob;
    c.short_seq_prob = short_seq_prob;
    c.cls = cls; c.sep = sep; c.mask = mask; c.vocab_size = vocab_size;
    memcpy(c.rng.mt, state.buf, MT_N * 4);
    c.rng.index = (int)((const uint32_t *)state.buf)[MT_N];
    c.tok.item = 4; c.off.item = 8; c.alen.item = 4; c.nsp.item = 1;
    c.mpos.item = 4; c.mlab.item = 4; c.moff.item = 8;

    /* A can hold a whole document and B the tail of one; before truncation both can be longer than
       max_seq_length (a single long sentence), so size the scratch to the longest document. */
    int64_t longest = 0;
    for (int64_t d = 0; d < c.n_docs; d++) {
        int64_t len = c.sent_off[c.doc_off[d + 1]] - c.sent_off[c.doc_off[d]];
        if (len > longest) longest = len;
    }
    c.doc_order = malloc((size_t)c.n_docs * sizeof(int64_t));
    c.a = malloc((size_t)(longest + 1) * sizeof(int32_t));
    c.b = malloc((size_t)(longest + 1) * sizeof(int32_t));
    c.inst = malloc((size_t)(max_seq_length + 1) * sizeof(int32_t));
    c.cand = malloc((size_t)(max_seq_length + 1) * sizeof(int32_t));
    c.picked = malloc((size_t)(max_seq_length + 1) * sizeof(int64_t));
    if (!c.doc_order || !c.a || !c.b || !c.inst || !c.cand || !c.picked) goto nomem;
    for (int64_t d = 0; d < c.n_docs; d++) c.doc_order[d] = d;
    if (vec_reserve(&c.off, 1) || vec_reserve(&c.moff, 1)) goto nomem;
    ((int64_t *)c.off.data)[c.off.len++] = 0;
    ((int64_t *)c.moff.data)[c.moff.len++] = 0;

    int failed = 0;
    int64_t n_inst = 0;
    Vec order = {0};
    order.item = 8;
    Py_BEGIN_ALLOW_THREADS
    rng_shuffle64(&c.rng, c.doc_order, c.n_docs);
    for (int dupe = 0; dupe < dupe_factor && !failed; dupe++)
        for (int64_t d = 0; d < c.n_docs && !failed; d++)
            failed = from_document(&c, d) != 0;
    n_inst = (int64_t)c.alen.len;
    if (!failed && !vec_reserve(&order, (size_t)n_inst + 1)) {
        for (int64_t i = 0; i < n_inst; i++) ((int64_t *)order.data)[i] = i;
        order.len = (size_t)n_inst;
        rng_shuffle64(&c.rng, (int64_t *)order.data, n_inst);
    } else {
        failed = 1;
    }
    Py_END_ALLOW_THREADS
    if (failed) { free(order.data); goto nomem; }
    result = Py_BuildValue("(NNNNNNNN)", vec_bytes(&c.tok), vec_bytes(&c.off), vec_bytes(&c.alen),
                           vec_bytes(&c.nsp), vec_bytes(&c.mpos), vec_bytes(&c.mlab),
                           vec_bytes(&c.moff), vec_bytes(&order));
    free(order.data);
    goto done;
nomem:
    PyErr_NoMemory();
done:
    free(c.doc_order); free(c.a); free(c.b); free(c.inst); free(c.cand); free(c.picked);
    free(c.tok.data); free(c.off.data); free(c.alen.data); free(c.nsp.data);
    free(c.mpos.data); free(c.mlab.data); free(c.moff.data);
    PyBuffer_Release(&tok); PyBuffer_Release(&soff); PyBuffer_Release(&doff); PyBuffer_Release(&state);
    return result;
}

static PyMethodDef methods[] = {
    {"create_instances", create_instances, METH_VARARGS,
     "create_instances(tokens, sent_offsets, doc_offsets, state, max_seq_length, max_pred, "
     "masked_lm_prob, dupe_factor, short_seq_prob, cls, sep, mask, vocab_size) -> 8 bytes objects"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastcreate", NULL, -1, methods};

PyMODINIT_FUNC PyInit__fastcreate(void) { return PyModule_Create(&module); }
