// The translation unit kernels/check_vectorized.py compiles: the host kernel's inner loop
// for float sum with 2 sources and PLAIT_PROBE_NDST destinations, and nothing else, so
// that every vectoriser remark for reduce_copy.hpp belongs to that one loop.
#include <cstddef>

#include <plait/kernel/reduce_copy.hpp>

#ifndef PLAIT_PROBE_NDST
#error "compile with -DPLAIT_PROBE_NDST=<number of destinations>"
#endif

template void plait::kernel::detail::reduce_copy_n<2, PLAIT_PROBE_NDST, false, float, plait::sum>(
    const plait::sum&, const float* const*, float* const*, std::size_t, int) noexcept;
