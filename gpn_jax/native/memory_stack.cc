// The memories entering each step of a segment, recomputed for the fused window's backward
// (gpn_jax/core/fast_window.py, `_recompute_memory`): from the segment's starting memory and
// its S stored write inputs, the gated delta write M' = e^g (keep M) + k (beta (v - k^T (keep M)))^T
// run S times per (batch row, head).
//
// Why a kernel of our own: as a `lax.scan`, XLA:CPU runs each step as four operations over the
// whole (B, H, K, U) memory (the contraction k^T M, the update, a copy of the carry and the
// stack's dynamic-update-slice), each a pass over 2 MiB at the bench's sizes, and zero-fills
// the stack first. Here each (b, h) memory (K x U floats, 32 KiB there) stays in the core's
// cache for all S steps: step t reads stack[t] and writes stack[t + 1], and nothing else
// touches memory-sized data. (b, h) items are shared between the calling thread and XLA's pool
// through one counter, as in small_matmul.cc.
//
// Shapes (row-major float32): M0 (B, H, K, U); k (S, B, H, K), already l2-normalised; v (S, B, H, U);
// beta, eg (S, B, H) (sigmoid and exp applied); keep (S, B) (0 at a document start).
// Out: Ms (S, B, H, K, U), Ms[t] the memory entering step t, before its reset by keep.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

struct Job {
  const float *m0, *k, *v, *beta, *eg, *keep;
  float* out;
  int64_t S, B, H, K, U;
  std::atomic<int64_t> next{0}, done{0};
};

// One (b, h) memory through the segment's S steps.
void Item(const Job& j, int64_t bh, float* w) {
  const int64_t BH = j.B * j.H, K = j.K, U = j.U, KU = K * U, b = bh / j.H;
  float* M = j.out + bh * KU;  // stack[0][b, h]
  std::memcpy(M, j.m0 + bh * KU, KU * sizeof(float));
  for (int64_t t = 0; t + 1 < j.S; ++t) {
    const int64_t i = t * BH + bh;  // (t, b, h)
    const float keep = j.keep[t * j.B + b], beta = j.beta[i], eg = j.eg[i] * keep;
    const float* kt = j.k + i * K;
    const float* vt = j.v + i * U;
    float* next = M + BH * KU;  // stack[t + 1][b, h]
    // w = beta (v - k^T (keep M))
    std::fill(w, w + U, 0.0f);
    for (int64_t r = 0; r < K; ++r) {
      const float kr = kt[r] * keep;
      const float* row = M + r * U;
      for (int64_t u = 0; u < U; ++u) w[u] += kr * row[u];
    }
    for (int64_t u = 0; u < U; ++u) w[u] = beta * (vt[u] - w[u]);
    // M' = e^g (keep M) + k w^T
    for (int64_t r = 0; r < K; ++r) {
      const float kr = kt[r];
      const float* row = M + r * U;
      float* row_next = next + r * U;
      for (int64_t u = 0; u < U; ++u) row_next[u] = eg * row[u] + kr * w[u];
    }
    M = next;
  }
}

void Work(Job& j) {
  std::vector<float> w(j.U);
  const int64_t items = j.B * j.H;
  for (int64_t bh; (bh = j.next.fetch_add(1, std::memory_order_relaxed)) < items;) {
    Item(j, bh, w.data());
    j.done.fetch_add(1, std::memory_order_release);
  }
}

ffi::Error MemoryStack(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> m0, ffi::Buffer<ffi::F32> k,
                       ffi::Buffer<ffi::F32> v, ffi::Buffer<ffi::F32> beta,
                       ffi::Buffer<ffi::F32> eg, ffi::Buffer<ffi::F32> keep,
                       ffi::ResultBuffer<ffi::F32> out) {
  auto dm = m0.dimensions(), dk = k.dimensions(), dv = v.dimensions(), db = beta.dimensions(),
       de = eg.dimensions(), dkeep = keep.dimensions(), dout = out->dimensions();
  const bool ok = dm.size() == 4 && dk.size() == 4 && dv.size() == 4 && db.size() == 3 &&
                  de.size() == 3 && dkeep.size() == 2 && dout.size() == 5 &&
                  dk[1] == dm[0] && dk[2] == dm[1] && dk[3] == dm[2] &&  // k (S, B, H, K)
                  dv[0] == dk[0] && dv[1] == dm[0] && dv[2] == dm[1] && dv[3] == dm[3] &&
                  db[0] == dk[0] && db[1] == dm[0] && db[2] == dm[1] &&
                  de[0] == db[0] && de[1] == db[1] && de[2] == db[2] &&
                  dkeep[0] == dk[0] && dkeep[1] == dm[0] && dout[0] == dk[0] &&
                  dout[1] == dm[0] && dout[2] == dm[1] && dout[3] == dm[2] && dout[4] == dm[3];
  if (!ok) {
    return ffi::Error::InvalidArgument(
        "memory_stack: expected M0 (B, H, K, U), k (S, B, H, K), v (S, B, H, U), beta and eg "
        "(S, B, H), keep (S, B), out (S, B, H, K, U)");
  }
  auto job = std::make_shared<Job>();  // shared with pool tasks that may start after we return
  job->m0 = m0.typed_data();
  job->k = k.typed_data();
  job->v = v.typed_data();
  job->beta = beta.typed_data();
  job->eg = eg.typed_data();
  job->keep = keep.typed_data();
  job->out = out->typed_data();
  job->S = dk[0];
  job->B = dm[0];
  job->H = dm[1];
  job->K = dm[2];
  job->U = dm[3];
  const int64_t items = job->B * job->H;
  if (job->S == 0 || items == 0) return ffi::Error::Success();
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, items - 1);
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { Work(*job); });
  Work(*job);
  while (job->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpnMemoryStack, MemoryStack,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // M0
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v
                                  .Arg<ffi::Buffer<ffi::F32>>()  // beta
                                  .Arg<ffi::Buffer<ffi::F32>>()  // eg
                                  .Arg<ffi::Buffer<ffi::F32>>()  // keep
                                  .Ret<ffi::Buffer<ffi::F32>>());  // Ms
