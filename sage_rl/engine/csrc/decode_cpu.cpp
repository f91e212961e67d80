// The float32 decode step of a Llama-family model on a CPU, all layers in one call (issue 29).
//
// The same computation as NativeRunner._forward + attention.attend_pooled for one new token per
// row, the rows' caches being slots of one DecodePool: the matrix products stay torch's (the
// column-blocked products of engine/packed.py, at their weights' bandwidth already), and what lay
// between them, ~160 small torch operations a layer, becomes a few loops here: the norms, the
// rotary embedding and the cache write in one pass, each row's own positions' attention with the
// softmax over [shared prefix | own positions] in one task per (row, KV head), the residual adds
// and SiLU(gate) * up read straight out of the blocked products' layout. See docs/LOG.md
// (2026-12-03, twenty-seventh session) for what it measured.
#include <torch/extension.h>
#include <ATen/Parallel.h>

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

// In place over [shared (P) | own (n)] scores of one query head: their softmax.
void softmax2(float* shared, int64_t P, float* own, int64_t n) {
  float m = -INFINITY;
#pragma omp simd reduction(max : m)
  for (int64_t l = 0; l < P; ++l) m = shared[l] > m ? shared[l] : m;
#pragma omp simd reduction(max : m)
  for (int64_t l = 0; l < n; ++l) m = own[l] > m ? own[l] : m;
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t l = 0; l < P; ++l) { float e = exp_le0(shared[l] - m); shared[l] = e; sum += e; }
#pragma omp simd reduction(+ : sum)
  for (int64_t l = 0; l < n; ++l) { float e = exp_le0(own[l] - m); own[l] = e; sum += e; }
  const float inv = 1.f / sum;
#pragma omp simd
  for (int64_t l = 0; l < P; ++l) shared[l] *= inv;
#pragma omp simd
  for (int64_t l = 0; l < n; ++l) own[l] *= inv;
}

// Up to three query heads (gc) of one KV head over one row's own n positions (keys kp, values vp,
// DH floats each): scores, the softmax with the shared prefix's scores (shared[g], P each, turned
// into probabilities in place), and the own positions' share of the output (out[g]).
template <int DH>
void own_heads(const float* q0, const float* kp, const float* vp, int64_t n, float* const* shared,
               int64_t P, int gc, float* sc, float* const* out) {
  const float* qa = q0;
  const float* qb = q0 + (gc > 1 ? DH : 0);
  const float* qc = q0 + (gc > 2 ? 2 * DH : 0);
  for (int64_t l = 0; l < n; ++l) {  // each key read once for the three heads
    const float* k = kp + l * DH;
    float d0 = 0.f, d1 = 0.f, d2 = 0.f;
#pragma omp simd reduction(+ : d0, d1, d2)
    for (int d = 0; d < DH; ++d) { d0 += qa[d] * k[d]; d1 += qb[d] * k[d]; d2 += qc[d] * k[d]; }
    sc[l] = d0;
    sc[n + l] = d1;
    sc[2 * n + l] = d2;
  }
  for (int g = 0; g < gc; ++g) softmax2(shared[g], P, sc + g * n, n);
  float a0[DH] = {0}, a1[DH] = {0}, a2[DH] = {0};
  for (int64_t l = 0; l < n; ++l) {  // each value read once for the three heads
    const float* v = vp + l * DH;
    const float p0 = sc[l], p1 = sc[n + l], p2 = sc[2 * n + l];
#pragma omp simd
    for (int d = 0; d < DH; ++d) { a0[d] += p0 * v[d]; a1[d] += p1 * v[d]; a2[d] += p2 * v[d]; }
  }
  std::copy(a0, a0 + DH, out[0]);
  if (gc > 1) std::copy(a1, a1 + DH, out[1]);
  if (gc > 2) std::copy(a2, a2 + DH, out[2]);
}

const float* optional(const Tensor& t) { return t.numel() ? t.data_ptr<float>() : nullptr; }

// Built for AVX2 without AVX-512 (x86-64-v3): the products of column blocks are our own loop.
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define SAGE_OWN_PRODUCT 1
#endif

#ifdef SAGE_OWN_PRODUCT
// R rows (x [R, K], row stride K) times one column block w [K, BLOCK]: y [R, BLOCK] (row stride
// BLOCK), the 32 columns in four 8-wide accumulators per row, every weight read once per R rows.
template <int R>
void rows_times_block(const float* x, int64_t K, const float* w, float* y) {
  __m256 a[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) a[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * BLOCK;
    _mm_prefetch(reinterpret_cast<const char*>(wk + 12 * BLOCK), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wk + 12 * BLOCK + 16), _MM_HINT_T0);
    const __m256 w0 = _mm256_loadu_ps(wk), w1 = _mm256_loadu_ps(wk + 8);
    const __m256 w2 = _mm256_loadu_ps(wk + 16), w3 = _mm256_loadu_ps(wk + 24);
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * K + k);
      a[r][0] = _mm256_fmadd_ps(xb, w0, a[r][0]);
      a[r][1] = _mm256_fmadd_ps(xb, w1, a[r][1]);
      a[r][2] = _mm256_fmadd_ps(xb, w2, a[r][2]);
      a[r][3] = _mm256_fmadd_ps(xb, w3, a[r][3]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(y + r * BLOCK + c * 8, a[r][c]);
}
#endif

