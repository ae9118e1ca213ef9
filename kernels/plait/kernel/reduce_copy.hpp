// reduce_copy: the fused host kernel every collective step goes through (NCCL's
// reduceCopy). One pass over `count` elements: for each i,
//   v = op(...op(op(src[0][i], src[1][i]), src[2][i])...)   in compute_t<T>
//   v = op.finalize(v, finalize_n)                           if finalize_n != 0 and Op has one
//   dst[j][i] = v                                            for every destination j
// with 1..3 sources and 0..3 destinations. One source and no finalize is a copy: bytes are
// copied with copy_bytes (copy.hpp; bit-exact, NaN payloads included), skipping a
// destination that is the source: that is how all-gather and broadcast share this path
// with the reductions.
//
// Aliasing: a destination may be the very same array as a source (in-place all-reduce
// reads out[i] and writes out[i]) or as another destination; any other overlap between
// arrays is undefined. Element i is only ever read and written in iteration i, so the
// loop carries no dependency and is declared so (PLAIT_IVDEP): the compiler vectorises
// it without runtime overlap checks. It runs in blocks of a constant block_elems
// elements plus a tail, because g++ at -O2 (meson's debugoptimized and release) uses
// the "very cheap" cost model, which vectorises only loops whose trip count is a known
// multiple of the vector width. kernels/check_vectorized.py fails the build if g++
// stops vectorising the inner loop (meson option vectorize_check).
//
// The 16-bit float types vectorise with SSE2 already; -march=native helps them most.
//
// Never throws and never allocates; thread-safe for disjoint destinations. Calling it
// with a source or destination count out of range is a programming error: it prints the
// counts and aborts. Call it as reduce_copy<T>(op, srcs, dsts, count, finalize_n) so that
// arrays of pointers convert to the spans.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <utility>

#include <plait/detail/config.hpp>
#include <plait/kernel/copy.hpp>
#include <plait/ops.hpp>
#include <plait/types.hpp>

// Arrays are either the same array or disjoint (the aliasing rule above), so no iteration
// of the inner loop depends on another: say so to the compiler, which cannot prove it and
// would otherwise add runtime overlap checks (-O3) or not vectorise at all (-O2).
#ifndef PLAIT_IVDEP
#if defined(__clang__)
#define PLAIT_IVDEP _Pragma("clang loop vectorize(assume_safety)")
#elif defined(__GNUC__)
#define PLAIT_IVDEP _Pragma("GCC ivdep")
#else
#define PLAIT_IVDEP
#endif
#endif

