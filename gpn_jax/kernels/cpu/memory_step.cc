// One token's write and read of the memory in the fused window's forward loop
// (the reference: gpn_jax/kernels/xla.py, `step`), per (batch row, head):
//   kM = M^T k,  w = beta (v - kM),  M' = e^g M + k w^T,  o = M'^T q   (layer 0's read)
// M' is written over M's buffer (each entry from the same entry of M), the loop's carry.
//
// Why a kernel of our own: XLA:CPU runs this as three operations over the whole (B, H, K, U)
// memory (the contraction M^T k, the update, the contraction M'^T q), each a pass over 2 MiB at
// the bench's sizes; here each (b, h) memory (32 KiB there) is read twice while it is in the
// cache, and o is summed while M' is written.
//
// Shapes (row-major float32): M (B, H, K, U); k, q (B, H, K), l2-normalised; v (B, H, U);
// beta, eg (B, H) (sigmoid and exp applied). Out: M' (B, H, K, U), o (B, H, U).
#include <vector>

#include "parallel.h"

namespace ffi = xla::ffi;

namespace {

ffi::Error MemoryStep(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> m, ffi::Buffer<ffi::F32> k,
                      ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> v,
                      ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> eg,
                      ffi::ResultBuffer<ffi::F32> m_next, ffi::ResultBuffer<ffi::F32> o) {
  auto d = m.dimensions();
  if (d.size() != 4) return ffi::Error::InvalidArgument("memory_step: expected M (B, H, K, U)");
  const int64_t B = d[0], H = d[1], K = d[2], U = d[3], BH = B * H, KU = K * U;
  if (k.element_count() != BH * K || q.element_count() != BH * K ||
      v.element_count() != BH * U || beta.element_count() != BH || eg.element_count() != BH ||
      m_next->element_count() != BH * KU || o->element_count() != BH * U) {
    return ffi::Error::InvalidArgument(
        "memory_step: expected k, q (B, H, K), v (B, H, U), beta and eg (B, H)");
  }
  const float *pm = m.typed_data(), *pk = k.typed_data(), *pq = q.typed_data(),
              *pv = v.typed_data(), *pb = beta.typed_data(), *pe = eg.typed_data();
  float *pn = m_next->typed_data(), *po = o->typed_data();
  gpn_native::ParallelFor(pool, BH, [&](int64_t bh) {
    thread_local std::vector<float> w;
    w.assign(U, 0.0f);
    const float *M = pm + bh * KU, *kk = pk + bh * K, *qq = pq + bh * K, *vv = pv + bh * U;
    float *N = pn + bh * KU, *out = po + bh * U;
    for (int64_t r = 0; r < K; ++r) {
      const float kr = kk[r];
      const float* row = M + r * U;
      for (int64_t u = 0; u < U; ++u) w[u] += kr * row[u];
    }
    const float b = pb[bh], e = pe[bh];
    for (int64_t u = 0; u < U; ++u) {
      w[u] = b * (vv[u] - w[u]);
      out[u] = 0.0f;
    }
    for (int64_t r = 0; r < K; ++r) {
      const float kr = kk[r], qr = qq[r];
      const float* row = M + r * U;
      float* row_next = N + r * U;
      for (int64_t u = 0; u < U; ++u) {
        const float x = e * row[u] + kr * w[u];
        row_next[u] = x;
        out[u] += qr * x;
      }
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpnMemoryStep, MemoryStep,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // M
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // eg
                                  .Ret<ffi::Buffer<ffi::F32>>()   // M'
                                  .Ret<ffi::Buffer<ffi::F32>>());  // o
