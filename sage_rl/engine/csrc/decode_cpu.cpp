// The float32 decode step of a Llama-family model on a CPU, all layers in one call (issue 29).
//
// The same computation as NativeRunner._forward + attention.attend_pooled for one new token per
// row, the rows' caches being slots of one DecodePool: the matrix products are the column-blocked
// products of engine/packed.py (our own few-row loop over the column blocks), and what lay between
// them, ~160 small torch operations a layer, becomes a few loops here: the norms, the rotary
// embedding and the cache write in one pass; attention in one task per (KV head, row), over the
// shared prefix and then the row's own positions, with one softmax over both (a KV head's query
// heads in groups of three, then one or two; scores four keys at a time, eight-lane
// exponentials, the values' sums in registers); the residual adds and
// SiLU(gate) * up read straight out of the blocked products' layout. See docs/LOG.md (2026-12-03,
// 2026-12-04: twenty-seventh to thirtieth sessions) for what it measured.
// The headers it uses, not <torch/extension.h> (all of torch's C++ API): a first build took ~40 s,
// ~16 s with these (g++ -O3, beside a training run; docs/LOG.md 2026-12-07).
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/utils/pybind.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

using at::Tensor;

namespace {

constexpr int64_t BLOCK = 32;  // output columns per block: engine/packed.py's BLOCK

// Element (b, n) of a column-blocked product [N / BLOCK, rows, BLOCK].
inline float blocked(const float* y, int64_t rows, int64_t b, int64_t n) {
  return y[((n / BLOCK) * rows + b) * BLOCK + n % BLOCK];
}

// exp(x) for x <= 0 (scores minus their maximum), vectorisable: 2^n * p(r) with r in
// [-ln2/2, ln2/2] and Cephes' polynomial (about 1 ulp); below -87.3 it returns ~1e-38.
inline float exp_le0(float x) {
  x = x < -87.3f ? -87.3f : x;
  float n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // round to nearest
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &e, sizeof scale);
  return p * scale;
}

void rms_norm(const float* h, const float* w, float* out, int64_t rows, int64_t D, double eps) {
  for (int64_t b = 0; b < rows; ++b) {
    const float* x = h + b * D;
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(x[d]) * x[d];
    const float r = static_cast<float>(1.0 / std::sqrt(ss / D + eps));
    float* o = out + b * D;
    for (int64_t d = 0; d < D; ++d) o[d] = (x[d] * r) * w[d];
  }
}

// exp_le0 on eight lanes, the same operations in the same order (so each lane's result is the scalar one's).
inline __m256 exp8_le0(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  const __m256 shift = _mm256_set1_ps(12582912.f);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), shift), shift);
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(-2.12194440e-4f)));
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// SiLU, g * sigmoid(g), with the exponential of -|g| only (exp_le0's domain): sigmoid is
// 1 / (1 + e) for g >= 0 and e / (1 + e) below.
inline float silu(float g) {
  const float e = exp_le0(-std::fabs(g));
  return g * ((std::signbit(g) ? e : 1.f) / (1.f + e));
}

inline __m256 silu8(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = exp8_le0(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_andnot_ps(_mm256_set1_ps(-0.f), g)));
  return _mm256_mul_ps(g, _mm256_div_ps(_mm256_blendv_ps(one, e, g), _mm256_add_ps(one, e)));
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// The four lanes' sums of a, b, c, d: [sum a, sum b, sum c, sum d].
inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

// In place over n scores of one query head: their softmax.
void softmax(float* s, int64_t n) {
  __m256 mv = _mm256_set1_ps(-INFINITY);
  int64_t l = 0;
  for (; l + 8 <= n; l += 8) mv = _mm256_max_ps(mv, _mm256_loadu_ps(s + l));
  float lanes[8];
  _mm256_storeu_ps(lanes, mv);
  float m = *std::max_element(lanes, lanes + 8);
  for (; l < n; ++l) m = std::max(m, s[l]);
  const __m256 mb = _mm256_set1_ps(m);
  __m256 sv = _mm256_setzero_ps();
  for (l = 0; l + 8 <= n; l += 8) {
    const __m256 e = exp8_le0(_mm256_sub_ps(_mm256_loadu_ps(s + l), mb));
    _mm256_storeu_ps(s + l, e);
    sv = _mm256_add_ps(sv, e);
  }
  float sum = hsum(sv);
  for (; l < n; ++l) { s[l] = exp_le0(s[l] - m); sum += s[l]; }
  const __m256 iv = _mm256_set1_ps(1.f / sum);
  for (l = 0; l + 8 <= n; l += 8) _mm256_storeu_ps(s + l, _mm256_mul_ps(_mm256_loadu_ps(s + l), iv));
  for (; l < n; ++l) s[l] *= 1.f / sum;
}

