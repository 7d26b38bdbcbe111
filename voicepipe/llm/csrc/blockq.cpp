// Block-quantized weights and a fused decoder layer for the CPU (AVX-512), built at first use by blockq.py.
//
// A weight matrix [out, in] is stored in blocks of 32 inputs, each with its own scale d and offset m: w = d * q + m
// with 4-bit codes q in 0..15, two a byte (inputs 0-15 in the low nibbles, 16-31 in the high ones, as GGUF's Q4_1
// lays them out). Products and sums are float32, so a model whose weights came from such blocks is multiplied
// exactly.
//
// Each output row's sums are taken in one fixed order whatever the number of rows in the call, so a row's result
// does not depend on the other rows of a step: batching and speculation give the same tokens.

#include <ATen/Parallel.h>
#include <immintrin.h>
#include <torch/extension.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace {

constexpr int kBlock = 32;

struct Blocks {
  const uint8_t* codes;
  const float* scale;
  const float* offset;
  int64_t out, in;
};

Blocks blocks_of(const std::vector<torch::Tensor>& w) {
  TORCH_CHECK(w.size() == 3, "block weights: (codes, scales, offsets)");
  const auto& scale = w[1];
  TORCH_CHECK(scale.dtype() == torch::kFloat32 && scale.is_contiguous() && scale.dim() == 2, "scales: [out, in/32]");
  const int64_t out = scale.size(0), in = scale.size(1) * kBlock;
  TORCH_CHECK(w[0].dtype() == torch::kUInt8 && w[0].is_contiguous() && w[0].numel() == out * in / 2,
              "codes: uint8 [out, in/2]");
  TORCH_CHECK(w[2].dtype() == torch::kFloat32 && w[2].is_contiguous() && w[2].numel() == scale.numel(),
              "offsets: float32 like the scales");
  return {w[0].data_ptr<uint8_t>(), scale.data_ptr<float>(), w[2].data_ptr<float>(), out, in};
}

// The 32 weights of one block as two vectors (inputs 0-15 and 16-31): the block's 16 levels d * q + m, each code
// picking its level (one permute instead of converting and scaling every code: 12 % faster for one row here, and
// the same bits).
inline void dequant(const Blocks& w, int64_t block, __m512& lo, __m512& hi) {
  const __m512 levels = _mm512_fmadd_ps(_mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                         _mm512_set1_ps(w.scale[block]), _mm512_set1_ps(w.offset[block]));
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.codes + block * 16)));
  lo = _mm512_permutexvar_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)), levels);
  hi = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), levels);
}

// Outputs j .. j+J of rows 0 .. R of x: y[r, j+t] = sum over blocks of w[j+t, block] . x[r, block]. Each block is
// dequantized where it is used, once for all R rows.
template <int R, int J>
void tile(const Blocks& w, const float* x, float* y, int64_t ldy, int64_t j) {
  const int64_t nb = w.in / kBlock;
  __m512 acc[R][J];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < J; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512 xl[R], xh[R];
    for (int r = 0; r < R; ++r) {
      xl[r] = _mm512_loadu_ps(x + r * w.in + b * kBlock);
      xh[r] = _mm512_loadu_ps(x + r * w.in + b * kBlock + 16);
    }
    for (int t = 0; t < J; ++t) {
      __m512 lo, hi;
      dequant(w, (j + t) * nb + b, lo, hi);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(hi, xh[r], _mm512_fmadd_ps(lo, xl[r], acc[r][t]));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < J; ++t) y[r * ldy + j + t] = _mm512_reduce_add_ps(acc[r][t]);
}

template <int R>
void outputs(const Blocks& w, const float* x, float* y, int64_t ldy, int64_t j0, int64_t j1) {
  constexpr int J = R <= 2 ? 4 : 2;
  int64_t j = j0;
  for (; j + J <= j1; j += J) tile<R, J>(w, x, y, ldy, j);
  for (; j < j1; ++j) tile<R, 1>(w, x, y, ldy, j);
}

