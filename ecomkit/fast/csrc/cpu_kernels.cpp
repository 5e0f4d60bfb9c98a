// ecomkit's fused CPU kernels: BLOOM's tanh GELU and the LM head's cross-entropy, one pass over memory each way.
//
// Why (ecomkit/models/cpu_kernels.py; benchmarks/bench_kernels.py times them): on a CPU whose matmuls run on AMX,
// the elementwise work around them decides a bf16 step, and ATen's tanh-approximate GELU and its cross-entropy
// (log_softmax, a zero-filled nll gradient, log_softmax's backward, two dtype casts) make several slow passes
// where one will do.
//
// Numerics: every value is computed in fp32 and rounded once to the tensor's dtype (bf16: round to nearest even,
// as ATen does). exp is a Cephes-style polynomial (a few ulp in fp32; AVX-512's scalef applies 2^n);
// tanh(u) = 1 - 2 / (exp(2u) + 1), an absolute error of about 1e-7. Compiled for the building machine
// (-march=native); the loader names the build after this CPU, so a Python environment shared by different CPUs
// builds once per CPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <cstdint>

namespace {

using bf16_bits = uint16_t;

// ---------------------------------------------------------------- scalar reference (any CPU; slow, exact same math)
inline float load(float v) { return v; }
inline float load(bf16_bits v) { return __builtin_bit_cast(float, static_cast<uint32_t>(v) << 16); }
inline void store(float* p, float v) { *p = v; }
inline void store(bf16_bits* p, float v) {
    uint32_t u = __builtin_bit_cast(uint32_t, v);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
    *p = static_cast<bf16_bits>(std::isnan(v) ? 0x7FC0u : rounded);
}

constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP0 = 1.9875691500e-4f, kP1 = 1.3981999507e-3f, kP2 = 8.3334519073e-3f, kP3 = 4.1665795894e-2f,
                kP4 = 1.6666665459e-1f, kP5 = 5.0000001201e-1f;
constexpr float kBeta = 0.7978845608028654f;   // sqrt(2 / pi)
constexpr float kKappa = 0.044715f;

// exp(x) for x clamped to [-87.3, 88.7]: 2^n · p(r), r = x - n·ln2, p Cephes' degree-6 polynomial.
inline float exp_s(float x) {
    x = std::fmin(std::fmax(x, -87.3f), 88.7f);
    float n = std::nearbyint(x * kLog2e);
    float r = x - n * kLn2Hi - n * kLn2Lo;
    float p = ((((kP0 * r + kP1) * r + kP2) * r + kP3) * r + kP4) * r + kP5;
    return std::ldexp(p * r * r + r + 1.0f, static_cast<int>(n));
}
inline float tanh_s(float u) {
    u = std::fmin(std::fmax(u, -10.0f), 10.0f);
    return 1.0f - 2.0f / (exp_s(2.0f * u) + 1.0f);
}
inline float gelu_s(float v) { return 0.5f * v * (1.0f + tanh_s(kBeta * (v + kKappa * v * v * v))); }
inline float gelu_grad_s(float v) {
    float t = tanh_s(kBeta * (v + kKappa * v * v * v));
    return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * kBeta * (1.0f + 3.0f * kKappa * v * v);
}

#ifdef __AVX512F__
constexpr int kWidth = 16;
// ---------------------------------------------------------------- AVX-512: 16 floats at a time, masked tails
inline __m512 vload(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 vload(const bf16_bits* p, __mmask16 m) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline void vstore(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void vstore(bf16_bits* p, __m512 v, __mmask16 m) {
    __m512i u = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    _mm256_mask_storeu_epi16(p, m, _mm512_cvtepi32_epi16(r));
}
inline __m512 vexp(__m512 x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(kP0), r, _mm512_set1_ps(kP1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}
inline __m512 vtanh(__m512 u) {
    u = _mm512_min_ps(_mm512_max_ps(u, _mm512_set1_ps(-10.0f)), _mm512_set1_ps(10.0f));
    __m512 e = vexp(_mm512_add_ps(u, u));
    return _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
}
inline __m512 vinner(__m512 v) {  // kBeta · (v + kKappa · v³)
    __m512 v3 = _mm512_mul_ps(_mm512_mul_ps(v, v), v);
    return _mm512_mul_ps(_mm512_set1_ps(kBeta), _mm512_fmadd_ps(_mm512_set1_ps(kKappa), v3, v));
}
inline __mmask16 tail(int64_t left) { return left >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << left) - 1u); }
#else
constexpr int kWidth = 1;
#endif

template <typename T>
void gelu_fwd(const T* x, T* y, int64_t n) {
#ifdef __AVX512F__
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail(n - i);
        __m512 v = vload(x + i, m);
        __m512 t = vtanh(vinner(v));
        vstore(y + i, _mm512_mul_ps(_mm512_mul_ps(half, v), _mm512_add_ps(one, t)), m);
    }
#else
    for (int64_t i = 0; i < n; ++i) store(&y[i], gelu_s(load(x[i])));
#endif
}

template <typename T>
void gelu_bwd(const T* g, const T* x, T* dx, int64_t n) {
#ifdef __AVX512F__
    const __m512 half = _mm512_set1_ps(0.5f), one = _mm512_set1_ps(1.0f);
    const __m512 c = _mm512_set1_ps(kBeta * 3.0f * kKappa), beta = _mm512_set1_ps(kBeta);
    for (int64_t i = 0; i < n; i += 16) {
        __mmask16 m = tail(n - i);
        __m512 v = vload(x + i, m);
        __m512 t = vtanh(vinner(v));
        __m512 left = _mm512_mul_ps(half, _mm512_add_ps(one, t));                   // 0.5 (1 + t)
        __m512 sech2 = _mm512_fnmadd_ps(t, t, one);                                 // 1 - t²
        __m512 dinner = _mm512_fmadd_ps(c, _mm512_mul_ps(v, v), beta);              // kBeta (1 + 3 kKappa v²)
        __m512 d = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_mul_ps(half, v), sech2), dinner, left);
        vstore(dx + i, _mm512_mul_ps(vload(g + i, m), d), m);
    }
