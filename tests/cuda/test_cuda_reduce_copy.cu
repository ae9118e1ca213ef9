// reduce_copy_device against the host reduce_copy, element by element and bit for bit, for
// the CI subset (float sum, bfloat16 sum, int32 max) over 1-3 sources, 1-3 destinations, in
// place and not, with avg finalize for float; arrays 16-byte aligned (the kernel's packed
// path: 16 bytes per access), all one element off (packed after a head of single
// elements), and only the last source and destination one element off (element by
// element), at counts that leave a partial pack. A plain program (no Catch2): prints a report,
// returns 0 on success, 1 on a mismatch or CUDA error, 77 (Meson: SKIP) without a device.
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <plait/kernel/reduce_copy.cuh>
#include <plait/kernel/reduce_copy.hpp>
#include <plait/ops.hpp>
#include <plait/types.hpp>

namespace {

int failures = 0;
int cases = 0;

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("FAIL  %s: %s (%d)\n", what, cudaGetErrorString(e), static_cast<int>(e));
  return false;
}

template <class T>
double show(T x) {
  return static_cast<double>(plait::to_compute(x));
}

template <class T>
T input(int k, std::size_t i) {
  const auto x = static_cast<std::uint32_t>(i * 2654435761u + static_cast<std::uint32_t>(k) * 40503u);
  if constexpr (std::is_same_v<T, plait::bfloat16>) {
    return T(static_cast<float>(static_cast<int>(x % 2001) - 1000) * 0.0625f);
  } else if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(static_cast<int>(x % 200001) - 100000) / T(7);
  } else {
    return static_cast<T>(x ^ (x >> 7));
  }
}

// One case: nsrc inputs, ndst outputs (the first one in place on source 0 when in_place),
// on the device and on the host, compared bit for bit. Arrays start at their allocation
// (shift::none), one element into it (shift::all), or so for the last source and the last
// destination only (shift::last: the arrays' offsets from 16-byte boundaries differ).
enum class shift { none, all, last };

