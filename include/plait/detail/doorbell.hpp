// doorbell: the one place an executor sleeps.
//
// A 32-bit counter that every event for this rank increments (a peer posted a slot
// or freed one, a progress thread moved bytes, abort() was called). The waiter reads
// the counter, re-checks its condition, spins briefly, then sleeps in futex(2) on
// the counter with a bound, so a lost wake-up costs at most that bound, never a hang.
// The word may live in shared memory (shm transport binds it into its segment so
// peers in other processes can ring it), hence non-private futex operations.
// A waiter whose transport can sleep on its own descriptors (tcp: the peers'
// sockets) sleeps there instead, so the bytes that wake it are moved by the thread
// they woke; ring() then also writes an eventfd that sleep watches. That eventfd is
// the doorbell's own, made at the first such sleep; a ring from another process (the
// static ring(), through shared memory) does not write it, so a transport whose
// peers ring that way (shm, a hybrid) sleeps on the futex.
// Thread-safety: ring() from any thread or process; wait() from the executor thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <linux/futex.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace plait::detail {

struct doorbell_word {
  std::atomic<std::uint32_t> count{0};
  std::atomic<std::uint32_t> sleepers{0};
};

inline void futex_wake_all(std::atomic<std::uint32_t>* word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void futex_wait_for(std::atomic<std::uint32_t>* word, std::uint32_t expected,
                           std::chrono::nanoseconds bound) noexcept {
  if (bound.count() <= 0) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(bound.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(bound.count() % 1'000'000'000);
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class doorbell {
 public:
  // A waiter that moves no bytes itself.
  struct no_io {
    static bool progress() noexcept { return false; }
    static void release() noexcept {}
  };

  doorbell() : word_(&own_) {}
  ~doorbell() {
    if (const int fd = kick_fd_.load(std::memory_order_relaxed); fd >= 0) ::close(fd);
  }
  doorbell(const doorbell&) = delete;
  doorbell& operator=(const doorbell&) = delete;

  // Moves the word into memory other processes map (before any peer can ring it).
  void bind(doorbell_word* shared) noexcept { word_ = shared; }
  doorbell_word* word() noexcept { return word_; }

  std::uint32_t snapshot() const noexcept { return word_->count.load(std::memory_order_acquire); }

  static void ring(doorbell_word* w) noexcept {
    w->count.fetch_add(1, std::memory_order_seq_cst);
    if (w->sleepers.load(std::memory_order_acquire) != 0) futex_wake_all(&w->count);
  }
  // The Dekker pair with wait(): the count's increment (seq_cst) before this load,
  // and the sleeper's io_sleepers_ increment before its count load, so one of them
  // sees the other.
  void ring() noexcept {
    ring(word_);
    if (io_sleepers_.load(std::memory_order_seq_cst) != 0) {
      const std::uint64_t one = 1;
      if (::write(kick_fd_.load(std::memory_order_relaxed), &one, sizeof one) < 0) {
        // EAGAIN: the counter is saturated, so the sleeper is being woken anyway.
      }
    }
  }

  // Returns when the counter moves past `seen`, or after `bound` at most. Polls
  // first, for a bounded time: waking a sleeping process costs tens of microseconds
  // (more in a VM, where an idle vCPU halts), while with ranks <= cores a peer's next
  // post usually lands within that. The first microseconds spin on the word; after
  // that each poll yields the core, so on a busy host the peer this rank waits for
  // can run. With more ranks than cores the poll is shorter: a rank that yields
  // hands the core to a peer that has work, which costs a few microseconds, while a
  // sleeping rank's wake-up costs tens; but a rank that waits long should leave the
  // core to the others altogether.
  void wait(std::uint32_t seen, std::chrono::nanoseconds bound) noexcept { wait(seen, bound, no_io{}); }

  // The same, for a waiter that moves its transport's bytes itself while it polls
  // (link_set::progress): io.progress() is called at every look and ends the wait
  // when it returns true (news); io.release() is called before sleeping, so that the
  // transport's own thread moves the bytes while this one sleeps.
  // When the Io can sleep in its transport (io.sleep(bound, kick_fd): blocks until
  // its descriptors have bytes to move or kick_fd is readable, moves them, returns
  // false where it cannot sleep so), the waiter sleeps there and keeps the I/O;
  // otherwise io.release() first, then the futex.
  // `start`, if given, is when the wait began (a clock read the caller just made):
  // the poll and the bound count from it.
  template <class Io>
  void wait(std::uint32_t seen, std::chrono::nanoseconds bound, Io&& io,
            std::chrono::steady_clock::time_point start = {}) noexcept {
    const auto poll = std::min(spin_, bound);
    if (poll.count() > 0) {
      if (start == std::chrono::steady_clock::time_point{}) start = std::chrono::steady_clock::now();
      for (unsigned i = 1;; ++i) {
        if (word_->count.load(std::memory_order_acquire) != seen) return;
        if (i % 16 != 0) {
          cpu_relax();
          continue;
        }
        if (io.progress()) return;
        const auto spent = std::chrono::steady_clock::now() - start;
        if (spent >= poll) break;
        if (spent >= pure_spin) sched_yield();
      }
    }
    if constexpr (requires { io.sleep(bound, 0); }) {
      if (const int fd = kick_fd(); fd >= 0) {
        io_sleepers_.fetch_add(1, std::memory_order_seq_cst);
        const bool slept = word_->count.load(std::memory_order_seq_cst) != seen || io.sleep(bound - poll, fd);
        io_sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        if (slept) return;
      }
    }
    io.release();
    word_->sleepers.fetch_add(1, std::memory_order_acq_rel);
    if (word_->count.load(std::memory_order_acquire) == seen) futex_wait_for(&word_->count, seen, bound - poll);
    word_->sleepers.fetch_sub(1, std::memory_order_acq_rel);
  }

  // How long wait() polls before it sleeps (PLAIT_POLL overrides). Oversubscribed
  // ranks (more ranks than cores) poll 100 us, yielding between looks: measured
  // against 2 us with 4 ranks on 2 cores, 4K all_reduce 31 -> 17 us, all_gather and
  // reduce_scatter 28 -> 9 us (docs/performance.md).
  void set_spin(std::chrono::nanoseconds spin) noexcept { spin_ = spin; }
  static constexpr std::chrono::nanoseconds dedicated_spin = std::chrono::microseconds(500);
  static constexpr std::chrono::nanoseconds oversubscribed_spin = std::chrono::microseconds(100);
  static constexpr std::chrono::nanoseconds pure_spin = std::chrono::microseconds(1);

 private:
  // The eventfd a sleep in the transport watches; made by the first such wait, kept
  // until the doorbell goes. -1 where it could not be made. (ring() reads it only
  // after it sees a sleeper, whose count was raised after this returned.)
  int kick_fd() noexcept {
    int fd = kick_fd_.load(std::memory_order_acquire);
    if (fd != -2) return fd;
    const int made = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (kick_fd_.compare_exchange_strong(fd, made < 0 ? -1 : made, std::memory_order_acq_rel))
      return made < 0 ? -1 : made;
    if (made >= 0) ::close(made);  // another waiter made one first
    return fd;
  }

  doorbell_word own_;
  doorbell_word* word_;
  std::atomic<int> kick_fd_{-2};  // -2: not made yet
  std::atomic<std::uint32_t> io_sleepers_{0};
  std::chrono::nanoseconds spin_ = dedicated_spin;
};

}  // namespace plait::detail