// Outputs j0 .. j1 of y [rows, out] = x [rows, in] times the weights (transposed). Made for a few rows (decode
// steps): the weights are read once per 4 rows and dequantized each time.
void matmul_outputs(const Blocks& w, const float* x, int64_t rows, float* y, int64_t j0, int64_t j1) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) outputs<4>(w, x + r * w.in, y + r * w.out, w.out, j0, j1);
  for (; r + 2 <= rows; r += 2) outputs<2>(w, x + r * w.in, y + r * w.out, w.out, j0, j1);
  for (; r < rows; ++r) outputs<1>(w, x + r * w.in, y + r * w.out, w.out, j0, j1);
}

void matmul(const Blocks& w, const float* x, int64_t rows, float* y) {
  at::parallel_for(0, w.out, 64, [&](int64_t j0, int64_t j1) { matmul_outputs(w, x, rows, y, j0, j1); });
}

void check_rows(const torch::Tensor& x, int64_t in) {
  TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous() && x.dim() == 2 && x.size(1) == in,
              "x: contiguous float32 [rows, ", in, "]");
}

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
  return _mm512_reduce_add_ps(acc);
}

void rms_norm(const float* x, const float* weight, float eps, int64_t rows, int64_t dim, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(dot(xr, xr, dim) / dim + eps));
    for (int64_t i = 0; i < dim; i += 16)
      _mm512_storeu_ps(out + r * dim + i,
                       _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + i), inv), _mm512_loadu_ps(weight + i)));
  }
}

// e^x for 16 floats: 2^n e^r with n = round(x / ln 2), r in [-ln2/2, ln2/2] split off in two steps, e^r by its
// Taylor polynomial to r^7 (relative error under 2e-7). Under -87 it gives e^-87; past 88 infinity, as expf does.
__m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 poly = _mm512_set1_ps(1.f / 5040);
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 720));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 120));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 24));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f / 6));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(0.5f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(poly, n);
}

// p[0 .. n) = e^(p - top); returns their sum.
float softmax_numerators(float* p, int64_t n, float top) {
  const __m512 t = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t l = 0; l < n; l += 16) {
    const __mmask16 live = n - l >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - l)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, p + l), t));
    _mm512_mask_storeu_ps(p + l, live, e);
    sum = _mm512_mask_add_ps(sum, live, sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// The heads of one row that share a K/V head (GQA's group): out [group, C * 16] = softmax(q_g . k_l * scale)
// weighted sum of v_l over the row's history slots hs[0 .. n), with p [group, n] as scratch. Each K and V row is
// loaded once for the whole group (the group's heads would each read it again otherwise).
template <int C>
void attend_group(const float* q, int64_t group, const float* k, const float* v, const int64_t* hs, int64_t n,
                  float scale, float* p, float* out) {
  constexpr int hd = C * 16;
  std::vector<float> top(group, -INFINITY);
  for (int64_t l = 0; l < n; ++l) {
    __m512 kl[C];
    for (int c = 0; c < C; ++c) kl[c] = _mm512_loadu_ps(k + hs[l] * hd + c * 16);
    for (int64_t g = 0; g < group; ++g) {
      __m512 s = _mm512_setzero_ps();
      for (int c = 0; c < C; ++c) s = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * hd + c * 16), kl[c], s);
      p[g * n + l] = _mm512_reduce_add_ps(s) * scale;
      top[g] = std::max(top[g], p[g * n + l]);
    }
  }
  std::vector<float> total(group);
  for (int64_t g = 0; g < group; ++g) total[g] = softmax_numerators(p + g * n, n, top[g]);
  std::fill_n(out, group * hd, 0.f);
  for (int64_t l = 0; l < n; ++l) {
    __m512 vl[C];
    for (int c = 0; c < C; ++c) vl[c] = _mm512_loadu_ps(v + hs[l] * hd + c * 16);
    for (int64_t g = 0; g < group; ++g) {
      const __m512 pl = _mm512_set1_ps(p[g * n + l]);
      for (int c = 0; c < C; ++c)
        _mm512_storeu_ps(out + g * hd + c * 16, _mm512_fmadd_ps(pl, vl[c], _mm512_loadu_ps(out + g * hd + c * 16)));
    }
  }
  for (int64_t g = 0; g < group; ++g)
    for (int c = 0; c < C; ++c)
      _mm512_storeu_ps(out + g * hd + c * 16, _mm512_div_ps(_mm512_loadu_ps(out + g * hd + c * 16),
                                                            _mm512_set1_ps(total[g])));
}

