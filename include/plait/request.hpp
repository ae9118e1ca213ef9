// plait::request: the handle of an asynchronous collective.
//
// Move-only. wait() blocks until the collective completes and throws its
// plait::error if it failed; test() returns whether it has completed (and throws
// likewise). The destructor of a request never waited waits for it and swallows its
// error — which the communicator raises on its next call (it is broken by then).
// Requests of one communicator complete in the order they were issued.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace plait {

namespace detail {
struct request_state {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  std::exception_ptr failure;

  void complete(std::exception_ptr e) {
    {
      std::lock_guard lock(mutex);
      failure = std::move(e);
      done = true;
    }
    done_cv.notify_all();
  }
};
}  // namespace detail

class request {
 public:
  request() = default;
  explicit request(std::shared_ptr<detail::request_state> s) : state_(std::move(s)) {}
  request(request&&) noexcept = default;
  request& operator=(request&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  ~request() { finish_quietly(); }

  void wait() {
    if (!state_) return;
    std::unique_lock lock(state_->mutex);
    state_->done_cv.wait(lock, [&] { return state_->done; });
    auto failure = state_->failure;
    lock.unlock();
    state_.reset();
    if (failure) std::rethrow_exception(failure);
  }

  bool test() {
    if (!state_) return true;
    {
      std::lock_guard lock(state_->mutex);
      if (!state_->done) return false;
    }
    wait();
    return true;
  }

  bool valid() const noexcept { return state_ != nullptr; }

 private:
  void finish_quietly() noexcept {
    if (!state_) return;
    std::unique_lock lock(state_->mutex);
    state_->done_cv.wait(lock, [&] { return state_->done; });
    lock.unlock();
    state_.reset();
  }

  std::shared_ptr<detail::request_state> state_;
};

}  // namespace plait
