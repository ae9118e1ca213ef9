// A bootstrap_context shared by threads of one process (for the sim transport):
// an in-memory key-value map with a condition variable.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <plait/transport.hpp>

namespace plait::testing {

struct thread_store {
  std::mutex m;
  std::condition_variable cv;
  std::map<std::string, std::vector<std::byte>> kv;
  std::string job;
};

class thread_bootstrap final : public bootstrap_context {
 public:
  thread_bootstrap(std::shared_ptr<thread_store> s, int rank, int size) : s_(std::move(s)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void put(std::string_view key, std::span<const std::byte> value) override {
    {
      std::lock_guard lock(s_->m);
      s_->kv[std::string(key)] = std::vector<std::byte>(value.begin(), value.end());
    }
    s_->cv.notify_all();
  }
  std::vector<std::byte> get(std::string_view key, clock::time_point deadline) override {
    std::unique_lock lock(s_->m);
    const std::string k(key);
    if (!s_->cv.wait_until(lock, deadline, [&] { return s_->kv.count(k) != 0; }))
      throw error(errc::timeout, "thread_bootstrap: key '" + k + "' never appeared", rank_);
    return s_->kv[k];
  }
  void barrier(std::string_view name, clock::time_point deadline) override {
    std::byte one{1};
    put(std::string(name) + "/" + std::to_string(rank_), std::span(&one, 1));
    for (int r = 0; r < size_; ++r) get(std::string(name) + "/" + std::to_string(r), deadline);
  }
  std::span<const std::byte> token() const override { return token_; }
  std::string host_id() const override { return "threads"; }
  std::string listen_address() const override { return "127.0.0.1"; }
  std::string job_key() const override { return s_->job; }

 private:
  std::shared_ptr<thread_store> s_;
  int rank_, size_;
  std::vector<std::byte> token_ = std::vector<std::byte>(32, std::byte{7});
};

}  // namespace plait::testing
