// The per-token passes of the fused window's backward over the (B, H, K, U) memory
// (gpn_jax/core/fused/backward.py, `memory_bwd`), one (batch row, head) at a time; memory.py's
// `grad` composes the two into the backward pass of gpn_jax/core/kernel_ops.py.
//
// One step's write and read, per (b, h), with Mi = keep Ms[t] (the memory entering step t,
// reset at a document start) and kM = Mi^T k, qM = Mi^T q from the recomputation
// (memory_stack.cc):
//   w = beta (v - kM),  M' = e^g Mi + k w^T,  o = M'^T q = e^g qM + (q . k) w.
// Given dM, the cotangent of M', everything but the matrix products is left to JAX:
//   `Reduce` (before the small vectors' backward): dM^T k (dw's part from M'), dM w (dk's part
//   from M') and <dM, Mi> (d e^g's part from M');
//   `Update` (after it, with the cotangents dkM, dqM of kM and qM): Mi dkM and Mi dqM (dk's
//   and dq's parts from kM and qM) and the memory's new cotangent
//   dMs[t] = keep (e^g dM + k dkM^T + q dqM^T).
// Why a kernel of our own: XLA:CPU ran these as ~11 operations per token over the whole memory
// (vjps of the write and the read: six batched contractions, a reduction, two cotangent adds,
// the stack's slice and two carry copies), each a pass over 2 MiB at the bench's sizes that
// the weights streamed between them had evicted from the cache. Here the two passes read Ms[t]
// where the recomputation wrote it, and each (b, h) pair of 32 KiB rows stays in the cache
// within a pass.
//
// Shapes (row-major float32): Ms (S, B, H, K, U); t () int32; keep (B,); dM (B, H, K, U);
// k, q (B, H, K); w, dkM, dqM (B, H, U); eg (B, H). `Update` may write dMs[t] over dM (each entry
// from the same entry of dM).
#include <cstdint>

#include "parallel.h"

namespace ffi = xla::ffi;

namespace {

float Dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (int64_t u = 0; u < n; ++u) s += a[u] * b[u];
  return s;
}

struct Shape {
  int64_t S, B, H, K, U;
};

// Ms (S, B, H, K, U) and dM (B, H, K, U) agree and t is in [0, S): their sizes; else an error.
ffi::Error Check(ffi::Buffer<ffi::F32>& ms, ffi::Buffer<ffi::S32>& t, ffi::Buffer<ffi::F32>& dm,
                 Shape& shape) {
  auto d = ms.dimensions(), e = dm.dimensions();
  if (d.size() != 5 || e.size() != 4 || e[0] != d[1] || e[1] != d[2] || e[2] != d[3] ||
      e[3] != d[4] || t.element_count() != 1) {
    return ffi::Error::InvalidArgument("memory_grad: expected Ms (S, B, H, K, U), t (), dM (B, H, K, U)");
  }
  const int32_t step = *t.typed_data();
  if (step < 0 || step >= d[0]) return ffi::Error::InvalidArgument("memory_grad: t outside [0, S)");
  shape = Shape{d[0], d[1], d[2], d[3], d[4]};
  return ffi::Error::Success();
}

ffi::Error Reduce(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> ms, ffi::Buffer<ffi::S32> t,
                  ffi::Buffer<ffi::F32> keep, ffi::Buffer<ffi::F32> dm,
                  ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> w,
                  ffi::ResultBuffer<ffi::F32> dmk, ffi::ResultBuffer<ffi::F32> dmw,
                  ffi::ResultBuffer<ffi::F32> inner) {
  Shape shape;
  if (ffi::Error e = Check(ms, t, dm, shape); e.failure()) return e;
  const auto [S, B, H, K, U] = shape;
  const int64_t KU = K * U;
  if (keep.element_count() != B || k.element_count() != B * H * K ||
      w.element_count() != B * H * U || dmk->element_count() != B * H * U ||
      dmw->element_count() != B * H * K || inner->element_count() != B * H) {
    return ffi::Error::InvalidArgument("memory_grad.reduce: expected keep (B,), k (B, H, K), w (B, H, U)");
  }
  const float* Mt = ms.typed_data() + *t.typed_data() * B * H * KU;
  const float *pdm = dm.typed_data(), *pk = k.typed_data(), *pw = w.typed_data(),
              *pkeep = keep.typed_data();
  float *pdmk = dmk->typed_data(), *pdmw = dmw->typed_data(), *pin = inner->typed_data();
  gpn_native::ParallelFor(pool, B * H, [&](int64_t bh) {
    const float *M = Mt + bh * KU, *D = pdm + bh * KU, *kk = pk + bh * K, *ww = pw + bh * U;
    float *out_k = pdmk + bh * U, *out_w = pdmw + bh * K;
    float dot_m = 0.0f;
    for (int64_t u = 0; u < U; ++u) out_k[u] = 0.0f;
    for (int64_t r = 0; r < K; ++r) {
      const float *row = D + r * U, kr = kk[r];
      for (int64_t u = 0; u < U; ++u) out_k[u] += kr * row[u];
      out_w[r] = Dot(row, ww, U);
      dot_m += Dot(row, M + r * U, U);
    }
    pin[bh] = pkeep[bh / H] * dot_m;
  });
  return ffi::Error::Success();
}

