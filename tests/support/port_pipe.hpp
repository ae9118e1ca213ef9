// Telling forked ranks the store's port through pipes, so that the ranks can be
// forked before the store server's thread starts: a fork while that thread runs
// could copy a lock it holds (malloc's under ASan, OpenSSL's inside RAND_bytes or
// HMAC) into a child, where nothing would ever release it.
//
//   int fds[2]; ::pipe(fds);  fork: the child closes fds[1] and calls
//   read_port(fds[0], deadline); the parent closes fds[0], keeps fds[1], starts the
//   server and calls send_port({fds[1], ...}, server.port()).
#pragma once

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace plait::testing {

// Waits (bounded) for the parent to send the store's port down `fd`; 0 if it did not.
inline std::uint16_t read_port(int fd, std::chrono::steady_clock::time_point deadline) {
  std::uint16_t port = 0;
  std::size_t got = 0;
  while (got < sizeof port) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    const ssize_t k = ::read(fd, reinterpret_cast<char*>(&port) + got, sizeof port - got);
    if (k <= 0) return 0;  // the parent went away
    got += static_cast<std::size_t>(k);
  }
  return port;
}

// Writes the port to every rank's pipe and closes it. SIGPIPE (a rank that died before
// reading) is blocked meanwhile and a pending one is discarded: reaping reports that rank.
inline void send_port(const std::vector<int>& pipes, std::uint16_t port) {
  sigset_t pipe_only, old;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  bool broken = false;
  for (int w : pipes) {
    broken |= ::write(w, &port, sizeof port) != static_cast<ssize_t>(sizeof port);
    ::close(w);
  }
  if (broken) {
    const timespec zero{};
    ::sigtimedwait(&pipe_only, nullptr, &zero);
  }
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

}  // namespace plait::testing