// A run of n positions of one KV head's cache: keys and values, DH floats each.
struct Span {
  const float* k;
  const float* v;
  int64_t n;
};

// NH (1 to 3) query heads (q[g], DH floats each) against the keys of a span: scores s[g][l].
// Four keys at a time, so that each query vector is loaded once per four keys and the sums of
// the dot products come out of one shuffle tree per head.
template <int DH, int NH>
void scores(const float* const* q, const float* k, int64_t n, float* const* s) {
  int64_t l = 0;
  for (; l + 4 <= n; l += 4) {
    const float* kl = k + l * DH;
    __m256 acc[NH][4];
    for (int g = 0; g < NH; ++g)
      for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_setzero_ps();
    for (int d = 0; d < DH; d += 8) {
      __m256 qd[NH];
      for (int g = 0; g < NH; ++g) qd[g] = _mm256_loadu_ps(q[g] + d);
      for (int j = 0; j < 4; ++j) {
        const __m256 kv = _mm256_loadu_ps(kl + j * DH + d);
        for (int g = 0; g < NH; ++g) acc[g][j] = _mm256_fmadd_ps(qd[g], kv, acc[g][j]);
      }
    }
    for (int g = 0; g < NH; ++g) _mm_storeu_ps(s[g] + l, hsum4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]));
  }
  for (; l < n; ++l) {
    const float* kl = k + l * DH;
    __m256 acc[NH];
    for (int g = 0; g < NH; ++g) acc[g] = _mm256_setzero_ps();
    for (int d = 0; d < DH; d += 8) {
      const __m256 kv = _mm256_loadu_ps(kl + d);
      for (int g = 0; g < NH; ++g) acc[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + d), kv, acc[g]);
    }
    for (int g = 0; g < NH; ++g) s[g][l] = hsum(acc[g]);
  }
}

// Columns d0..d0+31 of NH heads' outputs (o[g]): the value rows of the spans (row stride DH),
// weighted by the heads' probabilities (p[g]: the spans' positions in order). Named accumulators
// (in an array the compiler spilled them at every row); a head past NH costs nothing.
template <int NH>
void values_32(const float* const* p, const Span* spans, int ns, int64_t d0, int64_t DH, float* const* o) {
  const float *pa = p[0], *pb = p[NH > 1 ? 1 : 0], *pc = p[NH > 2 ? 2 : 0];
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
  for (int i = 0; i < ns; ++i) {
    const float* v = spans[i].v + d0;
    for (int64_t l = 0; l < spans[i].n; ++l, v += DH) {
      const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
      const __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
      __m256 w = _mm256_broadcast_ss(pa + l);
      a0 = _mm256_fmadd_ps(w, v0, a0), a1 = _mm256_fmadd_ps(w, v1, a1);
      a2 = _mm256_fmadd_ps(w, v2, a2), a3 = _mm256_fmadd_ps(w, v3, a3);
      if constexpr (NH > 1) {
        w = _mm256_broadcast_ss(pb + l);
        b0 = _mm256_fmadd_ps(w, v0, b0), b1 = _mm256_fmadd_ps(w, v1, b1);
        b2 = _mm256_fmadd_ps(w, v2, b2), b3 = _mm256_fmadd_ps(w, v3, b3);
      }
      if constexpr (NH > 2) {
        w = _mm256_broadcast_ss(pc + l);
        c0 = _mm256_fmadd_ps(w, v0, c0), c1 = _mm256_fmadd_ps(w, v1, c1);
        c2 = _mm256_fmadd_ps(w, v2, c2), c3 = _mm256_fmadd_ps(w, v3, c3);
      }
    }
    pa += spans[i].n, pb += spans[i].n, pc += spans[i].n;
  }
  float* oa = o[0] + d0;
  _mm256_storeu_ps(oa, a0), _mm256_storeu_ps(oa + 8, a1), _mm256_storeu_ps(oa + 16, a2), _mm256_storeu_ps(oa + 24, a3);
  if constexpr (NH > 1) {
    float* ob = o[1] + d0;
    _mm256_storeu_ps(ob, b0), _mm256_storeu_ps(ob + 8, b1), _mm256_storeu_ps(ob + 16, b2), _mm256_storeu_ps(ob + 24, b3);
  }
  if constexpr (NH > 2) {
    float* oc = o[2] + d0;
    _mm256_storeu_ps(oc, c0), _mm256_storeu_ps(oc + 8, c1), _mm256_storeu_ps(oc + 16, c2), _mm256_storeu_ps(oc + 24, c3);
  }
}