template <class T, class Op>
void run_case(const char* name, const Op& op, int nsrc, int ndst, std::size_t count, bool in_place, int finalize_n,
              shift where = shift::none) {
  ++cases;
  char label[160];
  std::snprintf(label, sizeof label, "%s nsrc=%d ndst=%d count=%zu%s%s finalize_n=%d", name, nsrc, ndst, count,
                in_place ? " in-place" : "",
                where == shift::all    ? " all-shifted"
                : where == shift::last ? " last-shifted"
                                       : "",
                finalize_n);

  std::vector<std::vector<T>> host_src(static_cast<std::size_t>(nsrc));
  for (int k = 0; k < nsrc; ++k)
    for (std::size_t i = 0; i < count; ++i) host_src[static_cast<std::size_t>(k)].push_back(input<T>(k, i));

  // Host reference: the host kernel on copies (in place too, when asked).
  std::vector<std::vector<T>> ref_src = host_src;
  std::vector<std::vector<T>> ref_dst(static_cast<std::size_t>(ndst), std::vector<T>(count));
  std::array<const T*, 3> hs{};
  std::array<T*, 3> hd{};
  for (int k = 0; k < nsrc; ++k) hs[static_cast<std::size_t>(k)] = ref_src[static_cast<std::size_t>(k)].data();
  for (int k = 0; k < ndst; ++k) hd[static_cast<std::size_t>(k)] = ref_dst[static_cast<std::size_t>(k)].data();
  if (in_place) hd[0] = ref_src[0].data();
  plait::kernel::reduce_copy<T>(op, std::span<const T* const>(hs.data(), static_cast<std::size_t>(nsrc)),
                                std::span<T* const>(hd.data(), static_cast<std::size_t>(ndst)), count, finalize_n);

  const std::size_t bytes = count * sizeof(T);
  // ds, dd: the allocations (one element spare); sp, dp: where the arrays start in them.
  const auto moved = [where](int k, int n) { return where == shift::all || (where == shift::last && k == n - 1); };
  std::array<T*, 3> ds{};
  std::array<T*, 3> dd{};
  std::array<T*, 3> sp{};
  std::array<T*, 3> dp{};
  bool ok = true;
  for (int k = 0; k < nsrc && ok; ++k) {
    const auto u = static_cast<std::size_t>(k);
    ok = check(cudaMalloc(&ds[u], bytes + sizeof(T)), "cudaMalloc");
    if (!ok) break;
    T* start = ds[u] + (moved(k, nsrc) ? 1 : 0);
    sp[u] = start;
    ok = check(cudaMemcpy(start, host_src[u].data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  for (int k = 0; k < ndst && ok; ++k) {
    const auto u = static_cast<std::size_t>(k);
    if (k == 0 && in_place) {
      dp[0] = sp[0];  // source 0's start, shifted or not
      continue;
    }
    ok = check(cudaMalloc(&dd[u], bytes + sizeof(T)), "cudaMalloc") &&
         check(cudaMemset(dd[u], 0xa5, bytes + sizeof(T)), "cudaMemset");
    dp[u] = dd[u] + (moved(k, ndst) ? 1 : 0);
  }
  if (ok) {
    ok = check(plait::kernel::reduce_copy_device<T>(op, sp.data(), nsrc, dp.data(), ndst, count, finalize_n, nullptr),
               label) &&
         check(cudaDeviceSynchronize(), label);
  }
  int bad = 0;
  for (int k = 0; k < ndst && ok; ++k) {
    std::vector<T> got(count);
    ok = check(cudaMemcpy(got.data(), dp[static_cast<std::size_t>(k)], bytes, cudaMemcpyDeviceToHost),
               "cudaMemcpy to host");
    const T* want = hd[static_cast<std::size_t>(k)];
    for (std::size_t i = 0; ok && i < count; ++i) {
      if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
        if (bad++ < 3)
          std::printf("FAIL  %s: destination %d element %zu: expected %.9g, got %.9g\n", label, k, i, show(want[i]),
                      show(got[i]));
      }
    }
  }
  if (bad > 0) std::printf("FAIL  %s: %d elements differ\n", label, bad);
  if (!ok || bad > 0) ++failures;
  for (int k = 0; k < nsrc; ++k) cudaFree(ds[static_cast<std::size_t>(k)]);
  for (int k = in_place ? 1 : 0; k < ndst; ++k) cudaFree(dd[static_cast<std::size_t>(k)]);
}

template <class T, class Op>
void sweep(const char* name, const Op& op, int finalize_n = 0) {
  const std::size_t counts[] = {0, 1, 13, 4099, (std::size_t{1} << 20) + 3};
  for (std::size_t count : counts)
    for (int nsrc = 1; nsrc <= 3; ++nsrc)
      for (int ndst = 1; ndst <= 3; ++ndst)
        for (bool in_place : {false, true}) run_case<T>(name, op, nsrc, ndst, count, in_place, finalize_n);
  // Arrays off 16-byte boundaries; 4099 leaves a partial pack too.
  for (int nsrc = 1; nsrc <= 3; ++nsrc)
    for (int ndst = 1; ndst <= 3; ++ndst)
      for (bool in_place : {false, true})
        for (shift where : {shift::all, shift::last})
          run_case<T>(name, op, nsrc, ndst, 4099, in_place, finalize_n, where);
}

}  // namespace

int main() {
  if (const char* why = plait::kernel::no_device_reason()) {
    std::printf("SKIP: no CUDA device (%s)\n", why);
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    std::printf("device 0: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);

  sweep<float>("float sum", plait::sum{});
  sweep<plait::bfloat16>("bfloat16 sum", plait::sum{});
  sweep<std::int32_t>("int32 max", plait::max{});
  sweep<float>("float avg", plait::avg{}, 3);

  // Invalid fan counts are refused without launching.
  const float* none[1] = {nullptr};
  float* out[1] = {nullptr};
  ++cases;
  if (plait::kernel::reduce_copy_device<float>(plait::sum{}, none, 4, out, 1, 10, 0, nullptr) !=
      cudaErrorInvalidValue) {
    std::printf("FAIL  4 sources were not refused with cudaErrorInvalidValue\n");
    ++failures;
  }

  std::printf("%s: %d of %d cases passed\n", failures == 0 ? "PASS" : "FAIL", cases - failures, cases);
  return failures == 0 ? 0 : 1;
}