// x [B, K] times column blocks w [N / BLOCK, K, BLOCK]: the blocked product [N / BLOCK, B, BLOCK].
// With AVX-512, torch's matmul (MKL's kernels are at the weights' bandwidth there). With AVX2 only,
// two rows at a time over each block, the blocks split among the threads: MKL's AVX2 path packs
// each block into a buffer at every call, a fifth of a step's cycles on a Zen 3 (docs/LOG.md,
// 2026-12-04), where a block read as it lies needs no copy.
Tensor blocked_product(const Tensor& x, const Tensor& w) {
#ifdef SAGE_OWN_PRODUCT
  const int64_t B = x.size(0), K = x.size(1), nb = w.size(0);
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous() && w.size(1) == K && w.size(2) == BLOCK,
              "blocked_product: x [B, K] and blocks [N / ", BLOCK, ", K, ", BLOCK, "], contiguous");
  Tensor y = at::empty({nb, B, BLOCK}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, nb, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      int64_t r = 0;
      for (; r + 2 <= B; r += 2) rows_times_block<2>(xp + r * K, K, wp + j * K * BLOCK, yp + (j * B + r) * BLOCK);
      if (r < B) rows_times_block<1>(xp + r * K, K, wp + j * K * BLOCK, yp + (j * B + r) * BLOCK);
    }
  });
  return y;
#else
  return at::matmul(x, w);
#endif
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
  Tensor q_sh = at::zeros({KV, S * G, Dh}, opt);            // by (KV head, slot, group)
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
    float* qs = q_sh.data_ptr<float>();
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
          float* d2 = qs + ((k * S + s) * G + g) * Dh;
          for (int64_t d = 0; d < Dh; ++d) d1[d] = d2[d] = r[d] * static_cast<float>(scaling);
        } else {
          const bool value = head >= H + KV;
          const int64_t k = head - H - (value ? KV : 0);
          float* dst = kv + (value ? half_stride : 0) + s * slot_stride + (k * C + pos[b]) * Dh;
          std::copy(r.begin(), r.end(), dst);
        }
      }
    }
    // the shared prefix: all rows' queries of a KV head against its keys, one product
    Tensor s_sh;
    float* ss = nullptr;
    if (P) {
      s_sh = at::bmm(q_sh, layer_kv[0][source].narrow(1, 0, P).transpose(1, 2));  // [KV, S*G, P]
      ss = s_sh.data_ptr<float>();
    }
    // each row's own positions, one task per (row, KV head)
    at::parallel_for(0, B * KV, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> sc(3 * (L - P + 1));
      float none[1] = {0.f};
      for (int64_t task = begin; task < end; ++task) {
        const int64_t b = task / KV, k = task % KV, s = slots[b], n = pos[b] + 1 - P;
        const float* kp = kv + s * slot_stride + (k * C + P) * Dh;
        const float* vp = kv + half_stride + s * slot_stride + (k * C + P) * Dh;
        for (int64_t g0 = 0; g0 < G; g0 += 3) {
          const int gc = static_cast<int>(std::min<int64_t>(3, G - g0));
          const float* q0 = q_own.data_ptr<float>() + ((s * KV + k) * G + g0) * Dh;
          float *shared[3], *out[3];
          for (int j = 0; j < 3; ++j) {
            const int64_t g = g0 + std::min(j, gc - 1);
            shared[j] = P ? ss + ((k * S + s) * G + g) * P : none;
            out[j] = ap + b * H * Dh + (k * G + g) * Dh;
          }
          if (Dh == 64) own_heads<64>(q0, kp, vp, n, shared, P, gc, sc.data(), out);
          else own_heads<128>(q0, kp, vp, n, shared, P, gc, sc.data(), out);
        }
      }
    });
    if (P) {  // the shared prefix's values, added to the own positions' share
      Tensor o_sh = at::bmm(s_sh, layer_kv[1][source].narrow(1, 0, P));  // [KV, S*G, Dh]
      const float* os = o_sh.data_ptr<float>();
      for (int64_t b = 0; b < B; ++b)
        for (int64_t head = 0; head < H; ++head) {
          const float* add = os + (((head / G) * S + slots[b]) * G + head % G) * Dh;
          float* dst = ap + (b * H + head) * Dh;
          for (int64_t d = 0; d < Dh; ++d) dst[d] += add[d];
        }
    }
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
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < I; ++j) {
        const float gate = blocked(ygp, B, b, j), up = blocked(ygp, B, b, I + j);
        mp[b * I + j] = (gate / (1.f + std::exp(-gate))) * up;
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