// NH query heads (queries q0, DH floats each, one after another) of one KV head over its
// positions in the spans (the shared prefix, then the row's own): scores into sc (NH x the spans'
// length), one softmax per head over all of them, and the heads' outputs (out[g], DH floats).
template <int DH, int NH>
void attend(const float* q0, const Span* spans, int ns, float* sc, float* const* out) {
  int64_t total = 0;
  for (int i = 0; i < ns; ++i) total += spans[i].n;
  const float* q[NH];
  float* s[NH];
  for (int g = 0; g < NH; ++g) q[g] = q0 + g * DH, s[g] = sc + g * total;
  for (int64_t i = 0, at = 0; i < ns; at += spans[i].n, ++i) {
    float* si[NH];
    for (int g = 0; g < NH; ++g) si[g] = s[g] + at;
    scores<DH, NH>(q, spans[i].k, spans[i].n, si);
  }
  for (int g = 0; g < NH; ++g) softmax(s[g], total);
  for (int64_t d0 = 0; d0 < DH; d0 += 32) values_32<NH>(s, spans, ns, d0, DH, out);
}

// Groups of three query heads of one KV head, then the rest (one or two) with as many lanes.
template <int DH>
void attend_group(const float* q0, int gc, const Span* spans, int ns, float* sc, float* const* out) {
  if (gc == 3) attend<DH, 3>(q0, spans, ns, sc, out);
  else if (gc == 2) attend<DH, 2>(q0, spans, ns, sc, out);
  else attend<DH, 1>(q0, spans, ns, sc, out);
}

const float* optional(const Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }

// The products of column blocks are our own loop (x86-64-v3 and v4 builds): a block read as it lies,
// every weight once per pass of R rows. MKL's AVX2 path packs each block into a buffer at every call
// (a fifth of a step's cycles on a Zen 3), and on a Zen 4 its AVX-512 path took 21.9 ms for the
// products of an 8-row step against 10.5 ms for this loop, eight rows a pass (docs/LOG.md, 2026-12-04
// and 2026-12-05). Each output column is summed over k in order, one fused multiply-add at a time, in
// both builds, so the AVX-512 and AVX2 builds give the same bits.
// The vector registers of the build: 16 lanes (32 registers) with AVX-512, 8 (16 registers) with AVX2.
#if defined(__AVX512F__)
struct Lanes {
  using V = __m512;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};
constexpr int ROWS = 8;  // rows per pass over a block: 16 accumulators of the 32 registers
#else
struct Lanes {
  using V = __m256;
  static constexpr int W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
};
constexpr int ROWS = 2;  // 8 accumulators, 4 weight vectors and a broadcast of the 16 registers
#endif

