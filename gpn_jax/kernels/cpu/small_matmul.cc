// Y (M, N) = X (M, K) @ W for the fused window's per-token products (gpn_jax/core/fused/window.py):
// few rows (M is the batch), and W the same for every token of a training step, so it is packed
// once per step (gpn_jax/kernels/cpu/small_matmul.py) into column tiles that each stream in order.
//
// Why a kernel of our own: XLA:CPU runs these products through a general matrix multiply that
// re-packs W on every call, i.e. every token (W0 is 10 MB at the bench's sizes), and splits the
// work over its threads in a way that made a 16-row product as slow as the machine's square
// matmul peak allows only when nothing else runs (README, Speed). Here the caller and one pool
// task per other thread claim tiles from a shared counter, so a pool thread that starts late
// costs only its share.
//
// Layout: Wp (tiles, K, kTile) float32; tile t holds columns [t kTile, (t + 1) kTile) of the
// (K, N) matrix W, zero past N. X (M, K) and Y (M, N) row-major.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Register tile: kRows rows x kVecs vectors of accumulators, plus kVecs loaded W vectors and
// a broadcast, within the 32 (AVX-512) or 16 (AVX, SSE) vector registers. With AVX2, 6 x 2
// (16-column tiles, which for K = 512 fit a 32 KiB L1) ran the bench's products fastest of
// the shapes 4 x 3, 3 x 4, 4 x 2, 5 x 2 and 8 x 1 (`experiments/bench/loop_costs.py` compares them).
#if defined(__AVX512F__)
constexpr int kLanes = 16, kRows = 8, kVecs = 3;
#elif defined(__AVX__)
constexpr int kLanes = 8, kRows = 6, kVecs = 2;
#else
constexpr int kLanes = 4, kRows = 4, kVecs = 3;
#endif
constexpr int64_t kTile = kLanes * kVecs;

// A vector of kLanes floats that may sit at any float's address (unaligned loads).
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float)), aligned(sizeof(float))));

// Rows [m0, m0 + R) of Y's columns [n0, n0 + kTile) (clipped to N) from tile Wt (K, kTile).
template <int R>
void TileRows(const float* X, const float* Wt, float* Y, int64_t K, int64_t N, int64_t m0,
              int64_t n0) {
  Vec acc[R][kVecs] = {};
  for (int64_t k = 0; k < K; ++k) {
    const Vec* w = reinterpret_cast<const Vec*>(Wt + k * kTile);
    Vec wk[kVecs];
    for (int j = 0; j < kVecs; ++j) wk[j] = w[j];
    for (int r = 0; r < R; ++r) {
      const float x = X[(m0 + r) * K + k];
      for (int j = 0; j < kVecs; ++j) acc[r][j] += x * wk[j];
    }
  }
  const int64_t cols = std::min<int64_t>(kTile, N - n0);
  for (int r = 0; r < R; ++r) std::memcpy(Y + (m0 + r) * N + n0, acc[r], cols * sizeof(float));
}

template <int R = kRows - 1>
void TailRows(int rows, const float* X, const float* Wt, float* Y, int64_t K, int64_t N,
              int64_t m0, int64_t n0) {
  if constexpr (R > 0) {
    if (rows == R) return TileRows<R>(X, Wt, Y, K, N, m0, n0);
    TailRows<R - 1>(rows, X, Wt, Y, K, N, m0, n0);
  }
}

struct Job {
  const float* x;
  const float* w;
  float* y;
  int64_t M, K, N, tiles;
  std::atomic<int64_t> next{0}, done{0};
};

void Work(Job& j) {
  for (int64_t t; (t = j.next.fetch_add(1, std::memory_order_relaxed)) < j.tiles;) {
    const float* Wt = j.w + t * j.K * kTile;
    int64_t m = 0;
    for (; m + kRows <= j.M; m += kRows) TileRows<kRows>(j.x, Wt, j.y, j.K, j.N, m, t * kTile);
    TailRows(static_cast<int>(j.M - m), j.x, Wt, j.y, j.K, j.N, m, t * kTile);
    j.done.fetch_add(1, std::memory_order_release);
  }
}

ffi::Error SmallMatmul(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::F32> wp,
                       ffi::ResultBuffer<ffi::F32> y) {
  auto dx = x.dimensions(), dw = wp.dimensions(), dy = y->dimensions();
  if (dx.size() != 2 || dw.size() != 3 || dy.size() != 2 || dw[2] != kTile || dw[1] != dx[1] ||
      dy[0] != dx[0] || dw[0] != (dy[1] + kTile - 1) / kTile) {
    return ffi::Error::InvalidArgument("small_matmul: expected x (M, K), wp (tiles, K, tile)");
  }
  // shared with the pool tasks, which may start after this call has returned
  auto job = std::make_shared<Job>();
  job->x = x.typed_data();
  job->w = wp.typed_data();
  job->y = y->typed_data();
  job->M = dx[0];
  job->K = dx[1];
  job->N = dy[1];
  job->tiles = dw[0];
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, job->tiles / 2 - 1);
  for (int64_t h = 0; h < helpers; ++h) pool.Schedule([job] { Work(*job); });
  Work(*job);
  while (job->done.load(std::memory_order_acquire) < job->tiles) std::this_thread::yield();
  return ffi::Error::Success();
}

}  // namespace

extern "C" int GpnSmallMatmulTile() { return static_cast<int>(kTile); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(GpnSmallMatmul, SmallMatmul,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::Buffer<ffi::F32>>()  // wp
                                  .Ret<ffi::Buffer<ffi::F32>>());  // y
