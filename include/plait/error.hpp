// plait::error and plait::errc: the one exception type the library throws.
//
// Every failure a caller can see is a plait::error carrying a code (errc), the
// rank that raised it, the peer involved (or -1) and the collective's sequence
// number on its communicator (or 0). what() says what went wrong and what to do.
// Kernels and destructors never throw; everything else reports through this type.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace plait {

enum class errc : int {
  invalid_argument = 1,  // misuse this rank can see by itself (sizes, root, overlap, env knobs)
  timeout,               // a deadline passed: a stopped or missing peer, or too short a timeout
  peer_lost,             // a peer's process died or closed its connections
  mismatch,              // ranks called different collectives (or a peer raised invalid_argument)
  protocol,              // malformed bytes on the wire
  auth,                  // a peer failed the token challenge
  aborted,               // abort() was called on this communicator
  unsupported,           // the composition or platform cannot do this
  system,                // an operating-system call failed
};

constexpr std::string_view to_string(errc c) noexcept {
  switch (c) {
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::timeout:
      return "timeout";
    case errc::peer_lost:
      return "peer_lost";
    case errc::mismatch:
      return "mismatch";
    case errc::protocol:
      return "protocol";
    case errc::auth:
      return "auth";
    case errc::aborted:
      return "aborted";
    case errc::unsupported:
      return "unsupported";
    case errc::system:
      return "system";
  }
  return "unknown";
}

class error : public std::runtime_error {
 public:
  error(errc code, std::string message, int rank = -1, int peer = -1, std::uint64_t sequence = 0)
      : std::runtime_error(format(code, message, rank, peer, sequence)),
        code_(code),
        rank_(rank),
        peer_(peer),
        sequence_(sequence),
        message_(std::move(message)) {}

  errc code() const noexcept { return code_; }
  int rank() const noexcept { return rank_; }
  int peer() const noexcept { return peer_; }
  std::uint64_t sequence() const noexcept { return sequence_; }
  // The message without the "plait: <code> ..." prefix, for re-raising with more context.
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string format(errc code, const std::string& message, int rank, int peer, std::uint64_t sequence) {
    std::string s = "plait: ";
    s += to_string(code);
    if (rank >= 0) s += " on rank " + std::to_string(rank);
    if (peer >= 0) s += " (peer " + std::to_string(peer) + ")";
    if (sequence != 0) s += " in collective #" + std::to_string(sequence);
    s += ": ";
    s += message;
    return s;
  }

  errc code_;
  int rank_;
  int peer_;
  std::uint64_t sequence_;
  std::string message_;
};

}  // namespace plait
