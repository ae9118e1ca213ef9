// Execution-space annotations and the versioned namespace for kernels.
// Host headers never include CUDA headers; under nvcc these expand to the
// annotations that make the op functors usable in device code.
#pragma once

#if defined(__CUDACC__)
#define PLAIT_HOST_DEVICE __host__ __device__
#define PLAIT_DEVICE __device__
#else
#define PLAIT_HOST_DEVICE
#define PLAIT_DEVICE
#endif

#define PLAIT_FORCE_INLINE inline __attribute__((always_inline))
