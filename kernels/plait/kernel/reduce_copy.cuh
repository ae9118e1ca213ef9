// reduce_copy on a CUDA device: the same one-pass N-source -> M-destination reduce as the
// host kernel (reduce_copy.hpp), for arrays in device memory (or memory the device can
// address: managed, mapped host, peer memory through CUDA IPC).
//
//   reduce_copy_device<T>(op, srcs, nsrc, dsts, ndst, count, finalize_n, stream)
//
// enqueues the work on `stream` and returns without waiting; the result is defined
// once the stream reaches that point. Element i of every destination is
// op(...op(src[0][i], src[1][i])..., src[nsrc-1][i]) in compute_t<T>, then
// op.finalize(v, finalize_n) when finalize_n != 0 and Op has one, rounded once to T:
// bit for bit what the host kernel gives, as long as Op computes the same on both sides.
// One source and no finalize is a copy (cudaMemcpyAsync, bit-exact, skipping a
// destination that is the source). The pointer arrays are read on the host before the
// call returns; the data arrays must stay valid until the stream has run the work.
// A destination may be the very same array as a source; other overlaps are undefined.
// Returns cudaErrorInvalidValue for a source count outside 1..3, a destination count
// outside 0..3 or a null pointer array, and otherwise the launch status. Never throws.
//
// Op must be callable in device code (its operator() __host__ __device__, as the
// built-in ops are through PLAIT_HOST_DEVICE). Kernels live in a versioned inline
// namespace with hidden visibility, so two libraries embedding different versions of
// plait never share a kernel stub. This is the only kernel header that includes CUDA
// headers; compile it with nvcc in C++20 mode.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <plait/detail/config.hpp>
#include <plait/ops.hpp>
#include <plait/types.hpp>

#ifndef PLAIT_KERNEL_ATTRIBUTES
#define PLAIT_KERNEL_ATTRIBUTES __global__ __attribute__((visibility("hidden")))
#endif

namespace plait::kernel {
inline namespace v1 {

namespace detail {

inline constexpr int device_max_sources = 3;
inline constexpr int device_max_destinations = 3;

// The pointers travel by value in the kernel's parameters (no device-side array to
// allocate or copy first).
template <class T>
struct device_fan {
  const T* src[device_max_sources];
  T* dst[device_max_destinations];
  int ndst;
};

// Element i of the result, from element i of each source.
template <int NSRC, bool Finalize, class T, class Op>
__device__ __forceinline__ T reduce_one(const Op& op, const T (&in)[NSRC], int finalize_n) {
  compute_t<T> v = to_compute(in[0]);
#pragma unroll
  for (int k = 1; k < NSRC; ++k) v = op(v, to_compute(in[k]));
  if constexpr (Finalize) v = op.finalize(v, finalize_n);
  return from_compute<T>(v);
}

// Elements per 16-byte access; 0 where T does not divide 16 bytes.
template <class T>
inline constexpr int pack_elements = 16 % sizeof(T) == 0 ? static_cast<int>(16 / sizeof(T)) : 0;

// NSRC is a template parameter so that the source loop unrolls into straight loads; the
// destination count stays a runtime value (uniform across the grid: no divergence), which
// keeps the number of kernels per (T, Op) at twelve.
// Packed: every pointer is the same number of bytes past a 16-byte boundary. The first
// `head` elements (up to that boundary) and those after the last whole pack go one by
// one; in between, each thread moves 16 bytes per access (one 128-bit load per source,
// one store per destination). A 2-byte type read one element per
// thread reached 58 % of the device copy's rate on an H200 (cuda-bw), 16 bytes at a time
// keeps the memory system busy with as few instructions. The arithmetic per element is
// the same either way, so the result is bit for bit the same.
template <int NSRC, bool Finalize, bool Packed, class T, class Op>
PLAIT_KERNEL_ATTRIBUTES void reduce_copy_kernel(Op op, device_fan<T> fan, std::size_t count, int finalize_n,
                                                std::size_t head) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const auto one = [&](std::size_t i) {
    T in[NSRC];
#pragma unroll
    for (int k = 0; k < NSRC; ++k) in[k] = fan.src[k][i];
    const T out = reduce_one<NSRC, Finalize>(op, in, finalize_n);
#pragma unroll
    for (int k = 0; k < device_max_destinations; ++k)
      if (k < fan.ndst) fan.dst[k][i] = out;
  };
  std::size_t done = 0;
  if constexpr (Packed) {
    constexpr int P = pack_elements<T>;
    if (first < head) one(first);
    const std::size_t packs = (count - head) / P;
    for (std::size_t g = first; g < packs; g += stride) {
      uint4 raw[NSRC];
#pragma unroll
      for (int k = 0; k < NSRC; ++k) raw[k] = reinterpret_cast<const uint4*>(fan.src[k] + head)[g];
      T out[P];
#pragma unroll
      for (int j = 0; j < P; ++j) {
        T in[NSRC];
#pragma unroll
        for (int k = 0; k < NSRC; ++k)
          std::memcpy(&in[k], reinterpret_cast<const char*>(&raw[k]) + j * sizeof(T), sizeof(T));
        out[j] = reduce_one<NSRC, Finalize>(op, in, finalize_n);
      }
      uint4 packed;
      std::memcpy(&packed, out, sizeof packed);
#pragma unroll
      for (int k = 0; k < device_max_destinations; ++k)
        if (k < fan.ndst) reinterpret_cast<uint4*>(fan.dst[k] + head)[g] = packed;
    }
    done = head + packs * P;
  }
  for (std::size_t i = done + first; i < count; i += stride) one(i);
}

// The elements before every pointer of the fan reaches a 16-byte boundary at once, or -1
// when the pointers sit at different offsets from it (or one is not T-aligned).
template <class T>
long pack_head(const device_fan<T>& fan, int nsrc) {
  const auto off = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16; };
  const std::uintptr_t o = off(fan.src[0]);
  for (int k = 1; k < nsrc; ++k)
    if (off(fan.src[k]) != o) return -1;
  for (int k = 0; k < fan.ndst; ++k)
    if (off(fan.dst[k]) != o) return -1;
  if (o % sizeof(T) != 0) return -1;
  return static_cast<long>((16 - o) % 16 / sizeof(T));
}

template <bool Finalize, bool Packed, class T, class Op>
cudaError_t launch_reduce_copy(const Op& op, const device_fan<T>& fan, int nsrc, std::size_t count, int finalize_n,
                               std::size_t head, cudaStream_t stream) {
  // A grid-stride loop: enough blocks to fill the device several times over, no more,
  // so that large counts do not pay for launching millions of blocks.
  constexpr unsigned threads = 256;
  constexpr std::size_t max_blocks = 4096;
  const std::size_t per_thread = Packed ? static_cast<std::size_t>(pack_elements<T>) : 1;
  const std::size_t wanted = (count + threads * per_thread - 1) / (threads * per_thread);
  const auto blocks = static_cast<unsigned>(wanted < max_blocks ? wanted : max_blocks);
  switch (nsrc) {
    case 1:
      reduce_copy_kernel<1, Finalize, Packed><<<blocks, threads, 0, stream>>>(op, fan, count, finalize_n, head);
      break;
    case 2:
      reduce_copy_kernel<2, Finalize, Packed><<<blocks, threads, 0, stream>>>(op, fan, count, finalize_n, head);
      break;
    default:
      reduce_copy_kernel<3, Finalize, Packed><<<blocks, threads, 0, stream>>>(op, fan, count, finalize_n, head);
      break;
  }
  return cudaGetLastError();
}

template <bool Finalize, class T, class Op>
cudaError_t launch_reduce_copy(const Op& op, const device_fan<T>& fan, int nsrc, std::size_t count, int finalize_n,
                               cudaStream_t stream) {
  if constexpr (pack_elements<T> != 0) {
    const long head = pack_head(fan, nsrc);
    if (head >= 0 && static_cast<std::size_t>(head) < count)
      return launch_reduce_copy<Finalize, true>(op, fan, nsrc, count, finalize_n, static_cast<std::size_t>(head),
                                                stream);
  }
  return launch_reduce_copy<Finalize, false>(op, fan, nsrc, count, finalize_n, 0, stream);
}

}  // namespace detail

