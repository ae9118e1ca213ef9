// Helpers for the bootstrap tests: an environment that is restored on scope exit,
// temporary directories, and running a forked child that reports through its exit code.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include <plait/error.hpp>

namespace plait::testing {

// The plait::error fn() throws; a test failure if it throws none.
template <class F>
plait::error caught(F&& fn) {
  try {
    fn();
  } catch (const plait::error& e) {
    return e;
  }
  FAIL("no plait::error was thrown");
  return plait::error(plait::errc::system, "unreachable");
}

// Every variable the launch, token and knob code reads. A scoped_env unsets all of
// them on construction and restores their values on destruction.
inline const std::vector<std::string>& bootstrap_variables() {
  static const std::vector<std::string> names = {"PLAIT_RANK",
                                                 "PLAIT_WORLD_SIZE",
                                                 "PLAIT_LOCAL_RANK",
                                                 "PLAIT_STORE",
                                                 "PLAIT_STORE_SERVED",
                                                 "RANK",
                                                 "WORLD_SIZE",
                                                 "LOCAL_RANK",
                                                 "MASTER_ADDR",
                                                 "MASTER_PORT",
                                                 "OMPI_COMM_WORLD_RANK",
                                                 "OMPI_COMM_WORLD_SIZE",
                                                 "OMPI_COMM_WORLD_LOCAL_RANK",
                                                 "PMI_RANK",
                                                 "PMI_SIZE",
                                                 "MPI_LOCALRANKID",
                                                 "SLURM_PROCID",
                                                 "SLURM_NTASKS",
                                                 "SLURM_LOCALID",
                                                 "PLAIT_TOKEN",
                                                 "PLAIT_TOKEN_FILE",
                                                 "XDG_CONFIG_HOME",
                                                 "PLAIT_HOST_ID",
                                                 "PLAIT_ADDR",
                                                 "PLAIT_IFNAME",
                                                 "PLAIT_TIMEOUT",
                                                 "PLAIT_SLICE_BYTES",
                                                 "PLAIT_COPY_SLICE_BYTES",
                                                 "PLAIT_DEPTH",
                                                 "PLAIT_SEND_WINDOW",
                                                 "PLAIT_POLL",
                                                 "PLAIT_PROGRESS",
                                                 "PLAIT_SINGLE_COPY",
                                                 "PLAIT_HUGE_PAGES",
                                                 "PLAIT_STREAM_BYTES",
                                                 "PLAIT_TCP_CONGESTION",
                                                 "PLAIT_DEBUG",
                                                 "PLAIT_GRACE"};
  return names;
}

class scoped_env {
 public:
  scoped_env() {
    for (const auto& n : bootstrap_variables()) {
      if (const char* v = std::getenv(n.c_str())) saved_[n] = v;
      ::unsetenv(n.c_str());
    }
  }
  ~scoped_env() {
    for (const auto& n : bootstrap_variables()) ::unsetenv(n.c_str());
    for (const auto& [n, v] : saved_) ::setenv(n.c_str(), v.c_str(), 1);
  }
  scoped_env(const scoped_env&) = delete;
  scoped_env& operator=(const scoped_env&) = delete;

  void set(const std::string& name, const std::string& value) { ::setenv(name.c_str(), value.c_str(), 1); }
  void unset(const std::string& name) { ::unsetenv(name.c_str()); }

 private:
  std::map<std::string, std::string> saved_;
};

class temp_dir {
 public:
  temp_dir() {
    std::string templ = (std::filesystem::temp_directory_path() / "plait-boot-XXXXXX").string();
    if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Runs body in a forked child; its return value (0..255) becomes the exit code.
// Exceptions in the child exit 250 after printing what() to stderr. With
// run_exit_handlers the child leaves through std::exit (static destructors run, as
// at the end of a real program); otherwise through _exit.
inline pid_t fork_child(const std::function<int()>& body, bool run_exit_handlers = false) {
  std::fflush(nullptr);  // nothing buffered is written twice
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 251;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", static_cast<int>(::getpid()), e.what());
      code = 250;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    if (run_exit_handlers) std::exit(code);
    ::_exit(code);
  }
  return pid;
}

// Exit code of the child, or 256 + signal number when it was killed.
inline int wait_child(pid_t pid) {
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 256 + WTERMSIG(status);
  return -1;
}

}  // namespace plait::testing
