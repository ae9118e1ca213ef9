// cuda-bw: reduce_copy_device against the device's own copy, in device memory.
//
// Usage: cuda-bw [MiB per array, default 1024]
// Times, with CUDA events (median of 20 calls after 5 warm-ups):
//   copy          cudaMemcpyAsync device to device (the memory bound: HBM read + write);
//   sum 2->1      reduce_copy_device float sum, 2 sources, 1 destination;
//   sum 2->2      the same, 2 destinations (the ring's reduce-and-forward step);
//   sum 3->1      3 sources, 1 destination;
//   bf16 sum 2->1 bfloat16, 2 sources, 1 destination;
//   sum 2->1 +1   float sum with every array one element in (off a 16-byte boundary, all by
//                 the same: 16 bytes per access after a few single elements);
//   ... mixed     the destination alone one element in (the arrays' offsets differ: the
//                 kernel goes element by element instead of 16 bytes per access).
// GB/s counts every byte read and written (1e9 bytes/s), and %copy is that over the
// copy's own rate: the gap between the fused kernel and the memory bound.
// Prints the reason and exits 77 without a device (no GPU here is not a failure).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <plait/kernel/reduce_copy.cuh>
#include <plait/ops.hpp>
#include <plait/types.hpp>

namespace {

void must(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "cuda-bw: %s: %s (%d)\n", what, cudaGetErrorString(e), static_cast<int>(e));
  std::exit(1);
}

// Median milliseconds of one call of f (which enqueues on the default stream).
template <class F>
float median_ms(F f) {
  cudaEvent_t a, b;
  must(cudaEventCreate(&a), "cudaEventCreate");
  must(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 5; ++i) must(f(), "warm-up");
  std::vector<float> ms;
  for (int i = 0; i < 20; ++i) {
    must(cudaEventRecord(a), "cudaEventRecord");
    must(f(), "timed call");
    must(cudaEventRecord(b), "cudaEventRecord");
    must(cudaEventSynchronize(b), "cudaEventSynchronize");
    float t = 0;
    must(cudaEventElapsedTime(&t, a, b), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::nth_element(ms.begin(), ms.begin() + 10, ms.end());
  return ms[10];
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* why = plait::kernel::no_device_reason()) {
    std::printf("SKIP: no CUDA device (%s)\n", why);
    return 77;
  }
  const long mib = argc > 1 ? std::atol(argv[1]) : 1024;
  if (mib < 1 || mib > 16384) {
    std::fprintf(stderr, "cuda-bw: MiB per array must be 1..16384, got %s\n", argv[1]);
    return 2;
  }
  cudaDeviceProp prop{};
  must(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const std::size_t bytes = static_cast<std::size_t>(mib) << 20;
  std::array<char*, 5> buf{};
  for (auto& p : buf) {
    must(cudaMalloc(&p, bytes), "cudaMalloc");
    must(cudaMemset(p, 0, bytes), "cudaMemset");  // first touch, outside the timing
  }
  const auto f = [&](int k) { return reinterpret_cast<float*>(buf[static_cast<std::size_t>(k)]); };
  const auto h = [&](int k) { return reinterpret_cast<plait::bfloat16*>(buf[static_cast<std::size_t>(k)]); };
  const std::size_t nf = bytes / sizeof(float), nh = bytes / sizeof(plait::bfloat16);

  std::printf("device 0: %s (sm_%d%d), %ld MiB per array\n", prop.name, prop.major, prop.minor, mib);
  std::printf("%-14s %10s %10s %7s\n", "kernel", "time (us)", "GB/s", "%copy");
  const float copy_ms = median_ms([&] { return cudaMemcpyAsync(buf[1], buf[0], bytes, cudaMemcpyDeviceToDevice); });
  const double copy_gbps = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e-3) / 1e9;
  std::printf("%-14s %10.1f %10.1f %6.0f%%\n", "copy", copy_ms * 1e3, copy_gbps, 100.0);

  const auto row = [&](const char* name, int arrays, auto call) {
    const float ms = median_ms(call);
    const double gbps = static_cast<double>(arrays) * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
    std::printf("%-14s %10.1f %10.1f %6.0f%%\n", name, ms * 1e3, gbps, 100.0 * gbps / copy_gbps);
  };
  row("sum 2->1", 3, [&] {
    const float* s[] = {f(0), f(1)};
    float* d[] = {f(2)};
    return plait::kernel::reduce_copy_device<float>(plait::sum{}, s, 2, d, 1, nf, 0, nullptr);
  });
  row("sum 2->2", 4, [&] {
    const float* s[] = {f(0), f(1)};
    float* d[] = {f(2), f(3)};
    return plait::kernel::reduce_copy_device<float>(plait::sum{}, s, 2, d, 2, nf, 0, nullptr);
  });
  row("sum 3->1", 4, [&] {
    const float* s[] = {f(0), f(1), f(2)};
    float* d[] = {f(3)};
    return plait::kernel::reduce_copy_device<float>(plait::sum{}, s, 3, d, 1, nf, 0, nullptr);
  });
  row("bf16 sum 2->1", 3, [&] {
    const plait::bfloat16* s[] = {h(0), h(1)};
    plait::bfloat16* d[] = {h(2)};
    return plait::kernel::reduce_copy_device<plait::bfloat16>(plait::sum{}, s, 2, d, 1, nh, 0, nullptr);
  });
  // One element into each array: packed after a head of single elements.
  row("sum 2->1 +1", 3, [&] {
    const float* s[] = {f(0) + 1, f(1) + 1};
    float* d[] = {f(2) + 1};
    return plait::kernel::reduce_copy_device<float>(plait::sum{}, s, 2, d, 1, nf - 1, 0, nullptr);
  });
  // Only the destination one element in: offsets differ, so element by element.
  row("sum 2->1 mixed", 3, [&] {
    const float* s[] = {f(0), f(1)};
    float* d[] = {f(2) + 1};
    return plait::kernel::reduce_copy_device<float>(plait::sum{}, s, 2, d, 1, nf - 1, 0, nullptr);
  });
  row("bf16 2->1 mixed", 3, [&] {
    const plait::bfloat16* s[] = {h(0), h(1)};
    plait::bfloat16* d[] = {h(2) + 1};
    return plait::kernel::reduce_copy_device<plait::bfloat16>(plait::sum{}, s, 2, d, 1, nh - 1, 0, nullptr);
  });
  for (auto* p : buf) cudaFree(p);
  return 0;
}