using AttendGroup = void (*)(const float*, int64_t, const float*, const float*, const int64_t*, int64_t, float, float*,
                             float*);

AttendGroup attend_group_for(int64_t head_dim) {
  static constexpr AttendGroup by_chunks[] = {attend_group<1>, attend_group<2>, attend_group<3>, attend_group<4>,
                                              attend_group<5>, attend_group<6>, attend_group<7>, attend_group<8>};
  TORCH_CHECK(head_dim % 16 == 0 && head_dim >= 16 && head_dim <= 128, "fused_layer: head_dim 16..128 in 16s");
  return by_chunks[head_dim / 16 - 1];
}

// Chunks c0 .. c1 (16 values each, row by row) of act [rows, inter] = SiLU(gate) * up, from gu [rows, 2 * inter]
// (gate, then up).
void silu_gate(const float* gu, int64_t inter, float* act, int64_t c0, int64_t c1) {
  const int64_t chunks = inter / 16;
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t r = c / chunks, i = c % chunks * 16;
    const __m512 g = _mm512_loadu_ps(gu + r * 2 * inter + i), up = _mm512_loadu_ps(gu + r * 2 * inter + inter + i);
    const __m512 sigmoid_denominator = _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)));
    _mm512_storeu_ps(act + r * inter + i, _mm512_mul_ps(_mm512_div_ps(g, sigmoid_denominator), up));
  }
}

// Waits of the barriers below that lasted over kStall: a thread of the layer had lost its core to another thread
// or process (voicepipe/llm/core_sharing.py).
std::atomic<int64_t> stalls{0};
constexpr auto kStall = std::chrono::milliseconds(1);

// The phases of one parallel region wait for each other here. A spin rather than OpenMP's barrier: once the
// process has more OpenMP threads than cores (torch ran ops on another thread than the engine's: loading, the
// quality check), libgomp puts a waiting thread to sleep after ~1000 spins, and waking it took ~30 us, which at
// six regions a layer cost a one-row step 5-6 of its 13 ms.
class SpinBarrier {
 public:
  explicit SpinBarrier(int threads) : threads_(threads) {}

  bool stalled() const { return stalled_.load(std::memory_order_relaxed); }

  void wait() {
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == threads_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    std::chrono::steady_clock::time_point yielding_since;
    bool stalled = false;
    for (int spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
      if (spins < kSpins) {
        _mm_pause();
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (spins == kSpins) yielding_since = now;
      if (!stalled && now - yielding_since > kStall) {
        stalled = true;
        stalls.fetch_add(1, std::memory_order_relaxed);
        stalled_.store(true, std::memory_order_relaxed);
      }
      std::this_thread::yield();  // the other thread lost its core (STT, TTS): let whatever waits for it run
    }
  }

 private:
  static constexpr int kSpins = 2000;  // ~50 us of pauses here: longer than a phase's usual imbalance
  const int threads_;
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
  std::atomic<bool> stalled_{false};
};

// Thread t's contiguous share [first, second) of n items split among threads.
std::pair<int64_t, int64_t> share(int64_t n, int t, int threads) { return {n * t / threads, n * (t + 1) / threads}; }

}  // namespace

torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& weight) {
  const Blocks w = blocks_of(weight);
  check_rows(x, w.in);
  auto y = torch::empty({x.size(0), w.out}, x.options());
  matmul(w, x.data_ptr<float>(), x.size(0), y.data_ptr<float>());
  return y;
}