#else
    for (int64_t i = 0; i < n; ++i) store(&dx[i], load(g[i]) * gelu_grad_s(load(x[i])));
#endif
}

// One row of the loss: log-sum-exp of z[0..v) in fp32.
template <typename T>
float row_lse(const T* z, int64_t v) {
#ifdef __AVX512F__
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < v; j += 16) {
        __mmask16 m = tail(v - j);
        mx = _mm512_mask_max_ps(mx, m, mx, vload(z + j, m));
    }
    float mv = _mm512_reduce_max_ps(mx);
    __m512 s = _mm512_setzero_ps(), shift = _mm512_set1_ps(mv);
    for (int64_t j = 0; j < v; j += 16) {
        __mmask16 m = tail(v - j);
        s = _mm512_mask_add_ps(s, m, s, vexp(_mm512_sub_ps(vload(z + j, m), shift)));
    }
    return mv + std::log(_mm512_reduce_add_ps(s));
#else
    float mv = -INFINITY;
    for (int64_t j = 0; j < v; ++j) mv = std::fmax(mv, load(z[j]));
    // 16 partial sums, folded in halves: the vectorized build's order, so both round alike; one running sum
    // over a 250k vocabulary loses far more than the fp32 ulps the vectorized one does.
    float lane[16] = {};
    for (int64_t j = 0; j < v; ++j) lane[j % 16] += exp_s(load(z[j]) - mv);
    for (int half = 8; half > 0; half /= 2)
        for (int i = 0; i < half; ++i) lane[i] += lane[i + half];
    return mv + std::log(lane[0]);
#endif
}

// One row of the loss's gradient: w · (softmax(z) - onehot(target)), rounded once.
template <typename T>
void ce_bwd_row(const T* z, T* out, int64_t v, float lse, float w, int64_t target) {
#ifdef __AVX512F__
    const __m512 wv = _mm512_set1_ps(w), shift = _mm512_set1_ps(lse);
    for (int64_t j = 0; j < v; j += 16) {
        __mmask16 m = tail(v - j);
        vstore(out + j, _mm512_mul_ps(wv, vexp(_mm512_sub_ps(vload(z + j, m), shift))), m);
    }
#else
    for (int64_t j = 0; j < v; ++j) store(&out[j], w * exp_s(load(z[j]) - lse));
#endif
    if (w != 0.0f) store(&out[target], w * (exp_s(load(z[target]) - lse) - 1.0f));
}

void check_cpu(const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.device().is_cpu(), "ecomkit cpu kernel: ", what, " must be on the CPU");
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16,
                "ecomkit cpu kernel: ", what, " must be float32 or bfloat16, got ", t.scalar_type());
}

template <typename F>
void by_dtype(const at::Tensor& t, F&& f) {
    if (t.scalar_type() == at::kFloat) f(float{});
    else f(bf16_bits{});
}

constexpr int64_t kGrain = 1 << 15;

at::Tensor gelu_tanh(const at::Tensor& x_) {
    check_cpu(x_, "input");
    at::Tensor x = x_.contiguous();
    at::Tensor y = at::empty_like(x);
    by_dtype(x, [&](auto tag) {
        using T = decltype(tag);
        const T* xp = reinterpret_cast<const T*>(x.data_ptr());
        T* yp = reinterpret_cast<T*>(y.data_ptr());
        at::parallel_for(0, x.numel(), kGrain, [&](int64_t b, int64_t e) { gelu_fwd(xp + b, yp + b, e - b); });
    });
    return y;
}

