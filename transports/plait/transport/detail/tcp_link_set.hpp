// tcp_link_set: the TCP transport's link_set over already connected sockets.
//
// Bytes move in one of two ways, one at a time (the I/O mutex):
//   - a waiting executor moves them itself: progress() reads arriving frames into
//     receive slots and writes posted slots and credits, and post() writes its frame
//     at once; the progress thread is parked meanwhile, so a rank runs one busy thread,
//     not two (on a host with no spare core, two hand-offs per frame between threads
//     were most of the time of a small call); when it has polled its time it sleeps
//     in ppoll() on the sockets (sleep()), still holding the I/O, and moves what woke
//     it;
//   - otherwise (the executor is between calls with bytes still owed, or cannot sleep
//     on the sockets: release_io(); or PLAIT_PROGRESS=thread, where progress() is
//     never called) the progress thread poll()s every peer socket plus an eventfd,
//     does the same, and rings the doorbell whenever the executor has news (a slot
//     arrived, a send slot freed, a link failed).
// The executor-side calls other than sleep() never block, and none allocates: they
// only touch the link's slot memory and its counters, and wake the progress thread
// through the eventfd only when it owns the I/O and sleeps.
// The doorbell must outlive the link set. Its word is looked up at every ring, so a
// transport that binds the word into shared memory (shm in a hybrid) must do so before
// this link set is created, as a hybrid does by connecting shm first.
// close() (thread-safe, returns at once) sends each peer a closing frame announcing the
// slots already posted, which still follow as credits allow; destruction waits for them
// (at most min(connect_timeout, 5 s)), then stops the thread and closes the sockets.
// The sockets may be any connected stream sockets (the tests use socketpairs).
#pragma once

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <plait/detail/doorbell.hpp>
#include <plait/detail/socket.hpp>
#include <plait/error.hpp>
#include <plait/transport.hpp>
#include <plait/transport/detail/tcp_link.hpp>

namespace plait::transport::tcp_detail {

class tcp_link_set final : public link_set {
 public:
  tcp_link_set(int rank, int size, plait::detail::doorbell& bell, const link_config& cfg,
               std::vector<std::pair<int, plait::detail::fd_handle>> sockets)
      : rank_(rank),
        slot_bytes_(cfg.slot_bytes),
        receive_into_(cfg.single_copy),
        bell_(&bell),
        index_(static_cast<std::size_t>(size), -1),
        linger_(cfg.connect_timeout > std::chrono::nanoseconds::zero()
                    ? std::min<std::chrono::nanoseconds>(cfg.connect_timeout, std::chrono::seconds(5))
                    : std::chrono::nanoseconds(std::chrono::seconds(5))) {
    for (auto& [peer, fd] : sockets) {
      if (peer < 0 || peer >= size || peer == rank || index_[static_cast<std::size_t>(peer)] >= 0)
        throw error(errc::invalid_argument, "tcp link set: bad or repeated peer " + std::to_string(peer), rank);
      index_[static_cast<std::size_t>(peer)] = static_cast<int>(links_.size());
      links_.push_back(std::make_unique<tcp_link>(rank, peer, std::move(fd), cfg.slot_bytes, cfg.depth,
                                                  cfg.send_window_bytes, cfg.send_window_frames));
    }
    wake_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_fd_) throw error(errc::system, "eventfd failed: " + plait::detail::errno_text(errno), rank);
    pollfds_.resize(links_.size() + 1);
    sleep_fds_.resize(links_.size() + 1);
    rx_fds_.resize(links_.size());
    if (links_.empty()) return;  // nothing to move (a hybrid whose peers are all local)
    thread_ = std::thread([this] { run(); });
  }