ffi::Error Update(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> ms, ffi::Buffer<ffi::S32> t,
                  ffi::Buffer<ffi::F32> keep, ffi::Buffer<ffi::F32> dm,
                  ffi::Buffer<ffi::F32> k, ffi::Buffer<ffi::F32> q,
                  ffi::Buffer<ffi::F32> dkm, ffi::Buffer<ffi::F32> dqm,
                  ffi::Buffer<ffi::F32> eg, ffi::ResultBuffer<ffi::F32> dm_prev,
                  ffi::ResultBuffer<ffi::F32> m_dkm, ffi::ResultBuffer<ffi::F32> m_dqm) {
  Shape shape;
  if (ffi::Error e = Check(ms, t, dm, shape); e.failure()) return e;
  const auto [S, B, H, K, U] = shape;
  const int64_t KU = K * U;
  if (keep.element_count() != B || k.element_count() != B * H * K ||
      q.element_count() != B * H * K || dkm.element_count() != B * H * U ||
      dqm.element_count() != B * H * U || eg.element_count() != B * H ||
      dm_prev->element_count() != B * H * KU || m_dkm->element_count() != B * H * K ||
      m_dqm->element_count() != B * H * K) {
    return ffi::Error::InvalidArgument(
        "memory_grad.update: expected keep (B,), k, q (B, H, K), dkM, dqM (B, H, U), eg (B, H)");
  }
  const float* Mt = ms.typed_data() + *t.typed_data() * B * H * KU;
  const float *pdm = dm.typed_data(), *pk = k.typed_data(), *pq = q.typed_data(),
              *pdk = dkm.typed_data(), *pdq = dqm.typed_data(), *peg = eg.typed_data(),
              *pkeep = keep.typed_data();
  float *pout = dm_prev->typed_data(), *pmk = m_dkm->typed_data(), *pmq = m_dqm->typed_data();
  gpn_native::ParallelFor(pool, B * H, [&](int64_t bh) {
    const float keep_b = pkeep[bh / H], e = peg[bh];
    const float *M = Mt + bh * KU, *D = pdm + bh * KU, *kk = pk + bh * K, *qq = pq + bh * K;
    const float *a = pdk + bh * U, *c = pdq + bh * U;
    float* O = pout + bh * KU;
    for (int64_t r = 0; r < K; ++r) {
      const float *row = M + r * U, *drow = D + r * U;
      pmk[bh * K + r] = keep_b * Dot(row, a, U);
      pmq[bh * K + r] = keep_b * Dot(row, c, U);
      const float kr = kk[r], qr = qq[r];
      float* orow = O + r * U;
      for (int64_t u = 0; u < U; ++u) orow[u] = keep_b * (e * drow[u] + kr * a[u] + qr * c[u]);
    }
  });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpnMemoryGradReduce, Reduce,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // Ms
                                  .Arg<ffi::Buffer<ffi::S32>>()  // t
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keep
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dM
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // w
                                  .Ret<ffi::Buffer<ffi::F32>>()   // dM^T k
                                  .Ret<ffi::Buffer<ffi::F32>>()   // dM w
                                  .Ret<ffi::Buffer<ffi::F32>>());  // <dM, Mi>

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpnMemoryGradUpdate, Update,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // Ms
                                  .Arg<ffi::Buffer<ffi::S32>>()  // t
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keep
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dM
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dkM
                                  .Arg<ffi::Buffer<ffi::F32>>()  // dqM
                                  .Arg<ffi::Buffer<ffi::F32>>()  // eg
                                  .Ret<ffi::Buffer<ffi::F32>>()   // dMs[t]
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Mi dkM
                                  .Ret<ffi::Buffer<ffi::F32>>());  // Mi dqM
