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

// NSRC is a template parameter so that the source loop unrolls into straight loads; the
// destination count stays a runtime value (uniform across the grid: no divergence), which
// keeps the number of kernels per (T, Op) at six.
template <int NSRC, bool Finalize, class T, class Op>
PLAIT_KERNEL_ATTRIBUTES void reduce_copy_kernel(Op op, device_fan<T> fan, std::size_t count, int finalize_n) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    compute_t<T> v = to_compute(fan.src[0][i]);
#pragma unroll
    for (int k = 1; k < NSRC; ++k) v = op(v, to_compute(fan.src[k][i]));
    if constexpr (Finalize) v = op.finalize(v, finalize_n);
    const T out = from_compute<T>(v);
#pragma unroll
    for (int k = 0; k < device_max_destinations; ++k)
      if (k < fan.ndst) fan.dst[k][i] = out;
  }
}

template <bool Finalize, class T, class Op>
cudaError_t launch_reduce_copy(const Op& op, const device_fan<T>& fan, int nsrc, std::size_t count, int finalize_n,
                               cudaStream_t stream) {
  // A grid-stride loop: enough blocks to fill the device several times over, no more,
  // so that large counts do not pay for launching millions of blocks.
  constexpr unsigned threads = 256;
  constexpr std::size_t max_blocks = 4096;
  const std::size_t wanted = (count + threads - 1) / threads;
  const auto blocks = static_cast<unsigned>(wanted < max_blocks ? wanted : max_blocks);
  switch (nsrc) {
    case 1:
      reduce_copy_kernel<1, Finalize><<<blocks, threads, 0, stream>>>(op, fan, count, finalize_n);
      break;
    case 2:
      reduce_copy_kernel<2, Finalize><<<blocks, threads, 0, stream>>>(op, fan, count, finalize_n);
      break;
    default:
      reduce_copy_kernel<3, Finalize><<<blocks, threads, 0, stream>>>(op, fan, count, finalize_n);
      break;
  }
  return cudaGetLastError();
}

}  // namespace detail

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
