// Token resolution (variable, file, per-user key file) and the environment knobs.
#include <catch2/catch.hpp>

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <plait/bootstrap/token.hpp>
#include <plait/communicator.hpp>
#include <plait/detail/env.hpp>

#include "bootstrap_support.hpp"

using namespace std::chrono_literals;
using plait::errc;
using plait::bootstrap::resolve_token;
using plait::testing::caught;
using plait::testing::scoped_env;
using plait::testing::temp_dir;

namespace {

std::string text(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

mode_t mode_of(const std::filesystem::path& p) {
  struct stat st {};
  REQUIRE(::stat(p.c_str(), &st) == 0);
  return st.st_mode & 07777;
}

bool is_hex(const std::string& s) { return s.find_first_not_of("0123456789abcdef") == std::string::npos; }

}  // namespace

TEST_CASE("PLAIT_TOKEN is used as is and must be long enough", "[token]") {
  scoped_env env;
  env.set("PLAIT_TOKEN", "0123456789abcdef-secret");
  CHECK(text(resolve_token("10.0.0.1")) == "0123456789abcdef-secret");
  env.set("PLAIT_TOKEN", "short");
  auto e = caught([] { resolve_token("127.0.0.1"); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("PLAIT_TOKEN"));
  env.set("PLAIT_TOKEN", "");
  CHECK(caught([] { resolve_token("127.0.0.1"); }).code() == errc::invalid_argument);
}

TEST_CASE("PLAIT_TOKEN_FILE is read with its trailing newline stripped", "[token]") {
  scoped_env env;
  temp_dir dir;
  auto file = dir.path() / "tok";
  std::ofstream(file) << "file-secret-0123456789\n";
  env.set("PLAIT_TOKEN_FILE", file.string());
  CHECK(text(resolve_token("10.0.0.1")) == "file-secret-0123456789");
  std::ofstream(file) << "too-short\n";
  CHECK(caught([] { resolve_token("10.0.0.1"); }).code() == errc::invalid_argument);
  env.set("PLAIT_TOKEN_FILE", (dir.path() / "missing").string());
  auto e = caught([] { resolve_token("10.0.0.1"); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("PLAIT_TOKEN_FILE"));
  // PLAIT_TOKEN wins over the file.
  env.set("PLAIT_TOKEN", "variable-secret-0123");
  CHECK(text(resolve_token("10.0.0.1")) == "variable-secret-0123");
}

TEST_CASE("the per-user key file is created 0600 on first use for a loopback store", "[token]") {
  scoped_env env;
  temp_dir dir;
  auto config = dir.path() / "cfg";  // does not exist yet: created 0700
  env.set("XDG_CONFIG_HOME", config.string());
  auto first = text(resolve_token("127.0.0.1"));
  auto file = config / "plait" / "token";
  REQUIRE(std::filesystem::exists(file));
  CHECK(mode_of(file) == 0600);
  CHECK(mode_of(config / "plait") == 0700);
  CHECK(first.size() == 64);
  CHECK(is_hex(first));
  CHECK(text(resolve_token("localhost")) == first);  // the same key next time
  CHECK(text(resolve_token("::1")) == first);
  CHECK(std::filesystem::directory_iterator(config / "plait")->path() == file);  // no temporary left
}

TEST_CASE("a group-readable key file is refused with the chmod fix", "[token]") {
  scoped_env env;
  temp_dir dir;
  env.set("XDG_CONFIG_HOME", dir.path().string());
  resolve_token("127.0.0.1");
  auto file = dir.path() / "plait" / "token";
  REQUIRE(::chmod(file.c_str(), 0640) == 0);
  auto e = caught([] { resolve_token("127.0.0.1"); });
  CHECK(e.code() == errc::auth);
  CHECK_THAT(e.what(), Catch::Contains("chmod 600 " + file.string()));
  REQUIRE(::chmod(file.c_str(), 0604) == 0);
  CHECK(caught([] { resolve_token("127.0.0.1"); }).code() == errc::auth);
  REQUIRE(::chmod(file.c_str(), 0600) == 0);
  CHECK(text(resolve_token("127.0.0.1")).size() == 64);
}

TEST_CASE("ranks racing to create the key file agree on one key", "[token]") {
  scoped_env env;
  temp_dir dir;
  env.set("XDG_CONFIG_HOME", dir.path().string());
  constexpr int procs = 6;
  std::vector<pid_t> pids;
  for (int p = 0; p < procs; ++p)
    pids.push_back(plait::testing::fork_child([&dir, p] {
      auto key = text(resolve_token("127.0.0.1"));
      std::ofstream(dir.path() / ("seen" + std::to_string(p))) << key;
      return key.size() == 64 ? 0 : 1;
    }));
  for (auto pid : pids) CHECK(plait::testing::wait_child(pid) == 0);
  std::string expected;
  std::ifstream(dir.path() / "plait" / "token") >> expected;
  REQUIRE(expected.size() == 64);
  for (int p = 0; p < procs; ++p) {
    std::string seen;
    std::ifstream(dir.path() / ("seen" + std::to_string(p))) >> seen;
    CAPTURE(p);
    CHECK(seen == expected);
  }
}

TEST_CASE("a non-loopback store without a token says how to set one", "[token]") {
  scoped_env env;
  temp_dir dir;
  env.set("XDG_CONFIG_HOME", dir.path().string());
  auto e = caught([] { resolve_token("10.2.3.4"); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("PLAIT_TOKEN") && Catch::Contains("PLAIT_TOKEN_FILE") &&
                           Catch::Contains("same value on every rank"));
  CHECK_FALSE(std::filesystem::exists(dir.path() / "plait"));  // the key file is loopback-only
}

TEST_CASE("generate_token_hex gives 64 fresh hex digits", "[token]") {
  auto a = plait::bootstrap::generate_token_hex(), b = plait::bootstrap::generate_token_hex();
  CHECK(a.size() == 64);
  CHECK(is_hex(a));
  CHECK(a != b);
}

TEST_CASE("env_seconds reads decimals and rejects junk", "[env]") {
  using plait::detail::env_seconds;
  scoped_env env;
  CHECK_FALSE(env_seconds("PLAIT_TIMEOUT").has_value());
  const std::pair<const char*, std::chrono::nanoseconds> good[] = {{"600", 600s},
                                                                   {"2.5", 2500ms},
                                                                   {".5", 500ms},
                                                                   {"0", 0s},
                                                                   {"1.", 1s},
                                                                   {"0.000000001", 1ns},
                                                                   {"3.1234567891", 3123456789ns}};
  for (auto [text, want] : good) {
    CAPTURE(text);
    env.set("PLAIT_TIMEOUT", text);
    CHECK(env_seconds("PLAIT_TIMEOUT") == want);
  }
  for (const char* bad : {"", "-1", "+1", "1e3", "1.2.3", " 1", "1 ", "abc", ".", "5s", "10000000000"}) {
    CAPTURE(bad);
    env.set("PLAIT_TIMEOUT", bad);
    auto e = caught([] { env_seconds("PLAIT_TIMEOUT"); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("PLAIT_TIMEOUT='" + std::string(bad) + "'"));
  }
}

TEST_CASE("env_bytes reads K/M/G suffixes in powers of 1024", "[env]") {
  using plait::detail::env_bytes;
  scoped_env env;
  CHECK_FALSE(env_bytes("PLAIT_SLICE_BYTES").has_value());
  const std::pair<const char*, std::size_t> good[] = {
      {"65536", 65536}, {"512K", 512 * 1024}, {"1M", 1 << 20},  {"2G", std::size_t{2} << 30},
      {"4k", 4096},     {"1KiB", 1024},       {"3MB", 3 << 20}, {"7B", 7},
      {"0", 0}};
  for (auto [text, want] : good) {
    CAPTURE(text);
    env.set("PLAIT_SLICE_BYTES", text);
    CHECK(env_bytes("PLAIT_SLICE_BYTES") == want);
  }
  for (const char* bad : {"", "K", "-5", "1.5M", "1T", "12 K", "0x10", "99999999999999999999", "17179869184G"}) {
    CAPTURE(bad);
    env.set("PLAIT_SLICE_BYTES", bad);
    auto e = caught([] { env_bytes("PLAIT_SLICE_BYTES"); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("PLAIT_SLICE_BYTES"));
  }
}

TEST_CASE("config_from_env reads the pipeline and polling knobs and rejects out-of-range values", "[env]") {
  using plait::detail::config_from_env;
  scoped_env env;
  const auto defaults = config_from_env();
  CHECK(defaults.slice_bytes == 0);       // resolved per transport and placement by communicator::create
  CHECK(defaults.depth == 0);             // resolved per transport by communicator::create
  CHECK(defaults.copy_slice_bytes == 0);  // the same
  CHECK(defaults.send_window == 0);       // the same
  CHECK(defaults.poll.count() < 0);       // automatic: decided by ranks per core
  env.set("PLAIT_SLICE_BYTES", "1M");
  env.set("PLAIT_DEPTH", "8");
  env.set("PLAIT_SEND_WINDOW", "2");
  env.set("PLAIT_COPY_SLICE_BYTES", "4M");
  env.set("PLAIT_POLL", "0.00005");
  const auto set = config_from_env();
  CHECK(set.slice_bytes == (1u << 20));
  CHECK(set.depth == 8);
  CHECK(set.send_window == 2);
  CHECK(set.copy_slice_bytes == (4u << 20));
  CHECK(set.poll == std::chrono::microseconds(50));
  env.set("PLAIT_POLL", "0");
  CHECK(config_from_env().poll.count() == 0);
  CHECK(config_from_env().waiter_io);  // the default: a waiting rank moves its bytes
  env.set("PLAIT_PROGRESS", "thread");
  CHECK_FALSE(config_from_env().waiter_io);
  env.set("PLAIT_PROGRESS", "caller");
  CHECK(config_from_env().waiter_io);
  CHECK(config_from_env().single_copy);
  CHECK_FALSE(config_from_env().lend_always);
  env.set("PLAIT_SINGLE_COPY", "off");
  CHECK_FALSE(config_from_env().single_copy);
  env.set("PLAIT_SINGLE_COPY", "always");
  CHECK(config_from_env().single_copy);
  CHECK(config_from_env().lend_always);
  CHECK(defaults.huge_pages);
  env.set("PLAIT_HUGE_PAGES", "off");
  CHECK_FALSE(config_from_env().huge_pages);
  env.set("PLAIT_HUGE_PAGES", "on");
  CHECK(config_from_env().huge_pages);
  CHECK(defaults.stream_from_bytes == 8u << 20);
  CHECK(defaults.broadcast_stream_from_bytes == 0);  // resolved by comm_core from the host's cache
  env.set("PLAIT_STREAM_BYTES", "1");
  CHECK(config_from_env().stream_from_bytes == 1);
  CHECK(config_from_env().broadcast_stream_from_bytes == 1);
  env.set("PLAIT_STREAM_BYTES", "64M");
  CHECK(config_from_env().stream_from_bytes == 64u << 20);
  CHECK(config_from_env().broadcast_stream_from_bytes == 64u << 20);
  env.set("PLAIT_STREAM_BYTES", "off");
  CHECK(config_from_env().stream_from_bytes == std::numeric_limits<std::size_t>::max());
  CHECK(config_from_env().broadcast_stream_from_bytes == std::numeric_limits<std::size_t>::max());
  {
    using plait::detail::comm_config;
    constexpr std::size_t never = std::numeric_limits<std::size_t>::max();
    CHECK(comm_config::broadcast_stream_from(32u << 20, false) == (16u << 20) + 1);
    CHECK(comm_config::broadcast_stream_from(480u << 20, false) == (240u << 20) + 1);
    CHECK(comm_config::broadcast_stream_from(32u << 20, true) == never);  // a network transport
    CHECK(comm_config::broadcast_stream_from(0, false) == never);         // the cache's size unknown
  }
  CHECK_FALSE(defaults.host_congestion);                                    // resolved by communicator::create
  CHECK(plait::detail::comm_config::host_congestion_for(1) == "reno");      // a core per rank: unpaced reno
  CHECK(plait::detail::comm_config::host_congestion_for(1 << 20).empty());  // oversubscribed: the system's
  env.set("PLAIT_TCP_CONGESTION", "system");
  CHECK(config_from_env().host_congestion == std::string());
  env.set("PLAIT_TCP_CONGESTION", "reno");
  CHECK(config_from_env().host_congestion == "reno");
  const std::pair<const char*, const char*> bad[] = {{"PLAIT_SLICE_BYTES", "32"},
                                                     {"PLAIT_SLICE_BYTES", "65M"},
                                                     {"PLAIT_COPY_SLICE_BYTES", "0"},
                                                     {"PLAIT_COPY_SLICE_BYTES", "65M"},
                                                     {"PLAIT_DEPTH", "0"},
                                                     {"PLAIT_DEPTH", "65"},
                                                     {"PLAIT_SEND_WINDOW", "0"},
                                                     {"PLAIT_SEND_WINDOW", "65"},
                                                     {"PLAIT_POLL", "2"},
                                                     {"PLAIT_POLL", "fast"},
                                                     {"PLAIT_PROGRESS", "Thread"},
                                                     {"PLAIT_PROGRESS", ""},
                                                     {"PLAIT_SINGLE_COPY", "yes"},
                                                     {"PLAIT_HUGE_PAGES", "yes"},
                                                     {"PLAIT_HUGE_PAGES", ""},
                                                     {"PLAIT_STREAM_BYTES", "0"},
                                                     {"PLAIT_STREAM_BYTES", "never"},
                                                     {"PLAIT_TCP_CONGESTION", "no-such-algorithm"},
                                                     {"PLAIT_TCP_CONGESTION", ""}};
  for (auto [name, value] : bad) {
    CAPTURE(name, value);
    scoped_env one;
    env.set(name, value);
    auto e = caught([] { config_from_env(); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains(name));
  }
}

TEST_CASE("env_log_level reads PLAIT_DEBUG in any case", "[env]") {
  using plait::detail::env_log_level;
  using plait::detail::log_level;
  scoped_env env;
  CHECK(env_log_level() == log_level::none);
  env.set("PLAIT_DEBUG", "warn");
  CHECK(env_log_level() == log_level::warn);
  env.set("PLAIT_DEBUG", "INFO");
  CHECK(env_log_level() == log_level::info);
  env.set("PLAIT_DEBUG", "Trace");
  CHECK(env_log_level() == log_level::trace);
  for (const char* bad : {"", "debug", "1", "warn "}) {
    CAPTURE(bad);
    env.set("PLAIT_DEBUG", bad);
    auto e = caught([] { env_log_level(); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("PLAIT_DEBUG"));
  }
}

TEST_CASE("log writes one tagged line to stderr when enabled", "[env]") {
  // current_log_level() is read once per process, so check it in a child with PLAIT_DEBUG set.
  temp_dir dir;
  auto out = dir.path() / "stderr";
  pid_t pid = plait::testing::fork_child([&] {
    ::setenv("PLAIT_DEBUG", "info", 1);
    int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    plait::detail::set_log_rank(3);
    plait::detail::log(plait::detail::log_level::info, "connected to ", "host", ":", 42);
    plait::detail::log(plait::detail::log_level::trace, "not shown");
    return 0;
  });
  REQUIRE(plait::testing::wait_child(pid) == 0);
  std::ifstream f(out);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CHECK(all == "plait[3] INFO: connected to host:42\n");
}