// One decoder layer for a few rows (decodes, drafted tokens, a short prefill), in place on the residual stream
// x [rows, hidden]: RMSNorm, the fused q/k/v projection, the rotary multiply (q and k rows permuted at load so that
// each rotated pair of dimensions sits side by side), every row's new K/V into its pool slot, then attention of
// each row over its own history slots (which hold the step's earlier rows of its sequence), the output projection,
// RMSNorm, the fused gate/up projection, SiLU gate, the down projection.
void fused_layer(torch::Tensor x, const torch::Tensor& norm_in, const torch::Tensor& norm_post,
                  const std::vector<torch::Tensor>& qkv_w, const std::vector<torch::Tensor>& o_w,
                  const std::vector<torch::Tensor>& gate_up_w, const std::vector<torch::Tensor>& down_w,
                  const torch::Tensor& rotation, torch::Tensor k_pool, torch::Tensor v_pool, const torch::Tensor& slots,
                  const torch::Tensor& history, const torch::Tensor& lengths, int64_t heads, double eps,
                  double scale) {
  const Blocks qkv = blocks_of(qkv_w), o = blocks_of(o_w), gate_up = blocks_of(gate_up_w), down = blocks_of(down_w);
  const int64_t rows = x.size(0), hidden = x.size(1);
  const int64_t kv_heads = k_pool.size(0), pool_slots = k_pool.size(1), hd = k_pool.size(2);
  const int64_t group = heads / kv_heads, inter = gate_up.out / 2, width = history.size(1);
  check_rows(x, hidden);
  TORCH_CHECK(qkv.in == hidden && qkv.out == (heads + 2 * kv_heads) * hd && o.in == heads * hd && o.out == hidden &&
                  gate_up.in == hidden && down.in == inter && down.out == hidden,
              "fused_layer: weight shapes do not fit the model's");
  TORCH_CHECK(k_pool.dtype() == torch::kFloat32 && k_pool.is_contiguous() && v_pool.is_contiguous() &&
                  v_pool.sizes() == k_pool.sizes(), "pools: float32 [kv_heads, slots, head_dim]");
  TORCH_CHECK(rotation.dtype() == torch::kFloat32 && rotation.is_contiguous() && rotation.numel() == rows * hd,
              "rotation: float32 [rows, head_dim / 2, 2] (cos, sin)");
  TORCH_CHECK(slots.dtype() == torch::kLong && history.dtype() == torch::kLong && lengths.dtype() == torch::kLong &&
                  slots.numel() == rows && history.size(0) == rows && lengths.numel() == rows &&
                  history.is_contiguous(), "slots [rows], history [rows, width], lengths [rows]: int64");
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* hist = history.data_ptr<int64_t>();
  const int64_t* len = lengths.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(slot[r] >= 0 && slot[r] < pool_slots && len[r] >= 1 && len[r] <= width, "slots out of the pool");
    for (int64_t l = 0; l < len[r]; ++l)
      TORCH_CHECK(hist[r * width + l] >= 0 && hist[r * width + l] < pool_slots, "history slots out of the pool");
  }

  float* xs = x.data_ptr<float>();
  float* kp = k_pool.data_ptr<float>();
  float* vp = v_pool.data_ptr<float>();
  const float* rot = rotation.data_ptr<float>();
  auto opts = x.options();
  auto h = torch::empty({rows, hidden}, opts);
  auto qkv_out = torch::empty({rows, qkv.out}, opts);
  auto attn = torch::empty({rows, heads * hd}, opts);
  auto gu = torch::empty({rows, gate_up.out}, opts);
  auto act = torch::empty({rows, inter}, opts);
  auto proj = torch::empty({rows, hidden}, opts);
  float* hp = h.data_ptr<float>();
  float* qkvp = qkv_out.data_ptr<float>();
  float* attnp = attn.data_ptr<float>();
  float* projp = proj.data_ptr<float>();
  float* gup = gu.data_ptr<float>();
  float* actp = act.data_ptr<float>();
  const auto attend = attend_group_for(hd);

  // One parallel region for the layer, its phases split among the threads and separated by spin barriers.
  std::unique_ptr<SpinBarrier> barrier;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
