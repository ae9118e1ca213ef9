// comm_core: everything a communicator is, except its transport type.
//
// Kept non-templated so that the executor, the async machinery and error handling
// are compiled once per program, not once per transport. Owns the links, the
// doorbell, the sequence counters, the broken state and the progress thread that
// drives async collectives.
// Threading: calls come from one user thread at a time; async calls are queued to
// one progress thread; a blocking call first waits for the queue to drain, then runs
// on the caller's thread (no hand-off on the latency path). abort() may come from
// any thread. After the first error every call rethrows it (the communicator is broken).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <plait/detail/doorbell.hpp>
#include <plait/error.hpp>
#include <plait/executor.hpp>
#include <plait/request.hpp>
#include <plait/transport.hpp>

namespace plait::detail {

struct comm_config {
  std::chrono::nanoseconds timeout = std::chrono::seconds(600);
  std::size_t slice_bytes = 128 * 1024;
  std::size_t depth = 4;
};

class comm_core {
 public:
  comm_core(int rank, int size, comm_config cfg)
      : rank_(rank), size_(size), cfg_(cfg), p2p_sent_(static_cast<std::size_t>(size), 0),
        p2p_received_(static_cast<std::size_t>(size), 0) {
    const unsigned cores = std::thread::hardware_concurrency();
    // Oversubscribed (more ranks than cores on this host is likely): do not spin.
    if (cores != 0 && static_cast<unsigned>(size) > cores) bell_.set_spin_iterations(50);
  }

  comm_core(const comm_core&) = delete;
  comm_core& operator=(const comm_core&) = delete;

  ~comm_core() {
    stop_worker();
    if (links_) links_->close();
  }

  void attach(std::unique_ptr<link_set> links, std::unique_ptr<bootstrap_context> ctx,
              std::shared_ptr<void> keepalive) {
    links_ = std::move(links);
    ctx_ = std::move(ctx);
    keepalive_ = std::move(keepalive);
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  doorbell& bell() noexcept { return bell_; }
  const comm_config& config() const noexcept { return cfg_; }
  void set_timeout(std::chrono::nanoseconds t) { cfg_.timeout = t; }

  std::uint64_t next_sequence() noexcept { return ++sequence_; }
  std::uint64_t next_send(int peer) noexcept { return ++p2p_sent_[static_cast<std::size_t>(peer)]; }
  std::uint64_t next_recv(int peer) noexcept { return ++p2p_received_[static_cast<std::size_t>(peer)]; }

  clock::time_point deadline_for(std::chrono::milliseconds per_call) const {
    const auto t = per_call.count() > 0 ? std::chrono::nanoseconds(per_call) : cfg_.timeout;
    return clock::now() + t;
  }

  void throw_if_broken() const {
    std::lock_guard lock(broken_mutex_);
    if (broken_) throw *broken_;
  }

  // A locally detected misuse: use up the sequence number, tell the peers, break.
  [[noreturn]] void reject(const call_desc& d, std::string message) {
    error e(errc::invalid_argument, std::move(message), rank_, -1, d.sequence);
    drain();
    std::lock_guard exec(exec_mutex_);
    executor ex(rank_, size_, links_.get(), bell_, aborted_);
    ex.send_notice(d, clock::now() + std::min<std::chrono::nanoseconds>(cfg_.timeout, std::chrono::seconds(5)));
    mark_broken(e);
    throw e;
  }

  void run(call& c) {
    drain();
    std::lock_guard exec(exec_mutex_);
    execute(c);
  }

  request submit(std::unique_ptr<call> c) {
    auto state = std::make_shared<request_state>();
    {
      std::lock_guard lock(queue_mutex_);
      if (!worker_.joinable()) worker_ = std::thread([this] { work(); });
      queue_.push_back(job{std::move(c), state});
    }
    queue_cv_.notify_all();
    return request(state);
  }

  void abort() noexcept {
    aborted_.store(true, std::memory_order_release);
    bell_.ring();
    queue_cv_.notify_all();
    if (exec_mutex_.try_lock()) {  // idle: close now so peers learn at once
      if (links_) links_->close();
      exec_mutex_.unlock();
    }
  }

 private:
  struct job {
    std::unique_ptr<call> c;
    std::shared_ptr<request_state> state;
  };

  void execute(call& c) {
    throw_if_broken();
    if (aborted_.load(std::memory_order_acquire)) {
      error e(errc::aborted, "abort() was called on this communicator; recreate it to go on", rank_, -1,
              c.desc.sequence);
      mark_broken(e);
      throw e;
    }
    if (size_ == 1 || links_ == nullptr) {
      executor ex(rank_, size_, nullptr, bell_, aborted_);
      if (!ex.advance(c))
        throw error(errc::protocol, "a single-rank schedule needs a peer (internal error)", rank_);
      return;
    }
    executor ex(rank_, size_, links_.get(), bell_, aborted_);
    try {
      ex.run(c);
    } catch (const error& e) {
      mark_broken(e);
      if (e.code() == errc::mismatch || e.code() == errc::protocol)
        ex.send_notice(c.desc, clock::now() + std::chrono::milliseconds(200));
      else if (e.code() != errc::timeout)
        links_->close();  // peers waiting on this rank learn at once instead of timing out
      throw;
    }
  }

  void mark_broken(const error& e) {
    std::lock_guard lock(broken_mutex_);
    if (!broken_) broken_ = e;
  }

  // Waits until every queued async call has completed.
  void drain() {
    std::unique_lock lock(queue_mutex_);
    idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  }

  void work() {
    std::unique_lock lock(queue_mutex_);
    for (;;) {
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      job j = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr failure;
      try {
        std::lock_guard exec(exec_mutex_);
        if (stopping_) {
          error e(errc::aborted, "the communicator was destroyed before this collective ran", rank_, -1,
                  j.c->desc.sequence);
          mark_broken(e);
          throw e;
        }
        execute(*j.c);
      } catch (...) {
        failure = std::current_exception();
      }
      j.state->complete(failure);
      lock.lock();
      busy_ = false;
      if (queue_.empty()) idle_cv_.notify_all();
    }
  }

  void stop_worker() noexcept {
    {
      std::lock_guard lock(queue_mutex_);
      stopping_.store(true);
    }
    aborted_.store(true, std::memory_order_release);  // in-flight calls end promptly
    bell_.ring();
    queue_cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  int rank_, size_;
  comm_config cfg_;
  doorbell bell_;
  std::unique_ptr<link_set> links_;
  std::unique_ptr<bootstrap_context> ctx_;
  std::shared_ptr<void> keepalive_;  // the store client and server this communicator was made with

  std::uint64_t sequence_ = 0;
  std::vector<std::uint64_t> p2p_sent_, p2p_received_;
  std::atomic<bool> aborted_{false};

  mutable std::mutex broken_mutex_;
  std::optional<error> broken_;

  std::mutex exec_mutex_;  // held while a call runs
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_, idle_cv_;
  std::deque<job> queue_;
  bool busy_ = false;
  std::atomic<bool> stopping_{false};
  std::thread worker_;
};

}  // namespace plait::detail
