// The block runner of the CPU emulator (see include/cuda_emu.h).
#include <barrier>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "cuda_emu.h"

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
dim3 blockDim;
dim3 gridDim;

namespace emu {
namespace {

struct Warp {
  std::unique_ptr<std::barrier<>> barrier;
  uint64_t slots[32];
};

struct Block {
  std::unique_ptr<std::barrier<>> barrier;
  std::vector<Warp> warps;
};

Block* current = nullptr;
thread_local int linear = 0;

}  // namespace

void sync_block() { current->barrier->arrive_and_wait(); }

void exchange(const void* value, void* out, int bytes, int lane_mask) {
  Warp& warp = current->warps[linear / 32];
  const int lane = linear % 32;
  memcpy(&warp.slots[lane], value, bytes);
  warp.barrier->arrive_and_wait();
  memcpy(out, &warp.slots[lane ^ lane_mask], bytes);
  warp.barrier->arrive_and_wait();
}

// Runs fn on every thread of every block of the grid, one block at a time.
int run(const unsigned* grid, const unsigned* block, const std::function<void()>& fn) {
  gridDim = {grid[0], grid[1], grid[2]};
  blockDim = {block[0], block[1], block[2]};
  const int threads = (int) (block[0] * block[1] * block[2]);
  for (unsigned bz = 0; bz < grid[2]; ++bz)
    for (unsigned by = 0; by < grid[1]; ++by)
      for (unsigned bx = 0; bx < grid[0]; ++bx) {
        Block b;
        b.barrier = std::make_unique<std::barrier<>>(threads);
        for (int w = 0; w * 32 < threads; ++w) {
          Warp warp;
          warp.barrier = std::make_unique<std::barrier<>>(std::min(32, threads - w * 32));
          b.warps.push_back(std::move(warp));
        }
        current = &b;
        std::vector<std::thread> pool;
        pool.reserve(threads);
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            linear = t;
            threadIdx = {(unsigned) t % block[0], (unsigned) (t / block[0]) % block[1],
                         (unsigned) t / (block[0] * block[1])};
            blockIdx = {bx, by, bz};
            fn();
            b.warps[t / 32].barrier->arrive_and_drop();
            b.barrier->arrive_and_drop();
          });
        for (auto& th : pool) th.join();
        current = nullptr;
      }
  return 0;
}

}  // namespace emu