// R rows (x [R, K], row stride K) times one column block w [K, BLOCK]: y [R, BLOCK] (row stride
// BLOCK), the 32 columns in BLOCK / W accumulators per row, every weight read once per R rows.
template <int R>
void rows_times_block(const float* x, int64_t K, const float* w, float* y) {
  constexpr int C = BLOCK / Lanes::W;
  Lanes::V a[R][C], wv[C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = Lanes::zero();
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * BLOCK;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 12 * BLOCK), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk + 12 * BLOCK + 16), _MM_HINT_T0);
    for (int c = 0; c < C; ++c) wv[c] = Lanes::load(wk + c * Lanes::W);
    for (int r = 0; r < R; ++r) {
      const Lanes::V xb = Lanes::set1(x[r * K + k]);
      for (int c = 0; c < C; ++c) a[r][c] = Lanes::fma(xb, wv[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) Lanes::store(y + r * BLOCK + c * Lanes::W, a[r][c]);
}

// x [B, K] times column blocks w [N / BLOCK, K, BLOCK]: the blocked product [N / BLOCK, B, BLOCK],
// ROWS rows a pass over each block (the rest in passes of four, two, one), the blocks split among
// the threads.
template <int R>
void rows_pass(const float* x, int64_t K, const float* w, float* y, int64_t& r, int64_t B) {
  for (; r + R <= B; r += R) rows_times_block<R>(x + r * K, K, w, y + r * BLOCK);
}

Tensor blocked_product(const Tensor& x, const Tensor& w) {
  const int64_t B = x.size(0), K = x.size(1), nb = w.size(0);
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && w.size(1) == K && w.size(2) == BLOCK,
              "blocked_product: x [B, K] and blocks [N / ", BLOCK, ", K, ", BLOCK, "], contiguous");
  Tensor y = at::empty({nb, B, BLOCK}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, nb, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const float* wj = wp + j * K * BLOCK;
      float* yj = yp + j * B * BLOCK;
      int64_t r = 0;
      rows_pass<ROWS>(xp, K, wj, yj, r, B);
      if constexpr (ROWS > 4) rows_pass<4>(xp, K, wj, yj, r, B);
      if constexpr (ROWS > 2) rows_pass<2>(xp, K, wj, yj, r, B);
      rows_pass<1>(xp, K, wj, yj, r, B);
    }
  });
  return y;
}

}  // namespace