#pragma omp single
    barrier = std::make_unique<SpinBarrier>(threads);
    const auto [r0, r1] = share(rows, t, threads);
    const auto in_rows = [&](auto body) {
      for (int64_t r = r0; r < r1; ++r) body(r);
    };
    const auto outputs_of = [&](const Blocks& w, const float* in, float* out) {
      const auto [j0, j1] = share(w.out, t, threads);
      matmul_outputs(w, in, rows, out, j0, j1);
    };

    rms_norm(xs + r0 * hidden, norm_in.data_ptr<float>(), eps, r1 - r0, hidden, hp + r0 * hidden);
    barrier->wait();
    outputs_of(qkv, hp, qkvp);
    barrier->wait();
    in_rows([&](int64_t r) {
      float* row = qkvp + r * qkv.out;
      const float* rr = rot + r * hd;
      for (int64_t head = 0; head < heads + kv_heads; ++head)
        for (int64_t p = 0; p < hd / 2; ++p) {
          float* pair = row + head * hd + 2 * p;
          const float a = pair[0], b = pair[1], c = rr[2 * p], s = rr[2 * p + 1];
          pair[0] = a * c - b * s;
          pair[1] = a * s + b * c;
        }
      for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
        std::copy_n(row + (heads + kvh) * hd, hd, kp + (kvh * pool_slots + slot[r]) * hd);
        std::copy_n(row + (heads + kv_heads + kvh) * hd, hd, vp + (kvh * pool_slots + slot[r]) * hd);
      }
    });
    barrier->wait();
    {
      std::vector<float> p(group * width);
      const auto [i0, i1] = share(rows * kv_heads, t, threads);
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t r = i / kv_heads, kvh = i % kv_heads, head = kvh * group;
        attend(qkvp + r * qkv.out + head * hd, group, kp + kvh * pool_slots * hd, vp + kvh * pool_slots * hd,
               hist + r * width, len[r], static_cast<float>(scale), p.data(), attnp + r * heads * hd + head * hd);
      }
    }
    barrier->wait();
    outputs_of(o, attnp, projp);
    barrier->wait();
    in_rows([&](int64_t r) {
      for (int64_t i = r * hidden; i < (r + 1) * hidden; ++i) xs[i] += projp[i];
    });
    rms_norm(xs + r0 * hidden, norm_post.data_ptr<float>(), eps, r1 - r0, hidden, hp + r0 * hidden);
    barrier->wait();
    outputs_of(gate_up, hp, gup);
    barrier->wait();
    const auto [c0, c1] = share(rows * inter / 16, t, threads);
    silu_gate(gup, inter, actp, c0, c1);
    barrier->wait();
    outputs_of(down, actp, projp);
    barrier->wait();
    in_rows([&](int64_t r) {
      for (int64_t i = r * hidden; i < (r + 1) * hidden; ++i) xs[i] += projp[i];
    });
  }
  // The step's later layers, and torch's ops, would each wait out the same scheduler slice: they run on this one
  // thread until the engine sets the count back (`set_threads`).
  if (barrier->stalled()) omp_set_num_threads(1);
}

// The calling thread's OpenMP threads, which torch's ops use too. Not torch.set_num_threads: that also empties
// oneDNN's cache of compiled kernels, which the next op-by-op step then compiles again.
void set_threads(int threads) { omp_set_num_threads(threads); }

// How many threads a parallel_for of the kernels runs on (one when the build lost OpenMP: blockq.FLAGS).
int64_t threads_used() {
  std::vector<char> seen(at::get_num_threads(), 0);
  at::parallel_for(0, 64 * at::get_num_threads(), 1, [&](int64_t, int64_t) { seen[at::get_thread_num()] = 1; });
  return std::count(seen.begin(), seen.end(), 1);
}

// The kernels let go of the GIL, as torch's own ops do: held through every call, a thread of them kept an asyncio
// loop beside it (a call's inbound audio, the VAD) from waking for up to 1.5 s.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  const auto without_gil = py::call_guard<py::gil_scoped_release>();
  m.def("threads_used", &threads_used, "threads a parallel_for of these kernels runs on");
  m.def("stalls", [] { return stalls.load(std::memory_order_relaxed); },
        "how many barrier waits of the fused layers lasted over 1 ms so far (a thread had lost its core)");
  m.def("set_threads", &set_threads, "the calling thread's OpenMP threads, torch's ops' included");
  m.def("linear", &linear, "x [rows, in] times block-quantized weights -> [rows, out]", without_gil);
  m.def("fused_layer", &fused_layer, "one decoder layer for a few rows, each over its own history, in place on x",
        without_gil);
}