namespace plait::kernel {
inline namespace v1 {

inline constexpr int max_sources = 3;
inline constexpr int max_destinations = 3;

namespace detail {

// Elements per block: a multiple of every vector width, and above g++'s limit for
// unrolling a loop completely (16 iterations), so the block stays a vector loop.
inline constexpr std::size_t block_elems = 64;

[[noreturn]] inline void bad_fan(std::size_t nsrc, std::size_t ndst) noexcept {
  std::fprintf(stderr,
               "plait: reduce_copy called with %zu sources and %zu destinations; it takes 1 to "
               "%d sources and 0 to %d destinations (a bug in the caller)\n",
               nsrc, ndst, max_sources, max_destinations);
  std::abort();
}

// One block of `len` elements starting at `base`. Len is std::integral_constant for
// full blocks (constant trip count) and std::size_t for the tail.
template <bool Finalize, class T, class Op, std::size_t NSRC, std::size_t NDST, std::size_t... K, std::size_t... D,
          class Len>
PLAIT_FORCE_INLINE void reduce_copy_block(const Op& op, const T* const (&s)[NSRC], T* const (&d)[NDST],
                                          std::size_t base, Len len, int finalize_n, std::index_sequence<K...>,
                                          std::index_sequence<D...>) noexcept {
  const std::size_t n = len;
  // The inner loop: kernels/check_vectorized.py fails the build if it is not vectorised.
  PLAIT_IVDEP
  for (std::size_t j = 0; j < n; ++j) {
    compute_t<T> v = to_compute(s[0][base + j]);
    ((v = op(v, to_compute(s[K + 1][base + j]))), ...);
    if constexpr (Finalize) v = op.finalize(v, finalize_n);
    // Converted once per destination rather than through a local T: g++ does not
    // vectorise a store of a local struct (half, bfloat16); it merges the conversions.
    ((d[D][base + j] = from_compute<T>(v)), ...);
  }
}

// The inner loop for a fan-in/fan-out known at compile time.
template <std::size_t NSRC, std::size_t NDST, bool Finalize, class T, class Op>
void reduce_copy_n(const Op& op, const T* const* srcs, T* const* dsts, std::size_t count, int finalize_n) noexcept {
  static_assert(NSRC >= 1 && NSRC <= max_sources && NDST >= 1 && NDST <= max_destinations);
  const T* s[NSRC];
  T* d[NDST];
  for (std::size_t k = 0; k < NSRC; ++k) s[k] = srcs[k];
  for (std::size_t k = 0; k < NDST; ++k) d[k] = dsts[k];
  constexpr auto ks = std::make_index_sequence<NSRC - 1>{};
  constexpr auto ds = std::make_index_sequence<NDST>{};
  std::size_t i = 0;
  for (; count - i >= block_elems; i += block_elems)
    reduce_copy_block<Finalize>(op, s, d, i, std::integral_constant<std::size_t, block_elems>{}, finalize_n, ks, ds);
  if (i < count) reduce_copy_block<Finalize>(op, s, d, i, count - i, finalize_n, ks, ds);
}

template <std::size_t NSRC, bool Finalize, class T, class Op>
void reduce_copy_dispatch_dst(const Op& op, const T* const* srcs, T* const* dsts, std::size_t ndst, std::size_t count,
                              int finalize_n) noexcept {
  switch (ndst) {
    case 1:
      return reduce_copy_n<NSRC, 1, Finalize>(op, srcs, dsts, count, finalize_n);
    case 2:
      return reduce_copy_n<NSRC, 2, Finalize>(op, srcs, dsts, count, finalize_n);
    case 3:
      return reduce_copy_n<NSRC, 3, Finalize>(op, srcs, dsts, count, finalize_n);
    default:
      bad_fan(NSRC, ndst);
  }
}

template <bool Finalize, class T, class Op>
void reduce_copy_dispatch(const Op& op, std::span<const T* const> srcs, std::span<T* const> dsts, std::size_t count,
                          int finalize_n) noexcept {
  switch (srcs.size()) {
    case 1:
      return reduce_copy_dispatch_dst<1, Finalize>(op, srcs.data(), dsts.data(), dsts.size(), count, finalize_n);
    case 2:
      return reduce_copy_dispatch_dst<2, Finalize>(op, srcs.data(), dsts.data(), dsts.size(), count, finalize_n);
    case 3:
      return reduce_copy_dispatch_dst<3, Finalize>(op, srcs.data(), dsts.data(), dsts.size(), count, finalize_n);
    default:
      bad_fan(srcs.size(), dsts.size());
  }
}

}  // namespace detail

// finalize_n: 0 for no finalize step; otherwise the n passed to op.finalize (the number
// of ranks for avg), applied only when Op has a finalize for T.
template <class T, class Op>
requires reduce_op<Op, T>
void reduce_copy(const Op& op, std::span<const T* const> srcs, std::span<T* const> dsts, std::size_t count,
                 int finalize_n) noexcept {
  if (srcs.empty() || srcs.size() > max_sources || dsts.size() > max_destinations)
    detail::bad_fan(srcs.size(), dsts.size());
  if (count == 0 || dsts.empty()) return;
  constexpr bool can_finalize = has_finalize<Op, T>;
  const bool finalize = can_finalize && finalize_n != 0;
  if (srcs.size() == 1 && !finalize) {
    for (T* dst : dsts)
      if (dst != srcs[0]) copy_bytes(dst, srcs[0], count * sizeof(T));
    return;
  }
  if constexpr (can_finalize) {
    if (finalize) return detail::reduce_copy_dispatch<true>(op, srcs, dsts, count, finalize_n);
  }
  detail::reduce_copy_dispatch<false>(op, srcs, dsts, count, finalize_n);
}

}  // namespace v1
}  // namespace plait::kernel
