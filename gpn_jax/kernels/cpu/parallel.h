// Independent work items shared between the calling thread and XLA's intra-op pool (the
// memory kernels' (batch row, head) items): each thread claims the next item from one counter,
// so a pool task that starts late costs only the items it would have taken (as small_matmul.cc
// shares its tiles). The call returns when every item is done; a pool task that starts after
// that finds none left and touches nothing of the caller's.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>

#include "xla/ffi/api/ffi.h"

namespace gpn_native {

template <typename F>
void ParallelFor(xla::ffi::ThreadPool& pool, int64_t items, const F& fn) {
  if (items <= 0) return;
  struct State {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto state = std::make_shared<State>();
  const F* body = &fn;  // only dereferenced while items remain, i.e. before this call returns
  auto work = [state, items, body] {
    for (int64_t i; (i = state->next.fetch_add(1, std::memory_order_relaxed)) < items;) {
      (*body)(i);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = std::min<int64_t>(pool.num_threads() - 1, items - 1);
  for (int64_t h = 0; h < helpers; ++h) {
    auto task = work;
    pool.Schedule(std::move(task));
  }
  work();
  while (state->done.load(std::memory_order_acquire) < items) std::this_thread::yield();
}

}  // namespace gpn_native