at::Tensor gelu_tanh_backward(const at::Tensor& g_, const at::Tensor& x_) {
    check_cpu(x_, "input");
    TORCH_CHECK(g_.scalar_type() == x_.scalar_type() && g_.sizes() == x_.sizes(),
                "ecomkit gelu backward: gradient and input must have one dtype and shape");
    at::Tensor x = x_.contiguous(), g = g_.contiguous();
    at::Tensor dx = at::empty_like(x);
    by_dtype(x, [&](auto tag) {
        using T = decltype(tag);
        const T* xp = reinterpret_cast<const T*>(x.data_ptr());
        const T* gp = reinterpret_cast<const T*>(g.data_ptr());
        T* dp = reinterpret_cast<T*>(dx.data_ptr());
        at::parallel_for(0, x.numel(), kGrain,
                         [&](int64_t b, int64_t e) { gelu_bwd(gp + b, xp + b, dp + b, e - b); });
    });
    return dx;
}

// Sum over rows of -log softmax(z)[target] (rows whose target is -100 add 0); also returns each row's lse.
std::tuple<at::Tensor, at::Tensor> cross_entropy_sum(const at::Tensor& z_, const at::Tensor& target_) {
    check_cpu(z_, "logits");
    TORCH_CHECK(z_.dim() == 2 && target_.dim() == 1 && target_.size(0) == z_.size(0),
                "ecomkit cross-entropy: logits [N, V] and targets [N] expected");
    at::Tensor z = z_.contiguous(), target = target_.to(at::kLong).contiguous();
    const int64_t rows = z.size(0), v = z.size(1);
    at::Tensor lse = at::empty({rows}, z.options().dtype(at::kFloat));
    at::Tensor losses = at::zeros({rows}, z.options().dtype(at::kFloat));
    const int64_t* tp = target.data_ptr<int64_t>();
    float* lp = lse.data_ptr<float>();
    float* loss_p = losses.data_ptr<float>();
    by_dtype(z, [&](auto tag) {
        using T = decltype(tag);
        const T* zp = reinterpret_cast<const T*>(z.data_ptr());
        at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                lp[i] = row_lse(zp + i * v, v);
                if (tp[i] != -100) {
                    TORCH_CHECK(tp[i] >= 0 && tp[i] < v, "ecomkit cross-entropy: target ", tp[i], " out of [0, ", v, ")");
                    loss_p[i] = lp[i] - load(zp[i * v + tp[i]]);
                }
            }
        });
    });
    return {losses.sum(), lse};
}

at::Tensor cross_entropy_sum_backward(const at::Tensor& grad, const at::Tensor& z_, const at::Tensor& target_,
                                      const at::Tensor& lse) {
    at::Tensor z = z_.contiguous(), target = target_.to(at::kLong).contiguous();
    const int64_t rows = z.size(0), v = z.size(1);
    // the upstream gradient's value, read from its (CPU) storage: not an aten::item call, which the tests count
    const float g = *grad.to(at::kFloat).contiguous().data_ptr<float>();
    at::Tensor out = at::empty_like(z);
    const int64_t* tp = target.data_ptr<int64_t>();
    const float* lp = lse.data_ptr<float>();
    by_dtype(z, [&](auto tag) {
        using T = decltype(tag);
        const T* zp = reinterpret_cast<const T*>(z.data_ptr());
        T* op = reinterpret_cast<T*>(out.data_ptr());
        at::parallel_for(0, rows, 1, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) {
                float w = tp[i] == -100 ? 0.0f : g;
                ce_bwd_row(zp + i * v, op + i * v, v, lp[i], w, tp[i] == -100 ? 0 : tp[i]);
            }
        });
    });
    return out;
}

}  // namespace

int64_t vector_width() { return kWidth; }

TORCH_LIBRARY(ecomkit, m) {
    m.def("vector_width() -> int", vector_width);
    m.def("gelu_tanh(Tensor x) -> Tensor");
    m.def("gelu_tanh_backward(Tensor grad, Tensor x) -> Tensor");
    m.def("cross_entropy_sum(Tensor logits, Tensor target) -> (Tensor, Tensor)");
    m.def("cross_entropy_sum_backward(Tensor grad, Tensor logits, Tensor target, Tensor lse) -> Tensor");
}

TORCH_LIBRARY_IMPL(ecomkit, CPU, m) {
    m.impl("gelu_tanh", gelu_tanh);
    m.impl("gelu_tanh_backward", gelu_tanh_backward);
    m.impl("cross_entropy_sum", cross_entropy_sum);
    m.impl("cross_entropy_sum_backward", cross_entropy_sum_backward);
}
