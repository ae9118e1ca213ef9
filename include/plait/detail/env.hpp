// Environment knobs (DESIGN.md section 4) and the PLAIT_DEBUG log.
//
// Each parser returns std::nullopt when the variable is unset and throws
// plait::error(errc::invalid_argument) naming the variable and its value when it is
// set but malformed (an empty value is malformed). Parsing is strict: no signs, no
// exponents, no surrounding spaces, no trailing text.
//   env_seconds:  "600", "2.5", ".5"            -> nanoseconds
//   env_bytes:    "65536", "512K", "1M", "2G"   -> bytes (powers of 1024; "KB"/"KiB" also read)
//   env_log_level: PLAIT_DEBUG = warn | info | trace (any case); unset -> none
// log() writes one line "plait[<rank>] LEVEL: ..." to stderr when PLAIT_DEBUG enables
// the level; it never throws and is safe from any thread (one write(2) per line).
#pragma once

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <plait/error.hpp>

namespace plait::detail {

inline error bad_env(const char* name, std::string_view value, std::string_view expected) {
  // Options on a command line ("--grace") are fixed there; variables may also be unset.
  const bool option = name[0] == '-';
  return error(errc::invalid_argument, std::string(name) + "='" + std::string(value) + "' is malformed: expected " +
                                           std::string(expected) + (option ? "" : "; fix or unset it"));
}

// Seconds as text ("30", "2.5", ".5") -> nanoseconds; `name` is used in the error.
inline std::chrono::nanoseconds parse_seconds(const char* name, std::string_view v) {
  constexpr std::string_view expected = "a non-negative number of seconds such as 30 or 2.5";
  std::int64_t whole = 0, frac_ns = 0;
  std::size_t i = 0, digits = 0;
  for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])); ++i, ++digits) {
    if (whole > 1'000'000'000) throw bad_env(name, v, "at most 1e9 seconds");
    whole = whole * 10 + (v[i] - '0');
  }
  if (i < v.size() && v[i] == '.') {
    ++i;
    std::int64_t scale = 100'000'000;
    for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])); ++i, ++digits) {
      frac_ns += (v[i] - '0') * scale;  // digits past nanoseconds are dropped
      scale /= 10;
    }
  }
  if (digits == 0 || i != v.size()) throw bad_env(name, v, expected);
  if (whole > 1'000'000'000) throw bad_env(name, v, "at most 1e9 seconds");
  return std::chrono::nanoseconds(whole * 1'000'000'000 + frac_ns);
}

inline std::optional<std::chrono::nanoseconds> env_seconds(const char* name) {
  const char* raw = std::getenv(name);
  if (!raw) return std::nullopt;
  return parse_seconds(name, raw);
}

inline std::optional<std::size_t> env_bytes(const char* name) {
  const char* raw = std::getenv(name);
  if (!raw) return std::nullopt;
  std::string_view v(raw);
  constexpr std::string_view expected = "a byte count such as 65536, 512K, 1M or 2G";
  std::size_t i = 0;
  std::uint64_t n = 0;
  for (; i < v.size() && std::isdigit(static_cast<unsigned char>(v[i])); ++i) {
    if (n > (std::numeric_limits<std::uint64_t>::max() - 9) / 10) throw bad_env(name, v, expected);
    n = n * 10 + static_cast<std::uint64_t>(v[i] - '0');
  }
  if (i == 0) throw bad_env(name, v, expected);
  std::string suffix;
  for (; i < v.size(); ++i) suffix += static_cast<char>(std::toupper(static_cast<unsigned char>(v[i])));
  unsigned shift = 0;
  if (suffix.empty() || suffix == "B")
    shift = 0;
  else if (suffix == "K" || suffix == "KB" || suffix == "KIB")
    shift = 10;
  else if (suffix == "M" || suffix == "MB" || suffix == "MIB")
    shift = 20;
  else if (suffix == "G" || suffix == "GB" || suffix == "GIB")
    shift = 30;
  else
    throw bad_env(name, v, expected);
  if (n > (std::numeric_limits<std::size_t>::max() >> shift)) throw bad_env(name, v, "a smaller byte count");
  return static_cast<std::size_t>(n << shift);
}

enum class log_level { none, warn, info, trace };

inline constexpr std::string_view to_string(log_level l) noexcept {
  switch (l) {
    case log_level::none:
      return "NONE";
    case log_level::warn:
      return "WARN";
    case log_level::info:
      return "INFO";
    case log_level::trace:
      return "TRACE";
  }
  return "?";
}

inline log_level env_log_level() {
  const char* raw = std::getenv("PLAIT_DEBUG");
  if (!raw) return log_level::none;
  std::string v;
  for (const char* p = raw; *p; ++p) v += static_cast<char>(std::tolower(static_cast<unsigned char>(*p)));
  if (v == "warn") return log_level::warn;
  if (v == "info") return log_level::info;
  if (v == "trace") return log_level::trace;
  throw bad_env("PLAIT_DEBUG", raw, "warn, info or trace");
}

// The rank printed in log lines; set once the launch environment is known.
inline std::atomic<int>& log_rank_slot() noexcept {
  static std::atomic<int> rank{-1};
  return rank;
}
inline void set_log_rank(int rank) noexcept { log_rank_slot().store(rank, std::memory_order_relaxed); }

// PLAIT_DEBUG read once; a malformed value logs nothing here (the communicator's
// start-up parses it with env_log_level() and reports it).
inline log_level current_log_level() noexcept {
  static const log_level level = [] {
    try {
      return env_log_level();
    } catch (...) {
      return log_level::none;
    }
  }();
  return level;
}

inline bool log_enabled(log_level level) noexcept {
  return level != log_level::none && static_cast<int>(level) <= static_cast<int>(current_log_level());
}

// log(log_level::info, "connected to ", host, ":", port): the arguments are streamed
// with operator<< into one line.
template <class... Args>
void log(log_level level, const Args&... args) noexcept {
  if (!log_enabled(level)) return;
  try {
    std::ostringstream line;
    int rank = log_rank_slot().load(std::memory_order_relaxed);
    line << "plait[";
    if (rank >= 0)
      line << rank;
    else
      line << '-';
    line << "] " << to_string(level) << ": ";
    (line << ... << args);
    line << '\n';
    std::string s = line.str();
    [[maybe_unused]] auto n = ::write(2, s.data(), s.size());
  } catch (...) {
  }
}

}  // namespace plait::detail
