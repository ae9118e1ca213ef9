// The shared secret every store and transport connection authenticates with
// (DESIGN.md section 5).
//
// resolve_token(store_host), in order:
//   1. PLAIT_TOKEN (its bytes; at least 16), else
//   2. the file named by PLAIT_TOKEN_FILE (must exist; at least 16 bytes; one trailing
//      newline stripped), else
//   3. only when store_host is a loopback address: the per-user key file
//      $XDG_CONFIG_HOME/plait/token (default ~/.config/plait/token), created on first
//      use with 64 random hex digits, mode 0600, in directories created 0700. Ranks
//      racing to create it agree: each writes a private temporary file and link(2)s it
//      into place, which only the first succeeds in; the others read the winner's.
//      A key file readable by group or others is refused (errc::auth).
// With a non-loopback store and neither variable set: errc::invalid_argument saying
// how to set one. Malformed values: errc::invalid_argument naming the variable.
// Reads the environment and the file system; no state is kept.
#pragma once

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <plait/bootstrap/auth.hpp>
#include <plait/detail/socket.hpp>

namespace plait::bootstrap {

inline constexpr std::size_t min_token_bytes = 16;

// 32 random bytes as 64 lower-case hex digits.
inline std::string generate_token_hex() {
  std::array<std::byte, 32> raw{};
  auth_detail::random_bytes(raw);
  static constexpr char hex[] = "0123456789abcdef";
  std::string s;
  for (auto b : raw) {
    s += hex[std::to_integer<unsigned>(b) >> 4];
    s += hex[std::to_integer<unsigned>(b) & 15];
  }
  return s;
}

namespace token_detail {

inline std::vector<std::byte> bytes_of(const std::string& s) {
  auto* p = reinterpret_cast<const std::byte*>(s.data());
  return std::vector<std::byte>(p, p + s.size());
}

// Whole contents of an open file.
inline std::string read_fd(int fd, const std::string& path) {
  std::string s;
  char buf[4096];
  for (;;) {
    ssize_t k = ::read(fd, buf, sizeof buf);
    if (k > 0) {
      s.append(buf, static_cast<std::size_t>(k));
      if (s.size() > (1 << 20)) throw error(errc::invalid_argument, "token file " + path + " is larger than 1 MiB");
      continue;
    }
    if (k == 0) return s;
    if (errno != EINTR) throw error(errc::system, "cannot read token file " + path + ": " + detail::errno_text(errno));
  }
}

inline void strip_newline(std::string& s) {
  if (!s.empty() && s.back() == '\n') s.pop_back();
  if (!s.empty() && s.back() == '\r') s.pop_back();
}

inline std::string config_dir() {
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x == '/') return std::string(x) + "/plait";
  std::string home;
  if (const char* h = std::getenv("HOME"); h && *h)
    home = h;
  else if (const passwd* pw = ::getpwuid(::getuid()); pw && pw->pw_dir)
    home = pw->pw_dir;
  if (home.empty())
    throw error(errc::invalid_argument,
                "cannot find a home directory for the per-user token file; "
                "set PLAIT_TOKEN, PLAIT_TOKEN_FILE or XDG_CONFIG_HOME");
  return home + "/.config/plait";
}

// mkdir -p with mode 0700 for every directory it creates.
inline void make_dirs(const std::string& path) {
  for (std::size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string part = path.substr(0, pos);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST)
      throw error(errc::system, "cannot create directory " + part + " for the per-user token file: " +
                                    detail::errno_text(errno) + "; set PLAIT_TOKEN or PLAIT_TOKEN_FILE instead");
  }
}

inline std::string read_user_key(const std::string& path) {
  detail::fd_handle fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw error(errc::system, "cannot open token file " + path + ": " + detail::errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw error(errc::system, "cannot stat token file " + path + ": " + detail::errno_text(errno));
  if (st.st_uid != ::getuid())
    throw error(errc::auth, "token file " + path + " belongs to another user; remove it or set PLAIT_TOKEN");
  if ((st.st_mode & 077) != 0)
    throw error(errc::auth,
                "token file " + path + " is readable or writable by group or others; run: chmod 600 " + path);
  return read_fd(fd.get(), path);
}

// Creates the key file if absent (race-free between ranks) and returns its contents.
inline std::string user_key(const std::string& dir) {
  const std::string path = dir + "/token";
  if (::access(path.c_str(), F_OK) != 0) {
    make_dirs(dir);
    std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + generate_token_hex().substr(0, 8);
    detail::fd_handle fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) throw error(errc::system, "cannot create " + tmp + ": " + detail::errno_text(errno));
    std::string key = generate_token_hex();
    bool ok = ::write(fd.get(), key.data(), key.size()) == static_cast<ssize_t>(key.size()) && ::fsync(fd.get()) == 0;
    int write_errno = ok ? 0 : errno;
    fd.reset();
    int link_errno = ok && ::link(tmp.c_str(), path.c_str()) == 0 ? 0 : errno;
    ::unlink(tmp.c_str());
    if (!ok) throw error(errc::system, "cannot write " + tmp + ": " + detail::errno_text(write_errno));
    if (link_errno != 0 && link_errno != EEXIST)
      throw error(errc::system, "cannot create token file " + path + ": " + detail::errno_text(link_errno));
  }
  // Another writer could still be filling it (an older plait without link); wait briefly.
  auto until = clock::now() + std::chrono::seconds(2);
  for (;;) {
    std::string key = read_user_key(path);
    strip_newline(key);
    if (key.size() >= min_token_bytes) return key;
    if (clock::now() >= until)
      throw error(errc::auth, "token file " + path + " holds fewer than " + std::to_string(min_token_bytes) +
                                  " bytes; delete it (it is recreated) or set PLAIT_TOKEN");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace token_detail

inline std::vector<std::byte> resolve_token(const std::string& store_host) {
  using namespace token_detail;
  if (const char* t = std::getenv("PLAIT_TOKEN")) {
    std::string s(t);
    if (s.size() < min_token_bytes)
      throw error(errc::invalid_argument, "PLAIT_TOKEN must be at least " + std::to_string(min_token_bytes) +
                                              " bytes (it is " + std::to_string(s.size()) +
                                              "); use e.g. PLAIT_TOKEN=$(openssl rand -hex 32)");
    return bytes_of(s);
  }
  if (const char* f = std::getenv("PLAIT_TOKEN_FILE")) {
    std::string path(f);
    if (path.empty()) throw error(errc::invalid_argument, "PLAIT_TOKEN_FILE is set but empty; name a file or unset it");
    detail::fd_handle fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd)
      throw error(errc::invalid_argument,
                  "PLAIT_TOKEN_FILE=" + path + " cannot be opened: " + detail::errno_text(errno));
    std::string s = read_fd(fd.get(), path);
    strip_newline(s);
    if (s.size() < min_token_bytes)
      throw error(errc::invalid_argument, "PLAIT_TOKEN_FILE=" + path + " holds " + std::to_string(s.size()) +
                                              " bytes; a token needs at least " + std::to_string(min_token_bytes));
    return bytes_of(s);
  }
  if (!detail::is_loopback_address(store_host))
    throw error(errc::invalid_argument,
                "the store address '" + store_host +
                    "' is not a loopback address, so every rank needs the same secret token: set "
                    "PLAIT_TOKEN=<at least 16 characters, e.g. $(openssl rand -hex 32)> or "
                    "PLAIT_TOKEN_FILE=<path of a file holding it>, with the same value on every rank");
  return bytes_of(user_key(config_dir()));
}

}  // namespace plait::bootstrap