// h [B, D] float32, updated in place and returned. w: per layer 8 tensors, in order in_norm,
// post_norm, qkv blocks, qkv bias (or empty), o blocks, o bias (or empty), gate|up blocks, down
// blocks. pool: DecodePool.kv [layers, 2, slots, KV, capacity, Dh]; cos, sin [B, Dh]; slots, pos
// [B] int64 (row b's slot, and the position its new token takes); the first P positions are the
// same in every row and read from slot `source`. H query heads; queries scaled by `scaling`.
Tensor decode_layers(Tensor h, const std::vector<Tensor>& w, Tensor pool, Tensor cos, Tensor sin,
                     Tensor slots_t, Tensor pos_t, int64_t P, int64_t source, int64_t H, double eps,
                     double scaling) {
  const int64_t B = h.size(0), D = h.size(1), layers = pool.size(0), slot_count = pool.size(2);
  const int64_t KV = pool.size(3), C = pool.size(4), Dh = pool.size(5), G = H / KV, half = Dh / 2;
  TORCH_CHECK(Dh == 64 || Dh == 128, "decode_layers: head_dim ", Dh, " (64 or 128 supported)");
  TORCH_CHECK(static_cast<int64_t>(w.size()) == 8 * layers, "decode_layers: 8 tensors a layer");
  const int64_t* slots = slots_t.data_ptr<int64_t>();
  const int64_t* pos = pos_t.data_ptr<int64_t>();
  int64_t S = 0, L = 0;
  for (int64_t b = 0; b < B; ++b) {
    S = std::max(S, slots[b] + 1);
    L = std::max(L, pos[b] + 1);
  }
  const auto opt = h.options();
  Tensor x = at::empty({B, D}, opt), a = at::empty({B, H * Dh}, opt);
  Tensor q_own = at::empty({S * KV, G, Dh}, opt);           // by (slot, head)
  float* hp = h.data_ptr<float>();
  float* ap = a.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t slot_stride = KV * C * Dh, half_stride = slot_count * slot_stride;
  std::vector<float> r(Dh);
  for (int64_t i = 0; i < layers; ++i) {
    const Tensor* lw = &w[i * 8];
    Tensor layer_kv = pool[i];
    float* kv = layer_kv.data_ptr<float>();
    // queries (rotated, scaled) in both layouts; keys (rotated) and values into the pool
    rms_norm(hp, lw[0].data_ptr<float>(), x.data_ptr<float>(), B, D, eps);
    Tensor y = blocked_product(x, lw[2]);
    const float* yp = y.data_ptr<float>();
    const float* bias = optional(lw[3]);
    float* qo = q_own.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      const float *cb = cp + b * Dh, *sb = sp + b * Dh;
      const int64_t s = slots[b];
      for (int64_t head = 0; head < H + 2 * KV; ++head) {
        for (int64_t d = 0; d < Dh; ++d) {
          const int64_t n = head * Dh + d;
          r[d] = blocked(yp, B, b, n) + (bias ? bias[n] : 0.f);
        }
        if (head < H + KV) {  // rotate_half form: x * cos + rotated * sin
          float t[256];
          for (int64_t d = 0; d < Dh; ++d) t[d] = r[d] * cb[d] + (d < half ? -r[d + half] : r[d - half]) * sb[d];
          std::copy(t, t + Dh, r.begin());
        }
        if (head < H) {
          const int64_t k = head / G, g = head % G;
          float* d1 = qo + ((s * KV + k) * G + g) * Dh;
          for (int64_t d = 0; d < Dh; ++d) d1[d] = r[d] * static_cast<float>(scaling);
        } else {
          const bool value = head >= H + KV;
          const int64_t k = head - H - (value ? KV : 0);
          float* dst = kv + (value ? half_stride : 0) + s * slot_stride + (k * C + pos[b]) * Dh;
          std::copy(r.begin(), r.end(), dst);
        }
      }
    }
    // attention, one task per (KV head, row): the KV head's shared prefix (read from slot `source`,
    // the same for every row, so that the tasks of one KV head, run together, find it in cache),
    // then the row's own positions
    at::parallel_for(0, KV * B, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> sc(3 * L);
      for (int64_t task = begin; task < end; ++task) {
        const int64_t k = task / B, b = task % B, s = slots[b];
        const int64_t shared_at = source * slot_stride + k * C * Dh, own_at = s * slot_stride + (k * C + P) * Dh;
        const Span spans[2] = {{kv + shared_at, kv + half_stride + shared_at, P},
                               {kv + own_at, kv + half_stride + own_at, pos[b] + 1 - P}};
        for (int64_t g0 = 0; g0 < G; g0 += 3) {
          const int gc = static_cast<int>(std::min<int64_t>(3, G - g0));
          const float* q0 = qo + ((s * KV + k) * G + g0) * Dh;
          float* out[3];
          for (int j = 0; j < gc; ++j) out[j] = ap + b * H * Dh + (k * G + g0 + j) * Dh;
          if (Dh == 64) attend_group<64>(q0, gc, spans + (P ? 0 : 1), P ? 2 : 1, sc.data(), out);
          else attend_group<128>(q0, gc, spans + (P ? 0 : 1), P ? 2 : 1, sc.data(), out);
        }
      }
    });
    // o projection and the residual
    Tensor yo = blocked_product(a, lw[4]);
    const float* yop = yo.data_ptr<float>();
    const float* ob = optional(lw[5]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < D; ++n) hp[b * D + n] += blocked(yop, B, b, n) + (ob ? ob[n] : 0.f);
    // the MLP and its residual
    rms_norm(hp, lw[1].data_ptr<float>(), x.data_ptr<float>(), B, D, eps);
    Tensor yg = blocked_product(x, lw[6]);
    const int64_t I = yg.size(0) * BLOCK / 2;
    const float* ygp = yg.data_ptr<float>();
    Tensor m = at::empty({B, I}, opt);
    float* mp = m.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b) {
      int64_t j = 0;
      if (I % BLOCK == 0)  // eight columns at a time, within one block of gate and one of up
        for (; j < I; j += 8)
          _mm256_storeu_ps(mp + b * I + j, _mm256_mul_ps(silu8(_mm256_loadu_ps(&ygp[((j / BLOCK) * B + b) * BLOCK + j % BLOCK])),
                                                         _mm256_loadu_ps(&ygp[(((I + j) / BLOCK) * B + b) * BLOCK + j % BLOCK])));
      for (; j < I; ++j) mp[b * I + j] = silu(blocked(ygp, B, b, j)) * blocked(ygp, B, b, I + j);
    }
    Tensor yd = blocked_product(m, lw[7]);
    const float* ydp = yd.data_ptr<float>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t n = 0; n < D; ++n) hp[b * D + n] += blocked(ydp, B, b, n);
  }
  return h;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // Without the GIL, as torch's own operations run: a step is tens of milliseconds.
  m.def("decode_layers", &decode_layers, "A float32 decode step over a DecodePool (decode_cpu.cpp)",
        pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("blocked_product", &blocked_product, "x [B, K] times column blocks [N / 32, K, 32]",
        pybind11::call_guard<pybind11::gil_scoped_release>());
}
