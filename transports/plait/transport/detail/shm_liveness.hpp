// Liveness of the peers on this host: is a peer's process still there?
//
// One pidfd per peer (pidfd_open(2), Linux 5.3+), polled with timeout 0: a pidfd
// becomes readable when its process exits, zombie or reaped, so a crash or a
// SIGKILL is seen on the next check with no heartbeat traffic. A stopped process
// (SIGSTOP, a debugger) is alive: that is for the caller's deadline to report as a
// timeout. Where pidfd_open is missing (ENOSYS: older kernels, some seccomp
// filters) kill(pid, 0) stands in; it cannot tell an unreaped zombie from a live
// process, so a dead peer whose parent does not reap it is then seen only when
// it is reaped.
// Not thread-safe: used by the executor thread only. Never blocks.
#pragma once

#include <cerrno>
#include <csignal>
#include <cstddef>
#include <string>
#include <vector>

#include <poll.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <plait/error.hpp>
#include <plait/transport/detail/shm_segment.hpp>

namespace plait::transport::shm_detail {

class peer_watch {
 public:
  // Starts watching `pid` (rank `peer`). Throws peer_lost if it is already gone.
  void add(int me, int peer, pid_t pid) {
    int fd = -1;
#ifdef SYS_pidfd_open
    if (!use_kill_) {
      fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
      if (fd < 0 && errno == ENOSYS) use_kill_ = true;  // every later add() takes the same path
    }
#else
    use_kill_ = true;
#endif
    if (use_kill_) {
      if (::kill(pid, 0) != 0 && errno == ESRCH) throw gone(me, peer, pid);
    } else if (fd < 0) {
      const int e = errno;
      if (e == ESRCH) throw gone(me, peer, pid);
      throw error(errc::system,
                  "shm: pidfd_open for rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
                      ") failed: " + errno_text(e) + "; raise the open-file limit (ulimit -n)",
                  me, peer);
    }
    fds_.emplace_back(fd);
    pids_.push_back(pid);
    exited_.push_back(false);
  }

  // Has the i-th watched process (in add() order) exited? Looks once, without blocking.
  bool exited(std::size_t i) noexcept {
    if (exited_[i]) return true;
    if (use_kill_) {
      exited_[i] = ::kill(pids_[i], 0) != 0 && errno == ESRCH;
    } else {
      pollfd p{fds_[i].get(), POLLIN, 0};
      exited_[i] = ::poll(&p, 1, 0) > 0 && p.revents != 0;
    }
    return exited_[i];
  }

  pid_t pid(std::size_t i) const noexcept { return pids_[i]; }

 private:
  static error gone(int me, int peer, pid_t pid) {
    return error(errc::peer_lost,
                 "shm: rank " + std::to_string(peer) + " (pid " + std::to_string(pid) +
                     ") exited while connecting; look at its output for the cause",
                 me, peer);
  }

  bool use_kill_ = false;
  std::vector<unique_fd> fds_;  // -1 where kill() stands in
  std::vector<pid_t> pids_;
  std::vector<bool> exited_;
};

}  // namespace plait::transport::shm_detail
