// The memories entering each step of a segment, recomputed for the fused window's backward
// (the reference: gpn_jax/kernels/xla.py, `stack`): from the segment's starting memory and
// its S stored write inputs, the gated delta write
//   Mi = keep M,  M' = e^g Mi + k (beta (v - Mi^T k))^T
// run S times per (batch row, head), with Mi^T k and Mi^T q (the read's query) of every step,
// which the per-token backward (memory_grad.cc) takes instead of passing over the memory again.
//
// Why a kernel of our own: as a `lax.scan`, XLA:CPU runs each step as four operations over the
// whole (B, H, K, U) memory (the contraction k^T M, the update, a copy of the carry and the
// stack's dynamic-update-slice), each a pass over 2 MiB at the bench's sizes, and zero-fills
// the stack first. Here each (b, h) memory (K x U floats, 32 KiB there) stays in the core's
// cache for all S steps: step t reads stack[t] and writes stack[t + 1].
//
// Shapes (row-major float32): M0 (B, H, K, U); k, q (S, B, H, K), l2-normalised; v (S, B, H, U);
// beta, eg (S, B, H) (sigmoid and exp applied); keep (S, B) (0 at a document start).
// Out: Ms (S, B, H, K, U), Ms[t] the memory entering step t, before its reset by keep; kM, qM
// (S, B, H, U): (keep Ms[t])^T k[t] and (keep Ms[t])^T q[t].
#include <algorithm>
#include <cstring>

#include "parallel.h"

namespace ffi = xla::ffi;

namespace {

struct Args {
  const float *m0, *k, *q, *v, *beta, *eg, *keep;
  float *out, *km, *qm;
  int64_t S, B, H, K, U;
};

// One (b, h) memory through the segment's S steps.
void Item(const Args& j, int64_t bh) {
  const int64_t BH = j.B * j.H, K = j.K, U = j.U, KU = K * U, b = bh / j.H;
  float* M = j.out + bh * KU;  // stack[0][b, h]
  std::memcpy(M, j.m0 + bh * KU, KU * sizeof(float));
  for (int64_t t = 0; t < j.S; ++t) {
    const int64_t i = t * BH + bh;  // (t, b, h)
    const float keep = j.keep[t * j.B + b], beta = j.beta[i], eg = j.eg[i] * keep;
    const float *kt = j.k + i * K, *qt = j.q + i * K, *vt = j.v + i * U;
    float *km = j.km + i * U, *qm = j.qm + i * U;
    std::fill(km, km + U, 0.0f);
    std::fill(qm, qm + U, 0.0f);
    for (int64_t r = 0; r < K; ++r) {
      const float kr = kt[r] * keep, qr = qt[r] * keep;
      const float* row = M + r * U;
      for (int64_t u = 0; u < U; ++u) {
        km[u] += kr * row[u];
        qm[u] += qr * row[u];
      }
    }
    if (t + 1 == j.S) break;  // the segment's last write is not needed
    float* next = M + BH * KU;  // stack[t + 1][b, h]
    for (int64_t r = 0; r < K; ++r) {
      const float kr = kt[r];
      const float* row = M + r * U;
      float* row_next = next + r * U;
      for (int64_t u = 0; u < U; ++u) row_next[u] = eg * row[u] + kr * (beta * (vt[u] - km[u]));
    }
    M = next;
  }
}

ffi::Error MemoryStack(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> m0, ffi::Buffer<ffi::F32> k,
                       ffi::Buffer<ffi::F32> q, ffi::Buffer<ffi::F32> v,
                       ffi::Buffer<ffi::F32> beta, ffi::Buffer<ffi::F32> eg,
                       ffi::Buffer<ffi::F32> keep, ffi::ResultBuffer<ffi::F32> out,
                       ffi::ResultBuffer<ffi::F32> km, ffi::ResultBuffer<ffi::F32> qm) {
  auto dm = m0.dimensions(), dk = k.dimensions();
  if (dm.size() != 4 || dk.size() != 4) {
    return ffi::Error::InvalidArgument("memory_stack: expected M0 (B, H, K, U), k (S, B, H, K)");
  }
  const int64_t S = dk[0], B = dm[0], H = dm[1], K = dm[2], U = dm[3];
  const int64_t n = S * B * H;
  const bool ok = dk[1] == B && dk[2] == H && dk[3] == K && q.element_count() == n * K &&
                  v.element_count() == n * U && beta.element_count() == n &&
                  eg.element_count() == n && keep.element_count() == S * B &&
                  out->element_count() == n * K * U && km->element_count() == n * U &&
                  qm->element_count() == n * U;
  if (!ok) {
    return ffi::Error::InvalidArgument(
        "memory_stack: expected k, q (S, B, H, K), v (S, B, H, U), beta and eg (S, B, H), keep "
        "(S, B), out (S, B, H, K, U), kM and qM (S, B, H, U)");
  }
  const Args a{m0.typed_data(),  k.typed_data(),    q.typed_data(),  v.typed_data(),
               beta.typed_data(), eg.typed_data(),  keep.typed_data(), out->typed_data(),
               km->typed_data(),  qm->typed_data(), S, B, H, K, U};
  if (S > 0) gpn_native::ParallelFor(pool, B * H, [&a](int64_t bh) { Item(a, bh); });
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpnMemoryStack, MemoryStack,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // M0
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // eg
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keep
                                  .Ret<ffi::Buffer<ffi::F32>>()   // Ms
                                  .Ret<ffi::Buffer<ffi::F32>>()   // kM
                                  .Ret<ffi::Buffer<ffi::F32>>());  // qM
