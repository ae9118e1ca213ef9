// What the TCP transport puts on a socket besides the slot header (wire.hpp).
//
// After the authentication handshake (bootstrap/auth.hpp) each side sends one
// tcp_hello, so the acceptor learns which rank connected and both check that they
// agree on the slot size and FIFO depth. Then the stream is a sequence of frames:
//   data frame:    slot_header (64 bytes, magic "PLT1") + header.bytes payload bytes
//   control frame: control_frame (16 bytes, magic "PLC1"): credit or closing
// A credit frame returns `value` receive slots to the sender (flow control: a sender
// never has more frames outstanding than the receiver has slots). A closing frame
// says the sender closed its link set and that `value` more data frames follow it
// (the ones it had posted but not yet sent); after them comes end-of-stream.
// Values are in host byte order: every rank of a job runs on the same architecture.
// Checks here never trust a length from the wire beyond the configured slot size.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include <plait/transport.hpp>
#include <plait/wire.hpp>

namespace plait::transport::tcp_detail {

inline constexpr std::uint32_t control_magic = 0x504c4331;  // "PLC1"
inline constexpr std::uint32_t hello_magic = 0x504c4848;    // "PLHH"
inline constexpr std::uint16_t tcp_wire_version = 1;
inline constexpr std::string_view auth_context = "plait-tcp";

enum class control_type : std::uint16_t {
  credit = 1,   // value: receive slots freed since the last credit frame
  closing = 2,  // value: data frames that still follow before end-of-stream
};

struct control_frame {
  std::uint32_t magic = control_magic;
  std::uint16_t version = tcp_wire_version;
  control_type type = control_type::credit;
  std::uint64_t value = 0;
};
static_assert(sizeof(control_frame) == 16);

// A closing frame's value: the data frames still to come (low 32 bits), the
// plait::errc of the closer's close_reason (bits 32..39) and its culprit + 1 (bits 40..63).
struct closing_info {
  std::uint64_t remaining = 0;
  errc code = errc::aborted;
  int culprit = -1;
};
inline std::uint64_t encode_closing(std::uint64_t remaining, close_reason why) noexcept {
  const auto code = static_cast<std::uint64_t>(static_cast<std::uint8_t>(why.code));
  const auto culprit = static_cast<std::uint64_t>(why.culprit < 0 ? 0 : why.culprit + 1) & 0xffffffu;
  return (remaining & 0xffffffffu) | (code << 32) | (culprit << 40);
}
inline closing_info decode_closing(std::uint64_t v) noexcept {
  closing_info i;
  i.remaining = v & 0xffffffffu;
  i.code = static_cast<errc>((v >> 32) & 0xffu);
  i.culprit = static_cast<int>(v >> 40) - 1;
  return i;
}

struct tcp_hello {
  std::uint32_t magic = hello_magic;
  std::uint16_t version = tcp_wire_version;
  std::uint16_t reserved = 0;
  std::int32_t rank = -1;  // the sender
  std::int32_t peer = -1;  // whom the sender believes it talks to
  std::uint64_t slot_bytes = 0;
  std::uint64_t depth = 0;
};
static_assert(sizeof(tcp_hello) == 32);

inline std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Why a data frame header cannot be accepted, or empty when it can.
inline std::string check_data_header(const plait::detail::slot_header& h, std::size_t slot_bytes) {
  if (h.version != plait::detail::wire_version)
    return "slot header version " + std::to_string(h.version) + ", this build speaks " +
           std::to_string(plait::detail::wire_version) + " (mixed plait versions?)";
  if (h.bytes > slot_bytes)
    return "slot of " + std::to_string(h.bytes) + " payload bytes, larger than the " + std::to_string(slot_bytes) +
           "-byte slots of this job";
  return {};
}

// Why a link configuration in a hello differs from ours, or empty when it agrees.
inline std::string check_hello_config(const tcp_hello& theirs, std::size_t slot_bytes, std::size_t depth) {
  if (theirs.slot_bytes == slot_bytes && theirs.depth == depth) return {};
  return "rank " + std::to_string(theirs.rank) + " uses slot_bytes " + std::to_string(theirs.slot_bytes) + ", depth " +
         std::to_string(theirs.depth) + " but this rank uses slot_bytes " + std::to_string(slot_bytes) + ", depth " +
         std::to_string(depth) + "; every rank must use the same slice size and depth (PLAIT_SLICE_BYTES, link_config)";
}

}  // namespace plait::transport::tcp_detail