  ~tcp_link_set() override {
    if (!thread_.joinable()) return;
    close();
    // A failed rank does not wait for peers to take its last slots (one may be stopped).
    const auto until =
        clock::now() +
        (deliver_.load(std::memory_order_relaxed) ? linger_ : std::chrono::nanoseconds(std::chrono::milliseconds(100)));
    while (!settled_.load(std::memory_order_acquire) && clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    stop_.store(true, std::memory_order_seq_cst);
    kick();
    thread_.join();
  }

  tcp_link_set(const tcp_link_set&) = delete;
  tcp_link_set& operator=(const tcp_link_set&) = delete;

  bool reaches(int peer) const override {
    return peer >= 0 && static_cast<std::size_t>(peer) < index_.size() && index_[static_cast<std::size_t>(peer)] >= 0;
  }
  std::size_t slot_bytes() const override { return slot_bytes_; }

  std::byte* acquire(int peer) override {
    if (close_requested_.load(std::memory_order_relaxed)) return nullptr;
    return link(peer).acquire();
  }

  void post(int peer, const plait::detail::slot_header& header) override { post_from(peer, header, nullptr); }

  // The payload goes from the caller's memory straight into the socket: one copy
  // fewer than through the slot.
  bool sends_from_memory(int peer) const override { return reaches(peer); }

  std::uint64_t post_from(int peer, const plait::detail::slot_header& header, const std::byte* payload) override {
    tcp_link& l = link(peer);
    const std::uint64_t ticket = l.post_from(header, payload);
    if (executor_io_.load(std::memory_order_seq_cst)) {
      // The executor moves the bytes: the frame leaves now, with any credits owed.
      std::unique_lock lock(io_mutex_, std::try_to_lock);
      if (lock.owns_lock()) {
        l.on_writable();
        l.pump_tx();
        return ticket;
      }
    }
    wake();
    return ticket;
  }

  bool sent(int peer, std::uint64_t ticket) override { return link(peer).sent(ticket); }

  // Diagnostics: readv calls made so far on the socket to `peer`.
  std::uint64_t socket_reads(int peer) {
    std::lock_guard lock(io_mutex_);
    return link(peer).socket_reads();
  }

  // Diagnostics: the congestion control of the socket to `peer` ("" when the kernel
  // does not say).
  std::string congestion(int peer) const { return plait::detail::congestion_of(link(peer).fd()); }

  void detach() noexcept override {
    std::lock_guard lock(io_mutex_);
    for (auto& l : links_) l->detach();
  }

  slot_view peek(int peer) override { return link(peer).peek(); }

  // A frame's payload can go from the socket straight into the caller's output: one
  // copy fewer than through the slot (off with link_config::single_copy = false).
  bool receives_into_memory(int peer) const override { return receive_into_ && reaches(peer); }

  expectation expect(int peer, std::size_t ahead, const plait::detail::slot_header& header, std::byte* dst) override {
    if (!receive_into_) return expectation::passed;
    return link(peer).expect(ahead, header, dst);
  }

  void release(int peer) override {
    link(peer).release();
    if (!executor_io_.load(std::memory_order_seq_cst)) wake();  // else the credit goes with the next pump
  }

  // Reads and writes every socket as far as it goes now, in the calling thread; the
  // progress thread stays parked until release_io(). Failures are recorded on the
  // links as the thread would record them.
  bool progress() noexcept override {
    if (links_.empty() || close_requested_.load(std::memory_order_acquire)) return false;
    if (!executor_io_.load(std::memory_order_relaxed)) executor_io_.store(true, std::memory_order_seq_cst);
    std::unique_lock lock(io_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return false;  // the thread is mid-pass; it parks after it
    return executor_pass(lock, credit_timing::polling);
  }

  void release_io(bool leaving) noexcept override {
    if (!executor_io_.load(std::memory_order_relaxed)) return;
    if (leaving) {
      // Keep the I/O while nothing is owed: a rank between calls then costs the peers
      // nothing, and the next call's first wait pumps again.
      std::unique_lock lock(io_mutex_, std::try_to_lock);
      if (lock.owns_lock()) {
        bool pending = false;
        try {
          pump_all(false, credit_timing::leaving);
          for (auto& l : links_) pending = pending || l->tx_pending(credit_timing::leaving);
        } catch (...) {
          pending = true;
        }
        if (!pending) return;
      }
    }
    executor_io_.store(false, std::memory_order_seq_cst);
    kick();
  }

  // The executor sleeps in ppoll() on the peers' sockets and the doorbell's eventfd,
  // keeping the I/O: the bytes that wake it are moved by this thread, with no hand-off
  // to the progress thread and back (with 4 ranks on 2 cores those hand-offs cost a
  // quarter of a large all_gather's CPU time: docs/performance.md). Returns at news,
  // a kick, or the bound; a pass that moved bytes but brought no news sleeps again.
  bool sleep(std::chrono::nanoseconds bound, int kick_fd) noexcept override {
    if (links_.empty() || close_requested_.load(std::memory_order_acquire) ||
        !executor_io_.load(std::memory_order_seq_cst))
      return false;
    if (sleeper_.exchange(true, std::memory_order_acquire)) return false;  // one sleeper at a time
    struct clear {
      std::atomic<bool>& flag;
      ~clear() { flag.store(false, std::memory_order_release); }
    } done{sleeper_};
    const auto until = clock::now() + bound;
    for (;;) {
      {
        std::unique_lock lock(io_mutex_, std::try_to_lock);
        if (!lock.owns_lock()) return true;  // the thread is mid-pass: look again
        if (executor_pass(lock, credit_timing::now)) return true;
        sleep_fds_[0] = {kick_fd, POLLIN, 0};
        for (std::size_t i = 0; i < links_.size(); ++i) {
          const short ev = links_[i]->poll_events();
          sleep_fds_[i + 1] = {ev != 0 ? links_[i]->fd() : -1, ev, 0};
        }
      }
      const auto left = until - clock::now();
      if (left <= clock::duration::zero() || close_requested_.load(std::memory_order_acquire)) return true;
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
      const timespec ts{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
      if (::ppoll(sleep_fds_.data(), sleep_fds_.size(), &ts, nullptr) < 0 && errno != EINTR) return false;
      if (sleep_fds_[0].revents & POLLIN) {
        std::uint64_t count;
        if (::read(kick_fd, &count, sizeof count) < 0) {
          // EAGAIN: another read already drained it
        }
        return true;
      }
    }
  }

  void health(int peer) override {
    tcp_link& l = link(peer);
    if (failed_.load(std::memory_order_acquire)) {
      std::lock_guard lock(failure_mutex_);
      throw error(errc::system, failure_, rank_, peer);
    }
    if (close_requested_.load(std::memory_order_acquire))
      throw error(errc::aborted,
                  "this rank closed its TCP links (close() was called: the communicator aborted, "
                  "failed or is being destroyed)",
                  rank_, peer);
    try {
      l.health();
    } catch (const error& e) {
      // The rank a closing peer blames comes off the wire: name the peer itself
      // unless it is a rank of this world.
      if (e.peer() < 0 || static_cast<std::size_t>(e.peer()) >= index_.size())
        throw error(e.code(), e.message(), rank_, peer);
      throw;
    }
  }

  void close(close_reason why = {}) noexcept override {
    if (close_claimed_.exchange(true, std::memory_order_acq_rel)) return;  // the first reason stands
    close_code_.store(static_cast<int>(why.code), std::memory_order_relaxed);
    close_culprit_.store(why.culprit, std::memory_order_relaxed);
    deliver_.store(why.deliver, std::memory_order_relaxed);
    if (close_requested_.exchange(true, std::memory_order_seq_cst)) return;
    kick();
  }

 private:
  tcp_link& link(int peer) const {
    if (!reaches(peer))
      throw error(errc::invalid_argument, "rank " + std::to_string(peer) + " is not reached by this TCP link set",
                  rank_, peer);
    return *links_[static_cast<std::size_t>(index_[static_cast<std::size_t>(peer)])];
  }

  // One pass of the executor's I/O over every link (holds io_mutex_): writes, and
  // reads too when `rx`; true when the executor has news. Credits that may wait stay
  // owed, by `when` (tcp_link::credits_may_wait). A socket that was full is simply
  // tried again. With several links, one poll() with no wait first says which sockets
  // have bytes: a pass that finds nothing costs one syscall, not a readv() per link (a
  // waiting rank's passes made 14 readv per rank per call in a 4-rank reduce_scatter
  // of 4 KiB: docs/performance.md).
  bool pump_all(bool rx, credit_timing when) {
    const bool look_first = rx && links_.size() > 1 && readable_now();
    bool news = false;
    for (std::size_t i = 0; i < links_.size(); ++i) {
      tcp_link& l = *links_[i];
      l.on_writable();
      if (rx && (!look_first || (rx_fds_[i].revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL)) != 0))
        news |= l.pump_rx();
      news |= l.pump_tx(when);
    }
    return news;
  }

  // poll() with no wait on every socket still read (rx_fds_, under io_mutex_): true when
  // its revents say which to read, false when it failed (then every link is read).
  bool readable_now() noexcept {
    for (std::size_t i = 0; i < links_.size(); ++i)
      rx_fds_[i] = {(links_[i]->poll_events() & POLLIN) != 0 ? links_[i]->fd() : -1, POLLIN, 0};
    return ::poll(rx_fds_.data(), rx_fds_.size(), 0) >= 0;
  }

  // The executor's pass (progress(): polling; sleep(): now, so no credit stays owed
  // while it sleeps), with io_mutex_ held in `lock`: true at news, or at a failure,
  // which it records after releasing the lock.
  bool executor_pass(std::unique_lock<std::mutex>& lock, credit_timing when) noexcept {
    try {
      return pump_all(true, when);
    } catch (const std::exception& e) {
      lock.unlock();
      fail_all(std::string("TCP I/O failed: ") + e.what());
      return true;
    }
  }

  void kick() noexcept {
    const std::uint64_t one = 1;
    if (::write(wake_fd_.get(), &one, sizeof one) < 0) {
      // EAGAIN: the counter is saturated, so the thread is being woken anyway.
    }
  }

  // The Dekker pair with run(): the counter store (seq_cst) before this load, and the
  // thread's sleeping_ store before its counter loads, so one of them sees the other.
  void wake() noexcept {
    if (sleeping_.load(std::memory_order_seq_cst)) kick();
  }

  void run() noexcept {
    try {
      loop();
    } catch (const std::exception& e) {
      fail_all(std::string("the TCP progress thread failed: ") + e.what());
    } catch (...) {
      fail_all("the TCP progress thread failed with an unknown exception");
    }
    std::lock_guard lock(io_mutex_);
    for (auto& l : links_) l->shut_down();
    settled_.store(true, std::memory_order_release);  // nothing more can leave: stop lingering
  }

  void fail_all(std::string why) noexcept {
    try {
      std::lock_guard lock(failure_mutex_);
      failure_ = std::move(why);
    } catch (...) {
    }
    failed_.store(true, std::memory_order_release);
    bell_->ring();
  }

  // One pass: pump what poll() reported, then sleep in poll() until there is more.
  // While an executor drives the I/O (executor_io_) the thread is parked: it skips
  // the pump and sleeps on the eventfd alone, which release_io() and close() kick.
  void loop() {
    bool closing = false;
    while (!stop_.load(std::memory_order_acquire)) {
      bool work = false;
      bool parked = false;
      int timeout_ms = 100;
      {
        std::lock_guard lock(io_mutex_);
        if (!closing && close_requested_.load(std::memory_order_acquire)) {
          closing = true;
          const close_reason why{static_cast<errc>(close_code_.load(std::memory_order_relaxed)),
                                 close_culprit_.load(std::memory_order_relaxed)};
          for (auto& l : links_) l->begin_close(why);
        }
        parked = !closing && executor_io_.load(std::memory_order_seq_cst);
        bool news = false;
        for (std::size_t i = 0; i < links_.size(); ++i) {
          tcp_link& l = *links_[i];
          const short re = pollfds_[i + 1].revents;
          pollfds_[i + 1].revents = 0;
          if (parked) continue;
          if (re & (POLLOUT | POLLERR | POLLHUP)) l.on_writable();
          if (re & (POLLIN | POLLERR | POLLHUP)) news |= l.pump_rx();
          news |= l.pump_tx();
        }
        if (news) bell_->ring();
        if (closing && !settled_.load(std::memory_order_relaxed)) {
          bool all = true;
          for (auto& l : links_) all = all && l->settled();
          if (all) settled_.store(true, std::memory_order_release);
        }

        sleeping_.store(true, std::memory_order_seq_cst);
        work = stop_.load(std::memory_order_seq_cst) || (!closing && close_requested_.load(std::memory_order_seq_cst));
        if (parked)
          work = work || !executor_io_.load(std::memory_order_seq_cst);  // handed back meanwhile
        else
          for (auto& l : links_) work = work || l->tx_ready();
        pollfds_[0] = {wake_fd_.get(), POLLIN, 0};
        for (std::size_t i = 0; i < links_.size(); ++i) {
          const short ev = parked ? 0 : links_[i]->poll_events();
          pollfds_[i + 1] = {ev != 0 ? links_[i]->fd() : -1, ev, 0};
        }
        // While closing, acknowledgements arrive without an event: look again soon.
        if (closing && !settled_.load(std::memory_order_relaxed)) timeout_ms = 1;
      }
      if (!work) {
        if (::poll(pollfds_.data(), pollfds_.size(), timeout_ms) < 0 && errno != EINTR)
          throw error(errc::system, "poll failed: " + plait::detail::errno_text(errno), rank_);
        if (pollfds_[0].revents & POLLIN) {
          std::uint64_t count;
          if (::read(wake_fd_.get(), &count, sizeof count) < 0) {
            // EAGAIN: another read already drained it
          }
        }
      } else {
        for (auto& p : pollfds_) p.revents = 0;
      }
      sleeping_.store(false, std::memory_order_seq_cst);
    }
  }

  const int rank_;
  const std::size_t slot_bytes_;
  const bool receive_into_;  // frames may land in the caller's memory (expect)
  plait::detail::doorbell* bell_;
  std::vector<int> index_;  // peer rank -> position in links_, or -1
  std::vector<std::unique_ptr<tcp_link>> links_;
  const std::chrono::nanoseconds linger_;

  plait::detail::fd_handle wake_fd_;
  std::vector<pollfd> pollfds_;  // progress thread only; [0] is the eventfd
  std::atomic<bool> sleeping_{false};
  std::vector<pollfd> sleep_fds_;  // sleep() only, one caller at a time (sleeper_); [0] is the kick
  std::vector<pollfd> rx_fds_;     // pump_all() only (io_mutex_): one per link
  std::atomic<bool> sleeper_{false};
  // Who moves the bytes: the progress thread, or (true) an executor in progress().
  // The I/O side of every link (pump_*, begin_close, settled) runs under io_mutex_.
  std::atomic<bool> executor_io_{false};
  std::mutex io_mutex_;
  std::atomic<bool> close_requested_{false};
  std::atomic<bool> close_claimed_{false};
  std::atomic<bool> deliver_{true};
  std::atomic<int> close_code_{static_cast<int>(errc::aborted)};
  std::atomic<int> close_culprit_{-1};
  std::atomic<bool> settled_{false};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::mutex failure_mutex_;
  std::string failure_;
  std::thread thread_;
};

}  // namespace plait::transport::tcp_detail