// Why this process cannot use a CUDA device, or nullptr when it can. A failed
// cudaGetDeviceCount (no driver: cudaErrorInsufficientDriver) counts as no device; it
// leaves the count unwritten, so the count starts at 0. Never throws.
inline const char* no_device_reason() noexcept {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return cudaGetErrorString(e);
  return devices == 0 ? "cudaGetDeviceCount returned 0" : nullptr;
}

template <class T, class Op>
requires reduce_op<Op, T> cudaError_t reduce_copy_device(const Op& op, const T* const* srcs, int nsrc, T* const* dsts,
                                                         int ndst, std::size_t count, int finalize_n,
                                                         cudaStream_t stream) {
  if (srcs == nullptr || nsrc < 1 || nsrc > detail::device_max_sources || ndst < 0 ||
      ndst > detail::device_max_destinations || (ndst > 0 && dsts == nullptr))
    return cudaErrorInvalidValue;
  if (count == 0 || ndst == 0) return cudaSuccess;
  constexpr bool can_finalize = has_finalize<Op, T>;
  const bool finalize = can_finalize && finalize_n != 0;
  if (nsrc == 1 && !finalize) {
    for (int k = 0; k < ndst; ++k) {
      if (dsts[k] == srcs[0]) continue;
      const cudaError_t e = cudaMemcpyAsync(dsts[k], srcs[0], count * sizeof(T), cudaMemcpyDefault, stream);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  }
  detail::device_fan<T> fan{};
  for (int k = 0; k < nsrc; ++k) fan.src[k] = srcs[k];
  for (int k = 0; k < ndst; ++k) fan.dst[k] = dsts[k];
  fan.ndst = ndst;
  if constexpr (can_finalize) {
    if (finalize) return detail::launch_reduce_copy<true>(op, fan, nsrc, count, finalize_n, stream);
  }
  return detail::launch_reduce_copy<false>(op, fan, nsrc, count, finalize_n, stream);
}

}  // namespace v1
}  // namespace plait::kernel
