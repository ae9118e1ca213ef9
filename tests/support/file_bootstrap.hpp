// A bootstrap_context over a directory, for transport tests that fork ranks
// without a store: put() writes a file atomically (write + rename), get() polls.
#pragma once

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include <plait/transport.hpp>

namespace plait::testing {

class file_bootstrap final : public bootstrap_context {
 public:
  file_bootstrap(std::filesystem::path dir, int rank, int size, std::string host = "testhost")
      : dir_(std::move(dir)), rank_(rank), size_(size), host_(std::move(host)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void put(std::string_view key, std::span<const std::byte> value) override {
    auto final_path = path_of(key);
    auto tmp = final_path;
    tmp += ".tmp" + std::to_string(rank_);
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
    }
    std::filesystem::rename(tmp, final_path);
  }

  std::vector<std::byte> get(std::string_view key, clock::time_point deadline) override {
    auto p = path_of(key);
    while (!std::filesystem::exists(p)) {
      if (clock::now() > deadline)
        throw error(errc::timeout, "file_bootstrap: key '" + std::string(key) + "' never appeared", rank_);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream f(p, std::ios::binary);
    std::vector<char> raw((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(raw.size());
    std::memcpy(out.data(), raw.data(), raw.size());
    return out;
  }

  void barrier(std::string_view name, clock::time_point deadline) override {
    std::byte one{1};
    put(std::string(name) + ".arrived." + std::to_string(rank_), std::span(&one, 1));
    for (int r = 0; r < size_; ++r) get(std::string(name) + ".arrived." + std::to_string(r), deadline);
  }

  std::span<const std::byte> token() const override { return token_; }
  std::string host_id() const override { return host_; }
  std::string listen_address() const override { return "127.0.0.1"; }
  std::string job_key() const override { return "t" + dir_.filename().string(); }

 private:
  std::filesystem::path path_of(std::string_view key) const {
    std::string k(key);
    for (char& c : k)
      if (c == '/') c = '_';
    return dir_ / k;
  }

  std::filesystem::path dir_;
  int rank_, size_;
  std::string host_;
  std::vector<std::byte> token_ = std::vector<std::byte>(32, std::byte{0x42});
};

}  // namespace plait::testing
